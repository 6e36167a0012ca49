"""Latency-optimal layer grouping and parallelization (Gillis, ICDCS'21, §IV-B): the dynamic
program of eq. 1-2 over Algorithm 1, and a brute-force search to check it on small models.

A plan splits the layers into consecutive groups, run one after another (eq. 1: the latency is
the sum of the groups' rounds). Each group runs under one option (:mod:`.graph`) in ``parts``
shards: each on a worker of its own, or one of them on the leader, which keeps every shard it
takes in its memory (eq. 2: the leader's shards together fit in ``memory_limit``). A shard's
size is its weights plus the activations it reads and writes; no shard may exceed the limit.

Memory is counted in ``levels`` equal units of the limit, a shard's size rounded up: the DP's
table ``L[j][m]``, the best latency of layers ``0..j-1`` with at most ``m`` units on the leader, is

    L[0][m] = 0,   L[j][m] = min over k < j, b <= m of  L[k][m - b] + t(layers k..j-1, b)

where ``t(g, b)`` (Algorithm 1) is the best round of group ``g`` whose leader shard, if any,
takes at most ``b`` units, over every option, number of parts (at most ``workers`` on
workers) and whether the leader takes a shard. Time ``O(n^2 levels^2)`` after the ``O(n^2)``
groups' rounds; the brute force, ``O(2^n)`` groupings times every choice in each. The brute
force also answers gillis eq. 3 on small models: the least cost (:attr:`Plan.cost_s`, busy
seconds of leader and workers) within a latency SLO.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from raysrv.partitioning.graph import Layer, options
from raysrv.partitioning.perf import PerfModel
from raysrv.partitioning.shards import Shard, shards

__all__ = ["Plan", "Stage", "brute_force", "latency_optimal", "stage"]


@dataclass(frozen=True)
class Stage:
    """One group's fork-join round: layers ``first`` to ``last`` (inclusive)."""

    first: int
    last: int
    option: str
    parts: int
    leader: bool  # the first shard runs on the leader
    shards: tuple[Shard, ...]
    latency_s: float
    leader_units: int
    worker_s: float = 0.0  # the workers' busy seconds together


@dataclass(frozen=True)
class Plan:
    """Stages in order and what the model predicts for them; ``model`` (the ONNX file or proto
    the layers come from) where :meth:`run_local` is to run it."""

    layers: tuple[Layer, ...]
    stages: tuple[Stage, ...]
    model: Any = field(default=None, compare=False, repr=False)  # a path or an onnx.ModelProto

    @property
    def predicted_latency_s(self) -> float:
        return sum(stage.latency_s for stage in self.stages)

    def predicted_s(self, perf: PerfModel) -> float:
        """Its latency as ``perf`` predicts it: the same shards on another model's machine."""
        return sum(
            perf.latency_s(self.layers[s.first : s.last + 1], s.shards, s.leader)
            for s in self.stages
        )

    @property
    def cost_s(self) -> float:
        """Busy seconds of a query (gillis §IV-C, billed at a granularity of zero): the leader
        for the whole latency, each worker for its shards."""
        return self.predicted_latency_s + sum(stage.worker_s for stage in self.stages)

    @property
    def leader_bytes(self) -> int:
        """What the leader's shards hold together."""
        return sum(size(s.shards[0]) for s in self.stages if s.leader)

    def worker_shards(self) -> list[Shard]:
        """Every shard a worker runs, one worker each."""
        return [p for s in self.stages for p in (s.shards[1:] if s.leader else s.shards)]

    @property
    def shards(self) -> list[Shard]:
        """Every shard of every stage, in order: the leader's and the workers'."""
        return [p for s in self.stages for p in s.shards]

    @property
    def largest_shard_bytes(self) -> int:
        """What the largest shard holds: weights, and the activations it reads and writes."""
        return max(size(p) for p in self.shards)

    def run_local(self, x: np.ndarray) -> np.ndarray:
        """The plan's output for the batch ``x``, its shards run fork-join in this process
        (:class:`.local.LocalPlan`; made for this one call: keep a ``LocalPlan`` to run many)."""
        from raysrv.partitioning.local import LocalPlan

        if self.model is None:
            raise ValueError("this plan has no model to run; plan() gives plans one")
        with LocalPlan(self.model, self) as local:
            return local.run(x)

    def describe(self) -> str:
        lines = [f"predicted latency {self.predicted_latency_s * 1e3:.2f} ms"]
        for stage in self.stages:
            names = self.layers[stage.first].name
            if stage.last != stage.first:
                names += f" .. {self.layers[stage.last].name}"
            where = "leader + " if stage.leader else ""
            lines.append(
                f"  layers {stage.first}-{stage.last} ({names}): {stage.option} x{stage.parts} "
                f"on {where}{stage.parts - stage.leader} worker(s), "
                f"{stage.latency_s * 1e3:.2f} ms, largest shard "
                f"{max(size(p) for p in stage.shards) / 2**20:.2f} MiB"
            )
        return "\n".join(lines)


def size(shard: Shard) -> int:
    """A shard's memory: its weights and the activations it reads and writes."""
    return shard.weight_bytes + shard.in_bytes + shard.out_bytes


def _choices(
    layers: Sequence[Layer], first: int, last: int, perf: PerfModel, workers: int, limit: int,
    unit: float,
) -> Iterator[Stage]:  # fmt: skip
    """Every feasible round of layers ``first..last`` (Algorithm 1's options)."""
    group = layers[first : last + 1]
    for option in options(group):
        for parts in range(1, (workers if option != "none" else 0) + 2):
            try:
                pieces = tuple(shards(group, option, parts))
            except ValueError:  # more parts than rows or channels
                break
            if max(size(p) for p in pieces) > limit:
                continue  # a partition too large for any function
            for leader in (True, False):
                if parts - leader > workers or parts - leader < 0:
                    continue
                yield stage(group, first, option, pieces, leader, perf, unit)


def stage(
    group: Sequence[Layer], first: int, option: str, pieces: tuple[Shard, ...], leader: bool,
    perf: PerfModel, unit: float,
) -> Stage:  # fmt: skip
    """The round of ``group`` (the layers from ``first`` on) as ``pieces``, the first on the
    leader if ``leader``: its predicted latency, the workers' busy time and the leader's
    memory in units of ``unit`` bytes."""
    latency = perf.latency_s(group, pieces, leader)
    busy = perf.worker_s(group, pieces, leader)
    units = math.ceil(size(pieces[0]) / unit) if leader else 0
    last = first + len(group) - 1
    return Stage(first, last, option, len(pieces), leader, pieces, latency, units, busy)


def latency_optimal(
    layers: Sequence[Layer], perf: PerfModel, workers: int, memory_limit: int, levels: int = 64
) -> Plan:
    """The plan of least predicted latency (eq. 1) whose leader shards fit ``memory_limit``
    bytes together (eq. 2) and whose every shard fits it, with at most ``workers`` workers in
    a round; ValueError if none fits."""
    rounds = _rounds(layers, perf, workers, memory_limit, levels)
    n = len(layers)
    # L[j][m], and the stage that ends its best plan with the units left before it
    table = [[0.0] * (levels + 1)] + [[math.inf] * (levels + 1) for _ in range(n)]
    ends: list[list[tuple[Stage, int] | None]] = [[None] * (levels + 1) for _ in range(n + 1)]
    for j, m, k in itertools.product(range(1, n + 1), range(levels + 1), range(n)):
        if k >= j:
            continue
        for b, stage in enumerate(rounds[k, j - 1][: m + 1]):
            if stage is not None and table[k][m - b] + stage.latency_s < table[j][m]:
                table[j][m] = table[k][m - b] + stage.latency_s
                ends[j][m] = (stage, m - b)
    if math.isinf(table[n][levels]):
        raise ValueError(f"no plan fits {memory_limit} bytes a shard with {workers} workers")
    stages, j, m = [], n, levels
    while j > 0:
        found = ends[j][m]
        assert found is not None  # every finite entry has its last stage
        stage, m = found
        stages.append(stage)
        j = stage.first
    return Plan(tuple(layers), tuple(reversed(stages)))


def _rounds(
    layers: Sequence[Layer], perf: PerfModel, workers: int, memory_limit: int, levels: int
) -> dict[tuple[int, int], list[Stage | None]]:
    """``t(g, b)`` of Algorithm 1 for every group ``g``, with the stage that gives it: the best
    round whose leader shard takes at most ``b`` units, for each ``b``."""
    unit = memory_limit / levels
    rounds = {}
    for first, last in itertools.combinations_with_replacement(range(len(layers)), 2):
        by_units: list[Stage | None] = [None] * (levels + 1)
        for stage in _choices(layers, first, last, perf, workers, memory_limit, unit):
            if stage.leader_units <= levels and _better(stage, by_units[stage.leader_units]):
                by_units[stage.leader_units] = stage
        for b in range(1, levels + 1):
            if _better(by_units[b - 1], by_units[b]):
                by_units[b] = by_units[b - 1]
        rounds[first, last] = by_units
    return rounds


def _better(stage: Stage | None, than: Stage | None) -> bool:
    return stage is not None and (than is None or stage.latency_s < than.latency_s)


def brute_force(
    layers: Sequence[Layer],
    perf: PerfModel,
    workers: int,
    memory_limit: int,
    levels: int = 64,
    slo_s: float | None = None,
) -> Plan:
    """The same optimum by trying every grouping and every choice in each (small models); with
    ``slo_s``, the plan of least cost whose latency is within it (gillis eq. 3), the exact
    answer the SLO-aware planner approximates."""
    n, unit = len(layers), memory_limit / levels
    found: Plan | None = None
    for cuts in itertools.product((False, True), repeat=n - 1):
        edges = [0] + [k + 1 for k, cut in enumerate(cuts) if cut] + [n]
        rounds = [
            list(_choices(layers, a, b - 1, perf, workers, memory_limit, unit))
            for a, b in itertools.pairwise(edges)
        ]
        for stages in itertools.product(*rounds):
            if sum(s.leader_units for s in stages) > levels:
                continue
            plan = Plan(tuple(layers), tuple(stages))
            if slo_s is not None and plan.predicted_latency_s > slo_s:
                continue
            if found is None or _key(plan, slo_s) < _key(found, slo_s):
                found = plan
    if found is None:
        within = "" if slo_s is None else f" within {slo_s * 1e3:.3g} ms"
        raise ValueError(
            f"no plan fits {memory_limit} bytes a shard with {workers} workers{within}"
        )
    return found


def _key(plan: Plan, slo_s: float | None) -> tuple[float, float]:
    """What a search minimizes: the latency, or within an SLO the cost, then the latency."""
    if slo_s is None:
        return (plan.predicted_latency_s, 0.0)
    return (plan.cost_s, plan.predicted_latency_s)
