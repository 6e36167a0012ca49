"""What a pool's scheduler knows of its workers and models, and what one step hands out: the
state :mod:`raysrv.batching.scheduler` and :mod:`raysrv.batching._placement` share."""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from raysrv.batching.actions import Action, Infer, PlanJob, Refusal, Unload
from raysrv.batching.base import BatchingPolicy, QueuedQuery, ReplicaSlot
from raysrv.batching.profile import RunTimes

__all__ = [
    "PLAN_Q",
    "PLAN_WINDOW",
    "PREDICT_Q",
    "RATE_TAU_S",
    "_Model",
    "_Out",
    "_Worker",
]

PLAN_Q, PLAN_WINDOW = 0.99, 10  # the run-time estimates of refusals and load priorities
PREDICT_Q = 0.5  # when work in flight should end
RATE_TAU_S = 1.0  # the time constant of each model's arrival rate


@dataclass(slots=True)
class _Sent:
    action: Action
    predicted: float
    call: int  # the step that sent it: a step's actions for one worker travel as one call


class _Worker:
    """What the scheduler knows of one worker: the models it holds and its work in flight."""

    def __init__(self, index: int, depth: int) -> None:
        self.index = index
        self.depth = depth
        self.held: dict[str, int] = {}  # model -> weight bytes, loaded or loading
        self.loading: set[str] = set()
        self.pinned: set[str] = set()
        self.last_used: dict[str, float] = {}
        self.running: collections.Counter[str] = collections.Counter()  # INFERs in flight
        self.inflight: list[_Sent] = []
        self.open_at = -math.inf  # when the work in flight should end
        self.busy_since: float | None = None
        self.peak_bytes = 0

    @property
    def resident(self) -> int:
        return sum(self.held.values())

    def counted(self) -> int:
        """Calls in flight that occupy the worker (an UNLOAD alone only updates its state)."""
        return len({s.call for s in self.inflight if not isinstance(s.action, Unload)})

    def can_take(self, now: float) -> bool:
        n = self.counted()
        return n == 0 or (n < self.depth and now >= self.open_at)

    def opening(self, now: float) -> float | None:
        """When this busy worker can take more, if later than ``now`` and known."""
        n = self.counted()
        if 0 < n < self.depth and now < self.open_at < math.inf:
            return self.open_at
        return None

    def sent(self, action: Action, predicted: float, now: float, call: int) -> None:
        if not self.inflight:
            self.busy_since = now
        base = now if not self.inflight else max(now, self.open_at)
        self.inflight.append(_Sent(action, predicted, call))
        self.open_at = base + predicted

    def done(self, action: Action, now: float) -> None:
        """``action`` came back at ``now``: what is still in flight runs from now."""
        self.inflight = [s for s in self.inflight if s.action is not action]
        if not self.inflight:
            self.busy_since, self.open_at = None, -math.inf
        else:
            self.open_at = now + sum(s.predicted for s in self.inflight)

    def slot(self, now: float, offered: bool) -> ReplicaSlot:
        until = self.open_at if self.inflight and math.isfinite(self.open_at) else None
        if offered:
            return ReplicaSlot(self.index, busy_until=until)
        sizes = [len(s.action.query_ids) for s in self.inflight if isinstance(s.action, Infer)]
        busy_since = now if self.busy_since is None else self.busy_since
        return ReplicaSlot(self.index, busy_since, sizes[-1] if sizes else 0, until)

    def evictable(self, models: dict[str, _Model]) -> list[str]:
        """Held models no queued query needs, least recently used first."""
        idle = [
            name
            for name in self.held
            if name not in self.pinned
            and name not in self.loading
            and not self.running[name]
            and not (name in models and models[name].queue)
        ]
        return sorted(idle, key=lambda name: self.last_used.get(name, -math.inf))


@dataclass(slots=True)
class _Model:
    name: str
    policy: BatchingPolicy
    runs: RunTimes
    weight_bytes: int | None
    max_queue: int
    queue: list[QueuedQuery] = field(default_factory=list)
    dirty: bool = True
    wake: float = math.inf
    planning: bool = False
    failed_until: float = -math.inf
    error: str = ""
    loads: int = 0
    evictions: int = 0
    cold_starts: int = 0
    batches: int = 0
    batched: int = 0
    rate: float = 0.0  # arrivals per second, decayed with RATE_TAU_S, as of ``seen``
    seen: float = -math.inf

    def arrived(self, t: float) -> None:
        """A query arrived at ``t``: one more in the decayed count."""
        self.rate = self.rate_at(t) + 1.0 / RATE_TAU_S
        self.seen = t

    def rate_at(self, now: float) -> float:
        return self.rate * math.exp(-(now - self.seen) / RATE_TAU_S) if self.rate else 0.0


@dataclass(slots=True)
class _Out:
    """What one step decides, and which workers it has given work to."""

    call: int  # the step's number: its actions for one worker form one call
    window: dict[int, float]  # workers that could take work at the step's start -> until when
    # the step may fill them (the first action always goes)
    actions: list[Action] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    plans: list[PlanJob] = field(default_factory=list)
    wake: float = math.inf
    used: set[int] = field(default_factory=set)  # workers given an action in this step
    used_by: dict[str, set[int]] = field(default_factory=dict)  # per model
    steady: set[str] | None = None  # held models with steady traffic, once asked

    def open_for(self, w: _Worker, model: str) -> bool:
        """Whether ``model`` may add an INFER to what ``w`` gets in this step: one per model,
        and while the call's predicted work still ends within the window."""
        if w.index not in self.window or w.index in self.used_by.get(model, ()):
            return False
        return w.index not in self.used or w.open_at < self.window[w.index]

    def fresh(self, w: _Worker) -> bool:
        """Whether ``w`` could take work and has none from this step (for a LOAD)."""
        return w.index in self.window and w.index not in self.used


def _outstanding(w: _Worker, now: float) -> float:
    """Seconds of work in flight on ``w`` (0 when none, or when its end is not known)."""
    if not w.inflight or not math.isfinite(w.open_at):
        return 0.0
    return max(0.0, w.open_at - now)


def _ids(queue: Iterable[QueuedQuery]) -> tuple[int, ...]:
    return tuple(q.query_id for q in queue)


def _estimate(runs: RunTimes, size: int, quantile: float = PLAN_Q, default: float = 0.0) -> float:
    value = runs.estimate(size, quantile, PLAN_WINDOW)
    return default if value is None else value


def _load_estimate(runs: RunTimes, quantile: float = PLAN_Q, default: float = 0.0) -> float:
    value = runs.load_time(quantile, PLAN_WINDOW)
    return default if value is None else value
