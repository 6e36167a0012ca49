"""Straggler mitigation in miniature (clipper §5.2.2, Fig. 9; issue 5).

    python -m bench.stragglers [--queries 1500] [--rate 40] [--out bench/out/stragglers.json]

An ensemble app (``exp4``, feedback right after each answer) over k digits models, k = 3 and 5,
served by raysrv's ingress (:class:`raysrv._server.Server`: selection, batchers, deadlines) in
this process, each model a real classifier run in a worker thread: the example's ONNX models in
onnxruntime and two scikit-learn ones. One model, ``mlp``, is made a straggler: every batch it
runs waits an extra exponential delay of mean ``--straggle-ms`` (30 ms) before answering. Open-loop
Poisson arrivals at ``--rate`` queries/s of digits test images, SLO 50 ms (the example's).

Two ways to serve each ensemble, same arrivals:
- ``mitigated``: raysrv's default, every query carries the SLO; at the deadline (less the
  app's 5 ms ``ensemble_reserve_ms``) the ensemble combines the predictions that arrived;
- ``blocking``: ``best_effort``: the ensemble waits for every model (what an ensemble without
  mitigation does).

Reported: latency p50 / p99 / max, the share of predictions missing, accuracy, and answers
later than the SLO. Ray Serve is not in the loop (no hops between processes): the figures
show what mitigation changes, not raysrv's end-to-end latency.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from bench.selection import labels_of, train_classifier
from examples.digits import build as digits
from raysrv._heap import settle
from raysrv._server import Server
from raysrv.config import RaysrvSpec
from raysrv.errors import RaysrvError

__all__ = ["main"]

SLO_MS = 50.0
STRAGGLER = "mlp"
ENSEMBLES = {3: ("logreg", "mlp", "cnn"), 5: ("nb", "logreg", "mlp-150", "mlp", "cnn")}


def _classifiers() -> dict[str, Any]:
    """name -> a function from a batch of images to their labels."""
    import onnxruntime as ort

    x_train, y_train = digits.train_split()
    out: dict[str, Any] = {}
    for name, path in digits.build_all(digits.DEFAULT_OUT_DIR).items():
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        out[name] = lambda x, s=session: s.run(["label"], {"input": x})[0]
    subset = np.random.default_rng(0).choice(len(x_train), 150, replace=False)
    nb = train_classifier("nb", x_train, y_train)
    small = train_classifier("mlp", x_train[subset], y_train[subset])
    out["nb"] = lambda x: labels_of(nb, x)
    out["mlp-150"] = lambda x: labels_of(small, x)
    return out


def _execute(classify: Any, straggle_s: float, rng: np.random.Generator) -> Any:
    async def execute(
        inputs: np.ndarray, replica: int, latest_start: float = float("inf")
    ) -> tuple[list[Any] | None, float]:
        start = time.perf_counter()
        labels = await asyncio.to_thread(classify, np.asarray(inputs, dtype=np.float32))
        if straggle_s:
            await asyncio.sleep(rng.exponential(straggle_s))
        return [{"label": int(y)} for y in labels], time.perf_counter() - start

    return execute


def _spec(models: tuple[str, ...]) -> RaysrvSpec:
    model_specs = [
        {
            "name": m,
            "runtime": "python",
            "source": "raysrv.testing:LabelModel",  # never built: execute is given directly
            "batching": {"policy": "fixed", "params": {"max_batch_size": 8}},
            "slo_ms": SLO_MS,
            "input": {"shape": [64], "dtype": "float32"},
        }
        for m in models
    ]
    app = {"name": "vote", "models": list(models), "selection": {"policy": "exp4"}}
    return RaysrvSpec.model_validate({"models": model_specs, "apps": [{**app, "cache_size": 0}]})


@dataclass(frozen=True)
class Row:
    ensemble: int
    mode: str
    p50_ms: float
    p99_ms: float
    max_ms: float
    missing: float
    accuracy: float
    late: int
    failed: int


async def _serve(
    models: tuple[str, ...], blocking: bool, args: argparse.Namespace, classifiers: dict[str, Any]
) -> Row:
    x_test, y_test = digits.test_split()
    rng = np.random.default_rng(1)
    straggle = args.straggle_ms / 1000.0
    execute = {
        m: _execute(classifiers[m], straggle if m == STRAGGLER else 0.0, rng) for m in models
    }
    server = Server(_spec(models), execute)
    settle()  # as the ingress deployment does once started
    items = rng.integers(len(y_test), size=args.queries)
    gaps = rng.exponential(1.0 / args.rate, size=args.queries)

    async def one(i: int) -> tuple[float, dict[str, Any] | None]:
        start = time.perf_counter()
        try:
            answer = await server.predict("vote", x_test[i], best_effort=blocking)
        except RaysrvError:
            return (time.perf_counter() - start) * 1000.0, None
        ms = (time.perf_counter() - start) * 1000.0
        await server.feedback("vote", answer["query_id"], {"label": int(y_test[i])})
        return ms, answer

    tasks = []
    for i, gap in zip(items, gaps, strict=True):
        tasks.append(asyncio.create_task(one(int(i))))
        await asyncio.sleep(gap)
    results = await asyncio.gather(*tasks)
    await server.close()
    latency = np.array([ms for ms, _ in results])
    answered = [(a, int(y_test[i])) for (_, a), i in zip(results, items, strict=True) if a]
    missing = sum(len(a["missing"]) for a, _ in answered) / (len(answered) * len(models))
    correct = sum(a["output"]["label"] == y for a, y in answered)
    return Row(
        len(models),
        "blocking" if blocking else "mitigated",
        float(np.percentile(latency, 50)),
        float(np.percentile(latency, 99)),
        float(latency.max()),
        missing,
        correct / args.queries,
        int(np.sum(latency > SLO_MS)),
        args.queries - len(answered),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--queries", type=int, default=1500)
    parser.add_argument("--rate", type=float, default=40.0, help="queries per second")
    parser.add_argument("--straggle-ms", type=float, default=30.0)
    parser.add_argument("--out", default="bench/out/stragglers.json")
    args = parser.parse_args(argv)
    classifiers = _classifiers()
    rows = [
        asyncio.run(_serve(models, blocking, args, classifiers))
        for models in ENSEMBLES.values()
        for blocking in (True, False)
    ]
    print(
        f"SLO {SLO_MS:g} ms, {args.queries} queries at {args.rate:g}/s, straggler {STRAGGLER} "
        f"+exp({args.straggle_ms:g} ms) per batch\n"
    )
    print("| k | mode | p50 ms | p99 ms | max ms | missing | accuracy | late | failed |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r.ensemble} | {r.mode} | {r.p50_ms:.1f} | {r.p99_ms:.1f} | {r.max_ms:.1f} "
            f"| {r.missing:.1%} | {r.accuracy:.2%} | {r.late} | {r.failed} |"
        )
    with open(args.out, "w") as f:
        json.dump([asdict(r) for r in rows], f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
