"""A zoo of many small ONNX models with distinct random weights, for many-model benchmarks.

Clockwork (OSDI'20) §6.2-6.5 serves thousands of model instances from a pool of workers whose
memory holds only some of them, so that loading and evicting models is part of serving. This
module builds such a zoo for CPU workers: ``count`` MLPs on the digits input ([N, 64] float32,
pixel values 0..16, dynamic batch) to 10 logits, 64 -> 1024 -> 448 -> 10 with ReLUs (Gemm
nodes), 530,250 float32 parameters, about 2.0 MiB a file. With ``passes`` > 0 a square
448 x 448 layer follows the second, applied ``passes`` times with its one set of weights
(2.8 MiB a file): the weights stay few while a batch costs what a larger network's would,
and a batch of one costs nearly as much as a small batch, as on a GPU. Each model's weights
come from its own generator, seeded by ``(seed, index)``: files are reproducible and no two
models are equal, so nothing can share or deduplicate them. Model ``i`` is ``m{i:04d}.onnx``;
the file stem is the model's name (lowercase, starts with a letter).

The zoo is rebuilt from code, never downloaded: ``python -m bench.zoo`` builds 1,000 models in
``bench/out/zoo`` (git-ignored; files already there with the right size are kept, so a rerun is
instant) and prints what a worker pays per model: file size, onnxruntime session creation, the
first and the steady run time of batches 1, 4 and 16, and the resident memory a loaded session
adds. One intra-op thread and the CPU provider throughout, as the benchmark's workers run.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from bench.models import IR_VERSION, N_CLASSES, OPSET, _he, _median_seconds, _session
from raysrv.artifacts import atomic_write

__all__ = [
    "DEFAULT_DIR",
    "INPUT_DIM",
    "build_zoo",
    "digits_like",
    "main",
    "model_name",
    "model_size",
    "parameters",
    "zoo_model",
]

INPUT_DIM = 64  # the digits input: 8x8 pixels, values 0..16
WIDTH, NARROW = 1024, 448  # hidden layers: 530,250 parameters, about 2.0 MiB of float32
DEFAULT_DIR = Path(__file__).parent / "out" / "zoo"
BATCHES = (1, 4, 16)

Weights = list[tuple[np.ndarray, np.ndarray]]


def model_name(index: int) -> str:
    """The name (and file stem) of the zoo's model ``index``: ``m0000``, ``m0001``, ..."""
    return f"m{index:04d}"


def _shapes(width: int, narrow: int, passes: int = 0) -> list[tuple[int, int]]:
    square = [(narrow, narrow)] if passes else []
    return [(INPUT_DIM, width), (width, narrow), *square, (narrow, N_CLASSES)]


def _weights(
    rng: np.random.Generator, width: int, narrow: int, passes: int = 0, steady: bool = False
) -> Weights:
    """He-normal weight matrices and zero biases, layer by layer; ``steady``: the square layer
    scaled by :func:`_steady_gain`."""
    weights = [
        (_he(rng, shape, shape[0]), np.zeros(shape[1], np.float32))
        for shape in _shapes(width, narrow, passes)
    ]
    if passes and steady:
        w, b = weights[2]
        weights[2] = ((w * _steady_gain(w)).astype(np.float32), b)
    return weights


def _steady_gain(w: np.ndarray, iterations: int = 300) -> float:
    """What scales the square layer ``w`` so that a pass, ``relu(h @ w)``, keeps the size of
    the activations it settles to: the inverse of the map's growth per pass, found by power
    iteration. He-normal weights grow them about 10% a pass, past float32's range within a
    thousand passes (NaN answers)."""
    h = np.ones(w.shape[0])
    growth = 1.0
    for _ in range(iterations):
        h = np.maximum(h @ w.astype(np.float64), 0.0)
        growth = float(np.linalg.norm(h))
        h /= growth
    return 1.0 / growth


def _stamp(
    index: int, seed: int, width: int, narrow: int, passes: int = 0, steady: bool = False
) -> str:
    """What a zoo file says of itself: fixed width, so that every file of a shape has one size."""
    head = f"raysrv bench zoo: model {index:>7}, seed {seed:>12}, hidden {width:>6} {narrow:>6}"
    return head + (f", passes {passes:>4}" if passes else "") + (", steady" if steady else "")


def _layer(x: str, k: int, out: str, relu: bool) -> list[onnx.NodeProto]:
    """Gemm over weights ``w{k}``, ``b{k}`` (and a Relu): ``x`` -> ``out``."""
    if not relu:
        return [helper.make_node("Gemm", [x, f"w{k}", f"b{k}"], [out])]
    return [
        helper.make_node("Gemm", [x, f"w{k}", f"b{k}"], [f"{out}_pre"]),
        helper.make_node("Relu", [f"{out}_pre"], [out]),
    ]


def _loop(x: str, k: int, passes: int, out: str) -> tuple[list[onnx.NodeProto], TensorProto]:
    """Layer ``k`` applied ``passes`` times: one ONNX Loop node, so the graph stays small and a
    session is as quick to create as without it."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond"], ["cond_out"]), *_layer("h", k, "h_out", True)],
        "square_layer",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
            helper.make_tensor_value_info("h", TensorProto.FLOAT, None),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("h_out", TensorProto.FLOAT, None),
        ],
    )
    trips = numpy_helper.from_array(np.array(passes, np.int64), "passes")
    node = helper.make_node("Loop", ["passes", "", x], [out], body=body)
    return [node], trips


def _graph(weights: Weights, stamp: str, passes: int = 0) -> onnx.ModelProto:
    """Gemm (+ Relu between layers) over ``weights``: input [N, 64] -> logits [N, 10]; with
    ``passes``, the third layer (square) runs that many times (an ONNX Loop)."""
    inits: list[TensorProto] = []
    for k, (w, b) in enumerate(weights):
        inits += [numpy_helper.from_array(w, f"w{k}"), numpy_helper.from_array(b, f"b{k}")]
    last = len(weights) - 1
    nodes = _layer("input", 0, "h0", True) + _layer("h0", 1, "h1", True)
    x = "h1"
    if passes:
        loop, trips = _loop(x, 2, passes, "h2")
        nodes, x = nodes + loop, "h2"
        inits.append(trips)
    nodes += _layer(x, last, "logits", False)
    graph = helper.make_graph(
        nodes,
        "zoo_mlp",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", INPUT_DIM])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", N_CLASSES])],
        initializer=inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="raysrv-bench"
    )
    model.ir_version = IR_VERSION
    model.doc_string = stamp  # serialized before the graph: the first bytes of the file
    return model


def zoo_model(
    index: int,
    seed: int = 0,
    width: int = WIDTH,
    narrow: int = NARROW,
    passes: int = 0,
    steady: bool = False,
) -> onnx.ModelProto:
    """Model ``index`` of the zoo built with ``seed``: its own generator, ``(seed, index)``."""
    weights = _weights(np.random.default_rng([seed, index]), width, narrow, passes, steady)
    return _graph(weights, _stamp(index, seed, width, narrow, passes, steady), passes)


def parameters(width: int = WIDTH, narrow: int = NARROW, passes: int = 0) -> int:
    """Weights and biases of one zoo model of this shape."""
    return sum(n_in * n_out + n_out for n_in, n_out in _shapes(width, narrow, passes))


def model_size(
    width: int = WIDTH, narrow: int = NARROW, passes: int = 0, steady: bool = False
) -> int:
    """Bytes of every zoo file of this shape (weights are raw data: values do not change it)."""
    shapes = _shapes(width, narrow, passes)
    zeros = [(np.zeros(s, np.float32), np.zeros(s[1], np.float32)) for s in shapes]
    return _graph(zeros, _stamp(0, 0, width, narrow, passes, steady), passes).ByteSize()


def _built(path: Path, size: int, stamp: str) -> bool:
    """Whether ``path`` already holds the model stamped ``stamp``, whole."""
    if not path.exists() or path.stat().st_size != size:
        return False
    with path.open("rb") as f:
        return stamp.encode() in f.read(256)


def build_zoo(
    directory: str | os.PathLike[str],
    count: int,
    seed: int = 0,
    width: int = WIDTH,
    narrow: int = NARROW,
    passes: int = 0,
    steady: bool = False,
) -> list[Path]:
    """Write models ``m0000.onnx`` ... to ``directory`` (each atomically) and return their paths.

    A file already there is kept as it is when its size and the stamp in its first bytes (model,
    seed and shape) are this model's, so a rerun is instant; any other file is written again.
    The first model written is checked with onnx's checker.
    """
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    size, checked = model_size(width, narrow, passes, steady), False
    paths = [directory / f"{model_name(i)}.onnx" for i in range(count)]
    for i, path in enumerate(paths):
        if _built(path, size, _stamp(i, seed, width, narrow, passes, steady)):
            continue
        model = zoo_model(i, seed, width, narrow, passes, steady)
        if not checked:
            onnx.checker.check_model(model, full_check=True)
            checked = True
        atomic_write(path, model.SerializeToString())
    return paths


def digits_like(rng: np.random.Generator, batch: int) -> np.ndarray:
    """A [batch, 64] float32 input shaped like the digits (integer pixels 0..16)."""
    return rng.integers(0, 17, (batch, INPUT_DIM)).astype(np.float32)


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def _rss() -> int:
    """This process's resident set size in bytes (psutil; Ray ships a copy of it)."""
    try:
        import psutil
    except ImportError:  # Ray's own copy: importing ray puts it on sys.path
        importlib.import_module("ray")
        psutil = importlib.import_module("psutil")
    return int(psutil.Process().memory_info().rss)


def run_times(paths: list[Path], batch: int, rng: np.random.Generator) -> tuple[float, float]:
    """p50 over ``paths`` of a fresh session's first run, and of its steady run time."""
    x = digits_like(rng, batch)
    first, steady = [], []
    for path in paths:
        session = _session(path)
        seconds, _ = _timed(lambda s=session: s.run(None, {"input": x}))
        first.append(seconds)
        steady.append(_median_seconds(session, x, repeats=50, warmup=2))
    return float(np.median(first)), float(np.median(steady))


def _memory(paths: list[Path], rng: np.random.Generator) -> list[float]:
    """Resident bytes per session: loaded, after a batch of 16 each, and left once all dropped."""
    gc.collect()
    base = _rss()
    sessions = [_session(p) for p in paths]
    loaded = _rss()
    x = digits_like(rng, 16)
    for session in sessions:
        session.run(None, {"input": x})
    ran = _rss()
    del sessions
    gc.collect()
    return [(value - base) / len(paths) for value in (loaded, ran, _rss())]


def _report(paths: list[Path], samples: int) -> None:
    """Print the per-model costs a worker pays (see the module docstring)."""
    rng = np.random.default_rng(0)
    size = paths[0].stat().st_size
    print(f"file: {size:,} bytes ({size / 2**20:.2f} MiB), {parameters():,} float32 parameters")
    sample = paths[:samples]
    creation = [_timed(lambda p=p: _session(p))[0] for p in sample]
    print(
        f"session creation: p50 {np.median(creation) * 1e3:.2f} ms, "
        f"p90 {np.percentile(creation, 90) * 1e3:.2f} ms over {len(sample)} models"
    )
    print(f"{'batch':>5}  {'first run ms':>12}  {'steady ms':>9}  (p50 over {len(sample)} models)")
    for batch in BATCHES:
        first, steady = run_times(sample, batch, rng)
        print(f"{batch:>5}  {first * 1e3:>12.3f}  {steady * 1e3:>9.3f}")
    loaded, ran, left = _memory(paths[samples : samples + 50] or sample, rng)
    print(
        f"RSS per session: {loaded / 2**20:.2f} MiB loaded, {ran / 2**20:.2f} MiB after a "
        f"batch of 16, {left / 2**20:.2f} MiB still resident once all are dropped (freed heap "
        "that glibc keeps for the next loads)"
    )


def main(argv: list[str] | None = None) -> int:
    """Build the zoo and print its per-model costs."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1000, help="models to build")
    parser.add_argument("--out", type=Path, default=DEFAULT_DIR, help="the zoo's folder")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--samples", type=int, default=20, help="models timed per figure")
    parser.add_argument("--passes", type=int, default=0, help="runs of the square layer")
    args = parser.parse_args(argv)
    seconds, paths = _timed(lambda: build_zoo(args.out, args.count, args.seed, passes=args.passes))
    print(f"zoo: {len(paths)} models in {args.out} ({seconds:.1f} s to build or check)")
    _report(paths, args.samples)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
