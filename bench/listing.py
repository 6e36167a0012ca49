"""What listing every model (``GET /v1/models``) costs the queries being served.

A dashboard polls ``GET /v1/models``; with a thousand models registered the ingress describes
and renders every one of them each time. This deploys :mod:`bench.many_models`'s shared pool
with ``--models`` registered, then runs a closed loop of 8 on one model for ``--seconds``,
``--repeats`` times with a watcher listing the models (the handle's ``models()``) every
``--every`` seconds and as often without, alternating in one deployment (each first in turn).
Reported: answers within the SLO per second and refusals per loop, their medians and the
ratio of the medians, how long a listing took, and what describing the models costs the
ingress's CPU (the same spec's server in this process, on in-process workers, no traffic).

    python -m bench.listing [--models 1000] [--every 1] [--seconds 20] [--repeats 4]

Results: bench/RESULTS_ARCHIVE.md, "listing the models while serving, as summarized on c14's day".
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.loadgen import HandleClient, closed_loop
from bench.many_models import (
    PASSES,
    TRIP_BACK,
    Bench,
    TallyClient,
    goodput_of,
    serve_mode,
    timed_closed_loop,
)
from bench.validate_live import start_ray

__all__ = ["main"]

WARM_S = 5.0  # of the loop before the first measured one
CONCURRENCY = 8  # in flight on the model, as in the results recorded


async def _watch(handle: Any, every: float, took: list[float]) -> None:
    """The models listed every ``every`` seconds; each listing's milliseconds into ``took``."""
    while True:
        start = time.perf_counter()
        await handle.models.remote()
        took.append((time.perf_counter() - start) * 1000.0)
        await asyncio.sleep(every)


async def describe_cost(spec: dict[str, Any], times: int = 5) -> float:
    """Median milliseconds of ``Server.describe_models`` over the models of ``spec``."""
    from raysrv._server import Server
    from raysrv.config import RaysrvSpec
    from raysrv.testing import LocalWorkers

    full = RaysrvSpec.model_validate(spec).expanded(Path.cwd())
    server = Server(full, {p.name: LocalWorkers(p.workers) for p in full.resolved_pools()})
    took = []
    for _ in range(times):
        start = time.perf_counter()
        await server.describe_models()
        took.append((time.perf_counter() - start) * 1000.0)
    return statistics.median(took)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    bench = Bench(args)
    describe_ms = await describe_cost(bench.raysrv_spec())
    print(f"describing the {args.models} models: {describe_ms:.1f} ms (median, in this process)")
    start_ray()
    handle = bench.deploy("raysrv", bench.raysrv_spec())
    pairs = bench.pairs(np.zeros(200_000, dtype=int))  # the most popular model only
    warm = HandleClient(bench.call("raysrv", handle, args.slo_ms), pairs)
    await closed_loop(warm, CONCURRENCY, WARM_S)
    rows: dict[bool, list[dict[str, Any]]] = collections.defaultdict(list)
    for repeat in range(args.repeats):
        for polled in (False, True) if repeat % 2 == 0 else (True, False):
            took: list[float] = []
            watcher = asyncio.create_task(_watch(handle, args.every, took)) if polled else None
            client = TallyClient(bench.call("raysrv", handle, args.slo_ms), pairs)
            log = await timed_closed_loop(client, args.seconds, CONCURRENCY)
            if watcher is not None:
                watcher.cancel()
            row = {
                "goodput": goodput_of(log, bench.slo_s),
                "refused": int(np.sum(np.asarray(log.status) == 429)),
                "listing_ms": statistics.median(took) if took else None,
            }
            rows[polled].append(row)
            print(f"  {'listed' if polled else 'not listed'}: {row}", flush=True)
    return {
        "args": vars(args),
        "describe_ms": describe_ms,
        "rows": {str(k): v for k, v in rows.items()},
    }


def table(rows: dict[str, list[dict[str, Any]]], every: float) -> str:
    quiet = statistics.median(r["goodput"] for r in rows["False"])
    lines = [
        "| models listed | goodput/s, median | each loop | refused, each loop | listing ms, median "
        "| median / not listed |",
        "|---|---:|---|---|---:|---:|",
    ]
    for key, label in (("False", "never"), ("True", f"every {every:g} s")):
        loops = rows[key]
        goodput = statistics.median(r["goodput"] for r in loops)
        listing = [r["listing_ms"] for r in loops if r["listing_ms"] is not None]
        each = ", ".join(f"{r['goodput']:.1f}" for r in loops)
        refused = ", ".join(str(r["refused"]) for r in loops)
        took = f"{statistics.median(listing):.0f}" if listing else ""
        lines.append(
            f"| {label} | {goodput:.1f} | {each} | {refused} | {took} | {goodput / quiet:.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=1000)
    parser.add_argument("--every", type=float, default=1.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--slo-ms", type=float, default=100.0)
    args = parser.parse_args(argv)
    args.passes, args.trip_back, args.param = PASSES, TRIP_BACK, None
    serve_mode(default_mode=False)
    result = asyncio.run(run(args))
    print(table(result["rows"], args.every))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
