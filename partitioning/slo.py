"""SLO-aware partitioning (Gillis, ICDCS'21, §IV-C): the plan of least cost whose predicted
latency meets an SLO (eq. 3), learned with REINFORCE by a partitioner and a placer, each a
two-layer network, trained on the performance model alone (no run of the model).

* **Partitioner** (``pi_a``): for each layer, from its features (FLOPs, weights, activations,
  the options it allows, where it sits), whether a new group starts at it; then, for each group,
  from its first layer's features, an option and a number of parts (one of :func:`choices`,
  those that do not apply to the group, or give a shard over the memory limit, masked out).
* **Placer** (``pi_b``): for each group, from its layers' mean features and the partitioner's
  choice, whether the leader takes the group's first shard.
* **Reward** (eq. 4, in ms): ``B - cost`` where the latency meets the SLO, ``SLO - latency``
  where it does not, and ``-B`` where a shard, or the leader's shards together, exceed the
  memory limit (an OOM). ``B``, the budget, is ten times the model's run on the leader alone.
* **Training** (eq. 5 and its two gradients): batches of ``batch`` episodes; each network
  ascends the mean of ``log p(its decisions) * advantage`` with Adam, the advantage the reward
  less the batch's mean, over its standard deviation. The plan returned is the cheapest one
  within the SLO seen in training or drawn greedily at the end.

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


def choices(workers: int) -> list[tuple[str, int]]:
    """Every (option, parts) a group may take with ``workers`` workers: its parts on the
    workers and perhaps one on the leader."""
    split = range(2, workers + 2)
    return [("none", 1), *(("spatial", p) for p in split), *(("channel", p) for p in split)]


@dataclass(frozen=True)
class Search:
    """What a search found: the cheapest plan within the SLO (None if none was), how many
    plans it evaluated, and the best cost within the SLO after each batch (ms; inf before
    one is found)."""

    plan: Plan | None
    evaluated: int
    best_costs_ms: tuple[float, ...]


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

    def allowed(self, first: int, last: int) -> np.ndarray:
        """The choices that apply to layers ``first..last`` and whose every shard fits the
        limit; where none does, those that apply (the plan then draws the OOM reward)."""
        pieces = [self.pieces(first, last, c) for c in range(len(self.choices))]
        applies = np.array([p is not None for p in pieces])
        fits = np.array([p is not None and max(map(size, p)) <= self.limit for p in pieces])
        return fits if fits.any() else applies

    def placements(self, choice: int) -> np.ndarray:
        """[leader takes no shard, leader takes the first]: all parts must find a place."""
        parts = self.choices[choice][1]
        return np.array([parts <= self.workers, True])

    def plan(self, groups: Sequence[tuple[int, int, int, bool]]) -> Plan:
        stages = []
        for first, last, choice, leader in groups:
            key = (first, last, choice, leader)
            if key not in self._stages:
                pieces = self.pieces(first, last, choice)
                assert pieces is not None  # masked out when drawn
                group = self.layers[first : last + 1]
                option = self.choices[choice][0]
                self._stages[key] = stage(
                    group, first, option, pieces, leader, self.perf, self.unit
                )
            stages.append(self._stages[key])
        return Plan(self.layers, tuple(stages))

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


@dataclass
class _Episode:
    cuts: list[int]  # per layer from the second: 1 if a group starts there
    groups: list[tuple[int, int, int, bool]]  # first, last, choice, leader


def _episode(
    space: _Space, partitioner: _Net, placer: _Net, pick: Callable[[np.ndarray], int]
) -> _Episode:
    """Draw one plan: ``pick`` takes a distribution and returns an action (a sample, or the
    most likely one)."""
    n, f = len(space.layers), space.features
    both = np.array([True, True])
    cuts = [pick(partitioner.probs(f[i], _CUT, both)[0]) for i in range(1, n)]
    starts = [0] + [i for i in range(1, n) if cuts[i - 1]]
    groups = []
    for first, end in zip(starts, [*starts[1:], n], strict=True):
        last = end - 1
        allowed = space.allowed(first, last)
        choice = pick(partitioner.probs(f[first], _CHOICE, allowed)[0])
        leader = bool(pick(placer.probs(_placer_input(space, first, last, choice), 0,
                                        space.placements(choice))[0]))  # fmt: skip
        groups.append((first, last, choice, leader))
    return _Episode(cuts, groups)


def _placer_input(space: _Space, first: int, last: int, choice: int) -> np.ndarray:
    onehot = np.zeros(len(space.choices))
    onehot[choice] = 1.0
    return np.concatenate([space.features[first : last + 1].mean(axis=0), onehot])


def _learn(space: _Space, partitioner: _Net, placer: _Net, episode: _Episode, adv: float) -> None:
    f = space.features
    both = np.array([True, True])
    for i, cut in enumerate(episode.cuts, start=1):
        partitioner.ascend(f[i], _CUT, both, cut, adv)
    for first, last, choice, leader in episode.groups:
        partitioner.ascend(f[first], _CHOICE, space.allowed(first, last), choice, adv)
        x = _placer_input(space, first, last, choice)
        placer.ascend(x, 0, space.placements(choice), int(leader), adv)


def _cheaper(plan: Plan, than: Plan | None) -> bool:
    return than is None or (plan.cost_s, plan.predicted_latency_s) < (
        than.cost_s,
        than.predicted_latency_s,
    )


def slo_aware(
    layers: Sequence[Layer], perf: PerfModel, workers: int, memory_limit: int, slo_s: float,
    batches: int = 150, batch: int = 32, seed: int = 0, levels: int = 64,
) -> Search:  # fmt: skip
    """The cheapest plan within ``slo_s`` that REINFORCE finds in ``batches`` batches of
    ``batch`` episodes (see the module docstring)."""
    space = _Space(layers, perf, workers, memory_limit, slo_s, levels)
    rng = np.random.default_rng(seed)
    width = space.features.shape[1]
    partitioner = _Net(width, [2, len(space.choices)], rng)
    placer = _Net(width + len(space.choices), [2], rng)
    best: Plan | None = None
    history = []
    for _ in range(batches):
        drawn = [_episode(space, partitioner, placer, lambda p: rng.choice(len(p), p=p))
                 for _ in range(batch)]  # fmt: skip
        plans = [space.plan(e.groups) for e in drawn]
        rewards = np.array([space.reward(p) for p in plans])
        for plan in plans:
            if space.within(plan) and _cheaper(plan, best):
                best = plan
        spread = rewards.std()
        if spread > 0:
            for episode, r in zip(drawn, (rewards - rewards.mean()) / spread, strict=True):
                _learn(space, partitioner, placer, episode, float(r))
            partitioner.step(1.0 / batch)
            placer.step(1.0 / batch)
        history.append(best.cost_s * 1e3 if best is not None else math.inf)
    greedy = space.plan(_episode(space, partitioner, placer, lambda p: int(np.argmax(p))).groups)
    if space.within(greedy) and _cheaper(greedy, best):
        best = greedy
    return Search(best, batches * batch + 1, tuple(history))


def random_search(
    layers: Sequence[Layer], perf: PerfModel, workers: int, memory_limit: int, slo_s: float,
    samples: int, seed: int = 0, batch: int = 32, levels: int = 64,
) -> Search:  # fmt: skip
    """The cheapest plan within ``slo_s`` of ``samples`` drawn uniformly: each boundary a cut
    with probability 1/2, each group's choice and placement uniform among those allowed."""
    space = _Space(layers, perf, workers, memory_limit, slo_s, levels)
    rng = np.random.default_rng(seed)
    n = len(space.layers)
    best: Plan | None = None
    history = []
    for k in range(samples):
        cuts = rng.integers(0, 2, n - 1)
        starts = [0] + [i for i in range(1, n) if cuts[i - 1]]
        groups = []
        for first, end in zip(starts, [*starts[1:], n], strict=True):
            choice = int(rng.choice(np.flatnonzero(space.allowed(first, end - 1))))
            leader = bool(rng.choice(np.flatnonzero(space.placements(choice))))
            groups.append((first, end - 1, choice, leader))
        plan = space.plan(groups)
        if space.within(plan) and _cheaper(plan, best):
            best = plan
        if (k + 1) % batch == 0:
            history.append(best.cost_s * 1e3 if best is not None else math.inf)
    return Search(best, samples, tuple(history))
