"""Partitioned models on Ray: the latency-optimal plan's prediction against its run with shard
actors in a placement group, beside the same plan run in one process and the whole model.

    python -m bench.partition_ray [--plans 3] [--rounds 3] [--runs 50] [--out OUT.json]
    python -m bench.partition_ray --plot RUN.json [RUN.json ...] [--figure FIGURE.png]

The two models of :mod:`bench.partition` at their tight limit (the model must be split), one
worker beside the leader (2 cores). Ray is started here (2 CPUs); this process is the leader
(:class:`raysrv._partitioned.TimedRuntime`, which keeps its stages' times), planned as a pool
plans a leader: the machine profiled in one process, and its transfers timed as calls to a
probe actor (:func:`raysrv._partitioned.ray_transfers`). Also shown: the prediction of the
plan made from the profile alone (transfers between threads). Each round first times Ray's
calls again as the planner does, amid the plan's own run too
(:func:`raysrv._partitioned.timed_for`), and predicts the same plan with them
(:meth:`Plan.predicted_s`): the prediction beside the run, which this machine's drift between
planning and measuring does not move. Then it times ``--runs`` batches of one on Ray, the same
plan in one process (:class:`raysrv.partitioning.local.LocalPlan`), the whole model in one
session and a call to an actor that only returns its input, sent as a shard actor is sent it
(:func:`raysrv._partitioned.to_bytes`) and as a NumPy array; medians of the rounds' medians,
and the median of the rounds' ratios. Last, what that call costs after 0, 2, 5 and 10 ms of
rest (``--runs`` calls each, medians), the caller sleeping meanwhile or calling another actor,
as the planner's probe does (:func:`raysrv._partitioned.calls_s`). Also printed: the terms
Ray's calls were timed at beside the rounds (the delay's mean, ``overlap``, ``cold_s``,
``cold_s_per_byte``), and stage by stage the round, the slowest worker's run (timed inside its
actor), the leader's own run and what the round takes beyond that worker's run, each predicted
beside the round and measured. ``--plot``: no run, but each model's ratios plan by plan in
the runs' ``--out`` files, at planning and beside (:func:`plot_runs`).

Each model is planned, started and measured ``--plans`` times, the two models in turn, and
its verdict is the median of its plans' ratios (:func:`verdict`). One plan's prediction and
its measure are each one draw of a shared machine's speed: here the same plan's rounds, seconds
apart, differ by 5-8% at the median, and a model's batch varies by 4-11% (the coefficient of
variation, by the day) from one planning to the next, the prediction following it in part
(bench/RESULTS_ARCHIVE.md, "Partitioned models: the detail as summarized on fl7's day").

Results: bench/RESULTS.md, "Partitioned models".
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from bench.partition import WORKERS, export, models, tightest
from raysrv._partitioned import TimedRuntime, to_bytes

__all__ = ["main"]


class _Echo:
    def run(self, x: Any) -> Any:
        return x


def _medians(taken: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Each stage's median round, slowest worker's median run and the leader's median run
    (seconds) in what :meth:`raysrv._partitioned.TimedRuntime.taken` found."""
    return [
        {
            "round": statistics.median(found["rounds"]),
            "workers_run": max(map(statistics.median, found["workers"]), default=0.0),
            "leader_run": statistics.median(found["here"]) if found["here"] else 0.0,
        }
        for found in taken
    ]


def _predicted(perf: Any, plan: Any) -> list[dict[str, float]]:
    """What ``perf`` predicts of each stage of ``plan``: as :func:`_medians`."""
    found = []
    for s in plan.stages:
        group = plan.layers[s.first : s.last + 1]
        on_workers = s.shards[1:] if s.leader else s.shards
        slow = perf.slowed(len(s.shards) if s.leader else len(on_workers))
        found.append(
            {
                "round": perf.latency_s(group, s.shards, s.leader),
                "workers_run": max((perf.run_s(group, p) * slow for p in on_workers), default=0.0),
                "leader_run": perf.run_s(group, s.shards[0]) * slow if s.leader else 0.0,
            }
        )
    return found


STAGE_PARTS = ("round", "workers_run", "leader_run")  # of a stage, as timed and predicted
TERMS = ("delay_ms", "overlap", "cold_s", "cold_s_per_byte")  # of Ray's calls, timed beside


def _stage_medians(
    rounds: list[tuple[list[dict[str, float]], list[dict[str, float]]]],
) -> list[dict[str, dict[str, float]]]:
    """Each stage's predicted and measured parts (:func:`_predicted`, :func:`_medians`; one
    pair of lists a round in ``rounds``): the medians of the rounds', in ms."""
    return [
        {
            side: {k: statistics.median(r[j][i][k] for r in rounds) * 1e3 for k in STAGE_PARTS}
            for j, side in enumerate(("predicted", "measured"))
        }
        for i in range(len(rounds[0][0]))
    ]


def measure(path: Path, rounds: int, runs: int) -> dict[str, Any]:
    """The model at ``path`` profiled, planned as a pool plans it, started and measured over
    ``rounds`` rounds of ``runs`` batches (see the module docstring): one plan's figures."""
    import onnx
    import ray

    from raysrv._partitioned import plan_on_ray, timed_for
    from raysrv.config import ModelSpec
    from raysrv.partitioning import layers, weight_bytes
    from raysrv.partitioning.local import LocalPlan, shard_session
    from raysrv.partitioning.planner import MIB, plan
    from raysrv.partitioning.profile import measure_s, profile

    model = onnx.load(str(path))
    found, weights = layers(model), weight_bytes(model)
    perf = profile(model, workers=WORKERS)
    limit = tightest(found, perf, weights)
    threads = plan(path, WORKERS, limit / MIB, perf=perf)
    spec = ModelSpec.model_validate(
        {
            "name": path.stem,
            "runtime": "onnx",
            "source": str(path),
            "input": {"shape": [3, 32, 32]},
            "partition": {"workers": WORKERS, "memory_limit_mb": limit / MIB, "num_cpus": 0.5},
        }
    )
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    whole = shard_session(model.SerializeToString())
    expected = whole.run(None, {"x": x})[0]
    echo = ray.remote(_Echo).options(num_cpus=0).remote()
    chosen = plan_on_ray(spec, perf)  # as a pool plans: Ray's transfers timed
    runtime = TimedRuntime(spec, chosen)
    timed: dict[str, list[float]] = {k: [] for k in ("ray", "local", "whole", "hop", "hop_numpy")}
    beside = []
    terms: dict[str, list[float]] = {k: [] for k in TERMS}
    stages: list[tuple[list[dict[str, float]], list[dict[str, float]]]] = []
    try:
        got = np.array(runtime.predict_batch(x), dtype=np.float32)
        runtime.taken()
        with LocalPlan(model, chosen) as local:
            for _ in range(rounds):
                now = timed_for(perf, chosen, 60.0)
                beside.append(chosen.predicted_s(now))
                terms["delay_ms"].append(now.delay.mean * 1e3)
                for k in TERMS[1:]:
                    terms[k].append(getattr(now, k))
                timed["ray"].append(measure_s(lambda: runtime.predict_batch(x), runs))
                stages.append((_predicted(now, chosen), _medians(runtime.taken())))
                timed["local"].append(measure_s(lambda: local.run(x), runs))
                timed["whole"].append(measure_s(lambda: whole.run(None, {"x": x}), runs))
                timed["hop"].append(measure_s(lambda: ray.get(echo.run.remote(to_bytes(x))), runs))
                timed["hop_numpy"].append(measure_s(lambda: ray.get(echo.run.remote(x)), runs))
    finally:
        runtime.close()
        ray.kill(echo)
    medians = {k: statistics.median(v) * 1e3 for k, v in timed.items()}
    ratios = [r / b for r, b in zip(timed["ray"], beside, strict=True)]
    return {
        "predicted_ms": chosen.predicted_latency_s * 1e3,
        "beside_ms": [b * 1e3 for b in beside],
        "ray_rounds_ms": [r * 1e3 for r in timed["ray"]],
        "ray_over_beside": statistics.median(ratios),
        "ray_terms": {k: statistics.median(v) for k, v in terms.items()},
        "stages_ms": _stage_medians(stages),
        "threads_predicted_ms": threads.predicted_latency_s * 1e3,
        "same_shards": [s.parts for s in threads.stages] == [s.parts for s in chosen.stages],
        "stages": len(chosen.stages),
        "shard_actors": len(chosen.worker_shards()),
        "max_abs_error": float(np.max(np.abs(got - expected))),
        "describe": chosen.describe(),
        **{f"{k}_ms": v for k, v in medians.items()},
    }


RESTS_S = (0.0, 0.002, 0.005, 0.01)


def verdict(plans: list[dict[str, Any]]) -> dict[str, Any]:
    """A model's plans (:func:`measure`'s, one a planning) judged: each plan's measure over its
    prediction made at planning (``at_planning``) and over those made beside its rounds
    (``beside``), and the medians of both over the plans."""
    at_planning = [p["ray_ms"] / p["predicted_ms"] for p in plans]
    beside = [p["ray_over_beside"] for p in plans]
    return {
        "at_planning": at_planning,
        "beside": beside,
        "median_at_planning": statistics.median(at_planning),
        "median_beside": statistics.median(beside),
    }


def call_after_rest(runs: int) -> dict[str, dict[str, float]]:
    """Median ms of a call to an actor that returns its input, after each of ``RESTS_S``, the
    caller sleeping meanwhile (``sleeps``) or calling another such actor (``calls``, the
    planner's probe: :func:`raysrv._partitioned.calls_s`)."""
    import ray

    from raysrv._partitioned import Probe, calls_s

    probe, keeper = (ray.remote(Probe).options(num_cpus=0).remote() for _ in range(2))
    x = np.zeros(1024, np.uint8)
    found: dict[str, dict[str, float]] = {"sleeps": {}, "calls": {}}
    try:
        ray.get([probe.echo.remote(to_bytes(x)), keeper.echo.remote(to_bytes(x))])
        for rest in RESTS_S:
            for caller, other in (("sleeps", None), ("calls", keeper)):
                times = calls_s(probe, x, 60.0, rest, runs, keeper=other)
                found[caller][f"{rest * 1e3:g}"] = statistics.median(times) * 1e3
        return found
    finally:
        ray.kill(probe)
        ray.kill(keeper)


def plot_runs(paths: list[Path], figure: Path) -> None:
    """Each model's measure over its prediction, made at planning and beside each round, plan
    by plan in ``paths`` (this benchmark's ``--out`` files, in order), and each run's verdict
    (:func:`verdict`'s medians) as a bar across its plans where every run has as many."""
    from bench.plots import ratio_runs

    runs = [json.loads(path.read_text()) for path in paths]
    series = {}
    for name in models():
        judged = [verdict(r[name]) for r in runs]
        series[f"{name}, at planning"] = [x for j in judged for x in j["at_planning"]]
        series[f"{name}, beside"] = [x for j in judged for x in j["beside"]]
    sizes = {len(r[name]) for r in runs for name in models()}
    every = sizes.pop() if len(sizes) == 1 else 0  # a run's verdict, where runs match
    label = f"run: its {every} plans, and their median (bar)" if every else "plan"
    ratio_runs(series, 0.1, "on Ray / predicted", figure, xlabel=label, every=every)


def main(argv: list[str] | None = None) -> int:
    import ray

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plans", type=int, default=3, help="plannings of each model")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds a plan")
    parser.add_argument("--runs", type=int, default=50, help="timed runs a round")
    parser.add_argument("--out", type=Path, default=Path("bench/out/partition_ray.json"))
    parser.add_argument(
        "--plot", type=Path, nargs="+", help="no run: plot these runs' ratios to --figure"
    )
    parser.add_argument("--figure", type=Path, default=Path("bench/figures/partition_ray.png"))
    args = parser.parse_args(argv)
    if args.plot:
        plot_runs(args.plot, args.figure)
        return 0
    ray.init(num_cpus=2, include_dashboard=False, logging_level="error", log_to_driver=False)
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in models()}
    try:
        with tempfile.TemporaryDirectory(prefix="raysrv-partition-ray-") as tmp:
            paths = {name: Path(tmp) / f"{name}.onnx" for name in results}
            for name, module in models().items():
                export(module, paths[name])
            for _ in range(args.plans):
                for name, path in paths.items():
                    results[name].append(measure(path, args.rounds, args.runs))
        rests = call_after_rest(args.runs)
    finally:
        ray.shutdown()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({**results, "call_after_rest_ms": rests}, indent=1))
    report(results, rests)
    return 0


def _stage_cells(parts: dict[str, dict[str, float]]) -> list[str]:
    """A stage's predicted and measured parts (one of :func:`_stage_medians`) as table cells:
    round, slowest worker's run, leader's run and the round beyond that worker's run."""
    p, m = parts["predicted"], parts["measured"]
    pairs = [
        (p["round"], m["round"]),
        (p["workers_run"], m["workers_run"]),
        (p["leader_run"], m["leader_run"]),
        (p["round"] - p["workers_run"], m["round"] - m["workers_run"]),
    ]
    shown = [True, bool(m["workers_run"]), bool(m["leader_run"]), bool(m["workers_run"])]
    return [f"{a:.3f}, {b:.3f}" if on else "" for (a, b), on in zip(pairs, shown, strict=True)]


def report(results: dict[str, list[dict[str, Any]]], rests: dict[str, dict[str, float]]) -> None:
    """Print the run's tables: each plan's latencies, each model's verdict, each plan's terms
    and stages, and :func:`call_after_rest`'s calls."""
    print("| model | plan | stages | shard actors | predicted with threads' rounds ms "
          "| predicted with Ray's calls ms | on Ray ms | on Ray / predicted | predicted beside "
          "each round ms | on Ray / predicted beside | same plan in one process ms | whole "
          "model ms | actor call ms | the same, NumPy ms | max abs error |")  # fmt: skip
    print("|---|" + "---:|" * 14)
    for name, plans in results.items():
        for k, r in enumerate(plans, 1):
            print(
                f"| {name} | {k} | {r['stages']} | {r['shard_actors']} "
                f"| {r['threads_predicted_ms']:.3f} | {r['predicted_ms']:.3f} "
                f"| {r['ray_ms']:.3f} | {r['ray_ms'] / r['predicted_ms']:.2f} "
                f"| {statistics.median(r['beside_ms']):.3f} | {r['ray_over_beside']:.2f} "
                f"| {r['local_ms']:.3f} | {r['whole_ms']:.3f} | {r['hop_ms']:.3f} "
                f"| {r['hop_numpy_ms']:.3f} | {r['max_abs_error']:.1e} |"
            )
    print("\n| model | on Ray / predicted at planning, plan by plan | median | on Ray / predicted "
          "beside, plan by plan | median |")  # fmt: skip
    print("|---|---|---:|---|---:|")
    for name, plans in results.items():
        v = verdict(plans)
        print(
            f"| {name} | {', '.join(f'{x:.2f}' for x in v['at_planning'])} "
            f"| {v['median_at_planning']:.2f} | {', '.join(f'{x:.2f}' for x in v['beside'])} "
            f"| {v['median_beside']:.2f} |"
        )
    for name, plans in results.items():
        for k, r in enumerate(plans, 1):
            t = r["ray_terms"]
            print(f"\n{name}, plan {k}:\n{r['describe']}\n  Ray's calls, timed beside (medians): "
                  f"delay mean {t['delay_ms']:.3f} ms, overlap {t['overlap']:.2f}, cold runs "
                  f"{t['cold_s'] * 1e3:.3f} ms and {t['cold_s_per_byte'] * 2**20 * 1e3:.4f} ms a "
                  "MiB")  # fmt: skip
    print("\n| model | plan | stage | round ms: predicted, measured | slowest worker's run ms "
          "| leader's run ms | beyond the slowest worker's run ms |")  # fmt: skip
    print("|---|---:|---:|---|---|---|---|")
    for name, plans in results.items():
        for k, r in enumerate(plans, 1):
            for i, parts in enumerate(r["stages_ms"]):
                print(f"| {name} | {k} | {i + 1} | " + " | ".join(_stage_cells(parts)) + " |")
    print("\n| rest before the call ms | " + " | ".join(rests["sleeps"]) + " |")
    print("|---|" + "---:|" * len(rests["sleeps"]))
    for caller, row in rests.items():
        cells = " | ".join(f"{v:.3f}" for v in row.values())
        print(f"| call ms, the caller {caller} | {cells} |")


if __name__ == "__main__":
    sys.exit(main())
