"""Profiling the machine at hand for the performance model (Gillis, ICDCS'21, §IV-A): each kind of
layer's run time against its FLOPs, and the fork-join's transfers, as :class:`.local.LocalPlan`
meets them (threads of one process; shard actors on Ray meet their own, measured there).

* **Run times**: every layer of the model alone, whole and as its spatial and channel shards of
  2 to ``max_parts`` parts, each the median of ``repeats`` runs on one onnxruntime thread;
  a line through each kind's points (:func:`.perf.fit_kind`), and through all of them for
  ``default``. Several sizes of each kind of layer are what the paper's regression needs.
  Timed one by one, each layer runs with its weights warm in the caches; the lines are then
  scaled by the whole model's run, layer after layer, against their sum for it (below).
* **A session's run**: the whole model in one session against the same run in one session a
  layer; the difference, over the sessions saved, is what a shard pays once however many layers
  it holds. The lines are scaled to the layer-after-layer run less its sessions, so that the
  model predicts both runs.
* **Transfers**: the bytes a second of the copies that cut a shard's rows and join its
  outputs, and the delay of a fork-join round beyond its shards' runs alone and those copies:
  every layer that splits into ``workers + 1`` parts, run as one round ``ROUNDS`` times, fitted
  as an exponentially modified Gaussian (:func:`raysrv.analytics.forkjoin.fit_emg`). It holds
  the hand-over to the worker threads and back and what the shards cost each other running
  together (memory bandwidth, caches), which a shard timed alone does not show.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx

from raysrv.analytics.forkjoin import EMG, fit_emg
from raysrv.partitioning.graph import Layer, layers, options
from raysrv.partitioning.latency import Plan, Stage
from raysrv.partitioning.local import LocalPlan, Sharder, shard_session
from raysrv.partitioning.perf import PerfModel, fit_kind, kind
from raysrv.partitioning.shards import shards

__all__ = ["measure_s", "profile", "single_stage"]

COPY_BYTES = 1 << 22  # of the copies timed for the bandwidth
ROUNDS = 20  # fork-join rounds timed on each layer split for the delay


def single_stage(
    found: list[Layer], first: int, last: int, option: str, parts: int, leader: bool = True
) -> Plan:
    """A plan of one stage, layers ``first..last`` under ``option``, its first shard on the
    leader where ``leader`` (no latency predicted, no memory counted)."""
    pieces = tuple(shards(found[first : last + 1], option, parts))
    return Plan(tuple(found), (Stage(first, last, option, parts, leader, pieces, 0.0, 0),))


def measure_s(run: Callable[[], object], repeats: int) -> float:
    """The median seconds of ``repeats`` calls of ``run``, after one to warm up."""
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def profile(
    model: str | Path | onnx.ModelProto, max_parts: int = 4, repeats: int = 15, workers: int = 1
) -> PerfModel:
    """The performance model of this machine, measured on ``model``'s layers, for plans of at
    most ``workers`` workers a round."""
    proto = model if isinstance(model, onnx.ModelProto) else onnx.load(str(model))
    found, sharder = layers(proto), Sharder(proto)
    points: dict[str, list[tuple[int, float]]] = defaultdict(list)
    rounds = []
    for k, layer in enumerate(found):
        for option in options([layer]):
            for parts in range(1, (max_parts if option != "none" else 1) + 1):
                try:
                    plan = single_stage(found, k, k, option, parts)
                except ValueError:
                    break
                seconds = _first_shard_s(sharder, plan, repeats)
                points[kind(layer)].append((plan.stages[0].shards[0].flops, seconds))
                if option != "none" and parts == workers + 1:
                    rounds.append((plan, seconds))
    bandwidth = _bandwidth(repeats)
    timed = [(alone, _round_delays(proto, plan, alone, bandwidth)) for plan, alone in rounds]
    if sum(len(found) for _, found in timed) < 3:
        raise ValueError(f"the model has no layer to split into {workers + 1} parts")
    side_by_side, delays = _side_by_side(timed)
    runs = _runs(points)
    chain = _chain_s(proto, found, repeats)
    session = _session_s(proto, found, chain, repeats)
    layers_s = max(chain - len(found) * session, chain * 1e-3)  # the chain less its sessions
    scale = layers_s / _predicted_chain_s(found, runs)
    calibrated = {name: (o * scale, rate / scale) for name, (o, rate) in runs.items()}
    return PerfModel(calibrated, bandwidth, fit_emg(delays), session, side_by_side=side_by_side)


def _side_by_side(timed: list[tuple[float, list[float]]]) -> tuple[float, list[float]]:
    """From each round's shard run alone and what the round took beyond it: the fraction a
    shard's run grows by beside the others (the slope of the rounds' median excess on their
    run alone, none if it does not grow) and the delays left once that is taken out."""
    alone = np.array([a for a, _ in timed])
    excess = np.array([np.median(found) for _, found in timed])
    varied = len(timed) > 1 and np.ptp(alone) > 0 and np.ptp(excess) > 0  # else no slope
    slope = max(0.0, float(np.polyfit(alone, excess, 1)[0])) if varied else 0.0
    return slope, [max(1e-7, d - slope * a) for a, found in timed for d in found]


def _session_s(proto: onnx.ModelProto, found: list[Layer], chain_s: float, repeats: int) -> float:
    """What one session's run costs beyond its layers': the whole model in one session against
    the same layers in one session each, over the sessions saved."""
    if len(found) < 2:
        return 0.0
    stage = single_stage(found, 0, len(found) - 1, "none", 1).stages[0]
    with LocalPlan(proto, Plan(tuple(found), (stage,))) as whole:
        x = _input(found[0])
        one = measure_s(lambda: whole.run(x), repeats)
    return max(0.0, (chain_s - one) / (len(found) - 1))


def _predicted_chain_s(found: list[Layer], runs: dict[str, tuple[float, float]]) -> float:
    perf = PerfModel(runs, 1.0, EMG(1.0, 1.0, 1.0))
    return sum(perf.latency_s([layer], shards([layer], "none", 1), True) for layer in found)


def _chain_s(proto: onnx.ModelProto, found: list[Layer], repeats: int) -> float:
    """Median seconds of the whole model run layer after layer, each a session of its own:
    what the layers timed one by one, each with its weights warm in the caches, take when the
    model's weights go through the caches in turn."""
    stages = [single_stage(found, k, k, "none", 1).stages[0] for k in range(len(found))]
    x = _input(found[0])
    with LocalPlan(proto, Plan(tuple(found), tuple(stages))) as local:
        return measure_s(lambda: local.run(x), repeats)


def _input(layer: Layer) -> np.ndarray:
    return np.random.default_rng(0).standard_normal((1, *layer.in_shape)).astype(np.float32)


def _first_shard_s(sharder: Sharder, plan: Plan, repeats: int) -> float:
    """Median seconds of the stage's first shard, run alone on one thread."""
    shard, rows = sharder.shard_models(plan, plan.stages[0])[0]
    session = shard_session(shard.SerializeToString())
    x = _input(plan.layers[plan.stages[0].first])
    feed = {session.get_inputs()[0].name: x if rows is None else x[:, :, slice(*rows)]}
    return measure_s(lambda: session.run(None, feed), repeats)


def _round_delays(
    proto: onnx.ModelProto, plan: Plan, alone_s: float, bandwidth: float
) -> list[float]:
    """What each fork-join round of the one-stage ``plan`` took beyond a shard's run alone
    and its bytes' copies: the hand-over to the workers and back, and the shards slowing each
    other down (memory, caches) while they run together."""
    stage = plan.stages[0]
    moved = max(p.in_bytes + p.out_bytes for p in stage.shards[1:]) / bandwidth
    x = _input(plan.layers[stage.first])
    found = []
    with LocalPlan(proto, plan) as local:
        local.run(x)
        for _ in range(ROUNDS):
            start = time.perf_counter()
            local.run(x)
            found.append(max(1e-7, time.perf_counter() - start - alone_s - moved))
    return found


def _runs(points: dict[str, list[tuple[int, float]]]) -> dict[str, tuple[float, float]]:
    """Each kind's fitted line where its points allow one, and ``default`` through all."""
    runs = {}
    everything = [p for kind_points in points.values() for p in kind_points]
    for name, found in [*points.items(), ("default", everything)]:
        flops, seconds = zip(*found, strict=True)
        try:
            runs[name] = fit_kind(flops, seconds)
        except ValueError:  # one size only, or run times that do not grow: the default's line
            continue
    if "default" not in runs:
        raise ValueError("the model's layers gave no line of run time on FLOPs")
    return runs


def _bandwidth(repeats: int) -> float:
    """Bytes a second of copying rows out of a tensor and joining two halves."""
    x = np.ones((1, 64, COPY_BYTES // (64 * 64 * 4), 64), dtype=np.float32)
    half = x.shape[2] // 2
    seconds = measure_s(
        lambda: np.concatenate(
            [np.ascontiguousarray(x[:, :, :half]), np.ascontiguousarray(x[:, :, half:])], axis=2
        ),
        repeats,
    )
    return 2 * x.nbytes / seconds
