"""Runtimes behind predict_batch: ONNX Runtime, torch (TorchScript and factory), python."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from raysrv.config import ModelSpec
from raysrv.runtimes import OnnxRuntime, load_runtime

WEIGHTS = np.arange(8, dtype=np.float32).reshape(4, 2)


def _onnx_matmul(path: Path, two_outputs: bool = False) -> Path:
    nodes = [helper.make_node("MatMul", ["input", "w"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 2])]
    if two_outputs:
        nodes.append(helper.make_node("ArgMax", ["y"], ["label"], axis=1, keepdims=0))
        outputs.append(helper.make_tensor_value_info("label", TensorProto.INT64, ["n"]))
    graph = helper.make_graph(
        nodes,
        "matmul",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["n", 4])],
        outputs,
        [numpy_helper.from_array(WEIGHTS, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def _spec(runtime: str, source: str, **extra: object) -> ModelSpec:
    return ModelSpec.model_validate(
        {"name": "m", "runtime": runtime, "source": source, "input": {"shape": [4]}, **extra}
    )


def test_onnx_runtime_predicts_a_batch_row_by_row(tmp_path: Path) -> None:
    runtime = load_runtime(_spec("onnx", str(_onnx_matmul(tmp_path / "m.onnx"))))
    x = np.array([[1, 0, 0, 0], [0, 0, 0, 1]], dtype=np.float32)
    assert runtime.predict_batch(x) == (x @ WEIGHTS).tolist()


def test_onnx_runtime_with_several_outputs_names_them(tmp_path: Path) -> None:
    runtime = OnnxRuntime(str(_onnx_matmul(tmp_path / "m.onnx", two_outputs=True)))
    out = runtime.predict_batch([[1, 0, 0, 0], [0, 0, 0, 1]])
    assert out == [{"y": [0.0, 1.0], "label": 1}, {"y": [6.0, 7.0], "label": 1}]


def test_onnx_gpu_without_cuda_fails_clearly(tmp_path: Path) -> None:
    """This machine has no GPU and no onnxruntime-gpu: the error must say what is missing."""

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("a CUDA-capable onnxruntime is installed here")
    path = str(_onnx_matmul(tmp_path / "m.onnx"))
    with pytest.raises(RuntimeError, match=r"onnxruntime-gpu.*raysrv\[gpu\]"):
        OnnxRuntime(path, device="gpu")


def test_torch_runtime_from_a_factory_and_from_torchscript(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from_factory = load_runtime(
        _spec("torch", "raysrv.testing:torch_linear", init_kwargs={"out_features": 2})
    )
    x = np.array([[1, 0, 0, 0], [0, 1, 1, 0]], dtype=np.float32)
    expected = [[0.0, 4.0], [3.0, 11.0]]
    assert from_factory.predict_batch(x) == expected
    from raysrv.testing import torch_linear

    scripted = tmp_path / "linear.pt"
    torch.jit.save(torch.jit.script(torch_linear()), str(scripted))
    assert load_runtime(_spec("torch", str(scripted))).predict_batch(x) == expected


def test_torch_factory_must_return_a_module() -> None:
    pytest.importorskip("torch")
    with pytest.raises(TypeError, match="not a torch.nn.Module"):
        load_runtime(_spec("torch", "raysrv.testing:FakeClock"))


def test_python_runtime_and_its_contract() -> None:
    runtime = load_runtime(_spec("python", "raysrv.testing:EchoModel", init_kwargs={"delay_s": 0}))
    out = runtime.predict_batch(np.ones((3, 4)))
    assert [o["sum"] for o in out] == [4.0, 4.0, 4.0]
    assert {o["batch_size"] for o in out} == {3}
    with pytest.raises(TypeError, match="predict_batch"):
        load_runtime(_spec("python", "raysrv.testing:FakeClock"))
    with pytest.raises(ValueError, match="cannot import"):
        load_runtime(_spec("python", "nowhere.at_all:Model"))


def test_onnx_source_must_be_a_file() -> None:
    with pytest.raises(ValueError, match="onnx source must be a .onnx file"):
        _spec("onnx", "pkg.mod:model")


_REAL_SESSION = onnxruntime.InferenceSession


class _FakeCudaSession:
    """Stands in for onnxruntime-gpu's session: no GPU can run here. Records what it was asked."""

    started_with: list[str] = []

    def __init__(self, path: str, sess_options: object, providers: list[str]) -> None:
        _FakeCudaSession.started_with = providers
        self._real = _REAL_SESSION(path, providers=["CPUExecutionProvider"])
        self.usable = providers if _FakeCudaSession.cuda_works else providers[1:]

    cuda_works = True

    def get_providers(self) -> list[str]:
        return self.usable

    def __getattr__(self, name: str) -> object:
        return getattr(self._real, name)


@pytest.mark.parametrize("cuda_works", [True, False])
def test_onnx_gpu_asks_for_cuda_and_refuses_a_silent_cpu_fallback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cuda_works: bool
) -> None:
    """A fake onnxruntime-gpu (no GPU here): CUDA is requested first, and a session that fell
    back to the CPU, as onnxruntime does when the CUDA libraries are missing, is an error."""

    path = str(_onnx_matmul(tmp_path / "m.onnx"))
    monkeypatch.setattr(
        onnxruntime,
        "get_available_providers",
        lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"],
    )
    monkeypatch.setattr(onnxruntime, "InferenceSession", _FakeCudaSession)
    monkeypatch.setattr(_FakeCudaSession, "cuda_works", cuda_works)
    if cuda_works:
        runtime = OnnxRuntime(path, device="gpu")
        assert _FakeCudaSession.started_with == ["CUDAExecutionProvider", "CPUExecutionProvider"]
        assert runtime.predict_batch([[0, 0, 0, 1]]) == [[6.0, 7.0]]
    else:
        with pytest.raises(RuntimeError, match="could not start the CUDA provider"):
            OnnxRuntime(path, device="gpu")


def test_torch_gpu_without_cuda_fails_clearly() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here")
    with pytest.raises(RuntimeError, match="CUDA build of torch"):
        load_runtime(
            _spec(
                "torch",
                "raysrv.testing:torch_linear",
                device="gpu",
                resources={"num_gpus": 1},
            )
        )
