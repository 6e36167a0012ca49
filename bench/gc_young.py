"""What the serving processes' threshold for the collector's young generation buys on Serve's
fast path, raysrv and plain Serve alike.

    python -m bench.gc_young [--young 700 20000] [--sessions 4] [--seconds 10]

``--sessions`` Ray sessions one after another, each in a process of its own, their thresholds
taken in turn from ``--young`` (700 is CPython's own). A session starts Ray with
``RAYSRV_GC_YOUNG_OBJECTS`` set, which every raysrv process and the baseline's replicas read
(:mod:`raysrv._heap`), deploys ``bench.fast_path``'s baseline (plain Serve ``@serve.batch``)
and raysrv with the model in its ingress (``placement: auto``, which puts it there), one
replica each, and measures each at saturation twice, in alternating order: ``wrk`` with 32
connections, one JSON input a request, every input distinct, ``--seconds`` a point. Prints
every point, then per threshold each system's median inputs per second and raysrv's ratio to
the baseline.

Results: bench/RESULTS.md, "The fast path".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
from typing import Any

from bench import fast_path
from bench.loadgen import make_inputs, wrk_saturation
from raysrv._heap import YOUNG_ENV

__all__ = ["main", "summary"]

SYSTEMS = ("baseline", "raysrv-colocated")
CONNECTIONS = 32
POINTS = 2  # per system and session
WARM_S = 3.0  # each system's unmeasured load before the first point


async def _points(port: int, seconds: float) -> list[dict[str, Any]]:
    bodies = fast_path.bodies(make_inputs(2048, (64,), seed=1), 1)
    urls = {
        "baseline": f"http://{fast_path.HOST}:{port}/baseline",
        "raysrv-colocated": f"http://{fast_path.HOST}:{port}/raysrv-colocated/v1/"
        f"{fast_path.APP}/predict",
    }
    for url in urls.values():
        await wrk_saturation(url, bodies, CONNECTIONS, WARM_S)
    points = []
    for k in range(POINTS):
        for system in SYSTEMS if k % 2 == 0 else SYSTEMS[::-1]:
            result = await wrk_saturation(
                urls[system], bodies, CONNECTIONS, seconds, count=fast_path.OUTPUT
            )
            rate = result.extra["counted"] / result.duration_s
            points.append({"system": system, "inputs_per_s": rate, "errors": result.errors})
    return points


def _session(seconds: float) -> list[dict[str, Any]]:
    """One session's points, in this process (its environment already holds the threshold)."""
    port, _ = fast_path.start(False, systems=("raysrv-colocated",))
    try:
        return asyncio.run(_points(port, seconds))
    finally:
        import ray

        ray.shutdown()


def summary(points: list[dict[str, Any]]) -> dict[int, dict[str, float]]:
    """Per threshold, each system's median inputs per second and raysrv's ratio to the
    baseline's (``ratio``)."""
    out: dict[int, dict[str, float]] = {}
    for young in sorted({p["young"] for p in points}):
        medians = {
            system: statistics.median(
                p["inputs_per_s"] for p in points if p["young"] == young and p["system"] == system
            )
            for system in SYSTEMS
        }
        out[young] = {**medians, "ratio": medians["raysrv-colocated"] / medians["baseline"]}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--young", type=int, nargs="+", default=[700, 20_000])
    parser.add_argument("--sessions", type=int, default=4, help="taking --young in turn")
    parser.add_argument("--seconds", type=float, default=10.0, help="per point")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a session
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(_session(args.seconds)))
        return 0
    points = []
    for k in range(args.sessions):
        young = args.young[k % len(args.young)]
        command = [sys.executable, "-m", "bench.gc_young", "--one", "--seconds", str(args.seconds)]
        env = {**os.environ, YOUNG_ENV: str(young)}
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"session {k} failed:\n{done.stderr[-2000:]}")
        for point in json.loads(done.stdout.strip().splitlines()[-1]):
            points.append({"session": k, "young": young, **point})
            print(
                f"session {k}, young objects {young:6d}: {point['system']:17s} "
                f"{point['inputs_per_s']:7.0f} inputs/s, errors {point['errors']}",
                flush=True,
            )
    for young, row in summary(points).items():
        print(
            f"young objects {young:6d}: baseline {row['baseline']:7.0f}, raysrv colocated "
            f"{row['raysrv-colocated']:7.0f} inputs/s (medians), ratio {row['ratio']:.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
