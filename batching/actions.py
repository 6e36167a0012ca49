"""The actions a pool's scheduler sends its workers, and what comes back (Clockwork, OSDI'20,
§4.4): ``LOAD`` a model's weights, ``UNLOAD`` them, ``INFER`` a batch, each with the latest
moment a worker may start it; the refusals a step answers without work; a step's whole answer.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from raysrv.batching.base import BatchingPolicy

__all__ = [
    "COLD_DOOMED",
    "LATE_START",
    "NOT_LOADED",
    "NO_ROOM",
    "Action",
    "ActionResult",
    "Infer",
    "Load",
    "PlanJob",
    "QueueFull",
    "Refusal",
    "Step",
    "Unload",
]

COLD_DOOMED = "cannot meet deadline (cold start)"
LATE_START = "deadline passed before the batch could start"  # a worker refused it (its window)
NOT_LOADED = "not_loaded"  # ActionResult.error of an INFER the worker had no model for
NO_ROOM = "no_room"  # ActionResult.error of a LOAD the worker had no room for (not run)


@dataclass(frozen=True, slots=True)
class Infer:
    """Run ``query_ids`` of ``model`` as one batch on ``worker``; start by ``latest``."""

    worker: int
    model: str
    query_ids: tuple[int, ...]
    sent: float
    expected_start: float
    latest: float


@dataclass(frozen=True, slots=True)
class Load:
    """Bring ``model``'s weights into ``worker``; start by ``latest`` or not at all."""

    worker: int
    model: str
    sent: float
    expected_start: float
    latest: float
    weight_bytes: int | None


@dataclass(frozen=True, slots=True)
class Unload:
    """Drop ``model`` from ``worker``: to make room (``evicted``) or because it was removed."""

    worker: int
    model: str
    sent: float
    evicted: bool = True


Action = Infer | Load | Unload


@dataclass(frozen=True, slots=True)
class Refusal:
    """Queries answered without work: ``error`` is ``rejected`` (they cannot be served in
    time), ``failed`` (their model cannot be loaded) or ``removed`` (their model is gone)."""

    model: str
    query_ids: tuple[int, ...]
    reason: str
    error: str = "rejected"


@dataclass(frozen=True, slots=True)
class ActionResult:
    """What a worker reported for one action. ``ran`` is False when it did not start it
    (outside its window, the model was not loaded, or no room for a LOAD); ``ok`` is False
    when it ran and failed.
    ``size``: queries an INFER actually ran (callers may have left since it was chosen).
    ``finished``: when the report reached the scheduler; ``started`` and ``ended``: when the
    worker ran the action (clockwork §5.2: results carry "start and end times"), on the
    scheduler's clock, NaN when not known."""

    action: Action
    finished: float
    ran: bool = True
    ok: bool = True
    duration: float = math.nan
    size: int | None = None
    weight_bytes: int | None = None
    error: str = ""
    started: float = math.nan
    ended: float = math.nan


@dataclass(frozen=True, slots=True)
class PlanJob:
    """A policy's planning job (``plan_request``), to run off the scheduling loop."""

    model: str
    policy: BatchingPolicy
    job: Callable[[], object]


@dataclass(frozen=True, slots=True)
class Step:
    actions: tuple[Action, ...]
    refusals: tuple[Refusal, ...]
    wake_at: float | None  # call step again by then, or at the next submit / result
    plans: tuple[PlanJob, ...] = ()


class QueueFull(Exception):
    """A model's queue holds ``max_queue`` queries."""
