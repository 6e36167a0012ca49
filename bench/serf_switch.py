"""Does a live switch of SERF's configuration lose or delay a query? A model under ``policy:
serf`` on Ray, its load stepping between a level its table serves with one configuration and a
level it serves with another, over HTTP; every answer, and every switch, recorded.

    python -m bench.serf_switch [--low 50] [--high 120] [--step-s 20] [--cycles 4]
        [--slo-ms 100] [--systems serf fixed] [--out JSON]

The model is an **emulated accelerator** (:class:`raysrv.testing.CurveModel`: a query takes
``BASE_S`` on one thread, two threads 1.5x faster, each other query running at once in its
process costs 15%) on 4 notional cores, its workers Ray actors, ``threads`` 1, 2 or 4 and
``lanes`` 1 or 2, between 1 and 4 workers. Its table (profiled live as it starts) serves the
low level with one worker of four threads and the high one with two workers of two threads
(in one process or two, as the profile finds them alike). ``fixed`` is the control: the same
arrivals on the low level's configuration (one worker of four threads), never switched. A
query that fails near a switch under ``serf`` but not near the same moment under ``fixed``
failed because of the switch; one that fails under both, because the load came near what the
old configuration serves.

Poisson arrivals at ``--low`` and ``--high`` queries/s in turn, ``--step-s`` each, ``--cycles``
times, after a 3 s warm-up and 12 s of rest; requests through Serve's HAProxy ingress, each
with its SLO and ``sent_at``. The pool is read every ``SAMPLE_S`` on both systems (a reading
costs the ingress some work, which the control should pay too): a switch runs from the first
sample that shows it under way to the first that shows the new configuration in force with
nothing draining. Reported for each system: answers within the SLO, late, refused (429/503),
dropped at the deadline (504) and failed or unanswered, in all and among the queries
scheduled from ``SAMPLE_S`` before one of ``serf``'s switches to ``AFTER_S`` after it ends.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from ray import serve

from bench.loadgen import REJECTED, replay
from bench.overload import TimedClient, raysrv_body, start

BASE_S = 0.01
SAMPLE_S = 0.25
AFTER_S = 3.0
# the high level times 1 + HEADROOM falls in the table's rows of two workers, while the old
# configuration serves the high level at about two thirds of what it can
HEADROOM = 0.3
SHOWN = ("in_service", "threads", "lanes", "switching_to", "draining", "starting")


def spec(slo_ms: float, system: str) -> dict[str, Any]:
    model: dict[str, Any] = {
        "name": "curve",
        "runtime": "python",
        "source": "raysrv.testing:CurveModel",
        "init_kwargs": {"base_s": BASE_S, "scaling": 0.6, "interference": 0.15},
        "batching": {"policy": "fixed", "params": {"max_batch_size": 1}},
        "slo_ms": slo_ms,
        "input": {"shape": [4], "dtype": "float32"},
        "resources": {"num_cpus": 0.1, "threads": 4 if system == "fixed" else 1},
        "autoscaling": None if system == "fixed" else {
            "policy": "serf", "min": 1, "max": 4, "threads": [1, 2, 4], "lanes": [1, 2],
            "cores": 4, "every_s": 0.5, "window_s": 5.0, "up_after_s": 0.0,
            "down_after_s": 5.0, "headroom": HEADROOM,
        },
    }  # fmt: skip
    return {
        "models": [model],
        "apps": [{"name": "curve", "models": ["curve"], "cache_size": 0}],
        "ingress": {"num_cpus": 0.1},
    }


def arrivals(args: argparse.Namespace, rng: np.random.Generator) -> np.ndarray:
    """Poisson arrivals, ``--low`` then ``--high`` queries/s for ``--step-s`` each, in turn."""
    out, start_s = [], 0.0
    for rate in [args.low, args.high] * args.cycles:
        gaps = rng.exponential(1.0 / rate, int(rate * args.step_s * 1.5) + 10)
        times = start_s + np.cumsum(gaps)
        out.append(times[times < start_s + args.step_s])
        start_s += args.step_s
    return np.concatenate(out)


async def _sample(base: str, out: list[dict[str, Any]]) -> None:
    """Samples of the pool's scaler, each at ``time.perf_counter()``."""
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.get(f"{base}/curve/v1/pools") as response:
                    (pool,) = [p for p in (await response.json())["pools"] if p["name"] == "curve"]
                scaling = pool.get("autoscaling")  # none on ``fixed``, read all the same
                shown = {k: scaling[k] for k in SHOWN} if scaling else {}
                out.append({"t": time.perf_counter(), **shown})
            except Exception as exc:  # a sample missed is not a run lost
                print(f"sampling failed: {exc}", file=sys.stderr)
            await asyncio.sleep(SAMPLE_S)


def switches(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each switch: when it was first seen under way, when the new configuration was in force
    with nothing draining, and the configurations before and after."""
    out: list[dict[str, Any]] = []
    opened: dict[str, Any] | None = None
    shape = None
    for s in samples:
        now = (s["threads"], s["lanes"])
        if opened is None and (s["switching_to"] is not None or (shape and now != shape)):
            opened = {"from": list(shape or now), "opens": s["t"]}
        if opened is not None and s["switching_to"] is None and not s["draining"]:
            out.append(opened | {"to": list(now), "workers": s["in_service"], "ends": s["t"]})
            opened = None
        shape = now
    return out


def summarize(log: dict[str, list[Any]], found: list[dict[str, Any]], slo_s: float) -> dict:
    """The figures of one system's ``log``, near the switches ``found`` and in all."""
    scheduled = np.asarray(log["scheduled"])
    latency = np.asarray(log["latency"])
    status = np.asarray(log["status"])
    answered = status == 200
    outcomes = {
        "late": answered & (latency > slo_s),
        "refused": np.isin(status, list(REJECTED)),
        "dropped": status == 504,
        "failed": ~answered & ~np.isin(status, [*REJECTED, 504]),
    }
    near = np.zeros(scheduled.size, dtype=bool)
    for s in found:
        near |= (scheduled >= s["opens"] - SAMPLE_S) & (scheduled < s["ends"] + AFTER_S)
    return {
        "offered": int(status.size),
        "within_slo": float((answered & ~outcomes["late"]).sum() / status.size),
        **{k: int(v.sum()) for k, v in outcomes.items()},
        "near_switches": int(near.sum()),
        **{f"{k}_near_switches": int((v & near).sum()) for k, v in outcomes.items()},
        "p99_ms": float(np.percentile(latency[answered], 99) * 1e3),
        "statuses": dict(collections.Counter(str(s) for s in status.tolist())),
    }


async def run(system: str, port: int, args: argparse.Namespace) -> dict[str, Any]:
    """One system on the stepped load: its requests' log, the pool's samples, its plan and
    timeline, and the reasons its errors gave."""
    from ray.serve.schema import LoggingConfig

    from bench.loadgen import closed_loop
    from raysrv.app import build_app

    quiet = LoggingConfig(enable_access_log=False, log_level="WARNING")
    serve.run(build_app(spec(args.slo_ms, system)), name="curve", route_prefix="/curve",
              logging_config=quiet)  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    inputs = np.random.default_rng(5).integers(0, 100, size=(4096, 4)).astype(float).tolist()
    offsets = arrivals(args, np.random.default_rng(11))
    async with TimedClient(f"{base}/curve/v1/curve/predict", inputs, args.slo_ms,
                           body=raysrv_body(args.slo_ms)) as client:  # fmt: skip
        await closed_loop(client, 2, 3.0)
        await asyncio.sleep(12.0)  # out of the scaler's window: at rest on the low configuration
        samples: list[dict[str, Any]] = []
        sampler = asyncio.create_task(_sample(base, samples))
        try:
            log = await replay(client, offsets)
        finally:
            sampler.cancel()
        for sample in samples:  # on the log's clock
            sample["t"] -= log.start
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{base}/curve/v1/models/curve/plan") as response:
            plan = (await response.json()).get("configurations")
        async with session.get(f"{base}/curve/v1/pools/curve/timeline") as response:
            timeline = await response.json()
    serve.delete("curve")
    scheduled = np.asarray(log.scheduled)
    return {
        "system": system,
        "log": {"scheduled": log.scheduled, "status": log.status,
                "latency": (np.asarray(log.done) - scheduled).tolist()},
        "samples": samples,
        "errors": collections.Counter(reason for reason, *_ in client.errors),
        "plan": plan,
        "timeline": timeline,
    }  # fmt: skip


def report(figures: list[dict[str, Any]], found: list[dict[str, Any]]) -> str:
    lines = [
        "| system | offered | within SLO | late | refused | dropped | failed | p99 ms | near a "
        "switch: queries | late | refused | dropped | failed |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in figures:
        lines.append(
            f"| {r['system']} | {r['offered']:,} | {r['within_slo']:.2%} | {r['late']} | "
            f"{r['refused']} | {r['dropped']} | {r['failed']} | {r['p99_ms']:.1f} | "
            f"{r['near_switches']:,} | {r['late_near_switches']} | "
            f"{r['refused_near_switches']} | {r['dropped_near_switches']} | "
            f"{r['failed_near_switches']} |"
        )
    lines += [
        "",
        "| switch | from (threads, lanes) | to | workers after | seconds |",
        "|---:|---|---|---:|---:|",
    ]
    for i, s in enumerate(found, 1):
        lines.append(
            f"| {i} | {tuple(s['from'])} | {tuple(s['to'])} | {s['workers']} | "
            f"{s['ends'] - s['opens']:.2f} |"
        )
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--low", type=float, default=50.0, help="queries/s")
    p.add_argument("--high", type=float, default=120.0, help="queries/s")
    p.add_argument("--step-s", type=float, default=20.0)
    p.add_argument("--cycles", type=int, default=4)
    p.add_argument("--slo-ms", type=float, default=100.0)
    p.add_argument("--systems", nargs="+", choices=("serf", "fixed"), default=["serf", "fixed"])
    p.add_argument("--out", type=Path, default=Path("bench/out/serf_switch.json"))
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    port = start(serve_proxy=False)
    runs = [asyncio.run(run(system, port, args)) for system in args.systems]
    found = switches(next((r["samples"] for r in runs if r["system"] == "serf"), []))
    for r in runs:  # what the figures need, not how ``fixed`` was read
        r["samples"] = [s for s in r["samples"] if len(s) > 1]
    figures = [
        {"system": r["system"], **summarize(r["log"], found, args.slo_ms / 1000.0)} for r in runs
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    kept = {"args": vars(args) | {"out": str(args.out)}, "switches": found, "figures": figures}
    args.out.write_text(json.dumps(kept | {"runs": runs}))
    print(report(figures, found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
