"""Straggler mitigation in miniature (clipper §5.2.2, Fig. 9; issue 5).

    python -m bench.stragglers [--serve] [--queries 1500] [--rate 40] [--out ...]

An ensemble app (``exp4``, feedback right after each answer) over k digits classifiers, k = 3
(``logreg``, ``mlp``, ``cnn``: the example's ONNX models in onnxruntime) and k = 5 (plus
scikit-learn's Gaussian naive Bayes and the ``mlp`` architecture trained on 150 images). One
model, ``mlp``, is made a straggler: every batch it runs waits an extra exponential delay of
mean ``--straggle-ms`` (30 ms) before answering. Open-loop Poisson arrivals at ``--rate``
queries/s of digits test images, SLO 50 ms (the example's).

Where it runs:
- default: raysrv's ingress (:class:`raysrv._server.Server`: selection, schedulers, deadlines)
  in this process, each model in a worker thread, the straggler's delay an ``asyncio`` sleep;
- ``--serve``: ``raysrv.app.build_app`` on a local Ray Serve, each model a replica actor of its
  own (the python runtime over :class:`Classifier`, whose delay blocks its replica as a slow
  machine would), queries and feedback through a Serve handle with ``sent_at``.

Two ways to serve each ensemble, same arrivals:
- ``mitigated``: raysrv's default, every query carries the SLO; at the deadline (less the
  app's 5 ms ``ensemble_reserve_ms``) the ensemble combines the predictions that arrived;
- ``blocking``: ``best_effort``: the ensemble waits for every model (what an ensemble without
  mitigation does).

Reported: latency from each query's scheduled arrival, p50 / p99 / max; the share of
predictions missing; accuracy over the queries offered; answers later than the SLO; queries
that failed (no prediction at all by the deadline).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from bench.selection import labeler
from examples.digits import build as digits
from raysrv._heap import settle
from raysrv._server import Server
from raysrv.config import RaysrvSpec
from raysrv.errors import RaysrvError
from raysrv.testing import LocalWorkers

__all__ = ["Classifier", "classifier", "main"]

SLO_MS = 50.0
STRAGGLER = "mlp"
ENSEMBLES = {3: ("logreg", "mlp", "cnn"), 5: ("nb", "logreg", "mlp-150", "mlp", "cnn")}

Ask = Callable[[np.ndarray, bool], Awaitable[dict[str, Any] | None]]
Tell = Callable[[str, int], Awaitable[object]]


def classifier(name: str) -> Callable[[np.ndarray], np.ndarray]:
    """A function from a batch of images to their labels, for one of the ensembles' models."""
    if name in digits.MODEL_NAMES:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        path = digits.build_all(digits.DEFAULT_OUT_DIR)[name]
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        return lambda x: session.run(["label"], {"input": x})[0]
    x_train, y_train = digits.train_split()
    if name == "mlp-150":
        subset = np.random.default_rng(0).choice(len(x_train), 150, replace=False)
        x_train, y_train = x_train[subset], y_train[subset]
    return labeler("nb" if name == "nb" else "mlp", x_train, y_train)


class Classifier:
    """A model replica for ``--serve`` (the python runtime): ``classifier(name)``, and for the
    straggler an exponential delay of mean ``straggle_ms`` per batch, blocking the replica."""

    def __init__(self, name: str, straggle_ms: float = 0.0, seed: int = 1) -> None:
        self._classify = classifier(name)
        self._straggle_s = straggle_ms / 1000.0
        self._rng = np.random.default_rng(seed)

    def predict_batch(self, inputs: Any) -> list[dict[str, int]]:
        labels = self._classify(np.asarray(inputs, dtype=np.float32))
        if self._straggle_s:
            time.sleep(self._rng.exponential(self._straggle_s))
        return [{"label": int(y)} for y in labels]


def _spec(models: tuple[str, ...], straggle_ms: float) -> dict[str, Any]:
    model_specs = [
        {
            "name": m,
            "runtime": "python",
            "source": "bench.stragglers:Classifier",
            "init_kwargs": {"name": m, "straggle_ms": straggle_ms if m == STRAGGLER else 0.0},
            "resources": {"num_cpus": 0.1, "threads": 1},
            "batching": {"policy": "fixed", "params": {"max_batch_size": 8}},
            "slo_ms": SLO_MS,
            "input": {"shape": [64], "dtype": "float32"},
        }
        for m in models
    ]
    app = {"name": "vote", "models": list(models), "selection": {"policy": "exp4"}}
    return {"models": model_specs, "apps": [{**app, "cache_size": 0}], "ingress": {"num_cpus": 0.1}}


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


async def _drive(ask: Ask, tell: Tell, models: tuple[str, ...], blocking: bool, args: Any) -> Row:
    """Offer the queries open-loop through ``ask``, feedback through ``tell``; one row."""
    x_test, y_test = digits.test_split()
    rng = np.random.default_rng(1)
    items = rng.integers(len(y_test), size=args.queries)
    gaps = rng.exponential(1.0 / args.rate, size=args.queries)
    settle()  # the client's own collector pauses are not the server's latency
    t0 = time.perf_counter()

    async def one(i: int, scheduled: float) -> tuple[float, dict[str, Any] | None]:
        answer = await ask(x_test[i], blocking)
        ms = (time.perf_counter() - t0 - scheduled) * 1000.0
        if answer is not None:
            await tell(answer["query_id"], int(y_test[i]))
        return ms, answer

    tasks, scheduled = [], 0.0
    for i, gap in zip(items, gaps, strict=True):
        await asyncio.sleep(max(0.0, scheduled - (time.perf_counter() - t0)))
        tasks.append(asyncio.create_task(one(int(i), scheduled)))
        scheduled += gap
    results = await asyncio.gather(*tasks)
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


def _in_process(models: tuple[str, ...], blocking: bool, args: Any) -> Row:
    rng = np.random.default_rng(1)
    straggle_s = args.straggle_ms / 1000.0

    def workers(name: str) -> LocalWorkers:
        classify, delay = classifier(name), straggle_s if name == STRAGGLER else 0.0

        async def run(inputs: np.ndarray) -> tuple[list[Any], float]:
            start = time.perf_counter()
            labels = await asyncio.to_thread(classify, np.asarray(inputs, dtype=np.float32))
            if delay:
                await asyncio.sleep(rng.exponential(delay))
            return [{"label": int(y)} for y in labels], time.perf_counter() - start

        return LocalWorkers(1, run=run)

    async def scenario() -> Row:
        spec = RaysrvSpec.model_validate(_spec(models, args.straggle_ms))
        server = Server(spec, {m: workers(m) for m in models})

        async def ask(x: np.ndarray, best_effort: bool) -> dict[str, Any] | None:
            try:
                return await server.predict("vote", x, best_effort=best_effort)
            except RaysrvError:
                return None

        async def tell(query_id: str, label: int) -> object:
            return await server.feedback("vote", query_id, label)

        try:
            return await _drive(ask, tell, models, blocking, args)
        finally:
            await server.close()

    return asyncio.run(scenario())


def _on_serve(models: tuple[str, ...], blocking: bool, args: Any) -> Row:
    from ray import serve
    from ray.serve.schema import LoggingConfig

    from raysrv.app import build_app

    quiet = LoggingConfig(enable_access_log=False, log_level="WARNING")
    app = build_app(_spec(models, args.straggle_ms))
    handle = serve.run(app, name="stragglers", route_prefix="/stragglers", logging_config=quiet)

    async def ask(x: np.ndarray, best_effort: bool) -> dict[str, Any] | None:
        sent = time.time()
        answer = await handle.predict.remote("vote", x, best_effort=best_effort, sent_at=sent)
        return None if "error" in answer else answer

    async def tell(query_id: str, label: int) -> object:
        return await handle.feedback.remote("vote", query_id, label)

    async def scenario() -> Row:
        for _ in range(20):  # warm-up: load every replica's model, discarded
            await ask(np.zeros(64, dtype=np.float32), True)
        return await _drive(ask, tell, models, blocking, args)

    try:
        return asyncio.run(scenario())
    finally:
        serve.delete("stragglers")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--serve", action="store_true", help="run on a local Ray Serve")
    parser.add_argument("--queries", type=int, default=1500)
    parser.add_argument("--rate", type=float, default=40.0, help="queries per second")
    parser.add_argument("--straggle-ms", type=float, default=30.0)
    parser.add_argument("--out", default="bench/out/stragglers.json")
    args = parser.parse_args(argv)
    run = _in_process
    if args.serve:
        from bench.validate_live import start_ray

        start_ray()
        run = _on_serve
    rows = [run(m, blocking, args) for m in ENSEMBLES.values() for blocking in (True, False)]
    where = "Ray Serve" if args.serve else "in-process ingress"
    print(
        f"{where}; SLO {SLO_MS:g} ms, {args.queries} queries at {args.rate:g}/s, straggler "
        f"{STRAGGLER} +exp({args.straggle_ms:g} ms) per batch\n"
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
