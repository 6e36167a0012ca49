"""What registering many models costs a pool's scheduler, per query of a hot model.

A hot model's goodput with 1,000 models registered in its pool can only differ from the same
model alone by the work the scheduler does per query for the models that are registered but
idle: the workers, the ingress's parsing and the hops are the same. This measures that work
directly, in one process: a stream of queries of one model at ``--rate`` per second through
:func:`raysrv.analytics.simulate_pool` (the scheduler the live pool runs, over simulated
workers with the zoo's run times), with the model alone and with ``--models`` registered,
alternating, ``--repeats`` times each. The time to register the models (a run with no query) is
subtracted. Reported: microseconds of this process per query, medians, and their ratio.

    python -m bench.scheduler_cost

Results: bench/RESULTS.md, "Many models on a shared pool".
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from raysrv.analytics import SimModel, simulate_pool
from raysrv.batching import make_policy

__all__ = ["main", "measure"]

MB = 1 << 20
# the zoo model's batch of 1 / 4 / 16 (bench.zoo, 400 passes), interpolated between
RUN_S = np.interp(np.arange(1, 17), [1, 4, 16], [0.0042, 0.0067, 0.026])


def _models(count: int, slo_s: float) -> dict[str, SimModel]:
    return {
        f"m{i:04d}": SimModel(
            make_policy("deadline", {"max_batch_size": 16}, slo_s),
            RUN_S,
            load_s=0.012,
            weight_bytes=3 * MB,
            group="zoo",
        )
        for i in range(count)
    }


def _seconds(count: int, times: np.ndarray, slo_s: float) -> float:
    models = _models(count, slo_s)
    names = ["m0000"] * times.size
    start = time.perf_counter()
    simulate_pool(times, names, models, workers=2, capacity_bytes=75 * MB, depth=2, slo=slo_s)
    return time.perf_counter() - start


def measure(models: int, rate: float, queries: int, repeats: int) -> dict[int, list[float]]:
    """Microseconds per query of each run, for 1 and ``models`` models registered."""
    rng = np.random.default_rng(5)
    times = np.cumsum(rng.exponential(1.0 / rate, queries))
    none = np.empty(0)
    per_query: dict[int, list[float]] = {1: [], models: []}
    for _ in range(repeats):
        for count in per_query:
            spent = _seconds(count, times, 0.1) - _seconds(count, none, 0.1)
            per_query[count].append(spent / queries * 1e6)
    return per_query


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=300.0)
    parser.add_argument("--queries", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    per_query = measure(args.models, args.rate, args.queries, args.repeats)
    print(f"| models registered | us per query, median of {args.repeats} | each run |")
    print("|---|---:|---|")
    for count, runs in per_query.items():
        shown = ", ".join(f"{v:.1f}" for v in runs)
        print(f"| {count} | {statistics.median(runs):.1f} | {shown} |")
    alone, many = (statistics.median(runs) for runs in per_query.values())
    print(f"\nratio {many / alone:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
