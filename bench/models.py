"""A synthetic convnet for batching benchmarks, and its CPU latency profile.

The weights are random (seeded numpy, He-scaled so activations stay finite): only the cost
matters. The network is sized so that onnxruntime on one CPU thread takes a few milliseconds per
image and the time per batch grows with the batch size, which is what an adaptive batcher needs
to have something to trade off.

Run ``python -m bench.models`` to build ``bench/out/convnet.onnx`` and print the profile.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from raysrv.artifacts import atomic_write

__all__ = ["INPUT_SHAPE", "MLP_PATH", "N_CLASSES", "build_convnet", "build_mlp", "main", "profile"]

INPUT_SHAPE: tuple[int, int, int] = (3, 32, 32)
N_CLASSES = 10
OPSET = 17
IR_VERSION = 8  # goes with opset 17
DEFAULT_PATH = Path(__file__).parent / "out" / "convnet.onnx"
MLP_PATH = Path(__file__).parent / "out" / "mlp.onnx"

# One (out_channels, max_pool_after) pair per 3x3 conv + Relu stage. The two wide convs at full
# 32x32 resolution carry most of the ~0.7 GFLOP per image: a much smaller net runs in well under a
# millisecond on an AVX-512 core, leaving a batcher nothing to trade off.
_STAGES: tuple[tuple[int, bool], ...] = (
    (64, False),
    (128, False),
    (128, True),
    (256, True),
    (256, True),
)


def _he(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int) -> np.ndarray:
    """He-normal random weights as float32."""
    return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)


def _stage(
    rng: np.random.Generator, x: str, k: int, c_in: int, stage: tuple[int, bool]
) -> tuple[list[onnx.NodeProto], list[TensorProto], str]:
    """Conv 3x3 (pad 1) -> Relu [-> MaxPool 2x2]: nodes, initializers and the output name."""
    c_out, pool = stage
    w = numpy_helper.from_array(_he(rng, (c_out, c_in, 3, 3), c_in * 9), f"conv{k}_w")
    b = numpy_helper.from_array(np.zeros(c_out, np.float32), f"conv{k}_b")
    nodes = [
        helper.make_node(
            "Conv", [x, w.name, b.name], [f"conv{k}"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]
        ),
        helper.make_node("Relu", [f"conv{k}"], [f"relu{k}"]),
    ]
    if pool:
        nodes.append(
            helper.make_node(
                "MaxPool", [f"relu{k}"], [f"pool{k}"], kernel_shape=[2, 2], strides=[2, 2]
            )
        )
    return nodes, [w, b], nodes[-1].output[0]


def _convnet(seed: int) -> onnx.ModelProto:
    """The whole model: conv stages, Flatten, Gemm -> logits."""
    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    inits: list[TensorProto] = []
    x, channels = "input", INPUT_SHAPE[0]
    for k, stage in enumerate(_STAGES, start=1):
        block, params, x = _stage(rng, x, k, channels, stage)
        nodes += block
        inits += params
        channels = stage[0]
    side = INPUT_SHAPE[1] >> sum(pool for _, pool in _STAGES)
    features = channels * side * side
    inits += [
        numpy_helper.from_array(_he(rng, (features, N_CLASSES), features), "fc_w"),
        numpy_helper.from_array(np.zeros(N_CLASSES, np.float32), "fc_b"),
    ]
    nodes += [
        helper.make_node("Flatten", [x], ["flat"], axis=1),
        helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"]),
    ]
    return _model(nodes, inits)


def _mlp(seed: int, layers: int, width: int, passes: int) -> onnx.ModelProto:
    """Flatten, MatMul + Relu to ``width`` units, then ``passes`` times through the same
    ``layers`` square MatMul + Relu layers (shared weights), then MatMul -> logits."""
    rng = np.random.default_rng(seed)
    fan_in = int(np.prod(INPUT_SHAPE))
    inits = [numpy_helper.from_array(_he(rng, (fan_in, width), fan_in), "w_in")]
    inits += [
        numpy_helper.from_array(_he(rng, (width, width), width), f"w{k}") for k in range(layers)
    ]
    inits.append(numpy_helper.from_array(_he(rng, (width, N_CLASSES), width), "w_out"))
    nodes = [helper.make_node("Flatten", ["input"], ["flat"], axis=1)]
    x = "flat"
    weights = ["w_in"] + [f"w{k}" for _ in range(passes) for k in range(layers)]
    for i, w in enumerate(weights):
        nodes += [
            helper.make_node("MatMul", [x, w], [f"mm{i}"]),
            helper.make_node("Relu", [f"mm{i}"], [f"h{i}"]),
        ]
        x = f"h{i}"
    nodes.append(helper.make_node("MatMul", [x, "w_out"], ["logits"]))
    return _model(nodes, inits)


def _model(nodes: list[onnx.NodeProto], inits: list[TensorProto]) -> onnx.ModelProto:
    """Wrap the nodes in a checked opset-17 model with a dynamic batch dimension."""
    graph = helper.make_graph(
        nodes,
        "bench_model",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", *INPUT_SHAPE])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", N_CLASSES])],
        initializer=inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="raysrv-bench"
    )
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    return model


def build_convnet(path: str | os.PathLike[str], seed: int = 0) -> Path:
    """Write the benchmark convnet to ``path`` (atomically; skipped when the file exists).

    Input ``input`` [N, 3, 32, 32] float32, output ``logits`` [N, 10] float32.
    """
    path = Path(path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, _convnet(seed).SerializeToString())
    return path


def build_mlp(
    path: str | os.PathLike[str],
    layers: int = 16,
    width: int = 4096,
    passes: int = 3,
    seed: int = 0,
) -> Path:
    """Write a wide MLP whose cost is mostly reading its weights (skipped when the file exists).

    With the defaults that is about 1 GB of float32 weights (far more than any cache), read
    ``passes`` times per batch whatever its size: on one CPU thread a batch of 1 takes about
    0.1 s and a batch of 8 about twice that, a fixed cost per batch much like a GPU's. Sharing
    the weights between passes keeps the file under protobuf's 2 GB limit. The live policy
    benchmark uses it so that the replica, not the serving machinery, is what saturates. Same
    input and output as the convnet.
    """
    path = Path(path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, _mlp(seed, layers, width, passes).SerializeToString())
    return path


def _session(path: Path) -> Any:
    """An onnxruntime CPU session pinned to one intra-op and one inter-op thread."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def _median_seconds(session: Any, x: np.ndarray, repeats: int, warmup: int = 5) -> float:
    """Median wall time of ``session.run`` on ``x`` after a few warm-up runs."""
    for _ in range(warmup):
        session.run(None, {"input": x})
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        session.run(None, {"input": x})
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def profile(
    path: str | os.PathLike[str],
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32),
    repeats: int = 50,
) -> dict[int, float]:
    """Median seconds per batch for each batch size, onnxruntime CPU, one intra-op thread."""
    session = _session(Path(path))
    rng = np.random.default_rng(0)
    return {
        n: _median_seconds(session, rng.random((n, *INPUT_SHAPE), dtype=np.float32), repeats)
        for n in batch_sizes
    }


def main() -> int:
    """Build ``bench/out/convnet.onnx`` and ``bench/out/mlp.onnx``; print their profiles."""
    for path in (build_convnet(DEFAULT_PATH), build_mlp(MLP_PATH)):
        print(f"{path.name}  (onnxruntime CPU, 1 intra-op thread, median of 20)")
        print(f"{'batch':>5}  {'ms/batch':>9}  {'ms/item':>8}")
        for n, seconds in profile(path, repeats=20).items():
            print(f"{n:>5}  {seconds * 1e3:>9.3f}  {seconds * 1e3 / n:>8.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
