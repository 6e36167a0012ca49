"""The batching policy interface: a pure decision core the batcher loop consults.

A policy sees a snapshot of one model's queue and the workers holding the model
(:class:`BatcherView`) and answers with one :class:`Decision`: dispatch some queries to a free
worker, wait until a time (or the next event), or reject queries with a reason. After each batch
the pool's scheduler (:mod:`raysrv.batching.scheduler`) hands the measured outcome to
:meth:`BatchingPolicy.observe`. Run times are read from ``policy.runs``, the model's one record
of them (:class:`~raysrv.batching.profile.RunTimes`), which the scheduler writes after the policy
has observed the outcome; a policy never writes it. Policies never read a clock, sleep or call
Ray: ``view.now`` is the time, which makes every policy testable with a fake clock.

The scheduler calls :meth:`BatchingPolicy.decide` again right after acting on a dispatch or a
reject, and after every arrival, completion or expired wait of the model, and whenever a worker
holding it can take work, so a policy answers one step at a time. A ``Wait`` while a worker is
free leaves that worker to other models of the pool.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from pydantic import BaseModel, ConfigDict

from raysrv.batching.profile import RunTimes

__all__ = [
    "BatchOutcome",
    "BatcherView",
    "BatchingPolicy",
    "Decision",
    "Dispatch",
    "PolicyParams",
    "QueuedQuery",
    "Reject",
    "ReplicaSlot",
    "Wait",
]


class PolicyParams(BaseModel):
    """Base of every policy's parameters: immutable, validated, unknown keys rejected."""

    model_config = ConfigDict(frozen=True, extra="forbid")


@dataclass(frozen=True, slots=True)
class QueuedQuery:
    """What a policy knows of one waiting query (metadata only, never the payload)."""

    query_id: int
    arrival: float
    deadline: float = math.inf
    priority: int = 0


@dataclass(frozen=True, slots=True)
class ReplicaSlot:
    """One replica of the model: free when ``busy_since`` is None, else running one batch.

    ``busy_until`` is when the work already sent to it should be done (predicted from measured
    run times), None when it has none: a batch sent now starts at ``max(now, busy_until)``. A
    replica can be free and still have work in flight: the batcher sends the next batch one
    predicted run time ahead (``pipeline_depth``).
    """

    index: int
    busy_since: float | None = None
    batch_size: int = 0
    busy_until: float | None = None

    @property
    def free(self) -> bool:
        return self.busy_since is None

    def start_time(self, now: float) -> float:
        """When a batch sent to this replica now would start running."""
        return now if self.busy_until is None else max(now, self.busy_until)


@dataclass(frozen=True, slots=True)
class BatcherView:
    """A snapshot of one model's batcher: the queue in arrival order, the replicas and the time.

    ``concurrency``: the most requests that were inside the ingress at once lately, queued
    or not (0 where unknown, as in simulation). Each batch costs the ingress's event loop work
    whatever its size, and a policy may hold a batch until about that many wait
    (``busy_timeout_ms``).

    ``kept``: for a batch of ``n``, the seconds its worker keeps between the batch's latest
    start and its earliest deadline (the run at the machine's present speed and the answer's
    way back, :class:`~raysrv.batching.scheduler.PoolScheduler`; None: none kept, as in
    simulation). A batch held past that start is refused by its worker unrun."""

    now: float
    queue: Sequence[QueuedQuery]
    replicas: Sequence[ReplicaSlot]
    concurrency: int = 0
    kept: Callable[[int], float] | None = None

    def free_replica(self) -> int | None:
        """Index of the first free replica, or None when all are busy."""
        return next((r.index for r in self.replicas if r.free), None)


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Run these queries (by id) as one batch on replica ``replica``, which must be free."""

    query_ids: tuple[int, ...]
    replica: int
    # When the policy expects it to start (None: as the replica's start_time says); not part of
    # what the decision is.
    expected_start: float | None = field(default=None, compare=False)
    # Sent to measure the model again, its estimates being in doubt: the worker may start it
    # until its earliest deadline less the answer's way back, whatever the estimates say.
    probe: bool = field(default=False, compare=False)


@dataclass(frozen=True, slots=True)
class Wait:
    """Do nothing until ``until`` (clock seconds) or the next arrival or completion."""

    until: float | None = None


@dataclass(frozen=True, slots=True)
class Reject:
    """Refuse these queries now, before any work is spent on them, telling callers why."""

    query_ids: tuple[int, ...]
    reason: str


Decision = Dispatch | Wait | Reject


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    """What happened to one dispatched batch; ``duration`` is the replica's measured run time.

    ``expected_start`` is when the batch was expected to start as it left (the dispatch's own,
    else the replica's ``start_time`` then), None when unknown; ``finished`` is when its answers
    were back; ``ended`` when the replica finished running it, None when unknown.
    """

    size: int
    replica: int
    dispatched: float
    finished: float
    duration: float
    ok: bool = True
    expected_start: float | None = None
    ended: float | None = None


class BatchingPolicy(ABC):
    """Decides, for one model, when to cut which batch for which replica.

    Subclasses declare ``name``, a ``Params`` model (validated from the config's ``params``) and
    implement :meth:`decide`; :meth:`observe` is optional. ``slo_s`` is the model's default
    latency objective in seconds, which adaptive policies aim at.
    """

    name: ClassVar[str] = ""
    Params: ClassVar[type[PolicyParams]] = PolicyParams

    def __init__(self, params: PolicyParams, slo_s: float) -> None:
        self.params = params
        self.slo_s = slo_s
        self.runs = RunTimes()
        self.runs.require(self.run_window())
        self.shared = False  # replicas to itself until bound to a shared pool (``bind``)

    def bind(self, runs: RunTimes, *, shared: bool = False) -> None:
        """Read run times from ``runs`` from now on: the scheduler's record of this model;
        ``shared``: its replicas also run other models' batches (a pool that loads models on
        demand)."""
        runs.require(self.run_window())
        self.runs = runs
        self.shared = shared

    def run_window(self) -> int:
        """Durations per batch size this policy reads from ``runs`` (default: one)."""
        return 1

    @abstractmethod
    def decide(self, view: BatcherView) -> Decision:
        """Answer one step for ``view``: dispatch, wait or reject."""

    def observe(self, outcome: BatchOutcome) -> None:  # noqa: B027 - optional hook
        """Learn from a finished batch (default: nothing)."""

    def profile_sizes(self) -> tuple[int, ...]:
        """Batch sizes, smallest first, to run on every replica before the first query
        (clockwork §4: "a brief profiling step to produce a seed estimate for model execution
        times"); each measured run time goes to ``runs``. Default: none, and the model is not
        profiled."""
        return ()

    def plan_request(self, now: float) -> Callable[[], object] | None:
        """A planning job due now, or None (default: never).

        Slow planning (an analytic model over a grid) must not stall the batching loop: the
        policy copies what it needs here, and the caller runs the returned job (the live
        batcher in a worker thread, the simulator inline) and hands its result to
        :meth:`apply_plan` on the loop.
        """
        return None

    def apply_plan(self, plan: object) -> None:  # noqa: B027 - optional hook
        """Adopt the result of a job from :meth:`plan_request` (default: nothing)."""

    @property
    def max_batch_size(self) -> int:
        """The largest batch the policy would cut now (reported in metrics and plans)."""
        return 1

    def describe(self) -> dict[str, object]:
        """The policy's current settings, for ``GET /v1/models``."""
        return {
            "policy": self.name,
            "params": self.params.model_dump(),
            "max_batch_size": self.max_batch_size,
        }
