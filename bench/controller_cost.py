"""What a config's ``user_config`` costs Serve's controller while nothing is sent.

The many-model benchmark's shared pool, its one model declared in ``args``, deployed as
``serve deploy`` does (:meth:`bench.many_models.Bench.deploy_declared`) with each of three
ingress ``user_config`` overrides in turn: none, a catalog of the zoo's ``--models`` as one model
set (a glob and a template), and the same models listed one by one. After each, the CPU of
Serve's controller and of raysrv's processes over ``--seconds`` with no traffic (``psutil``),
``--repeats`` times.

    python -m bench.controller_cost [--models 1000] [--seconds 15] [--repeats 2]

Results: bench/RESULTS.md, "What registering them costs".
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import psutil

from bench.many_models import HOT, PASSES, TRIP_BACK, Bench, serve_mode
from bench.validate_live import start_ray

__all__ = ["main"]

PROCESSES = {  # what each measured process's command line holds
    "controller": "ServeController",
    "ingress": "ServeReplica",
    "workers": "_RayWorker",
}
SETTLE_S = 5.0  # after a deployment, before measuring


def _cpu_seconds() -> dict[str, float]:
    """CPU seconds so far of each kind of process, summed over its processes."""
    seconds = dict.fromkeys(PROCESSES, 0.0)
    for process in psutil.process_iter(["cmdline", "cpu_times"]):
        command = " ".join(process.info["cmdline"] or [])
        times = process.info["cpu_times"]
        for kind, marker in PROCESSES.items():
            if marker in command and times is not None:
                seconds[kind] += times.user + times.system
    return seconds


def _cpu_share(seconds: float) -> dict[str, float]:
    """Each kind's CPU over the next ``seconds``, in percent of one core."""
    before = _cpu_seconds()
    time.sleep(seconds)
    after = _cpu_seconds()
    return {kind: 100.0 * (after[kind] - before[kind]) / seconds for kind in PROCESSES}


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    bench = Bench(args)
    start_ray()
    spec = {**bench.raysrv_spec([]), "models": [{**bench.template(bench.names[0]), "name": HOT}]}
    listed = [bench.template(name) for name in bench.names]
    overrides = {
        "none": ({}, 1),
        "catalog, one model set": (
            {"catalog": {"model_sets": [bench.model_set()]}},
            1 + args.models,
        ),
        "catalog, every model listed": ({"catalog": {"models": listed}}, 1 + args.models),
    }
    rows = []
    for repeat in range(args.repeats):
        for label, (user_config, models) in overrides.items():
            await bench.deploy_declared(spec, user_config, models)
            await asyncio.sleep(SETTLE_S)
            share = await asyncio.to_thread(_cpu_share, args.seconds)
            rows.append({"user_config": label, "repeat": repeat, **share})
            shown = ", ".join(f"{kind} {value:.1f}%" for kind, value in share.items())
            print(f"  {label}: {shown}")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    args.passes, args.slo_ms, args.param, args.trip_back = PASSES, 100.0, None, TRIP_BACK
    serve_mode(default_mode=False)
    rows = asyncio.run(run(args))
    print("\n| user_config | " + " | ".join(f"{k}, % of a core" for k in PROCESSES) + " |")
    print("|---|" + "---:|" * len(PROCESSES))
    for row in rows:
        print(f"| {row['user_config']} | " + " | ".join(f"{row[k]:.1f}" for k in PROCESSES) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
