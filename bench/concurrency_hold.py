"""raysrv's batches held for the ingress's concurrency against batches cut as the model frees,
and plain Serve ``@serve.batch`` beside them, from one client to 32.

    python -m bench.concurrency_hold [--connections 1 2 4 8 16 32] [--rounds 2]
                                     [--seconds 6] [--policy fixed] [--out JSON]

:mod:`bench.fast_path`'s Ray (Serve's fast path), its baseline (``@serve.batch(32, 1 ms)``)
and raysrv with the digits MLP in its ingress (``colocated``) twice: as ``bench.fast_path``
serves it (``raysrv-held``: ``fixed`` with ``busy_timeout_ms`` 8,
:data:`bench.fast_path.BATCHING`), and the same with ``busy_timeout_ms`` 0 (``raysrv-unheld``:
a batch cut whenever the model frees). ``--policy deadline``: both batched by ``deadline``
instead, with the same largest batch and hold, within the model's SLO. For each number of
connections, each system in turn, in an order that alternates from round to round: ``wrk``
with that many connections, one JSON input a request, every input distinct, on raysrv's model
route (``/v1/models/mlp/predict``).
Prints, per number of connections and system, the medians over the rounds of the inputs
answered per second, the p50 and p99 latency, and for raysrv the mean batch, read from its
pool's timeline.

Results: bench/RESULTS.md, "The fast path".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench import fast_path
from bench.ingress_floor import pool_mean_batch
from bench.loadgen import make_inputs, wrk_saturation

__all__ = ["main", "summary", "table"]

SYSTEMS = ("baseline", "raysrv-held", "raysrv-unheld")
APPS = {"raysrv-held": "raysrv-colocated", "raysrv-unheld": "raysrv-unheld"}  # Serve's names
CONNECTIONS = (1, 2, 4, 8, 16, 32)
FIELDS = ("inputs_per_s", "p50_ms", "p99_ms", "mean_batch")


def _deploy(path: Path, system: str, policy: str) -> None:
    """raysrv's ``system`` with its model batched by ``policy``: :data:`fast_path.BATCHING`'s
    batch size and hold (none for ``raysrv-unheld``), and for ``fixed`` its timeout."""
    from ray import serve
    from ray.serve.schema import LoggingConfig

    from raysrv.app import build_app

    raw = fast_path.spec(path, "colocated")
    params = {**fast_path.BATCHING}
    if system == "raysrv-unheld":
        params["busy_timeout_ms"] = 0
    if policy != "fixed":
        del params["timeout_ms"]
    raw["models"][0]["batching"] = {"policy": policy, "params": params}
    quiet = LoggingConfig(enable_access_log=False, log_level="WARNING")
    name = APPS[system]
    serve.run(build_app(raw), name=name, route_prefix=f"/{name}", logging_config=quiet)


async def _points(
    port: int, connections: list[int], rounds: int, seconds: float
) -> list[dict[str, Any]]:
    bodies = fast_path.bodies(make_inputs(2048, (64,), seed=1), 1)
    base = f"http://{fast_path.HOST}:{port}"
    urls = {"baseline": f"{base}/baseline"}
    urls |= {system: f"{base}/{app}/v1/models/mlp/predict" for system, app in APPS.items()}
    for url in urls.values():
        await wrk_saturation(url, bodies, max(connections), 3.0)
    points = []
    for k in range(rounds):
        for n in connections:
            for system in SYSTEMS if k % 2 == 0 else SYSTEMS[::-1]:
                since = time.time()
                result = await wrk_saturation(
                    urls[system], bodies, n, seconds, count=fast_path.OUTPUT
                )
                batch = math.nan
                if system in APPS:
                    batch = await pool_mean_batch(f"{base}/{APPS[system]}", since)
                point = {
                    "round": k,
                    "connections": n,
                    "system": system,
                    "inputs_per_s": result.extra["counted"] / result.duration_s,
                    "p50_ms": result.p50_ms,
                    "p99_ms": result.p99_ms,
                    "errors": result.rejected + result.errors,
                    "mean_batch": batch,
                }
                print(
                    f"  round {k} {n:2d} connections {system:<13} "
                    f"{point['inputs_per_s']:7.0f} inputs/s  p50 {result.p50_ms:6.2f} ms  "
                    f"p99 {result.p99_ms:6.2f} ms  mean batch {batch:.1f}  "
                    f"errors {point['errors']}",
                    file=sys.stderr,
                    flush=True,
                )
                points.append(point)
    return points


def summary(points: list[dict[str, Any]]) -> dict[tuple[int, str], dict[str, float]]:
    """Per (connections, system), the medians of :data:`FIELDS` over the rounds."""
    out = {}
    for key in sorted({(p["connections"], p["system"]) for p in points}):
        mine = [p for p in points if (p["connections"], p["system"]) == key]
        out[key] = {field: statistics.median(p[field] for p in mine) for field in FIELDS}
    return out


def table(points: list[dict[str, Any]]) -> str:
    """:func:`summary` as a markdown table, each system's inputs/s also over the baseline's at
    the same number of connections."""
    lines = [
        "| connections | system | inputs/s | over the baseline | p50 ms | p99 ms | mean batch |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    rows = summary(points)
    for (n, system), row in rows.items():
        ratio = row["inputs_per_s"] / rows[(n, "baseline")]["inputs_per_s"]
        batch = "" if math.isnan(row["mean_batch"]) else f"{row['mean_batch']:.1f}"
        lines.append(
            f"| {n} | {system} | {row['inputs_per_s']:,.0f} | {ratio:.2f}x | "
            f"{row['p50_ms']:.2f} | {row['p99_ms']:.2f} | {batch} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, nargs="+", default=list(CONNECTIONS))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=6.0, help="per point")
    parser.add_argument(
        "--policy", choices=("fixed", "deadline"), default="fixed", help="raysrv's batching"
    )
    parser.add_argument("--out", type=Path, help="every point, as JSON")
    args = parser.parse_args(argv)
    if min(args.connections) < 1:
        parser.error(f"--connections must be at least 1, got {min(args.connections)}")
    port, path = fast_path.start(False, systems=())
    try:
        for system in APPS:
            _deploy(path, system, args.policy)
        points = asyncio.run(_points(port, args.connections, args.rounds, args.seconds))
    finally:
        import ray

        ray.shutdown()  # a local cluster: its Serve goes with it
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(points, indent=1))
    print(table(points))
    return 0


if __name__ == "__main__":
    sys.exit(main())
