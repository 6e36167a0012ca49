"""Every batching policy against ``@serve.batch``'s behaviour, in the simulator (issue 4's
workloads, before the live benchmark).

    python -m bench.policies_sim [--quick] [--jitter SIGMA] [--param KEY=JSON ...]
                                 [--policies NAME ...] [--workloads NAME ...]
                                 [--out bench/out/policies_sim.json]

One replica with a GPU-like batch cost, S_k = 4 ms + 0.5 ms per query (capacity 1,600 queries/s
at batches of 32), SLO 40 ms (about 9x the batch-1 time). Workloads:

- ``mmpp 50-90%``: MMPP(2) at that mean load whose bursts offer 120% of capacity a quarter of
  the time and last SLO/4 (10 ms) on average; the quiet phase makes up the mean.
- ``long bursts 80%``: MMPP(2) whose phases (50 ms on average, longer than the SLO) offer 1.6x
  and 0.4x the mean, so its bursts offer 128% of capacity for longer than any queue can hold
  within the SLO: no scheduler keeps 99% here, the row shows who loses what.
- ``spiky 54%``: Poisson at 50% with 1.8x the rate (90% of capacity) for one second in every
  ten (periodic spikes generated in place).
- ``trace 50%``: the trace with periodic spikes of :mod:`bench.traces` replayed at a mean of 50%,
  a trace minute lasting 2.5 SLOs (100 ms): hourly spikes at about 105-110% of capacity.
- ``poisson 150%``: overload.

Systems: raysrv's ``fixed`` (B 32, T 0), ``aimd``, ``quantile``, ``delayed``, ``deadline`` and
``ctmc``, with their defaults but a largest batch of 32 and the SLO as each query's deadline;
and two models of ``@serve.batch`` (no deadlines, a batch cut whether or not the replica is
free): its defaults (B 10, wait 10 ms) and hand-tuned (B 32, wait 15 ms). Reported
per system: SLO attainment (answered within the SLO / offered), goodput (answers within the SLO
per second), late answers, refusals, p50/p99/p99.9 of answered latency and the mean batch size.

Simulation leaves out everything but batching and queueing (no network, no Python overheads,
deterministic service unless ``--jitter``): it compares policies, it does not predict the live
figures. ``--jitter SIGMA`` multiplies every batch's run time by a lognormal draw of median 1
and log-spread ``SIGMA`` (0.06: runs within about +-12% of S_k 95% of the time), the noise the
policies must plan around without answering late.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.workloads import bursty, replayed, spiky
from raysrv.analytics import MMPP2, Poisson, simulate
from raysrv.batching import FixedParams, FixedPolicy, make_policy
from raysrv.batching.base import BatchingPolicy

__all__ = ["CAPACITY", "SERVICE", "SLO", "Row", "jittered", "main", "workloads"]

SERVICE = 0.004 + 0.0005 * np.arange(1, 65)
CAPACITY = 32 / float(SERVICE[31])  # queries/s at batches of 32
SLO = 0.040
POLICIES = ("fixed", "aimd", "quantile", "delayed", "deadline", "ctmc")


def workloads(quick: bool) -> dict[str, np.ndarray]:
    n = 20_000 if quick else 100_000
    rng = np.random.default_rng(0)
    out = {}
    for load in (0.5, 0.7, 0.8, 0.9):
        out[f"mmpp {load:.0%}"] = bursty(load, CAPACITY, SLO / 4, n, rng)
    m = 0.8 * CAPACITY
    out["long bursts 80%"] = MMPP2(1.6 * m, 0.4 * m, 20.0, 20.0).arrival_times(n, rng)
    out["spiky 54%"] = spiky(0.5 * CAPACITY, 1.8, n, rng)
    out["trace 50%"] = replayed(0.5 * CAPACITY, n / (0.5 * CAPACITY), SLO, rng)
    out["poisson 150%"] = Poisson(1.5 * CAPACITY).arrival_times(n, rng)
    return out


@dataclass(frozen=True)
class Row:
    workload: str
    system: str
    attainment: float
    goodput: float
    late: int
    refused: int
    p50_ms: float
    p99_ms: float
    p999_ms: float
    mean_batch: float
    offered: int = 0
    refusal_p99_ms: float = float("nan")  # how long after arrival the refusals came


def systems(params: dict[str, Any] | None = None) -> dict[str, tuple[BatchingPolicy, bool, bool]]:
    """name -> (policy, deadlines shown to it, batches queue for the replica); ``params`` go
    to the deadline-driven policies (``deadline``, ``ctmc``)."""
    out: dict[str, tuple[BatchingPolicy, bool, bool]] = {}
    for name in POLICIES:
        extra = (params or {}) if name in ("deadline", "ctmc") else {}
        out[name] = (make_policy(name, {"max_batch_size": 32, **extra}, SLO), True, False)
    serve_default = FixedPolicy(FixedParams(max_batch_size=10, timeout_ms=10.0), SLO)
    serve_tuned = FixedPolicy(FixedParams(max_batch_size=32, timeout_ms=15.0), SLO)
    out["@serve.batch default"] = (serve_default, False, True)
    out["@serve.batch tuned"] = (serve_tuned, False, True)
    return out


def run(
    workload: str,
    times: np.ndarray,
    jitter: float = 0.0,
    only: Sequence[str] = (),
    params: dict[str, Any] | None = None,
) -> list[Row]:
    rows = []
    duration = float(times[-1] - times[0])
    for name, (policy, deadlines, queued) in systems(params).items():
        if only and name not in only:
            continue
        result = simulate(
            times,
            jittered(jitter, np.random.default_rng(1)),
            policy,
            replicas=1,
            slo=SLO if deadlines else None,
            queue_batches=queued,
        )
        answered = result.answered
        on_time = int(np.sum(answered <= SLO + 1e-9))
        pct = np.percentile(answered, [50, 99, 99.9]) * 1e3 if answered.size else [np.nan] * 3
        rows.append(
            Row(
                workload,
                name,
                on_time / times.size,
                on_time / duration,
                int(np.sum(answered > SLO + 1e-9)),
                int(result.rejected.sum()),
                float(pct[0]),
                float(pct[1]),
                float(pct[2]),
                float(result.batch_sizes.mean()),
                int(times.size),
                _refusal_p99_ms(result.refused_after),
            )
        )
    return rows


def _refusal_p99_ms(refused_after: np.ndarray) -> float:
    """The p99 of the refusals' time after arrival, in ms (NaN with none kept)."""
    after = refused_after[np.isfinite(refused_after)] if refused_after.size else refused_after
    return float(np.percentile(after, 99) * 1e3) if after.size else float("nan")


def jittered(jitter: float, rng: np.random.Generator) -> np.ndarray | Callable[[int], float]:
    """``SERVICE``, each run times a lognormal draw of log-spread ``jitter`` (none at 0)."""
    if not jitter:
        return SERVICE
    return lambda k: float(SERVICE[k - 1] * rng.lognormal(0.0, jitter))


def table(rows: list[Row]) -> str:
    lines = [
        "| workload | system | within SLO | goodput/s | late | refused | p50 ms | p99 ms "
        "| p99.9 ms | mean batch | refusal p99 ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.workload} | {r.system} | {r.attainment:.2%} | {r.goodput:.0f} "
            f"| {r.late} ({r.late / max(r.offered, 1):.2%}) "
            f"| {r.refused} | {r.p50_ms:.1f} | {r.p99_ms:.1f} | {r.p999_ms:.1f} "
            f"| {r.mean_batch:.1f} | {r.refusal_p99_ms:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="20,000 queries per workload")
    parser.add_argument(
        "--jitter", type=float, default=0.0, help="log-spread of each run's lognormal noise"
    )
    parser.add_argument(
        "--policies", nargs="+", default=(), help="only these systems (default: every one)"
    )
    parser.add_argument(
        "--workloads", nargs="+", default=(), help="only these workloads (default: every one)"
    )
    parser.add_argument(
        "--param",
        action="extend",
        nargs="+",
        default=[],
        metavar="KEY=JSON",
        help="a parameter of deadline and ctmc, e.g. learn_spread=false",
    )
    parser.add_argument("--out", type=Path, default=Path("bench/out/policies_sim.json"))
    args = parser.parse_args(argv)
    params = {k: json.loads(v) for k, v in (p.split("=", 1) for p in args.param)}
    rows: list[Row] = []
    for workload, times in workloads(args.quick).items():
        if args.workloads and workload not in args.workloads:
            continue
        rows += run(workload, times, args.jitter, args.policies, params)
        print(f"  {workload} done", file=sys.stderr, flush=True)
    jitter = f", run times jittered (lognormal, {args.jitter})" if args.jitter else ""
    jitter += f", deadline and ctmc with {params}" if params else ""
    print(f"capacity {CAPACITY:.0f}/s, SLO {SLO * 1e3:.0f} ms{jitter}\n\n{table(rows)}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
