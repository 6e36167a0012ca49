"""Every batching policy and ``@serve.batch``, live, on bursty and overload workloads (issue 4).

    python -m bench.policies_live [--quick] [--seconds 20] [--slo-ms 600] [--margin-ms 0]
        [--max-batch 10] [--capacity 39.3] [--capacity-each-point] [--capacity-seconds 60]
        [--systems deadline ctmc ...]
        [--workloads "mmpp 80%" ...] [--deadline-param overrun_quantile=0.9 ...]
        [--trip-back-quantile 1.0] [--trace day.csv] [--tuned-bound 30]

The model is :func:`bench.models.build_mlp`: about 1 GB of weights read three times per batch,
so a batch of 1 costs about 0.1 s and a batch of 8 about twice that (a GPU-like fixed cost per
batch); the default SLO is about 6x the batch-1 time. It runs on one replica (one CPU, one
onnxruntime thread) in a local Ray, driven through Serve handles from this process, with
batches of at most ``--max-batch`` (default 10, ``@serve.batch``'s own default) for every system.
With that cost the replica, not the serving machinery, is what saturates on this 2-core machine.

1. **Capacity**, measured again just before each workload (the machine's speed drifts by a
   fifth and more over a run): after a warm-up, a closed loop of 64 in flight against raysrv's
   ``fixed`` policy (B ``--max-batch``, no hold, an SLO no answer reaches) for one point's
   length, or ``--capacity-seconds``. Its throughput is the capacity that workload's load is a
   fraction of, and its yardstick for goodput. With ``--capacity-each-point`` it is measured
   again before every system's point, and each point's arrivals (same seed) are scaled to its
   own measurement: the machine can slow by a fifth within the minutes one workload's points
   take, and a point run long after its workload's capacity loop then pays that as extra load.
   ``--capacity`` skips it and takes a capacity an earlier run measured for a workload: that
   workload's arrivals are then that run's very arrival times, to compare variants on the same
   trace.
2. **Workloads**: :mod:`bench.workloads`, scaled to the capacity and to the SLO: by default
   ``mmpp 50%``, ``mmpp 80%``, ``mmpp 90%``, ``trace 50%`` (``--trace`` replays another file in
   the Azure Functions trace's format than the one shipped) and ``poisson 150%``.
3. **Systems**, each redeployed per point, all seeing the same inputs and, unless
   ``--capacity-each-point``, the same arrival times:
   raysrv's ``fixed`` (no hold), ``aimd``, ``quantile``, ``delayed``, ``deadline`` and ``ctmc``,
   and a plain Serve deployment with ``@serve.batch`` at its defaults (B 10, wait 10 ms,
   ``max_ongoing_requests`` 128, callers' queue unbounded) and hand-tuned for the SLO: B
   ``--max-batch``, wait 5 ms, and admission bounded the way Serve offers, so that overload is
   refused instead of queued. ``max_ongoing_requests`` is as many full batches as can run one
   after another within the SLO behind the running one at the capacity measured for the point
   (:func:`bench.baseline.admitted`: 20 at 800 ms and 37.5-50/s; ``--tuned-bound`` sets
   another), and ``max_queued_requests`` 1, beyond which Serve refuses with
   ``BackPressureError`` (counted as 503). raysrv gets the SLO with every query (``slo_ms``, and
   ``sent_at`` so that it starts when the query is sent). ``deadline`` and ``ctmc`` learn how
   much later than planned their batches come back (``learn_overrun``); ``--margin-ms`` adds a
   fixed margin on top (default none), ``--deadline-param`` any other of their parameters, and
   ``--trip-back-quantile`` the ingress's ``trip_back_quantile``. ``@serve.batch`` cannot take
   a deadline.

Reported per point, from the client's side (latency from each query's scheduled arrival): SLO
attainment (answered within the SLO over offered), goodput (answers within the SLO per second, and
as a share of the workload's capacity), late answers, refusals (429/503: refused before any work),
expired queries (504: dropped at their deadline while their batch ran, the work spent), errors,
p50/p99/p99.9 of answered latency, the mean batch size, and for raysrv's systems the replica's p50
run time of a full batch during the point (each capacity loop's is printed above the table): the
machine's speed drifts between points, and a point whose batches ran slower offered more than its
nominal load. "At its speed" scales the point's capacity by how much faster or slower its full
batches ran than its capacity loop's, and gives goodput's share of that. Also for raysrv's
systems, "simulator": what the same policy keeps within the SLO in the simulator on the same
arrivals, with one replica running each batch size in the p50 time the live one measured (over
its last 100 batches of that size) and nothing else: no trips, no noise, no Ray. It is computed
after the last point, so that no point shares the machine with it, and the gap to the live
figure is what the live system adds.
Plots: the fraction of offered queries answered within x ms, per system
(``policies_live_cdf.png``), and goodput per second over time (``policies_live_goodput.png``).
The JSON output also keeps every request's timing and each raysrv policy's state after its
point (``learned_overrun_ms``, ``ctmc``'s plan).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.loadgen import (
    HandleClient,
    RequestLog,
    closed_loop,
    make_inputs,
    replay,
    scheduled_at,
)
from bench.models import INPUT_SHAPE, MLP_PATH, build_mlp
from bench.plots import attainment_panels, goodput_panels
from bench.traces import PERIODIC_SPIKES
from bench.validate_live import deploy_spec, start_ray
from bench.workloads import MORE, WORKLOADS, workload
from raysrv.analytics import simulate
from raysrv.analytics.profiles import interpolate_batches
from raysrv.batching import make_policy

__all__ = ["Point", "main"]

APP = "bench"
MAX_BATCH = 10  # @serve.batch's default max_batch_size
RAYSRV = ("fixed", "aimd", "quantile", "delayed", "deadline", "ctmc")
# (max_batch_size, batch_wait_timeout_s, admission bounded for the SLO); None: --max-batch
BASELINES = {
    "@serve.batch default": (10, 0.010, False),
    "@serve.batch tuned": (None, 0.005, True),
}
FIGURES = Path(__file__).parent / "figures"


@dataclass(frozen=True)
class Point:
    workload: str
    system: str
    offered: int
    within_slo: float
    goodput: float
    late: int
    refused: int
    expired: int
    errors: int
    p50_ms: float
    p99_ms: float
    p999_ms: float
    mean_batch: float
    full_batch_ms: float  # the replica's p50 run time of a full batch in the point; nan: unknown
    simulated: float  # within SLO in the simulator, same arrivals and run times; nan: not run
    capacity: float  # queries/s measured before the point: its load and goodput are shares of it
    # the capacity scaled by how much faster or slower the point's full batches ran than its
    # capacity loop's (nan: either run time unknown): what the machine could serve meanwhile
    capacity_at_speed: float


class System:
    """One deployed system: how to call it and how many batches it ran."""

    def __init__(
        self,
        name: str,
        path: Path,
        slo_ms: float,
        margin_ms: float,
        extra: dict[str, Any] | None = None,
        sent_at: bool = True,
        max_batch: int = MAX_BATCH,
        ingress: dict[str, Any] | None = None,
        capacity: float | None = None,
        tuned_bound: int | None = None,
    ) -> None:
        from ray import serve
        from ray.serve.schema import LoggingConfig

        from bench.baseline import admitted, build_baseline

        self.name = name
        self.max_batch = max_batch
        self.params: dict[str, Any] | None = None  # raysrv's policy parameters
        if name in BASELINES:
            batch, wait, bounded = BASELINES[name]
            batch = batch or max_batch
            bounds = {}
            if bounded:
                if capacity is None:
                    raise ValueError(f"{name} needs the measured capacity")
                bounds = {
                    "max_ongoing_requests": tuned_bound
                    or admitted(capacity, slo_ms / 1000.0, batch),
                    "max_queued_requests": 1,  # Serve's least; beyond it, 503 at once
                }
            quiet = LoggingConfig(enable_access_log=False, log_level="WARNING")  # as raysrv's
            app = build_baseline(str(path), INPUT_SHAPE, batch, wait, **bounds)
            serve.run(app, name="live", logging_config=quiet)
            self.handle = serve.get_app_handle("live")
            return
        params: dict[str, Any] = {"max_batch_size": max_batch}
        if name == "fixed":
            params["timeout_ms"] = 0.0
        if name in ("deadline", "ctmc"):
            params["margin_ms"] = margin_ms
            params.update(extra or {})
        self.params = params
        self.handle = deploy_spec(path, name, params, slo_ms, "live", ingress)
        self.slo_ms = slo_ms
        self.sent_at = sent_at

    def call(self, x: np.ndarray) -> Any:
        if self.name in BASELINES:
            return self.handle.predict.remote(x)
        if not self.sent_at:
            return self.handle.predict.remote(APP, x, slo_ms=self.slo_ms)
        return self.handle.predict.remote(APP, x, slo_ms=self.slo_ms, sent_at=scheduled_at())

    async def state(self) -> tuple[int, int, dict[str, Any], dict[int, float]]:
        """(batches, queries in them) since the deployment started, raysrv's policy as it
        stands (settings, learned overrun, plan; {} for the baseline) and the replica's p50 run
        time per batch size over its last batches of each, in seconds ({} for the baseline)."""
        if self.name in BASELINES:
            stats = await self.handle.stats.remote()
            return stats["batches"], stats["items"], {}, {}
        model = (await self.handle.models.remote())[0]
        runs = {int(k): v for k, v in model["batch_seconds"]["p50"].items()}
        return model["batches"], model["batched_queries"], dict(model["batching"]), runs

    async def replay(
        self, times: np.ndarray, inputs: list[np.ndarray]
    ) -> tuple[RequestLog, float, dict[str, Any], dict[int, float]]:
        """Replay the arrivals; return the log, the mean batch size over them, the policy's
        state after them and the p50 run time per batch size at the end (seconds)."""
        before = await self.state()
        log = await replay(HandleClient(self.call, inputs), times)
        after = await self.state()
        batches = after[0] - before[0]
        mean_batch = (after[1] - before[1]) / batches if batches else float("nan")
        return log, mean_batch, after[2], after[3]

    def simulated(self, times: np.ndarray, runs: dict[int, float], slo_s: float) -> float:
        """Within SLO in the simulator: this policy on the same arrivals, one replica running
        each batch size in the point's p50 run time (sizes not seen interpolated), no trips
        and no noise. nan for the baseline or without run times."""
        if self.params is None or not runs:
            return float("nan")
        sizes = sorted(runs)
        service = interpolate_batches(
            sizes, [runs[k] for k in sizes], np.arange(1, self.max_batch + 1)
        )
        policy = make_policy(self.name, self.params, slo_s)
        result = simulate(times, service, policy, replicas=1, slo=slo_s)
        return float(np.mean(result.latencies <= slo_s))


def point(
    workload: str,
    system: str,
    log: RequestLog,
    slo_s: float,
    mean_batch: float,
    full_batch_ms: float,
    simulated: float,
    capacity: float,
    loop_full_batch_ms: float,
) -> Point:
    status = np.asarray(log.status)
    latency = np.asarray(log.done) - np.asarray(log.scheduled)
    ok = status == 200
    within = ok & (latency <= slo_s)
    refused = np.isin(status, [429, 503])
    expired = status == 504
    span = float(np.max(log.done)) if log.done else 1.0
    pct = np.percentile(latency[ok], [50, 99, 99.9]) * 1e3 if ok.any() else [np.nan] * 3
    return Point(
        workload,
        system,
        int(status.size),
        float(within.mean()),
        float(within.sum() / span),
        int((ok & ~within).sum()),
        int(refused.sum()),
        int(expired.sum()),
        int((~ok & ~refused & ~expired).sum()),
        float(pct[0]),
        float(pct[1]),
        float(pct[2]),
        mean_batch,
        full_batch_ms,
        simulated,
        capacity,
        capacity * loop_full_batch_ms / full_batch_ms,
    )


def table(points: list[Point]) -> str:
    lines = [
        "| workload | system | offered | within SLO | goodput/s (of capacity) | late | refused "
        "| expired | errors | p50 ms | p99 ms | p99.9 ms | mean batch | full batch ms "
        "| at its speed: capacity/s (goodput's share) | simulator |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in points:
        speed = "-"
        if not np.isnan(p.capacity_at_speed):
            speed = f"{p.capacity_at_speed:.1f} ({p.goodput / p.capacity_at_speed:.1%})"
        lines.append(
            f"| {p.workload} | {p.system} | {p.offered} | {p.within_slo:.2%} "
            f"| {p.goodput:.1f} ({p.goodput / p.capacity:.1%}) "
            f"| {p.late} | {p.refused} | {p.expired} | {p.errors} | {p.p50_ms:.1f} "
            f"| {p.p99_ms:.1f} | {p.p999_ms:.1f} | {p.mean_batch:.1f} "
            f"| {'-' if np.isnan(p.full_batch_ms) else f'{p.full_batch_ms:.0f}'} | {speed} "
            f"| {'-' if np.isnan(p.simulated) else f'{p.simulated:.2%}'} |"
        )
    return "\n".join(lines)


def capacity_table(capacities: dict[str, dict[str, Any]], max_batch: int) -> str:
    """Per workload (or per point, with ``--capacity-each-point``): the capacity measured just
    before it, and the p50 run time of a full batch in that loop."""
    lines = ["| workload | capacity/s | full batch ms |", "|---|---|---|"]
    for name, measured in capacities.items():
        ms = full_batch_ms(measured, max_batch)
        ms_text = "-" if np.isnan(ms) else f"{ms:.0f}"
        lines.append(f"| {name} | {measured['capacity']:.1f} | {ms_text} |")
    return "\n".join(lines)


def full_batch_ms(measured: dict[str, Any], max_batch: int) -> float:
    """The p50 run time of a full batch in one capacity loop, in ms; nan if it ran none."""
    full = measured["run_seconds"].get("p50", {}).get(str(max_batch))
    return float("nan") if full is None else full * 1000.0


def measure_capacity(
    path: Path, inputs: list[np.ndarray], seconds: float, max_batch: int
) -> dict[str, Any]:
    """Closed loop, 64 in flight, ``fixed`` at B ``max_batch`` with no deadline in reach."""
    system = System("fixed", path, 60_000.0, 0.0, max_batch=max_batch)
    client = HandleClient(system.call, inputs)
    asyncio.run(closed_loop(client, 64, 3.0))  # warm-up, discarded
    result = asyncio.run(closed_loop(client, 64, seconds))
    model = system.handle.models.remote().result()[0]
    return {"capacity": result.throughput_rps, "run_seconds": model["batch_seconds"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="6 s per point instead of 20")
    parser.add_argument(
        "--seconds", type=float, default=None, help="seconds per point (default 20, 6 quick)"
    )
    parser.add_argument("--slo-ms", type=float, default=600.0)
    parser.add_argument("--margin-ms", type=float, default=0.0)
    parser.add_argument("--max-batch", type=int, default=MAX_BATCH, help="for every system")
    parser.add_argument(
        "--capacity", type=float, default=None, help="skip measuring it; use this (queries/s)"
    )
    parser.add_argument(
        "--capacity-each-point",
        action="store_true",
        help="measure the capacity again before every system's point, not once per workload",
    )
    parser.add_argument(
        "--capacity-seconds",
        type=float,
        default=None,
        help="how long each capacity loop runs (default: as long as a point)",
    )
    parser.add_argument("--systems", nargs="*", default=[*RAYSRV, *BASELINES])
    parser.add_argument(
        "--deadline-param",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="an extra parameter for deadline and ctmc, e.g. overrun_quantile=0.95",
    )
    parser.add_argument(
        "--no-sent-at",
        action="store_true",
        help="raysrv's callers send no sent_at: the SLO starts at the ingress and no time is "
        "kept for the trip back",
    )
    parser.add_argument(
        "--trip-back-quantile",
        type=float,
        default=None,
        help="the ingress's trip_back_quantile (default: raysrv's default)",
    )
    parser.add_argument(
        "--tuned-bound",
        type=int,
        default=None,
        help="the hand-tuned @serve.batch's max_ongoing_requests (default: derived from the SLO "
        "and the capacity measured for the point)",
    )
    parser.add_argument(
        "--workloads",
        nargs="*",
        default=None,
        choices=(*WORKLOADS, *MORE),
        help=f"run only these (default: {', '.join(WORKLOADS).replace('%', '%%')})",
    )
    parser.add_argument(
        "--trace",
        type=Path,
        default=PERIODIC_SPIKES,
        help="the trace 'trace 50%%' replays, in the Azure Functions trace's format "
        "(default: the one shipped, bench/data/periodic_spikes.csv)",
    )
    parser.add_argument("--out", type=Path, default=Path("bench/out/policies_live.json"))
    parser.add_argument("--figures", type=Path, default=FIGURES)
    args = parser.parse_args(argv)
    from ray import serve

    extra = {k: json.loads(v) for k, v in (kv.split("=", 1) for kv in args.deadline_param)}
    path = build_mlp(MLP_PATH)
    inputs = make_inputs(256, INPUT_SHAPE, seed=0)
    seconds = args.seconds or (6.0 if args.quick else 20.0)
    slo_s = args.slo_ms / 1000.0
    ingress = {}
    if args.trip_back_quantile is not None:
        ingress["trip_back_quantile"] = args.trip_back_quantile
    options = {
        "sent_at": not args.no_sent_at,
        "max_batch": args.max_batch,
        "ingress": ingress,
        "tuned_bound": args.tuned_bound,
    }
    start_ray()
    points: list[Point] = []
    # (workload, system, arrivals, log, mean batch, full batch ms, run times per size,
    # (capacity, its loop's full batch ms)), one per point
    done: list[tuple[str, System, np.ndarray, RequestLog, float, float, dict, tuple[float, float]]]
    done = []
    logs: dict[str, dict[str, RequestLog]] = {}
    policies: dict[str, dict[str, dict[str, Any]]] = {}  # each policy's state after its point
    # per workload as measured just before it, or per point ("workload / system")
    capacities: dict[str, dict[str, Any]] = {}
    try:
        for name in args.workloads or WORKLOADS:
            for i, system_name in enumerate(args.systems):
                if i == 0 or args.capacity_each_point:
                    if args.capacity is None:
                        loop_s = args.capacity_seconds or seconds
                        measured = measure_capacity(path, inputs, loop_s, args.max_batch)
                    else:
                        measured = {"capacity": args.capacity, "run_seconds": {}}
                    label = f"{name} / {system_name}" if args.capacity_each_point else name
                    capacities[label] = measured
                    capacity = measured["capacity"]
                    loop_ms = full_batch_ms(measured, args.max_batch)
                    print(f"{label}: capacity {capacity:.1f}/s", file=sys.stderr, flush=True)
                    times = workload(name, capacity, slo_s, seconds, args.trace)
                system = System(
                    system_name,
                    path,
                    args.slo_ms,
                    args.margin_ms,
                    extra,
                    capacity=capacity,
                    **options,
                )
                log, mean_batch, policy, runs = asyncio.run(system.replay(times, inputs))
                logs.setdefault(name, {})[system_name] = log
                policies.setdefault(name, {})[system_name] = policy
                full_ms = runs.get(args.max_batch, float("nan")) * 1000.0
                loop = (capacity, loop_ms)
                done.append((name, system, times, log, mean_batch, full_ms, runs, loop))
                print(f"  {name} {system_name} done", file=sys.stderr, flush=True)
    finally:
        serve.shutdown()
    for name, system, times, log, mean_batch, full_ms, runs, loop in done:  # after the points
        simulated = system.simulated(times, runs, slo_s)
        points.append(point(name, system.name, log, slo_s, mean_batch, full_ms, simulated, *loop))
    yardsticks = {  # per workload, for the plots: the mean of its points' capacities
        name: float(np.mean([p.capacity for p in points if p.workload == name])) for name in logs
    }
    print(f"SLO {args.slo_ms:g} ms\n\n{capacity_table(capacities, args.max_batch)}\n")
    print(table(points))
    args.figures.mkdir(parents=True, exist_ok=True)
    attainment_panels(logs, slo_s, args.figures / "policies_live_cdf.png")
    goodput_panels(logs, slo_s, yardsticks, args.figures / "policies_live_goodput.png")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "capacities": capacities,
        "slo_ms": args.slo_ms,
        "margin_ms": args.margin_ms,
        "max_batch": args.max_batch,
        "ingress": ingress,
        "points": [asdict(p) for p in points],
        "policies": policies,
        "logs": {w: {s: asdict(log) for s, log in per.items()} for w, per in logs.items()},
    }
    args.out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
