"""Every batching policy and ``@serve.batch``, live, on bursty and overload workloads (issue 4).

    python -m bench.policies_live [--quick] [--out bench/out/policies_live.json]

The benchmark convnet (:mod:`bench.models`) on one replica (one CPU, one onnxruntime thread),
in a local Ray, driven through Serve handles from this process. First the capacity: after a
2 s warm-up, a closed loop of 32 in flight against raysrv's ``fixed`` policy. Then, per
workload and system, the same arrival times and inputs: MMPP(2) at 50% and 80% of that
capacity with 50 ms phases at 1.6x and 0.4x the mean, and Poisson at 150%. The SLO is
``--slo-ms`` (default 40 ms); raysrv gets it with every query (``slo_ms``, and ``sent_at`` so
that it starts when the query is sent), ``@serve.batch`` cannot take one.

Reported per point, from the client's side (latency from each query's scheduled arrival):
queries within the SLO over queries offered, goodput (answers within the SLO per second), late
answers, refusals (429/503), errors, p50/p99/p99.9 of answered latency.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.loadgen import HandleClient, RequestLog, closed_loop, make_inputs, replay
from bench.models import DEFAULT_PATH, INPUT_SHAPE, build_convnet
from bench.validate_live import deploy_spec, start_ray
from raysrv.analytics import MMPP2, Poisson

__all__ = ["Point", "main"]

APP = "bench"
SYSTEMS = ("fixed", "aimd", "deadline", "ctmc", "@serve.batch default", "@serve.batch tuned")


@dataclass(frozen=True)
class Point:
    workload: str
    system: str
    offered: int
    within_slo: float
    goodput: float
    late: int
    refused: int
    errors: int
    p50_ms: float
    p99_ms: float
    p999_ms: float


def deploy(system: str, path: Path, slo_ms: float) -> Any:
    """Deploy one system as the app "live"; return a call ``x -> response``."""
    from ray import serve

    from bench.baseline import build_baseline

    if system.startswith("@serve.batch"):
        batch, wait = (10, 0.01) if system.endswith("default") else (16, 0.005)
        serve.run(build_baseline(str(path), INPUT_SHAPE, batch, wait), name="live")
        handle = serve.get_app_handle("live")
        return handle.predict.remote
    params: dict[str, Any] = {"max_batch_size": 16}
    handle = deploy_spec(path, system, params, slo_ms, name="live")
    return lambda x: handle.predict.remote(APP, x, slo_ms=slo_ms, sent_at=time.time())


def point(workload: str, system: str, log: RequestLog, slo_s: float) -> Point:
    status = np.asarray(log.status)
    latency = np.asarray(log.done) - np.asarray(log.scheduled)
    ok = status == 200
    within = ok & (latency <= slo_s)
    span = float(np.max(log.done)) if log.done else 1.0
    pct = np.percentile(latency[ok], [50, 99, 99.9]) * 1e3 if ok.any() else [np.nan] * 3
    return Point(
        workload,
        system,
        int(status.size),
        float(within.mean()),
        float(within.sum() / span),
        int((ok & ~within).sum()),
        int(np.isin(status, [429, 503]).sum()),
        int((~ok & ~np.isin(status, [429, 503])).sum()),
        float(pct[0]),
        float(pct[1]),
        float(pct[2]),
    )


def workloads(capacity: float, seconds: float) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    out = {}
    for load in (0.5, 0.8):
        m = load * capacity
        times = MMPP2(1.6 * m, 0.4 * m, 20.0, 20.0).arrival_times(int(m * seconds * 1.2), rng)
        out[f"mmpp {load:.0%}"] = times[times < seconds]
    times = Poisson(1.5 * capacity).arrival_times(int(1.5 * capacity * seconds * 1.2), rng)
    out["poisson 150%"] = times[times < seconds]
    return out


def table(points: list[Point]) -> str:
    lines = [
        "| workload | system | offered | within SLO | goodput/s | late | refused | errors "
        "| p50 ms | p99 ms | p99.9 ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in points:
        lines.append(
            f"| {p.workload} | {p.system} | {p.offered} | {p.within_slo:.2%} | {p.goodput:.0f} "
            f"| {p.late} | {p.refused} | {p.errors} | {p.p50_ms:.1f} | {p.p99_ms:.1f} "
            f"| {p.p999_ms:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="6 s per point instead of 20")
    parser.add_argument("--slo-ms", type=float, default=40.0)
    parser.add_argument("--out", type=Path, default=Path("bench/out/policies_live.json"))
    args = parser.parse_args(argv)
    from ray import serve

    path = build_convnet(DEFAULT_PATH)
    inputs = make_inputs(256, INPUT_SHAPE, seed=0)
    seconds = 6.0 if args.quick else 20.0
    start_ray()
    try:
        call = deploy("fixed", path, args.slo_ms)
        asyncio.run(closed_loop(HandleClient(call, inputs), 32, 2.0))  # warm-up, discarded
        saturated = asyncio.run(closed_loop(HandleClient(call, inputs), 32, seconds))
        capacity = saturated.throughput_rps
        print(f"capacity {capacity:.0f}/s (closed loop, 32 in flight)", file=sys.stderr)
        points = []
        for name, times in workloads(capacity, seconds).items():
            for system in SYSTEMS:
                call = deploy(system, path, args.slo_ms)
                log = asyncio.run(replay(HandleClient(call, inputs), times))
                points.append(point(name, system, log, args.slo_ms / 1000.0))
                print(f"  {name} {system} done", file=sys.stderr, flush=True)
    finally:
        serve.shutdown()
    print(f"capacity {capacity:.0f}/s, SLO {args.slo_ms:g} ms\n\n{table(points)}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {"capacity": capacity, "slo_ms": args.slo_ms, "points": [asdict(p) for p in points]}
    args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
