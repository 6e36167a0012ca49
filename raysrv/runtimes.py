"""Model runtimes behind Clipper's narrow waist (Clipper, NSDI'17, §4.4, Listing 1).

Every runtime implements ``predict_batch(inputs) -> outputs``: ``inputs`` is a sequence of
inputs (in practice one stacked ``numpy`` array), the result one JSON-ready output per input.
A model with one output yields that output's row per input; several outputs yield a dict
``{output name: row}`` per input. Models load only from the paths and import paths of the
config, never from request data.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from raysrv._plugins import import_object
from raysrv.config import ModelSpec

__all__ = ["OnnxRuntime", "PythonRuntime", "Runtime", "TorchRuntime", "load_runtime", "rows"]


class Runtime(ABC):
    """One loaded model; ``predict_batch`` runs one batch, one call at a time."""

    @abstractmethod
    def predict_batch(self, inputs: Sequence[Any]) -> list[Any]:
        """One output per input, in order."""

    def close(self) -> None:
        """Give back what the model holds outside this process (its UNLOAD); nothing here."""
        return


def rows(names: Sequence[str], arrays: Sequence[Any]) -> list[Any]:
    """Split batched outputs into one JSON-ready output per input."""
    columns = [np.asarray(a).tolist() for a in arrays]
    if len(columns) == 1:
        return columns[0]
    return [dict(zip(names, values, strict=True)) for values in zip(*columns, strict=True)]


class OnnxRuntime(Runtime):
    """ONNX Runtime: the CPU provider, or the CUDA provider for ``device: gpu``."""

    def __init__(self, path: str, device: str = "cpu", threads: int = 1) -> None:
        import onnxruntime as ort

        providers = ["CPUExecutionProvider"]
        if device == "gpu":
            available = ort.get_available_providers()
            if "CUDAExecutionProvider" not in available:
                raise RuntimeError(
                    "device 'gpu' needs onnxruntime-gpu with the CUDA provider; this onnxruntime "
                    f"offers {available} (install raysrv[gpu] on a machine with an NVIDIA GPU)"
                )
            providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(path), sess_options=options, providers=providers)
        if device == "gpu" and self.session.get_providers()[0] != "CUDAExecutionProvider":
            raise RuntimeError(
                f"onnxruntime could not start the CUDA provider for {path} (no usable GPU or CUDA "
                f"libraries); it offered {self.session.get_providers()}"
            )
        (model_input,) = self.session.get_inputs()
        self._input = model_input.name
        self._dtype = _ONNX_DTYPES.get(model_input.type, np.float32)
        self.output_names = [o.name for o in self.session.get_outputs()]

    def predict_batch(self, inputs: Sequence[Any]) -> list[Any]:
        batch = np.asarray(inputs, dtype=self._dtype)
        return rows(self.output_names, self.session.run(None, {self._input: batch}))


_ONNX_DTYPES = {
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(float16)": np.float16,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}


class TorchRuntime(Runtime):
    """torch: a TorchScript file, or an importable factory returning an ``nn.Module``."""

    def __init__(
        self, source: str, device: str = "cpu", threads: int = 1, **init_kwargs: Any
    ) -> None:
        import torch

        if device == "gpu" and not torch.cuda.is_available():
            raise RuntimeError(
                "device 'gpu' needs a CUDA build of torch and a visible GPU; none found"
            )
        self._torch = torch
        self._device = torch.device("cuda" if device == "gpu" else "cpu")
        torch.set_num_threads(threads)
        if Path(source).suffix in (".pt", ".pth", ".ts", ".torchscript") or Path(source).is_file():
            module = torch.jit.load(source, map_location=self._device)
        else:
            module = import_object(source)(**init_kwargs)
            if not isinstance(module, torch.nn.Module):
                raise TypeError(f"{source} returned {type(module).__name__}, not a torch.nn.Module")
        self.module = module.to(self._device).eval()

    def weight_bytes(self) -> int:
        """Bytes of the module's parameters and buffers."""
        tensors = [*self.module.parameters(), *self.module.buffers()]
        return sum(t.numel() * t.element_size() for t in tensors)

    def predict_batch(self, inputs: Sequence[Any]) -> list[Any]:
        torch = self._torch
        with torch.inference_mode():
            batch = torch.as_tensor(np.asarray(inputs)).to(self._device)
            out = self.module(batch)
        if isinstance(out, dict):
            return rows(list(out), [t.cpu().numpy() for t in out.values()])
        if isinstance(out, (tuple, list)):
            return rows([str(i) for i in range(len(out))], [t.cpu().numpy() for t in out])
        return rows(["output"], [out.cpu().numpy()])


class PythonRuntime(Runtime):
    """Any importable class whose instances implement ``predict_batch(inputs) -> outputs``:
    ``inputs`` a stacked array, or for string and bytes inputs a list of ``str`` or ``bytes``.
    A class whose constructor takes ``threads`` is given the worker's intra-op threads."""

    def __init__(self, source: str, threads: int = 1, **init_kwargs: Any) -> None:
        factory = import_object(source)
        if "threads" in _parameters(factory) and "threads" not in init_kwargs:
            init_kwargs["threads"] = threads
        self.model = factory(**init_kwargs)
        if not callable(getattr(self.model, "predict_batch", None)):
            raise TypeError(f"{source} does not implement predict_batch(inputs) -> outputs")
        if callable(getattr(self.model, "weight_bytes", None)):
            self.weight_bytes = self.model.weight_bytes  # what its weights take, if it says

    def predict_batch(self, inputs: Sequence[Any]) -> list[Any]:
        return [_plain(output) for output in self.model.predict_batch(inputs)]


def _parameters(factory: Any) -> set[str]:
    try:
        return set(inspect.signature(factory).parameters)
    except (TypeError, ValueError):  # a builtin without a signature
        return set()


def _plain(value: Any) -> Any:
    """A python model's output as JSON holds it: numpy arrays as lists and numpy numbers as
    numbers; any other type than JSON's raises ``TypeError``, which fails the batch (500)."""
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    if isinstance(value, dict):
        return {_key(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    raise TypeError(f"a python model's output must be what JSON holds, got {type(value).__name__}")


def _key(key: Any) -> str:
    if not isinstance(key, str):
        raise TypeError(f"an output's keys must be strings, got {type(key).__name__}")
    return key


def load_runtime(spec: ModelSpec, plan: Any = None) -> Runtime:
    """Load the model ``spec`` describes, from its configured source only; a partitioned model
    as its leader, with its shard actors started (:mod:`raysrv._partitioned`, inside Ray), on
    ``plan`` if given."""
    threads = spec.resources.threads
    if spec.partition is not None:
        from raysrv._partitioned import PartitionedRuntime

        return PartitionedRuntime(spec, plan)
    if spec.runtime == "onnx":
        return OnnxRuntime(spec.source, spec.device, threads)
    if spec.runtime == "torch":
        return TorchRuntime(spec.source, spec.device, threads, **spec.init_kwargs)
    return PythonRuntime(spec.source, threads, **spec.init_kwargs)
