"""Does SERF's table pick the configuration that measures best? Each configuration (workers,
threads, lanes) served at several loads, beside the table's pick, in one process.

    python -m bench.serf_configs [--models wide-cnn curve] [--seconds 2] [--rounds 3]
        [--loads 0.1 0.3 0.5 0.7 0.85] [--queries 20] [--profile-s 0.25] [--out JSON]

For each model the profile and the table are the live ones: :func:`raysrv._workers.concurrent_rates`
measures mu_1 .. mu_n per thread count and lanes (``--queries`` each, more where they would
take less than ``--profile-s``; by default what the live profile runs), and
:class:`raysrv.batching.autoscale.SerfScaler` builds the table from them. Then every
configuration that fits the cores serves Poisson arrivals at each tested load (a share of the
most any configuration serves) for ``--seconds``: ``workers`` threads take queries from one
first-come-first-served queue, ``lanes`` of them to a runtime with ``threads`` intra-op
threads, as the pool's workers take its queue. A query's latency runs from its scheduled
arrival to its answer. The configurations take turns within each round (``--rounds``), and a
configuration's figure is its median mean latency over the rounds (this host is noisy).

* ``wide-cnn``: the partitioned example's convnet (ONNX Runtime on this host's CPUs), a query
  a batch of ``WIDE_CNN_BATCH`` images, 1 or 2 threads on 2 cores, 1 or 2 lanes (two lanes:
  two queries at once on one session).
* ``curve``: an **emulated accelerator** (:class:`raysrv.testing.CurveModel`: 4 ms a query, 2
  threads 1.5x faster, each other query running at once stretches one by 15%), 1, 2 or 4
  threads on 4 notional cores, one lane (its stretch counts every query of the process, so
  lanes and runtimes of their own are the same to it). Its figures say how well the queueing
  model ranks the configurations of a known service curve, not how this host runs them.

Reported per load: the table's pick and its predicted mean, the measured best and the pick's
measured mean against the best's.
"""

from __future__ import annotations

import argparse
import json
import queue
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raysrv._workers import concurrent_rates, with_threads
from raysrv.batching.autoscale import AutoscalingSpec, SerfScaler
from raysrv.config import ModelSpec, resolve_pools
from raysrv.runtimes import Runtime, load_runtime

QUERIES = AutoscalingSpec.model_fields["profile_queries"].default  # the live profile's
PROFILE_S = AutoscalingSpec.model_fields["profile_s"].default
WIDE_CNN_BATCH = 8
OUT = Path("bench/out/serf_configs.json")


@dataclass(frozen=True)
class Case:
    name: str
    spec: dict[str, Any]
    threads: tuple[int, ...]
    cores: int
    size: int  # the batch one query is
    lanes: tuple[int, ...] = (1,)


CASES = {
    "wide-cnn": Case(
        "wide-cnn",
        {"runtime": "onnx", "source": "examples/partitioned/models/wide-cnn.onnx",
         "input": {"shape": [1, 8, 8], "dtype": "float32"}},
        (1, 2), 2, WIDE_CNN_BATCH, (1, 2),
    ),
    "curve": Case(
        "curve",
        {"runtime": "python", "source": "raysrv.testing:CurveModel",
         "init_kwargs": {"base_s": 0.004, "scaling": 0.6, "interference": 0.15},
         "input": {"shape": [4], "dtype": "float32"}},
        (1, 2, 4), 4, 1,
    ),
}  # fmt: skip


def _model(case: Case) -> ModelSpec:
    if case.name == "wide-cnn":
        from examples.partitioned.build import ensure_model

        ensure_model(case.spec["source"])
    scaling = {"policy": "serf", "max": case.cores, "threads": case.threads, "cores": case.cores,
               "lanes": case.lanes}  # fmt: skip
    return ModelSpec.model_validate({"name": case.name, **case.spec, "autoscaling": scaling})


def profile(case: Case, queries: int, seconds: float) -> tuple[ModelSpec, SerfScaler]:
    """The live profile and table of ``case``'s model, ``queries`` per point at the least,
    and ``seconds``."""
    model = _model(case)
    (pool,) = resolve_pools([], [model])
    assert model.autoscaling is not None
    rates = {
        (t, b): concurrent_rates(pool, model, t, case.cores // t, queries, case.size, b, seconds)
        for t in case.threads
        for b in case.lanes
    }
    scaler = SerfScaler(model.autoscaling)
    scaler.set_profile(rates, case.cores)
    return model, scaler


def serve(runtimes: list[Runtime], batch: Any, rate: float, seconds: float, seed: int) -> float:
    """Mean seconds from each query's scheduled arrival to its answer: Poisson arrivals at
    ``rate`` for ``seconds``, one FCFS queue, one thread per entry of ``runtimes`` (a runtime
    listed twice: two lanes of it) taking from it."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, int(rate * seconds * 1.5) + 10))
    arrivals = arrivals[arrivals < seconds]
    waiting: queue.SimpleQueue[float | None] = queue.SimpleQueue()
    latencies: list[float] = []

    def work(runtime: Runtime) -> None:
        while (due := waiting.get()) is not None:
            runtime.predict_batch(batch)
            latencies.append(time.perf_counter() - due)

    threads = [threading.Thread(target=work, args=(r,), daemon=True) for r in runtimes]
    for thread in threads:
        thread.start()
    start = time.perf_counter()
    for offset in arrivals:
        due = start + float(offset)
        ahead = due - time.perf_counter()
        if ahead > 0:
            time.sleep(ahead)
        waiting.put(due)
    for _ in threads:
        waiting.put(None)
    for thread in threads:
        thread.join()
    return statistics.fmean(latencies)


def measure(case: Case, model: ModelSpec, scaler: SerfScaler, args: argparse.Namespace) -> dict:
    """Every configuration at every tested load; the table's pick beside the measured best."""
    configs = sorted(scaler.capacity)  # (workers, threads, lanes) within the cores and bounds
    top = max(scaler.capacity.values())
    batch = model.input.batch(case.size)
    runtimes = {t: [load_runtime(with_threads(model, t)) for _ in range(case.cores // t)]
                for t in case.threads}  # fmt: skip
    for pool in runtimes.values():
        for runtime in pool:
            runtime.predict_batch(batch)
    rows = []
    for share in args.loads:
        rate = share * top
        means: dict[tuple[int, int, int], list[float]] = {c: [] for c in configs}
        for round_ in range(args.rounds):
            for workers, threads, lanes in configs:
                laned = [runtimes[threads][k // lanes] for k in range(workers)]
                took = serve(laned, batch, rate, args.seconds, round_)
                means[workers, threads, lanes].append(took)
        measured = {c: statistics.median(m) for c, m in means.items()}
        best = min(measured, key=measured.__getitem__)
        row = min((r for r in scaler.table if r.load >= rate), key=lambda r: r.load,
                  default=scaler.table[-1])  # fmt: skip
        assert row.best is not None
        pick = (row.best.config.service, row.best.config.intra_threads, row.best.config.lanes)
        rows.append({
            "share": share, "rate": rate, "pick": pick, "predicted_ms": row.best.latency * 1e3,
            "best": best, "pick_ms": measured[pick] * 1e3, "best_ms": measured[best] * 1e3,
            "measured_ms": {_name(c): m * 1e3 for c, m in measured.items()},
        })  # fmt: skip
        took = f"{measured[pick] * 1e3:.2f} vs {measured[best] * 1e3:.2f} ms"
        print(f"{case.name} {rate:.0f}/s: pick {pick} best {best} {took}", flush=True)
    return {"model": case.name, "profile": scaler.describe()["rates"], "top": top, "rows": rows}


def _name(config: tuple[int, ...]) -> str:
    """``workers x threads``, and ``/ lanes`` when a process runs more than one."""
    workers, threads, lanes = config
    return f"{workers} x {threads}" + (f" / {lanes}" if lanes > 1 else "")


def table(result: dict) -> str:
    lines = [
        f"{result['model']}: profile (per query, per second) {result['profile']}",
        "",
        "| load /s | table's pick (workers x threads / lanes) | predicted mean | measured best "
        "| pick measured | best measured | pick / best |",
        "|---:|---|---:|---|---:|---:|---:|",
    ]
    for r in result["rows"]:
        pick, best = _name(r["pick"]), _name(r["best"])
        lines.append(
            f"| {r['rate']:.0f} | {pick} | {r['predicted_ms']:.2f} ms | {best} "
            f"| {r['pick_ms']:.2f} ms | {r['best_ms']:.2f} ms | {r['pick_ms'] / r['best_ms']:.2f} |"
        )
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", choices=sorted(CASES), default=sorted(CASES))
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--loads", type=float, nargs="+", default=[0.1, 0.3, 0.5, 0.7, 0.85])
    p.add_argument("--queries", type=int, default=QUERIES, help="profiled per point")
    p.add_argument("--profile-s", type=float, default=PROFILE_S, help="profiled per point")
    p.add_argument("--out", type=Path, default=OUT)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    results = []
    for name in args.models:
        case = CASES[name]
        model, scaler = profile(case, args.queries, args.profile_s)
        results.append(measure(case, model, scaler, args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out)},
                                    "results": results}, default=list))  # fmt: skip
    for result in results:
        print(table(result), end="\n\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
