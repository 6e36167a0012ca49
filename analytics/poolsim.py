"""A discrete-event simulation of a worker pool, driven by the live system's own scheduler.

:func:`simulate_pool` runs :class:`raysrv.batching.scheduler.PoolScheduler`, the code that
schedules a live pool, against simulated workers: it submits each query at its arrival time,
calls ``step`` after every arrival, result or requested wake-up, carries the returned actions
out on simulated workers and reports each result back. Only the workers are simulated, as the
live ones run: two executors each (clockwork §4.4), one for INFERs and one for LOADs and
UNLOADs, each running its actions one at a time in the order they were sent; an action sent
while its executor has work starts right behind it, and an INFER of a model whose LOAD it
waits for starts when the LOAD ends (each after a handoff: :class:`Legs`). The actions a step
gives one executor of a worker travel as one call, as the live pool sends them, and their
results come back together after the last one ends. An INFER of k queries runs for
``service(k)`` seconds, a LOAD for the model's ``load_s`` and an UNLOAD for its ``unload_s``; a
LOAD or UNLOAD changes what the worker holds when it starts, and an action that would start
after its ``latest`` is not run (§4.4): an INFER's queries then go back to the scheduler's
queue once, as the live pool queues them again, and are refused if their second batch is late
too.
``hop_s`` is how long a call takes to reach its worker and its results to come back: a round
trip in seconds (half each way), or a function drawing each call's :class:`Legs` (close over a
``numpy.random.Generator`` for legs measured live).

:func:`simulate_closed_loop` feeds the same pool from clients instead of arrival times: each
sends its next query as its last one is answered or refused.

A ``weather`` makes the machine's speed vary over time: each INFER and LOAD takes its profile's
time times the weather's slowdown where and when it starts, and each call the weather's legs
there and then. A live pool's own timeline (``Pool.timeline``) replayed as the weather
(:func:`replayed_weather`) gives the simulator the live run's slow spells, in which runs,
LOADs and calls are slow together, where drawing each independently would not.

A call's legs (:class:`Legs`) are kept apart, not halves of one round trip: live, an answer's
way back took about twice the round trip's half, and halved round trips let the simulated
policies learn shorter overruns than the live ones did (``bench/RESULTS.md``, "The simulator
against the live system").

Each simulated worker also keeps its own account of the weights it holds and refuses a LOAD
that would take it past the capacity, as a live worker does, so the result's
``peak_bytes`` is what the workers held, not what the scheduler planned. The result shows its
actions as a live pool's timeline does (``timeline``): a simulated run replayed as its own
weather answers as many within the SLO, which checks the replay itself.

Cost: O(log n) per event plus the scheduler's own cost per step.
"""

from __future__ import annotations

import collections
import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, cast, runtime_checkable

import numpy as np

from raysrv.batching.actions import (
    LATE_START,
    NO_ROOM,
    NOT_LOADED,
    Action,
    ActionResult,
    Infer,
    Load,
    QueueFull,
    Step,
    Unload,
)
from raysrv.batching.base import BatchingPolicy, QueuedQuery
from raysrv.batching.scheduler import PoolScheduler

__all__ = [
    "PoolSimResult",
    "ServiceFn",
    "ServiceSource",
    "SimModel",
    "Weather",
    "Legs",
    "call_legs",
    "replayed_weather",
    "service_fn",
    "simulate_closed_loop",
    "simulate_pool",
    "size_band",
]

ServiceFn = Callable[[int], float]
_COLUMNS = ("kind", "worker", "model", "size", "sent", "started", "ended", "back")
MACHINE = -1  # the series of all the workers of a pool on one machine (``replayed_weather``)
# how far from its live time a replayed value may be taken (``replayed_weather``)
REPLAY_DRIFT_S = 0.2


@runtime_checkable
class _Predicts(Protocol):
    """A service-time profile (:class:`raysrv.analytics.profiles.ServiceProfile`,
    ``TableProfile``): seconds for a batch of k."""

    def predict(self, batch_size: Any, resource: Any = None) -> Any: ...


ServiceSource = Sequence[float] | np.ndarray | ServiceFn | _Predicts


def service_fn(service: ServiceSource) -> ServiceFn:
    """``service`` as a function of the batch size: ``service[k-1]`` seconds for a batch of k,
    a callable ``k -> seconds`` (close over a ``numpy.random.Generator`` for noisy service) or
    a profile with ``predict(k)``."""
    if isinstance(service, _Predicts):
        return lambda k: float(service.predict(k))
    if callable(service):
        return service
    table = np.asarray(service, dtype=float)
    if table.ndim != 1 or table.size == 0 or np.any(table < 0) or not np.all(np.isfinite(table)):
        raise ValueError(f"service must be finite times >= 0 per batch size, got {table!r}")

    def lookup(k: int) -> float:
        if k > table.size:
            raise ValueError(f"a batch of {k} but service times only up to {table.size}")
        return float(table[k - 1])

    return lookup


class Weather(Protocol):
    """How fast a pool's machine runs over time: an action of ``kind`` (``"infer"`` or
    ``"load"``) started on ``worker`` at ``t`` takes ``slowdown(worker, t, kind, size, model)``
    times its profile's time (``size``: an INFER's queries; ``model``: its model's name); a
    call of an action of ``kind`` (``"infer"``, ``"load"`` or ``"unload"``) sent to ``worker``
    at ``t`` takes ``legs(worker, t, kind, loading, idle)`` (:class:`Legs`), and an action
    that waited on ``worker`` for what ended there at ``t`` starts ``behind(worker, t, loading,
    leg)`` seconds after it, ``leg`` naming which of the :class:`Legs` (``"behind"``,
    ``"after_load"`` or ``"load_behind"``); ``loading``: a LOAD runs on one of the pool's
    workers then; ``idle``: the call's executor has nothing to do, so that its leg there
    decides when its first action starts."""

    def slowdown(
        self, worker: int, t: float, kind: str, size: int = 1, model: str = ""
    ) -> float: ...

    def legs(
        self, worker: int, t: float, kind: str = "infer", loading: bool = False, idle: bool = True
    ) -> Legs: ...

    def behind(
        self, worker: int, t: float, loading: bool = False, leg: str = "behind"
    ) -> float: ...


class Legs(NamedTuple):
    """How long a call takes beyond its actions' runs (seconds): ``there``, from its sending
    to its action's start on an idle worker; ``back``, from the action's end on the worker to
    the scheduler taking its answer up; ``behind``, for a batch that reached its worker while
    the worker still ran the one before, from that one's end to its start (the worker's own
    handoff between two batches); ``to_load``, from a LOAD's sending to its start on a worker
    whose LOADs before it are done (None: as ``there``); ``after_load``, for a batch that
    waited for its model's LOAD, from that LOAD's end to its start; ``load_behind``, for a LOAD
    that reached its worker while the worker still ran the LOAD or UNLOAD before it, from the
    end of the last one of those that ran to its start. A LOAD reaches a worker that is often
    running a batch, and starts later than a batch sent to an idle worker; one queued behind
    another LOAD started 1.2 ms after it at the median, live, where the batches behind a batch
    started 0.1 ms after it (``bench/RESULTS.md``, "The simulator against the live system")."""

    there: float
    back: float
    behind: float = 0.0
    to_load: float | None = None
    after_load: float = 0.0
    load_behind: float = 0.0


class _Replayed:
    """A :class:`Weather` that repeats what a timeline measured: at ``t``, each of the series'
    values in turn (the next one not yet taken), as long as it was measured within ``drift``
    seconds of ``t``; the value measured last before ``t + drift`` when every such one was
    taken, and the first when none was measured before. An INFER takes the values of its own
    model's INFERs of its size's band (:func:`size_band`) while one not yet taken was measured
    within ``drift`` of ``t``, else those of every model's INFERs of its band, or of the
    nearest band measured, smaller first."""

    def __init__(
        self,
        series: dict[tuple[int, str, int], tuple[np.ndarray, np.ndarray]],
        own: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]],
        one_machine: bool,
        drift: float,
    ) -> None:
        self._series = series
        self._own = own  # per model and size band: its own INFERs' slowdowns
        self._one_machine = one_machine
        self._drift = drift
        self._next = dict.fromkeys(series, 0)  # per series: the next value not yet taken
        self._own_next = dict.fromkeys(own, 0)
        self._kinds: dict[tuple[int, str], list[int]] = {}  # the kinds measured, per series
        for where, what, kind in sorted(series):
            self._kinds.setdefault((where, what), []).append(kind)

    def _key(self, worker: int, what: str, kind: int = 0) -> tuple[int, str, int] | None:
        """The series of ``what`` that an action or call of ``kind`` (an INFER's size band,
        whether a LOAD ran for a leg there or behind) on ``worker`` takes: ``kind``'s own, or the
        nearest one measured below it, or above it (None: none was measured)."""
        where = MACHINE if self._one_machine else worker
        kinds = self._kinds.get((where, what))
        if not kinds:
            return None
        below = [k for k in kinds if k <= kind]
        return (where, what, below[-1] if below else kinds[0])

    def _at(
        self, key: tuple[int, str, int] | None, t: float, default: float | None, take: bool = True
    ) -> float | None:
        """The value of the series ``key`` at ``t``; ``take``: it counts as taken."""
        if key is None:
            return default
        times, values = self._series[key]
        newest = int(np.searchsorted(times, t + self._drift, side="right")) - 1
        oldest = int(np.searchsorted(times, t - self._drift, side="left"))
        i = max(min(max(self._next[key], oldest), newest), 0)
        if take:
            self._next[key] = i + 1
        return float(values[i])

    def slowdown(self, worker: int, t: float, kind: str, size: int = 1, model: str = "") -> float:
        band = size_band(size) if kind == "infer" else 0
        own = self._own.get((model, band)) if kind == "infer" else None
        if own is not None:
            times, values = own
            i = max(
                self._own_next[(model, band)],
                int(np.searchsorted(times, t - self._drift, side="left")),
            )
            if i < len(times) and times[i] <= t + self._drift:
                self._own_next[(model, band)] = i + 1
                return float(values[i])
        return cast(float, self._at(self._key(worker, kind, band), t, 1.0))

    def legs(
        self, worker: int, t: float, kind: str = "infer", loading: bool = False, idle: bool = True
    ) -> Legs:
        """Live calls of INFERs measured the legs there and back, and of LOADs the leg to a
        LOAD: a call takes the values of its own kind's, and only looks at the others; a leg
        there those of calls sent while a LOAD ran, or while none did, as ``loading``. Only a
        call to an ``idle`` executor takes a leg there, as only those measured one live: taken
        by every call, they ran out where calls to busy workers were many, and the slower
        ones were taken again (``bench/RESULTS_ARCHIVE.md``, "the replay's steps on c4's
        day"). The legs behind, after a LOAD and behind a LOAD are :meth:`behind`'s, looked
        at."""
        infer = kind == "infer"
        there = self._at(self._key(worker, "there", int(loading)), t, 0.0, infer and idle)
        back = self._at(self._key(worker, "back"), t, 0.0, infer)
        behind = self._at(self._key(worker, "behind", int(loading)), t, 0.0, False)
        to_load = self._at(self._key(worker, "to_load"), t, None, kind == "load" and idle)
        after_load = self._at(self._key(worker, "after_load"), t, 0.0, False)
        load_behind = self._at(self._key(worker, "load_behind"), t, 0.0, False)
        floats = (cast(float, leg) for leg in (there, back, behind))
        return Legs(*floats, to_load, cast(float, after_load), cast(float, load_behind))

    def behind(self, worker: int, t: float, loading: bool = False, leg: str = "behind") -> float:
        """How long after ``t`` an action starts that waited for what ended then on its
        worker, as ``leg`` of :class:`Legs` says: a batch behind the batch before it
        (``"behind"``, as the batches whose batch before ended while a LOAD ran, or while none
        did, as ``loading``) or behind its model's LOAD (``"after_load"``), or a LOAD behind
        the LOAD or UNLOAD before it (``"load_behind"``)."""
        return cast(float, self._at(self._key(worker, leg, int(loading)), t, 0.0))


def size_band(size: int) -> int:
    """The band of batch sizes a batch of ``size`` is replayed with: the largest power of two
    not above it (1, 2-3 as 2, 4-7 as 4, ...). A slow spell added about as many milliseconds to a
    batch of 8 as to a batch of 1, so it slowed the small batches by a larger factor: live, on
    the many-model trace, batches of 1 ran 1.43 times their median on average and batches of
    3-8 1.22 times (``bench/RESULTS.md``, "The simulator against the live system")."""
    return 1 << (max(int(size), 1).bit_length() - 1)


def replayed_weather(
    timeline: Mapping[str, Sequence[Any]],
    expected: Callable[[str, str, int], float | None],
    t0: float,
    one_machine: bool = False,
    drift: float = REPLAY_DRIFT_S,
) -> Weather:
    """The weather of a live pool's ``timeline`` (``Pool.timeline``'s columns, wall seconds),
    on a clock whose 0 is the wall time ``t0``: a live INFER or LOAD started at ``t`` on a
    worker ran ``duration / expected(kind, model, size)`` times what the simulator's profile
    says (actions whose ``expected`` is None are skipped), and a live call sent at ``t``
    measured each of its :class:`Legs` (:func:`call_legs`).

    The simulator's actions and calls take those values in their live order, each once, as
    long as the simulation keeps within ``drift`` seconds of the live times: a simulated call
    at ``t`` takes the next live call's legs not yet taken that was sent after ``t - drift``,
    or, when every one sent by ``t + drift`` is taken, the last of those again; a call takes
    only the legs its own kind of action measured (:meth:`Weather.legs`). Taking
    instead the last value measured before ``t`` replays each one for as long as the live
    pool measured nothing newer, and a slow value is followed by a long wait: the slow
    values then stood for more of the simulated calls than of the live ones (on a trace
    point, the legs back at the median and p90 of time, 1.0 and 8.5 ms, against 0.6 and 6.9
    of the calls).

    Three splits keep what goes together. An INFER takes the slowdowns of its own model's live
    INFERs of its size's band near its time, or, where its model ran none then, those of
    every model's INFERs of its band (:func:`size_band`): a slow spell slowed a batch of 1 by
    a larger factor than a batch of 8, and the zoo's models, which all compute the same, ran
    at speeds of their own (a batch of one's median 3.4-7.6 ms from the p10 to the p90 of a
    trace point's models). A leg there takes those of the live calls sent while a LOAD ran in
    the pool, or while none did, and a leg behind those of the batches whose batch before
    ended while one ran, or none did: a LOAD slows the start of the batches beside it (on one
    worker of a trace point, the leg there at the median 2.05 ms with a LOAD running against
    0.77 ms without). A batch that waited for its model's LOAD takes the handoffs measured
    after LOADs (``Legs.after_load``).
    The slowdowns are replayed as measured, with whatever ran beside the live actions: the
    simulated schedule follows the live one, and charging each simulated action for what ran
    beside it at its start, net of what the live one met (SERF §III-C's interference, read at
    the start as in SERF's eq. 12), put the replays further from live, not nearer
    (``bench/RESULTS.md``, "The simulator against the live system").

    ``one_machine``: the pool's workers share one machine, whose speed every action on it
    measures, so the actions of a kind on every worker make one series, which gives the
    weather at ``t`` on every worker. Per worker, a slow action followed by a quiet spell on
    that worker held its slowness over the whole spell, while the other worker's actions showed
    how the machine then ran (``bench/RESULTS.md``, "The simulator against the live system")."""
    rows = _rows(timeline)
    points: dict[tuple[int, str, int], list[tuple[float, float]]] = {}
    own: dict[tuple[str, int], list[tuple[float, float]]] = {}

    def where(worker: int) -> int:
        return MACHINE if one_machine else worker

    for leg, legs in zip(Legs._fields, _legs(rows), strict=True):
        for worker, sent, seconds, loading in legs:
            points.setdefault((where(worker), leg, loading), []).append((sent - t0, seconds))
    for kind, worker, model, size, _, started, ended, _ in rows:
        if kind not in ("infer", "load") or not math.isfinite(ended - started):
            continue
        base = expected(kind, model, size)
        if base is not None and base > 0:
            band = size_band(size) if kind == "infer" else 0
            value = (started - t0, (ended - started) / base)
            points.setdefault((where(worker), kind, band), []).append(value)
            if kind == "infer":
                own.setdefault((model, band), []).append(value)
    return _Replayed(_sorted(points), _sorted(own), one_machine, drift)


def _sorted(
    points: Mapping[Any, list[tuple[float, float]]],
) -> dict[Any, tuple[np.ndarray, np.ndarray]]:
    """Each series of (time, value) pairs as its times and values, in time order."""
    series = {}
    for key, pairs in points.items():
        pairs.sort()
        series[key] = (np.array([t for t, _ in pairs]), np.array([v for _, v in pairs]))
    return series


def call_legs(timeline: Mapping[str, Sequence[Any]]) -> Legs:
    """The :class:`Legs` (seconds) a live pool's calls measured, from its ``timeline``, each
    an array. A LOAD tells its leg there (``to_load``) when the worker's LOAD or UNLOAD before it
    had ended by its sending. A batch that waited on its worker tells no leg there: one
    sent while the worker still ran the batch before it, or right behind its model's LOAD. One
    that waited for that LOAD alone tells how long after its end it started (``after_load``).
    One sent while the batch ahead of it ran, by at least the last leg there measured before
    that batch's end, reached its worker while that batch ran and tells how long after its end
    it started (``behind``); one sent closer to that end tells neither, as the worker does not
    say when a call reached it; a LOAD does the same behind the LOAD or UNLOAD before it
    (``load_behind``). A call's way back runs from its last batch's end: its answers come back
    together."""
    return Legs(*(np.array([s for _, _, s, _ in leg]) for leg in _legs(_rows(timeline))))


def _rows(timeline: Mapping[str, Sequence[Any]]) -> list[tuple[Any, ...]]:
    """A timeline's actions as rows of the ``_COLUMNS`` the simulator reads. A live pool's
    ``decided`` and ``acted`` (when its step that made an action began, and when its step that
    took the report up began) stand for ``sent`` and ``back`` where the timeline has them: a
    simulated step takes no time, so the live pool's time in its steps and in taking reports
    up belongs to the legs there and back. Left out, the simulated workers sent their next
    batch 0.38 ms sooner after an answer at the median, and idled 3.9 s less of 240
    (``bench/RESULTS.md``, "The simulator against the live system")."""
    sent = "decided" if "decided" in timeline else "sent"
    back = "acted" if "acted" in timeline else "back"
    keys = [{"sent": sent, "back": back}.get(key, key) for key in _COLUMNS]
    return list(zip(*(list(timeline[key]) for key in keys), strict=True))


# per leg: worker, when it began, seconds, and whether a LOAD ran in the pool then (1 or 0)
_Measured = list[tuple[int, float, float, int]]


def _legs(rows: Sequence[tuple[Any, ...]]) -> tuple[_Measured, ...]:
    """What the calls in ``rows`` (the ``_COLUMNS`` of a timeline) that ran measured of each
    of the :class:`Legs`, in their order, as :func:`call_legs` reads them."""
    there, back, behind, after_load = _infer_legs(rows)
    to_load, load_behind = _load_legs(rows)
    return there, back, behind, to_load, after_load, load_behind


def _infer_legs(rows: Sequence[tuple[Any, ...]]) -> tuple[_Measured, ...]:
    """The legs there, back, behind and after a LOAD that the calls of INFERs in ``rows``
    measured, each with whether a LOAD ran anywhere in the pool when the leg began: at the
    sending for the leg there, at the end of the batch before for the leg behind. A batch
    that waited for its model's LOAD, on a worker that had ended the batch before it by then,
    tells how long after that LOAD's end it started (``after_load``, at that end)."""
    loading = _loading(rows)
    loaded: dict[tuple[int, str], list[float]] = {}  # each LOAD's end, by worker and model
    runs: dict[int, list[tuple[float, float, float, str]]] = {}  # started, ended, sent, model
    for kind, worker, model, _, sent, started, ended, _ in rows:
        if kind in ("load", "infer") and math.isfinite(ended - started):
            if kind == "load":
                loaded.setdefault((worker, model), []).append(ended)
            else:
                runs.setdefault(worker, []).append((started, ended, sent, model))
    there: _Measured = []
    behind: _Measured = []
    after_load: _Measured = []
    for worker, ran in runs.items():
        ran.sort()
        free = -math.inf  # when the worker's batch before ended
        leg = 0.0  # the last leg there measured on the worker
        for started, ended, sent, model in ran:
            waited = [end for end in loaded.get((worker, model), ()) if sent <= end <= started]
            if waited and free <= max(waited):  # it waited for its model's LOAD alone
                end = max(waited)
                after_load.append((worker, end, started - end, loading(end)))
            elif waited:
                pass  # it waited for its model's LOAD and the batch before it
            elif sent >= free:
                leg = max(0.0, started - sent)
                there.append((worker, sent, leg, loading(sent)))
            elif sent + leg <= free:  # by the last leg there, it came while the worker ran
                behind.append((worker, sent, max(0.0, started - free), loading(free)))
            free = max(free, ended)
    return there, _ways_back(rows), behind, after_load


def _ways_back(rows: Sequence[tuple[Any, ...]]) -> _Measured:
    """The legs back of the calls of INFERs in ``rows``: a call's answers come back together,
    after its last batch, so its way back is from that batch's end."""
    calls: dict[tuple[int, float], tuple[float, float]] = {}  # last end, answered, per call
    for kind, worker, _, _, sent, started, ended, answered in rows:
        if kind == "infer" and math.isfinite(ended - started):
            last, _ = calls.get((worker, sent), (-math.inf, answered))
            calls[(worker, sent)] = (max(last, ended), answered)
    return [
        (worker, sent, max(0.0, answered - last), 0)
        for (worker, sent), (last, answered) in calls.items()
    ]


def _load_legs(rows: Sequence[tuple[Any, ...]]) -> tuple[_Measured, _Measured]:
    """The legs there of the LOADs in ``rows`` sent once the LOAD or UNLOAD before them on
    their worker had ended, and the legs behind of those that reached their worker while it
    still ran one (by the last leg there measured before), as :func:`call_legs` reads them."""
    executor: dict[int, list[tuple[float, float, float, str]]] = {}  # started, ended, sent, kind
    for kind, worker, _, _, sent, started, ended, _ in rows:
        if kind in ("load", "unload") and math.isfinite(ended - started):
            executor.setdefault(worker, []).append((started, ended, sent, kind))
    there: _Measured = []
    behind: _Measured = []
    for worker, actions in executor.items():
        actions.sort()
        free = -math.inf  # when the worker's LOAD or UNLOAD before ended
        leg = 0.0  # the last leg there measured on the worker
        for started, ended, sent, kind in actions:
            if kind == "load" and sent >= free:
                leg = max(0.0, started - sent)
                there.append((worker, sent, leg, 0))
            elif kind == "load" and sent + leg <= free:
                behind.append((worker, free, max(0.0, started - free), 0))
            free = max(free, ended)
    return there, behind


def _loading(rows: Sequence[tuple[Any, ...]]) -> Callable[[float], int]:
    """Whether a LOAD of ``rows`` ran at a time (1 or 0)."""
    ran = [(s, e) for kind, *_, s, e, _ in rows if kind == "load" and math.isfinite(e - s)]
    starts = np.sort([s for s, _ in ran])
    ends = np.sort([e for _, e in ran])
    return lambda t: int(np.searchsorted(starts, t, "right") > np.searchsorted(ends, t, "right"))


@dataclass(frozen=True)
class SimModel:
    """One model of a simulated pool: its batching policy and how long its actions take.

    ``pinned``: loaded on every worker from the start and never unloaded (a dedicated pool).
    ``weight_bytes`` counts against a worker's capacity; ``group`` names models whose run
    times are alike (a model not yet run is planned with its group's)."""

    policy: BatchingPolicy
    service: ServiceSource
    load_s: float = 0.0
    unload_s: float = 0.0
    weight_bytes: int | None = None
    group: str | None = None
    pinned: bool = False
    max_queue: int = 1 << 30


@dataclass(frozen=True)
class PoolSimResult:
    """Per-query and per-pool outcomes of one run (times in seconds)."""

    arrivals: np.ndarray
    models: np.ndarray  # the model of each query
    latencies: np.ndarray  # completion - arrival; NaN for refused queries
    rejected: np.ndarray  # bool per query: refused before any work
    late: np.ndarray  # bool per query: answered after its deadline
    cold: np.ndarray  # bool per query: its model was loaded nowhere when it arrived
    batch_sizes: np.ndarray
    batch_starts: np.ndarray
    batch_models: np.ndarray
    loads: int
    unloads: int
    evictions: int
    peak_bytes: tuple[int, ...]  # per worker, as the workers held them
    reasons: dict[str, int] = field(default_factory=dict)
    why: np.ndarray = field(default_factory=lambda: np.array([], dtype=object))  # per query:
    # why it was refused ("" for those answered)
    timeline: dict[str, list[Any]] = field(default_factory=dict)  # the actions as a live
    # pool's ``timeline`` shows them (its columns that :func:`replayed_weather` reads)
    refused_after: np.ndarray = field(default_factory=lambda: np.array([]))  # per query: its
    # refusal - arrival (NaN for those answered)

    @property
    def answered(self) -> np.ndarray:
        return self.latencies[~self.rejected]

    def within(self, slo: float | np.ndarray) -> np.ndarray:
        """Queries answered within ``slo`` seconds of their arrival (per query or one value)."""
        return ~self.rejected & (self.latencies <= slo)


class _SimWorker:
    """A simulated worker: what it holds, and its two executors, each running its actions one
    at a time in the order they were sent."""

    def __init__(self, index: int, capacity: int | None) -> None:
        self.index = index
        self.held: dict[str, int] = {}
        self.loading: dict[str, float | None] = {}  # model -> its LOAD's end (None: not begun)
        self.executors = {"infer": _SimExecutor(), "load": _SimExecutor()}
        self.capacity = capacity
        self.peak = 0


class _SimExecutor:
    def __init__(self) -> None:
        self.waiting: collections.deque[_Waiting] = collections.deque()
        self.next: _Waiting | None = None  # the action whose start is due
        self.running: tuple[float, float, Action] | None = None  # from when to when, what
        # when its last action ended: from the start, whatever the clock's origin (a run's
        # arrivals may begin before 0)
        self.free = -math.inf

    @property
    def busy(self) -> bool:
        return bool(self.waiting) or self.next is not None or self.running is not None


@dataclass
class _SimCall:
    """One call to a worker: its actions' outcomes fill in as they end; its results go back
    together after the last one."""

    actions: list[Action]
    sent: float
    legs: Legs
    outcomes: list[tuple[Any, ...] | None]
    ends: list[float] = field(default_factory=list)


@dataclass
class _Waiting:
    """An action of ``call`` (its ``index``) on its way to or queued on its executor."""

    call: _SimCall
    index: int
    arrives: float  # at the worker, when sent to an idle executor
    behind: bool  # sent while the executor had work: starts a handoff after it ends

    @property
    def action(self) -> Action:
        return self.call.actions[self.index]


class _PoolRun:
    def __init__(
        self,
        models: Mapping[str, SimModel],
        workers: int,
        capacity_bytes: int | None,
        depth: int,
        hop_s: float | Callable[[], Legs],
        weather: Weather | None = None,
        profile_runs: int = 0,
    ) -> None:
        self.specs = dict(models)
        self.weather = weather
        self.service = {name: service_fn(m.service) for name, m in models.items()}
        self.scheduler = PoolScheduler(workers, capacity_bytes=capacity_bytes, depth=depth)
        self.workers = [_SimWorker(i, capacity_bytes) for i in range(workers)]
        if callable(hop_s):
            self.legs = hop_s
        else:
            way = float(hop_s) / 2
            self.legs = lambda: Legs(way, way)
        self.events: list[tuple[float, int, Callable[[Any, float], bool], Any]] = []
        self.seq = 0
        self.timer = math.inf
        for name, m in models.items():
            self.scheduler.add_model(
                name,
                m.policy,
                weight_bytes=m.weight_bytes,
                group=m.group,
                max_queue=m.max_queue,
            )
            if m.pinned:
                for i, w in enumerate(self.workers):
                    w.held[name] = m.weight_bytes or 0
                    self.scheduler.pin(i, name, m.weight_bytes or 0)
        if profile_runs:
            self._profile(profile_runs)
        self.sizes: list[int] = []
        self.starts: list[float] = []
        self.timeline: list[tuple[Any, ...]] = []  # each action carried out, as _COLUMNS
        self.batch_models: list[str] = []
        self.refused: dict[int, str] = {}
        self.refused_at: dict[int, float] = {}
        self.done: dict[int, float] = {}
        self.cold: set[int] = set()
        self.queries: dict[int, QueuedQuery] = {}  # waiting or in a batch, by id
        self.again: set[int] = set()  # queued again once already
        self.concurrency = 0  # what the scheduler sees as the ingress's (BatcherView's)
        self.ended: Callable[[Sequence[int], float], None] | None = None  # told of the queries
        # answered or refused, and when (run_closed's clients send again)

    def _profile(self, runs: int) -> None:
        """The live pool's profiling step (``raysrv._pool.Pool.profile``) into the models' run
        times: ``runs`` batches of each of the policy's ``profile_sizes`` at their service
        time for every pinned model, and for the first model of each group of the others,
        which is also loaded and unloaded ``runs`` times."""
        seen: set[str] = set()
        for name, m in self.specs.items():
            sizes = m.policy.profile_sizes()
            group = m.group or name
            if not sizes or (not m.pinned and group in seen):
                continue
            seen.add(group)
            record = self.scheduler.runs(name)
            for size in sizes:
                for _ in range(runs):
                    record.observe(size, float(self.service[name](size)))
            if not m.pinned:
                for _ in range(runs):
                    record.observe_load(m.load_s, m.weight_bytes)
                    record.observe_unload(m.unload_s)

    def run(self, times: np.ndarray, names: Sequence[str], deadlines: np.ndarray, prio) -> None:
        """The queries arriving at ``times``, each due at its deadline."""
        i, n = 0, times.size

        def due() -> float:
            return float(times[i]) if i < n else math.inf

        def arrive(now: float) -> None:
            nonlocal i
            while i < n and times[i] <= now:
                self._arrive(i, names[i], float(times[i]), float(deadlines[i]), int(prio[i]))
                i += 1

        self._drive(due, arrive)

    def run_closed(
        self, clients: int, seconds: float, name: str, slo: float, turnaround: float, stagger: float
    ) -> np.ndarray:
        """``clients`` that start one by one over ``stagger`` and each send the next query
        ``turnaround`` after the last one's answer or refusal, until ``seconds``; then the
        pool drains. The queries' arrival times, by query (each due ``slo`` later)."""
        times: list[float] = []
        client_of: list[int] = []
        sending = [(c * stagger / clients, c) for c in range(clients)]  # a heap: when, who

        def again(query_ids: Sequence[int], at: float) -> None:
            for query in query_ids:
                if at + turnaround < seconds:
                    heapq.heappush(sending, (at + turnaround, client_of[query]))

        def arrive(now: float) -> None:
            while sending and sending[0][0] <= now:
                t, client = heapq.heappop(sending)
                times.append(t)
                client_of.append(client)
                self._arrive(len(times) - 1, name, t, t + slo, 0)

        self.concurrency, self.ended = clients, again
        self._drive(lambda: sending[0][0] if sending else math.inf, arrive)
        return np.asarray(times, dtype=float)

    def _drive(self, due: Callable[[], float], arrive: Callable[[float], None]) -> None:
        """Handle what happens next until nothing is left: ``due`` is when the next query
        arrives (inf: none will), ``arrive`` submits those due by a time. Arrivals, results
        and wake-ups each step the scheduler; a worker's own events (an action starting or
        ending) do not."""
        while due() < math.inf or self.events or self.timer < math.inf:
            now = min(self.events[0][0] if self.events else math.inf, due(), self.timer)
            step = self.timer <= now
            if step:
                self.timer = math.inf
            while self.events and self.events[0][0] <= now:
                _, _, handle, what = heapq.heappop(self.events)
                step |= handle(what, now)
            if due() <= now:
                arrive(now)
                step = True
            if step:
                self._step(now)

    def _at(self, t: float, handle: Callable[[Any, float], bool], what: Any) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, handle, what))

    def _arrive(self, i: int, name: str, t: float, deadline: float, priority: int) -> None:
        query = self.queries[i] = QueuedQuery(i, t, deadline, priority)
        try:
            if self.scheduler.submit(name, query):
                self.cold.add(i)
        except QueueFull:
            self.refused[i], self.refused_at[i] = "queue_full", t
            if self.ended is not None:
                self.ended((i,), t)

    def _step(self, now: float) -> None:
        step: Step = self.scheduler.step(now, self.concurrency)
        for plan in step.plans:  # planning takes no simulated time
            self.scheduler.apply_plan(plan.model, plan.policy, plan.job())
        for refusal in step.refusals:
            for q in refusal.query_ids:
                self.refused[q], self.refused_at[q] = refusal.reason, now
            if self.ended is not None:
                self.ended(refusal.query_ids, now)
        calls: dict[int, tuple[list[Action], list[Action]]] = {}  # per worker: LOADs, INFERs
        for action in step.actions:
            calls.setdefault(action.worker, ([], []))[isinstance(action, Infer)].append(action)
        for worker_calls in calls.values():
            for call in worker_calls:
                if call:
                    self._call(call, now)
        if step.wake_at is not None and now < step.wake_at < self.timer:
            self.timer = step.wake_at

    def _call(self, actions: list[Action], now: float) -> None:
        """One call to a worker carrying ``actions`` (one executor's) as the live pool sends
        them: one trip there, its actions run one after another, and their results back
        together after the last one's end."""
        worker = actions[0].worker
        kinds = {type(action).__name__.lower() for action in actions}
        kind = next(k for k in ("infer", "load", "unload") if k in kinds)
        w = self.workers[worker]
        if self.weather is None:
            legs = self.legs()
        else:
            idle = not w.executors[_executor(actions[0])].busy
            legs = self.weather.legs(worker, now, kind, self._loading(now), idle)
        call = _SimCall(actions, now, legs, [None] * len(actions))
        # a LOAD behind its own call's UNLOAD is not behind: live, the worker does not time
        # its UNLOADs, so its leg there was measured from the sending (Legs.to_load)
        loads_behind = w.executors["load"].busy
        for index, action in enumerate(actions):
            executor = w.executors[_executor(action)]
            leg = legs.there if isinstance(action, Infer) or legs.to_load is None else legs.to_load
            behind = executor.busy if isinstance(action, Infer) else loads_behind
            if isinstance(action, Load):
                w.loading[action.model] = None
            executor.waiting.append(_Waiting(call, index, now + leg, behind))
        for name in {_executor(action) for action in actions}:
            self._next(w, name, now)

    def _next(self, w: _SimWorker, name: str, now: float) -> None:
        """Set when the next action waiting on ``w``'s executor ``name`` starts, if it is
        free and that is known: an INFER sent to it busy starts ``behind`` after the action
        before it ends (live, such batches started 0.26 ms after it at the p90, where a call to
        an idle worker took 3.2 ms at the p90 to get there: ``bench/RESULTS.md``, "The
        simulator against the live system"), an INFER that waits for its model's LOAD
        ``after_load`` after that LOAD ends, and a LOAD sent to it busy ``load_behind`` after
        the action before it ends (an UNLOAD right away: live, it takes 0.1 ms)."""
        executor = w.executors[name]
        if executor.running is not None or executor.next is not None or not executor.waiting:
            return
        head = executor.waiting[0]
        if name == "load" and head.behind:
            load = isinstance(head.action, Load)
            start = executor.free + (self._handoff(w, head, now, "load_behind") if load else 0.0)
        elif name == "load":
            start = max(head.arrives, executor.free)
        else:
            loaded = w.loading.get(head.action.model, -math.inf)
            if loaded is None:
                return  # it waits for its model's LOAD, not begun: that LOAD's start sets it
            if head.call.sent <= loaded and (not head.behind or executor.free <= loaded):
                start = loaded + self._handoff(w, head, loaded, "after_load")
            elif head.behind:
                start = executor.free + self._handoff(w, head, now)
            else:
                start = head.arrives
        executor.next = executor.waiting.popleft()
        self._at(max(start, now), self._begin, (w, name))

    def _handoff(self, w: _SimWorker, head: _Waiting, t: float, leg: str = "behind") -> float:
        """How long after ``t`` the action ``head`` starts, which waited for what ended then:
        ``leg`` of :class:`Legs` says what (the batch before it, its model's LOAD, or for a
        LOAD the LOAD or UNLOAD before it)."""
        if self.weather is None:
            return cast(float, getattr(head.call.legs, leg))
        return self.weather.behind(w.index, t, self._loading(t), leg)

    def _begin(self, where: tuple[_SimWorker, str], now: float) -> bool:
        """The action due on an executor starts, for its profile's time times the weather's
        slowdown there and then."""
        w, name = where
        executor = w.executors[name]
        waiting = cast(_Waiting, executor.next)
        executor.next = None
        action = waiting.action
        ran, ok, error, size, weight = True, True, "", None, None
        if isinstance(action, Unload):
            w.held.pop(action.model, None)
            duration = self.specs[action.model].unload_s if action.model in self.specs else 0.0
        elif now > action.latest:
            ran, duration = False, 0.0
        elif isinstance(action, Load):
            duration, weight = self._load(w, action)
            duration *= self._slowdown(action.worker, now, "load", 1)
            if weight is None:  # as a live worker answers: not run
                ran, error = False, NO_ROOM
        elif action.model not in w.held:  # its LOAD did not run: as a live worker answers
            ran, duration, error = False, 0.0, NOT_LOADED
        else:
            duration, size = self._infer(action, now)
            duration *= self._slowdown(action.worker, now, "infer", size, action.model)
        end = now + duration
        executor.running = (now, end, action) if ran else None
        if isinstance(action, Load):
            w.loading[action.model] = end
            self._next(w, "infer", now)  # an INFER waiting for it may now be set
        when = (now, end) if ran else (math.nan, math.nan)  # as a live worker reports
        waiting.call.outcomes[waiting.index] = (ran, ok, duration, size, weight, error, *when)
        self._at(end, self._end, (w, name, waiting))
        return False

    def _end(self, where: tuple[_SimWorker, str, _Waiting], now: float) -> bool:
        """An action ends: the executor takes its next, and once every action of its call
        has ended their results start back."""
        w, name, waiting = where
        executor = w.executors[name]
        executor.running, executor.free = None, now
        ended = waiting.action
        if isinstance(ended, Load) and w.loading.get(ended.model) == now:
            del w.loading[ended.model]
        call = waiting.call
        call.ends.append(now)
        if len(call.ends) == len(call.actions):
            finished = max(call.ends) + call.legs.back
            for action, fields in zip(call.actions, call.outcomes, strict=True):
                result = ActionResult(action, finished, *cast(tuple[Any, ...], fields))
                kind = type(action).__name__.lower()
                queries = len(action.query_ids) if isinstance(action, Infer) else 0
                row = (kind, action.worker, action.model, queries, call.sent)
                self.timeline.append((*row, result.started, result.ended, finished))
                self._at(finished, self._finished, result)
        self._next(w, name, now)
        if isinstance(ended, Load):
            self._next(w, "infer", now)
        return False

    def _finished(self, result: ActionResult, now: float) -> bool:
        self._finish(result)
        return True

    def _slowdown(self, worker: int, t: float, kind: str, size: int, model: str = "") -> float:
        if self.weather is None:
            return 1.0
        return self.weather.slowdown(worker, t, kind, size, model)

    def _loading(self, t: float) -> bool:
        """Whether a LOAD runs at ``t`` on any of the pool's workers."""
        spans = (w.executors["load"].running for w in self.workers)
        return any(
            span is not None and isinstance(span[2], Load) and span[0] <= t < span[1]
            for span in spans
        )

    def _load(self, w: _SimWorker, action: Load) -> tuple[float, int | None]:
        spec = self.specs[action.model]
        weight = spec.weight_bytes or 0
        if w.capacity is not None and sum(w.held.values()) + weight > w.capacity:
            return 0.0, None
        w.held[action.model] = weight
        w.peak = max(w.peak, sum(w.held.values()))
        return spec.load_s, weight

    def _infer(self, action: Infer, start: float) -> tuple[float, int]:
        size = len(action.query_ids)
        self.sizes.append(size)
        self.starts.append(start)
        self.batch_models.append(action.model)
        return float(self.service[action.model](size)), size

    def _finish(self, result: ActionResult) -> None:
        action = result.action
        again: list[int] = []
        if isinstance(action, Infer) and result.ran:
            for q in action.query_ids:
                self.done[q] = result.finished
            if self.ended is not None:
                self.ended(action.query_ids, result.finished)
        elif isinstance(action, Infer):
            late = not result.error  # not started by its latest: queued again, once
            again = [q for q in action.query_ids if late and q not in self.again]
            refused = [q for q in action.query_ids if q not in again]
            self._refuse(refused, result.error or LATE_START, result.finished)
        self.scheduler.finished(result)
        if again and self.scheduler.requeue(action.model, [self.queries[q] for q in again]):
            self.again.update(again)
        else:  # none, or the model is gone
            self._refuse(again, LATE_START, result.finished)

    def _refuse(self, query_ids: list[int], reason: str, at: float) -> None:
        for q in query_ids:
            self.refused[q], self.refused_at[q] = reason, at
        if self.ended is not None and query_ids:
            self.ended(query_ids, at)


def _executor(action: Action) -> str:
    """The executor of a worker that runs ``action`` (clockwork §4.4)."""
    return "infer" if isinstance(action, Infer) else "load"


def simulate_pool(
    arrivals: Sequence[float] | np.ndarray,
    models_of: Sequence[str],
    models: Mapping[str, SimModel],
    *,
    workers: int,
    capacity_bytes: int | None = None,
    depth: int = 1,
    hop_s: float | Callable[[], Legs] = 0.0,
    slo: float | Mapping[str, float] | None = None,
    deadlines: Sequence[float] | np.ndarray | None = None,
    priorities: Sequence[int] | np.ndarray | None = None,
    weather: Weather | None = None,
    profile_runs: int = 0,
) -> PoolSimResult:
    """Run queries (``arrivals``: absolute, non-decreasing seconds; ``models_of``: each one's
    model) through a pool of ``workers`` scheduled by :class:`PoolScheduler`.

    Deadlines: ``slo`` seconds after each arrival (one value, or one per model), or absolute
    ``deadlines``, or none. ``weather``, when given, times the calls' legs in place of
    ``hop_s`` and slows runs and LOADs (the module's docstring). ``profile_runs``: the
    models' run times start from the live pool's profiling step with that many measured runs
    (its ``PROFILE_RUNS``), as a live pool's do; 0, from nothing measured. Every query ends
    answered or refused, exactly once."""
    times = np.asarray(arrivals, dtype=float)
    names = list(models_of)
    if times.ndim != 1 or len(names) != times.size or np.any(np.diff(times) < 0):
        raise ValueError("arrivals must be non-decreasing times, one model name per arrival")
    unknown = sorted(set(names) - set(models))
    if unknown:
        raise ValueError(f"queries name models the pool does not have: {unknown[:5]}")
    due = _deadlines(times, names, slo, deadlines)
    prio = np.zeros(times.size, dtype=int) if priorities is None else np.asarray(priorities)
    run = _PoolRun(models, workers, capacity_bytes, depth, hop_s, weather, profile_runs)
    run.run(times, names, due, prio)
    return _result(run, times, names, due)


def simulate_closed_loop(
    clients: int,
    seconds: float,
    model: SimModel,
    *,
    slo: float,
    workers: int = 1,
    depth: int = 1,
    hop_s: float | Callable[[], Legs] = 0.0,
    turnaround_s: float = 0.001,
    stagger_s: float = 0.0,
    profile_runs: int = 0,
) -> PoolSimResult:
    """A closed loop through a pool of ``workers`` serving ``model``: ``clients`` callers that
    start one by one over ``stagger_s`` and each send their next query ``turnaround_s`` after
    their last one's answer or refusal, for ``seconds`` (a benchmark's saturation loop, or
    callers that retry at once). Every query carries ``slo``; the scheduler sees the clients
    as the ingress's concurrency (:attr:`~raysrv.batching.base.BatcherView.concurrency`), as
    a live ingress counts them. The other arguments as :func:`simulate_pool`'s."""
    if clients < 1 or not seconds > 0.0 or turnaround_s < 0.0 or stagger_s < 0.0:
        raise ValueError(
            f"need clients >= 1, seconds > 0, turnaround_s >= 0 and stagger_s >= 0, got "
            f"{clients}, {seconds}, {turnaround_s}, {stagger_s}"
        )
    run = _PoolRun({"model": model}, workers, None, depth, hop_s, None, profile_runs)
    times = run.run_closed(clients, seconds, "model", slo, turnaround_s, stagger_s)
    return _result(run, times, ["model"] * times.size, times + slo)


def _result(run: _PoolRun, times: np.ndarray, names: list[str], due: np.ndarray) -> PoolSimResult:
    n = times.size
    cold = np.zeros(n, dtype=bool)
    cold[list(run.cold)] = True
    missing = set(range(n)) - run.done.keys() - run.refused.keys()
    if missing:
        first = min(missing)
        models = sorted({names[q] for q in missing})
        raise RuntimeError(
            f"{len(missing)} queries were never answered nor refused, of models {models[:5]}, "
            f"the first query {first} arriving {times[first] - times[0]:.3f} s in, due "
            f"{due[first] - times[first]:.3f} s later; still queued: "
            f"{ {m: run.scheduler.queue_length(m) for m in models[:5]} }"
        )
    done = np.full(n, np.nan)
    for q, t in run.done.items():
        done[q] = t
    rejected = np.zeros(n, dtype=bool)
    rejected[list(run.refused)] = True
    why = np.full(n, "", dtype=object)
    reasons: dict[str, int] = {}
    for q, reason in run.refused.items():
        why[q] = reason
        reasons[reason] = reasons.get(reason, 0) + 1
    latencies = np.where(rejected, np.nan, done - times)
    refused_after = np.full(n, np.nan)
    for q, t in run.refused_at.items():
        refused_after[q] = t - times[q]
    s = run.scheduler
    return PoolSimResult(
        times,
        np.asarray(names),
        latencies,
        rejected,
        ~rejected & (done > due),
        cold,
        np.asarray(run.sizes, dtype=int),
        np.asarray(run.starts, dtype=float),
        np.asarray(run.batch_models),
        s.loads,
        s.unloads,
        s.evictions,
        tuple(w.peak for w in run.workers),
        reasons,
        why,
        {name: [row[i] for row in run.timeline] for i, name in enumerate(_COLUMNS)},
        refused_after,
    )


def _deadlines(
    times: np.ndarray,
    names: list[str],
    slo: float | Mapping[str, float] | None,
    deadlines: Sequence[float] | np.ndarray | None,
) -> np.ndarray:
    if slo is not None and deadlines is not None:
        raise ValueError("give slo or deadlines, not both")
    if deadlines is not None:
        due = np.asarray(deadlines, dtype=float)
        if due.shape != times.shape:
            raise ValueError(f"deadlines needs one value per arrival ({times.size})")
        return due
    if slo is None:
        return np.full(times.size, math.inf)
    if isinstance(slo, Mapping):
        return times + np.array([slo[name] for name in names], dtype=float)
    return times + float(slo)
