"""What a pool's scheduler knows of its workers and models, and what one step hands out: the
state :mod:`raysrv.batching.scheduler` and :mod:`raysrv.batching._placement` share."""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from raysrv.batching.actions import Action, Infer, Load, PlanJob, Refusal, Unload
from raysrv.batching.base import BatchingPolicy, QueuedQuery, ReplicaSlot
from raysrv.batching.profile import RunTimes

__all__ = [
    "PLAN_Q",
    "PLAN_WINDOW",
    "PREDICT_Q",
    "RATE_TAU_S",
    "_Executor",
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


class _Executor:
    """One of a worker's executors (clockwork §4.4: one per action type), as the scheduler
    knows it: the calls in flight on it and when their work should end."""

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.inflight: list[_Sent] = []
        self.open_at = -math.inf  # when the work in flight should end
        self.busy_since: float | None = None

    def counted(self) -> int:
        """Calls in flight that occupy the executor (an UNLOAD alone only updates state)."""
        return len({s.call for s in self.inflight if not isinstance(s.action, Unload)})

    def can_take(self, now: float) -> bool:
        n = self.counted()
        return n == 0 or (n < self.depth and now >= self.open_at)

    def opening(self, now: float) -> float | None:
        """When this busy executor can take more, if later than ``now`` and known."""
        n = self.counted()
        if 0 < n < self.depth and now < self.open_at < math.inf:
            return self.open_at
        return None

    def free_at(self, now: float) -> float:
        """When work sent now would start: after what is in flight, as far as predicted."""
        return max(now, self.open_at) if self.inflight and self.open_at < math.inf else now

    def sent(self, action: Action, predicted: float, now: float, call: int, start: float) -> None:
        """``action`` leaves now, to start at ``start`` or later, for ``predicted`` seconds."""
        if not self.inflight:
            self.busy_since = now
        self.inflight.append(_Sent(action, predicted, call))
        self.open_at = max(start, self.free_at(now)) + predicted

    def done(self, action: Action, now: float, ended: float = math.nan) -> None:
        """``action`` came back at ``now``, having ended on the worker at ``ended`` (NaN: not
        known): what is still in flight runs from then."""
        self.inflight = [s for s in self.inflight if s.action is not action]
        if not self.inflight:
            self.busy_since, self.open_at = None, -math.inf
        else:
            since = ended if math.isfinite(ended) and ended <= now else now
            self.open_at = since + sum(s.predicted for s in self.inflight)

    def outstanding(self, now: float) -> float:
        """Seconds of work in flight (0 when none, or when its end is not known)."""
        if not self.inflight or not math.isfinite(self.open_at):
            return 0.0
        return max(0.0, self.open_at - now)


class _Worker:
    """What the scheduler knows of one worker: the models it holds, and its two executors,
    one for INFERs and one for LOADs and UNLOADs (clockwork §4.4), each running one action at
    a time."""

    def __init__(self, index: int, depth: int) -> None:
        self.index = index
        self.infers = _Executor(depth)
        self.loads = _Executor(depth)
        self.held: dict[str, int] = {}  # model -> weight bytes, loaded or loading
        self.loading: dict[str, float] = {}  # model -> when its LOAD should end
        # model -> the LOAD last sent for it here, whose report alone says whether it is here
        self.load_of: dict[str, Load] = {}
        self.pinned: set[str] = set()
        self.last_used: dict[str, float] = {}
        self.running: collections.Counter[str] = collections.Counter()  # INFERs in flight
        self.peak_bytes = 0
        self.full_until = -math.inf  # it refused a LOAD for want of room: none until then

    @property
    def resident(self) -> int:
        return sum(self.held.values())

    @property
    def busy(self) -> bool:
        return bool(self.infers.inflight or self.loads.inflight)

    def executor(self, action: Action) -> _Executor:
        return self.infers if isinstance(action, Infer) else self.loads

    def ready_at(self, name: str, now: float) -> float:
        """When an INFER of ``name`` sent now could start: after the INFERs in flight and, if
        the model is loading here, after its LOAD."""
        return max(self.infers.free_at(now), self.loading.get(name, now))

    def slot(self, name: str, now: float, offered: bool) -> ReplicaSlot:
        """This worker as ``name``'s policy sees it (``offered``: free to take a batch)."""
        ready = self.ready_at(name, now)
        until = ready if ready > now or self.infers.inflight else None
        if offered:
            return ReplicaSlot(self.index, busy_until=until)
        running = [s.action for s in self.infers.inflight if isinstance(s.action, Infer)]
        since = now if self.infers.busy_since is None else self.infers.busy_since
        size = len(running[-1].query_ids) if running else 0
        return ReplicaSlot(self.index, since, size, until)

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
    window: dict[int, float]  # workers whose INFER executor could take work at the step's
    # start -> until when the step may fill it (the first INFER always goes)
    loadable: set[int]  # workers whose LOAD executor could take work at the step's start
    actions: list[Action] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    plans: list[PlanJob] = field(default_factory=list)
    wake: float = math.inf
    used: set[int] = field(default_factory=set)  # workers given an INFER in this step
    used_by: dict[str, set[int]] = field(default_factory=dict)  # per model
    loaded: set[int] = field(default_factory=set)  # workers given a LOAD in this step
    steady: set[str] | None = None  # held models with steady traffic, once asked

    def open_for(self, w: _Worker, model: str) -> bool:
        """Whether ``model`` may add an INFER to what ``w`` gets in this step: one per model,
        and while the call's predicted work still ends within the window."""
        if w.index not in self.window or w.index in self.used_by.get(model, ()):
            return False
        return w.index not in self.used or w.infers.open_at < self.window[w.index]

    def may_load(self, w: _Worker) -> bool:
        """Whether ``w``'s LOAD executor could take work and has none from this step."""
        return w.index in self.loadable and w.index not in self.loaded


def _ids(queue: Iterable[QueuedQuery]) -> tuple[int, ...]:
    return tuple(q.query_id for q in queue)


def _estimate(runs: RunTimes, size: int, quantile: float = PLAN_Q, default: float = 0.0) -> float:
    value = runs.estimate(size, quantile, PLAN_WINDOW)
    return default if value is None else value


def _load_estimate(runs: RunTimes, quantile: float = PLAN_Q, default: float = 0.0) -> float:
    value = runs.load_time(quantile, PLAN_WINDOW)
    return default if value is None else value
