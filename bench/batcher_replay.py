"""The live benchmark's workloads through raysrv's own ingress core, in this process (issue 4).

    python -m bench.batcher_replay [--capacity 39.3] [--seconds 60] [--runs 3]
        [--systems deadline ctmc] [--workloads "mmpp 80%"] [--pipeline-depth 2]
        [--param schedule_ahead_ms=5 ...] [--sigma 0.05]

What :mod:`bench.policies_live` replays through Ray Serve, replayed here through the real ``Server``
and its pool's scheduler with one sleeping worker instead of the model: no Ray, no hops, no trip
back, so what is left is the scheduling loop and the policy. The arrivals are those of
``bench.workloads.workloads(capacity, slo, seconds)``: given the capacity a live run measured
for a workload, that workload's very arrival times. A batch of k sleeps the run time measured live
for k (interpolated between ``--run-ms`` sizes) times a lognormal factor of ``--sigma``, one batch
at a time. Each point reports queries answered within the SLO, refused and dropped at the deadline,
per run, for policies with batches of at most ``--run-ms``'s largest size (10 by default, as the
live benchmark since its run 8). Beside each, the simulator's figure for the same policy, arrivals
and run-time model (:func:`raysrv.analytics.simulate`, same seed): what the policy alone does on
that trace, with no batching loop around it. One 60 s point takes a minute of wall-clock time; a run
is noisy by a few queries (event-loop timing).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.workloads import workloads
from raysrv._server import Server
from raysrv.analytics import simulate
from raysrv.batching import BatchingPolicy, make_policy
from raysrv.config import RaysrvSpec
from raysrv.errors import RaysrvError
from raysrv.testing import LocalWorkers, model_spec, spec

__all__ = ["Setup", "main", "replay_point", "simulated"]

# p50 per batch size of a live `deadline` point (bench/RESULTS_ARCHIVE.md, "Run times that fall with
# the batch size")
RUN_MS = "1:96,2:118,3:120,4:137,5:148,6:157,7:184,8:204,9:190,10:183"


def run_times(table: str) -> dict[int, float]:
    """Seconds per batch size from ``"size:ms,..."``, from 1 to the largest size given, linear
    in between."""
    pairs = sorted(
        (int(k), float(v) / 1000.0) for k, v in (kv.split(":") for kv in table.split(","))
    )
    sizes, seconds = zip(*pairs, strict=True)
    return {k: float(np.interp(k, sizes, seconds)) for k in range(1, sizes[-1] + 1)}


@dataclass(frozen=True)
class Setup:
    """One policy on one sleeping replica: what both the replay and the simulator are given."""

    policy: str
    params: dict[str, Any]
    slo_s: float
    run_s: dict[int, float]
    sigma: float

    def make(self) -> BatchingPolicy:
        return make_policy(self.policy, self.batching()["params"], self.slo_s)

    def batching(self) -> dict[str, Any]:
        largest = max(self.run_s)
        return {"policy": self.policy, "params": {"max_batch_size": largest, **self.params}}

    def run_time(self, size: int, noise: np.random.Generator) -> float:
        """Seconds a batch of ``size`` runs: the measured time, times lognormal noise."""
        return self.run_s[size] * float(noise.lognormal(0.0, self.sigma))


async def replay_point(times: np.ndarray, setup: Setup, depth: int, seed: int) -> dict[str, int]:
    """Replay ``times`` through a Server with the setup's policy; counts of each outcome."""
    slo_s = setup.slo_s
    model = model_spec("m", batching=setup.batching(), slo_ms=slo_s * 1000.0, pipeline_depth=depth)
    app = {"name": "a", "models": ["m"], "cache_size": 0}  # every query reaches the batcher
    parsed = RaysrvSpec.model_validate(spec([model], [app]))
    noise = np.random.default_rng(seed)

    async def run(inputs: np.ndarray) -> tuple[list[Any], float]:
        seconds = setup.run_time(len(inputs), noise)
        await asyncio.sleep(seconds)
        return [0] * len(inputs), seconds

    server = Server(parsed, {"m": LocalWorkers(1, run=run)})
    x = np.zeros(4, dtype=np.float32)

    async def one(arrival: float, t0: float) -> str:
        try:
            await server.predict("a", x)
        except RaysrvError as error:
            return "refused" if error.status in (429, 503) else "expired"
        return "within" if time.monotonic() - t0 - arrival <= slo_s else "late"

    t0 = time.monotonic()
    tasks = []
    for arrival in times:
        delay = arrival - (time.monotonic() - t0)
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(float(arrival), t0)))
    outcomes = await asyncio.gather(*tasks)
    await server.close()
    return {k: outcomes.count(k) for k in ("within", "late", "refused", "expired")}


def simulated(times: np.ndarray, setup: Setup, seed: int) -> float:
    """Share of ``times`` the simulator answers within the SLO with the same run-time model."""
    noise = np.random.default_rng(seed)
    result = simulate(
        times, lambda k: setup.run_time(k, noise), setup.make(), replicas=1, slo=setup.slo_s
    )
    return float(np.sum(result.answered <= setup.slo_s + 1e-9)) / times.size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--capacity", type=float, default=39.328112856069076)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--slo-ms", type=float, default=600.0)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--systems", nargs="*", default=["deadline", "ctmc"])
    parser.add_argument("--workloads", nargs="*", default=["mmpp 50%", "mmpp 80%"])
    parser.add_argument("--pipeline-depth", type=int, default=2)
    parser.add_argument("--param", action="append", default=[], metavar="KEY=JSON")
    parser.add_argument("--run-ms", default=RUN_MS, help="run time per batch size, size:ms,...")
    parser.add_argument("--sigma", type=float, default=0.05, help="lognormal run-time noise")
    args = parser.parse_args(argv)
    params = {k: json.loads(v) for k, v in (kv.split("=", 1) for kv in args.param)}
    slo_s = args.slo_ms / 1000.0
    run_s = run_times(args.run_ms)
    points = workloads(args.capacity, slo_s, args.seconds)
    print(
        "| workload | system | run | offered | within SLO | late | refused | expired | simulator |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for workload in args.workloads:
        times = points[workload]
        for system in args.systems:
            for run in range(args.runs):
                setup = Setup(system, params, slo_s, run_s, args.sigma)
                counts = asyncio.run(replay_point(times, setup, args.pipeline_depth, run))
                sim = simulated(times, setup, run)
                print(
                    f"| {workload} | {system} | {run + 1} | {times.size} "
                    f"| {counts['within'] / times.size:.2%} | {counts['late']} "
                    f"| {counts['refused']} | {counts['expired']} | {sim:.2%} |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
