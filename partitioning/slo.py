"""SLO-aware partitioning (Gillis, ICDCS'21, §IV-C): the plan of least cost whose predicted
latency meets an SLO (eq. 3), learned with REINFORCE by a partitioner and a placer, each a
two-layer network, trained on the performance model alone (no run of the model).

* **Partitioner** (``pi_a``): layer by layer, whether the group so far ends before this layer;
  for each group ended, an option and a number of parts (one of :func:`choices`; those that do
  not apply to the group, give a shard over the memory limit or have no placement are masked
  out).
* **Placer** (``pi_b``): for each group, whether the leader takes its first shard (masked out
  where that shard would not fit what is left of the leader's memory, or where the parts
  outnumber the workers without it).
* Every decision sees the layer's features (FLOPs, weights, activations, the options it
  allows, where it sits), its group's so far, the leader's memory used and the latency
  predicted so far against the SLO: the plan is drawn as a sequence, each network two layers.
* **Reward** (eq. 4, in ms): ``B - cost`` where the latency meets the SLO, ``SLO - latency``
  where it does not, and ``-B`` where a shard, or the leader's shards together, exceed the
  memory limit (left only where no choice fits). ``B``, the budget, is ten times the model's
  run on the leader alone.
* **Training** (eq. 5 and its two gradients): batches of ``batch`` episodes; each network
  ascends the mean of ``log p(its decisions) * advantage`` with Adam, the advantage the rank of
  the episode's reward in its batch, centred (:func:`_advantages`: a cheaper plan within the
  SLO then weighs as much as meeting it). The plan returned is the cheapest one within the SLO
  seen in training or drawn greedily at the end, with the next cheapest as candidates for a
  planner that measures them (:func:`.planner.plan`).

:func:`random_search` draws as many plans uniformly from the same space, the baseline the
learned policy must beat; :func:`.latency.brute_force` with ``slo_s`` gives the exact optimum on
small models. Measured: bench/RESULTS.md, "Partitioned models".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from raysrv.partitioning.graph import Layer, options
from raysrv.partitioning.latency import Plan, Stage, size, stage
from raysrv.partitioning.perf import PerfModel
from raysrv.partitioning.shards import Shard, shards

__all__ = ["Search", "choices", "random_search", "slo_aware"]

HIDDEN = 32  # units of each network's hidden layer
LEARNING_RATE = 0.005
BUDGET_RUNS = 10.0  # B of eq. 4, in runs of the whole model on the leader
KEPT = 8  # the cheapest different plans within the SLO a search returns


def choices(workers: int) -> list[tuple[str, int]]:
    """Every (option, parts) a group may take with ``workers`` workers: its parts on the
    workers and perhaps one on the leader."""
    split = range(2, workers + 2)
    return [("none", 1), *(("spatial", p) for p in split), *(("channel", p) for p in split)]


@dataclass(frozen=True)
class Search:
    """What a search found: the cheapest plan within the SLO (None if none was), how many
    plans it evaluated, the best cost within the SLO after each batch (ms; inf before one is
    found), and the ``KEPT`` cheapest different plans within the SLO, cheapest first."""

    plan: Plan | None
    evaluated: int
    best_costs_ms: tuple[float, ...]
    candidates: tuple[Plan, ...] = ()


class _Kept:
    """The cheapest different plans within the SLO seen so far, at most ``KEPT``."""

    def __init__(self, space: _Space) -> None:
        self._space = space
        self._plans: dict[tuple[tuple[int, int, str, int, bool], ...], Plan] = {}

    def offer(self, plan: Plan) -> None:
        if not self._space.within(plan):
            return
        shape = tuple((s.first, s.last, s.option, s.parts, s.leader) for s in plan.stages)
        self._plans[shape] = plan
        if len(self._plans) > KEPT:
            dearest = max(self._plans.items(), key=lambda kv: _order(kv[1]))
            del self._plans[dearest[0]]

    @property
    def best(self) -> Plan | None:
        return min(self._plans.values(), key=_order, default=None)

    def cost_ms(self) -> float:
        best = self.best
        return best.cost_s * 1e3 if best is not None else math.inf

    def search(self, evaluated: int, history: list[float]) -> Search:
        kept = tuple(sorted(self._plans.values(), key=_order))
        return Search(kept[0] if kept else None, evaluated, tuple(history), kept)


class _Space:
    """The plans of one model, machine and limits, with their rewards; stages cached."""

    def __init__(
        self, layers: Sequence[Layer], perf: PerfModel, workers: int, memory_limit: int,
        slo_s: float, levels: int,
    ) -> None:  # fmt: skip
        self.layers, self.perf, self.workers = tuple(layers), perf, workers
        self.limit, self.slo_ms = memory_limit, slo_s * 1e3
        self.levels, self.unit = levels, memory_limit / levels
        self.choices = choices(workers)
        self._pieces: dict[tuple[int, int, int], tuple[Shard, ...] | None] = {}
        self._stages: dict[tuple[int, int, int, bool], Stage] = {}
        alone = sum(perf.run_s([layer], shards([layer], "none", 1)[0]) for layer in layers)
        self.budget_ms = BUDGET_RUNS * alone * 1e3
        self.features = _layer_features(self.layers, memory_limit)

    def pieces(self, first: int, last: int, choice: int) -> tuple[Shard, ...] | None:
        """The shards of layers ``first..last`` under ``choice``; None where it does not apply."""
        key = (first, last, choice)
        if key not in self._pieces:
            option, parts = self.choices[choice]
            group = self.layers[first : last + 1]
            found = None
            if option in options(group):
                try:
                    found = tuple(shards(group, option, parts))
                except ValueError:  # more parts than rows or channels
                    found = None
            self._pieces[key] = found
        return self._pieces[key]

    def stage(self, first: int, last: int, choice: int, leader: bool) -> Stage:
        key = (first, last, choice, leader)
        if key not in self._stages:
            pieces = self.pieces(first, last, choice)
            assert pieces is not None  # masked out when drawn
            group = self.layers[first : last + 1]
            option = self.choices[choice][0]
            self._stages[key] = stage(group, first, option, pieces, leader, self.perf, self.unit)
        return self._stages[key]

    def placements(self, first: int, last: int, choice: int, used: int) -> np.ndarray:
        """[the leader takes no shard, it takes the first]: every part must find a worker,
        and the leader's shard must fit what is left of its memory (``used`` units taken)."""
        parts = self.choices[choice][1]
        fits = used + self.stage(first, last, choice, True).leader_units <= self.levels
        return np.array([parts <= self.workers, fits])

    def allowed(self, first: int, last: int, used: int) -> np.ndarray:
        """The choices that apply to layers ``first..last``, whose every shard fits the limit
        and which have a placement; where none does, the best-effort fallbacks (the plan then
        draws the OOM reward)."""
        pieces = [self.pieces(first, last, c) for c in range(len(self.choices))]
        applies = np.array([p is not None for p in pieces])
        fits = np.array([p is not None and max(map(size, p)) <= self.limit for p in pieces])
        placed = np.array(
            [ok and self.placements(first, last, c, used).any() for c, ok in enumerate(fits)]
        )
        return next(mask for mask in (placed, fits, applies) if mask.any())

    def plan(self, groups: Sequence[tuple[int, int, int, bool]]) -> Plan:
        return Plan(self.layers, tuple(self.stage(*group) for group in groups))

    def fits(self, plan: Plan) -> bool:
        """Every shard within the limit, and the leader's within it together (eq. 2, counted
        in the DP's units)."""
        leader = sum(s.leader_units for s in plan.stages)
        return plan.largest_shard_bytes <= self.limit and leader <= self.levels

    def reward(self, plan: Plan) -> float:
        """Eq. 4 in ms, and ``-B`` for a plan that does not fit."""
        if not self.fits(plan):
            return -self.budget_ms
        latency_ms = plan.predicted_latency_s * 1e3
        if latency_ms <= self.slo_ms:
            return self.budget_ms - plan.cost_s * 1e3
        return self.slo_ms - latency_ms

    def within(self, plan: Plan) -> bool:
        return self.fits(plan) and plan.predicted_latency_s * 1e3 <= self.slo_ms


def _layer_features(layers: Sequence[Layer], memory_limit: int) -> np.ndarray:
    """One row per layer, every column in about [0, 1]."""

    def scaled(values: list[float]) -> np.ndarray:
        logs = np.log1p(np.asarray(values, dtype=float))
        return logs / max(1.0, float(logs.max()))

    n = len(layers)
    in_bytes = [float(np.prod(layer.in_shape)) for layer in layers]
    out_bytes = [float(np.prod(layer.out_shape)) for layer in layers]
    columns = [
        scaled([layer.flops for layer in layers]),
        scaled([layer.weight_bytes for layer in layers]),
        scaled(in_bytes),
        scaled(out_bytes),
        np.array([min(4.0, layer.weight_bytes / memory_limit) / 4.0 for layer in layers]),
        np.array([float("spatial" in options([layer])) for layer in layers]),
        np.array([float("channel" in options([layer])) for layer in layers]),
        np.arange(n) / max(1, n - 1),
        np.ones(n),
    ]
    return np.stack(columns, axis=1)


class _Net:
    """A two-layer network (tanh hidden layer) with softmax heads, trained by Adam."""

    def __init__(self, inputs: int, heads: Sequence[int], rng: np.random.Generator) -> None:
        self.params = {"hidden_w": rng.normal(0.0, 1.0 / math.sqrt(inputs), (HIDDEN, inputs))}
        self.params["hidden_b"] = np.zeros(HIDDEN)
        for k, actions in enumerate(heads):
            self.params[f"head{k}_w"] = rng.normal(0.0, 0.1 / math.sqrt(HIDDEN), (actions, HIDDEN))
            self.params[f"head{k}_b"] = np.zeros(actions)
        self._m = {k: np.zeros_like(v) for k, v in self.params.items()}
        self._v = {k: np.zeros_like(v) for k, v in self.params.items()}
        self._t = 0
        self.grads = {k: np.zeros_like(v) for k, v in self.params.items()}

    def probs(self, x: np.ndarray, head: int, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The head's distribution over its allowed actions, and the hidden layer."""
        hidden = np.tanh(self.params["hidden_w"] @ x + self.params["hidden_b"])
        logits = self.params[f"head{head}_w"] @ hidden + self.params[f"head{head}_b"]
        logits = np.where(mask, logits, -np.inf)
        p = np.exp(logits - logits[mask].max())
        return p / p.sum(), hidden

    def ascend(
        self, x: np.ndarray, head: int, mask: np.ndarray, action: int, weight: float
    ) -> None:
        """Add ``weight * grad log p(action)`` to the gradients."""
        p, hidden = self.probs(x, head, mask)
        dz = -p
        dz[action] += 1.0
        dz *= weight
        self.grads[f"head{head}_w"] += np.outer(dz, hidden)
        self.grads[f"head{head}_b"] += dz
        dpre = (self.params[f"head{head}_w"].T @ dz) * (1.0 - hidden**2)
        self.grads["hidden_w"] += np.outer(dpre, x)
        self.grads["hidden_b"] += dpre

    def step(self, scale: float) -> None:
        """One Adam step up the gradients gathered (times ``scale``), which it then clears."""
        self._t += 1
        for k, grad in self.grads.items():
            g = grad * scale
            self._m[k] = 0.9 * self._m[k] + 0.1 * g
            self._v[k] = 0.999 * self._v[k] + 0.001 * g * g
            m_hat = self._m[k] / (1 - 0.9**self._t)
            v_hat = self._v[k] / (1 - 0.999**self._t)
            self.params[k] += LEARNING_RATE * m_hat / (np.sqrt(v_hat) + 1e-8)
            grad[...] = 0.0


_CUT, _CHOICE = 0, 1  # the partitioner's heads
_BOTH = np.array([True, True])


@dataclass
class _Episode:
    """One plan drawn: its groups (first, last, choice, leader) and every decision taken
    on the way (the network, its input, head, mask and the action)."""

    groups: list[tuple[int, int, int, bool]]
    decisions: list[tuple[_Net, np.ndarray, int, np.ndarray, int]]


def _episode(
    space: _Space, partitioner: _Net, placer: _Net, pick: Callable[[np.ndarray], int]
) -> _Episode:
    """Draw one plan layer by layer: at each layer whether a group ends before it, and for
    each group ended its choice and placement, every decision seeing the leader's memory used
    and the latency predicted so far. ``pick`` takes a distribution and returns an action (a
    sample, the most likely, or any allowed one)."""
    n, f = len(space.layers), space.features
    episode = _Episode([], [])
    used, latency = 0, 0.0

    def decide(net: _Net, x: np.ndarray, head: int, mask: np.ndarray) -> int:
        action = pick(net.probs(x, head, mask)[0])
        episode.decisions.append((net, x, head, mask, action))
        return action

    def state(k: int, first: int, last: int) -> np.ndarray:
        running = [used / space.levels, latency * 1e3 / space.slo_ms, (last - first + 1) / n]
        return np.concatenate([f[k], f[first : last + 1].mean(axis=0), running])

    def close(first: int, last: int) -> None:
        nonlocal used, latency
        x = state(last, first, last)
        choice = decide(partitioner, x, _CHOICE, space.allowed(first, last, used))
        onehot = np.eye(len(space.choices))[choice]
        placements = space.placements(first, last, choice, used)
        leader = bool(
            decide(placer, np.concatenate([x, onehot]), 0, placements | ~placements.any())
        )
        chosen = space.stage(first, last, choice, leader)
        used += chosen.leader_units
        latency += chosen.latency_s
        episode.groups.append((first, last, choice, leader))

    start = 0
    for i in range(1, n):
        if decide(partitioner, state(i, start, i - 1), _CUT, _BOTH):
            close(start, i - 1)
            start = i
    close(start, n - 1)
    return episode


def _order(plan: Plan) -> tuple[float, float]:
    """Cheaper first, then faster."""
    return plan.cost_s, plan.predicted_latency_s


def _advantages(rewards: np.ndarray) -> np.ndarray:
    """Each episode's advantage over its batch: its reward's rank, centred and scaled to
    [-1/2, 1/2] (ties share their mean rank), so that a cheaper plan within the SLO counts as
    much against another as meeting the SLO does against missing it, whatever eq. 4's scale."""
    order = np.argsort(np.argsort(rewards, kind="stable"), kind="stable").astype(float)
    for value in np.unique(rewards):
        tied = rewards == value
        order[tied] = order[tied].mean()
    return order / (len(rewards) - 1) - 0.5


def _nets(space: _Space, rng: np.random.Generator) -> tuple[_Net, _Net]:
    """The partitioner (heads: cut, choice) and the placer (head: leader), untrained."""
    width = 2 * space.features.shape[1] + 3  # a layer, its group so far, the running state
    partitioner = _Net(width, [2, len(space.choices)], rng)
    return partitioner, _Net(width + len(space.choices), [2], rng)


def slo_aware(
    layers: Sequence[Layer], perf: PerfModel, workers: int, memory_limit: int, slo_s: float,
    batches: int = 150, batch: int = 32, seed: int = 0, levels: int = 64,
) -> Search:  # fmt: skip
    """The cheapest plan within ``slo_s`` that REINFORCE finds in ``batches`` batches of
    ``batch`` episodes (see the module docstring)."""
    space = _Space(layers, perf, workers, memory_limit, slo_s, levels)
    rng = np.random.default_rng(seed)
    partitioner, placer = _nets(space, rng)

    def sample(p: np.ndarray) -> int:
        return int(rng.choice(len(p), p=p))

    kept = _Kept(space)
    history = []
    for _ in range(batches):
        drawn = [_episode(space, partitioner, placer, sample) for _ in range(batch)]
        plans = [space.plan(e.groups) for e in drawn]
        rewards = np.array([space.reward(p) for p in plans])
        for plan in plans:
            kept.offer(plan)
        if np.ptp(rewards) > 0:
            for episode, r in zip(drawn, _advantages(rewards), strict=True):
                for net, x, head, mask, action in episode.decisions:
                    net.ascend(x, head, mask, action, float(r))
            partitioner.step(1.0 / batch)
            placer.step(1.0 / batch)
        history.append(kept.cost_ms())
    greedy = _episode(space, partitioner, placer, lambda p: int(np.argmax(p)))
    kept.offer(space.plan(greedy.groups))
    return kept.search(batches * batch + 1, history)


def random_search(
    layers: Sequence[Layer], perf: PerfModel, workers: int, memory_limit: int, slo_s: float,
    samples: int, seed: int = 0, batch: int = 32, levels: int = 64,
) -> Search:  # fmt: skip
    """The cheapest plan within ``slo_s`` of ``samples`` drawn as REINFORCE draws them, with
    every decision uniform among those allowed (the same masks, no learning)."""
    space = _Space(layers, perf, workers, memory_limit, slo_s, levels)
    rng = np.random.default_rng(seed)
    partitioner, placer = _nets(space, rng)  # their masks only: every allowed action alike

    def uniform(p: np.ndarray) -> int:
        return int(rng.choice(np.flatnonzero(p > 0)))

    kept = _Kept(space)
    history = []
    for k in range(samples):
        kept.offer(space.plan(_episode(space, partitioner, placer, uniform).groups))
        if (k + 1) % batch == 0:
            history.append(kept.cost_ms())
    return kept.search(samples, history)
