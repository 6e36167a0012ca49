"""A discrete-event simulation of a worker pool, driven by the live system's own scheduler.

:func:`simulate_pool` runs :class:`raysrv.batching.scheduler.PoolScheduler`, the code that
schedules a live pool, against simulated workers: it submits each query at its arrival time,
calls ``step`` after every arrival, result or requested wake-up, carries the returned actions
out on simulated workers and reports each result back. Only the workers are simulated, as the
live ones run: two executors each (clockwork §4.4), one for INFERs and one for LOADs and
UNLOADs, each running its actions one at a time in the order they were sent; an INFER sent
while its worker runs another starts right behind it, and an INFER of a model whose LOAD is
still running starts when the LOAD ends. An INFER of k queries runs for
``service(k)`` seconds, a LOAD for the model's ``load_s`` and an UNLOAD for its ``unload_s``,
with no interference between the two executors; an action that would start after its
``latest`` is not run (§4.4); ``hop_s`` is how long an action takes to reach its worker and its
result to come back: a round trip in seconds (half each way), or a function drawing each call's
:class:`Legs` (close over a ``numpy.random.Generator`` for legs measured live). A ``weather`` makes
the machine's speed vary over time: each INFER and LOAD takes its profile's time times the
weather's slowdown where and when it starts, given how many actions run on the pool's other
executors then (SERF's eq. 12 reads an action's interference at its start). Its time is fixed
when it is sent, so the count takes the actions sent before it: one sent later that starts
before it, on another executor, is not counted. Each call's legs are the weather's there and
then. A live pool's own timeline
(``Pool.timeline``) replayed as the weather (:func:`replayed_weather`) gives the simulator the
live run's slow spells, in which runs, LOADs and calls are slow together, where drawing each
independently would not, and the interference its actions met.

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
    "simulate_pool",
]

ServiceFn = Callable[[int], float]
_COLUMNS = ("kind", "worker", "model", "size", "sent", "started", "ended", "back")
MACHINE = -1  # the series of all the workers of a pool on one machine (``replayed_weather``)
MOST_OTHERS = 2  # the interference of this many others running and of more is one class
INTERFERENCE_ACTIONS = 20  # actions of a kind behind a count's interference
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
    ``"load"``) started on ``worker`` at ``t`` with ``others`` actions running on the pool's
    other executors then takes ``slowdown(worker, t, kind, others)`` times its profile's time,
    and a call of an action of ``kind`` (``"infer"``, ``"load"`` or ``"unload"``) sent to
    ``worker`` at ``t`` takes ``legs(worker, t, kind)`` (:class:`Legs`)."""

    def slowdown(self, worker: int, t: float, kind: str, others: int = 0) -> float: ...

    def legs(self, worker: int, t: float, kind: str = "infer") -> Legs: ...


class Legs(NamedTuple):
    """How long a call takes beyond its actions' runs (seconds): ``there``, from its sending
    to its action's start on an idle worker; ``back``, from the action's end on the worker to
    the scheduler taking its answer up; ``behind``, for a batch that reached its worker while
    the worker still ran the one before, from that one's end to its start (the worker's own
    handoff between two batches); ``to_load``, from a LOAD's sending to its start on a worker
    whose LOADs before it are done (None: as ``there``). A LOAD reaches a worker that is often
    running a batch, and starts later than a batch sent to an idle worker (``bench/RESULTS.md``,
    "The simulator against the live system")."""

    there: float
    back: float
    behind: float = 0.0
    to_load: float | None = None


class _Replayed:
    """A :class:`Weather` that repeats what a timeline measured, net of the interference each
    action met, times the interference of ``others``: at ``t``, each of the series' values in
    turn (the next one not yet taken), as long as it was measured within ``drift`` seconds of
    ``t``; the value measured last before ``t + drift`` when every such one was taken, and the
    first when none was measured before."""

    def __init__(
        self,
        series: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]],
        interference: dict[str, np.ndarray],
        one_machine: bool,
        drift: float,
    ) -> None:
        self._series = series
        self._interference = interference
        self._one_machine = one_machine
        self._drift = drift
        self._next = dict.fromkeys(series, 0)  # per series: the next value not yet taken

    def _key(self, worker: int, what: str) -> tuple[int, str]:
        return (MACHINE if self._one_machine else worker, what)

    def _at(
        self, worker: int, t: float, what: str, default: float | None, take: bool = True
    ) -> float | None:
        """The value of the series ``what`` at ``t``; ``take``: it counts as taken."""
        key = self._key(worker, what)
        series = self._series.get(key)
        if series is None:
            return default
        times, values = series
        newest = int(np.searchsorted(times, t + self._drift, side="right")) - 1
        oldest = int(np.searchsorted(times, t - self._drift, side="left"))
        i = max(min(max(self._next[key], oldest), newest), 0)
        if take:
            self._next[key] = i + 1
        return float(values[i])

    def slowdown(self, worker: int, t: float, kind: str, others: int = 0) -> float:
        if self._key(worker, kind) not in self._series:
            return 1.0
        factors = self._interference.get(kind)
        crowd = 1.0 if factors is None else float(factors[min(others, MOST_OTHERS)])
        return cast(float, self._at(worker, t, kind, 1.0)) * crowd

    def legs(self, worker: int, t: float, kind: str = "infer") -> Legs:
        """Live calls of INFERs measured the legs there, back and behind, and of LOADs the
        leg to a LOAD: a call takes the values of its own kind's, and only looks at the
        others."""
        there, back, behind = (
            cast(float, self._at(worker, t, leg, 0.0, kind == "infer")) for leg in Legs._fields[:3]
        )
        return Legs(there, back, behind, self._at(worker, t, "to_load", None, kind == "load"))


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

    Workers on one machine slow each other down (SERF §III-C's interference): an action that
    started with others running on the pool's other executors ran slower. So each action's
    slowdown is kept net of the interference it met, the median slowdown of the actions of its
    kind that started with as many others running (0, 1, or ``MOST_OTHERS`` or more; a count
    with fewer than ``INTERFERENCE_ACTIONS`` actions takes the nearest one below it that has
    them), and the simulator's action pays the interference of the others running with it
    there. A scheduler that runs more at once than the live one did then pays for it, where a
    replay of the live slowdowns alone would have given it the live run's quieter machine.

    ``one_machine``: the pool's workers share one machine, whose speed every action on it
    measures, so the actions of a kind on every worker make one series, which gives the
    weather at ``t`` on every worker. Per worker, a slow action followed by a quiet spell on
    that worker held its slowness over the whole spell, while the other worker's actions showed
    how the machine then ran (``bench/RESULTS.md``, "The simulator against the live system")."""
    rows = _rows(timeline)
    ran = [
        (started, ended)
        for kind, _, _, _, _, started, ended, _ in rows
        if kind in ("infer", "load") and math.isfinite(ended - started)
    ]
    starts = np.sort([started for started, _ in ran])
    ends = np.sort([ended for _, ended in ran])
    points: dict[tuple[int, str], list[tuple[float, float, int]]] = {}

    def where(worker: int) -> int:
        return MACHINE if one_machine else worker

    for leg, legs in zip(Legs._fields, _legs(rows), strict=True):
        for worker, sent, seconds in legs:
            points.setdefault((where(worker), leg), []).append((sent - t0, seconds, 0))
    for kind, worker, model, size, _, started, ended, _ in rows:
        if kind not in ("infer", "load") or not math.isfinite(ended - started):
            continue
        base = expected(kind, model, size)
        if base is not None and base > 0:
            running = np.searchsorted(starts, started, "right") - np.searchsorted(ends, started)
            others = min(max(int(running) - 1, 0), MOST_OTHERS)
            points.setdefault((where(worker), kind), []).append(
                (started - t0, (ended - started) / base, others)
            )
    interference = {
        kind: _interference([(v, n) for (_, k), p in points.items() if k == kind for _, v, n in p])
        for kind in ("infer", "load")
    }
    series = {}
    for key, triples in points.items():
        triples.sort()
        crowd = interference.get(key[1])
        values = [v / (1.0 if crowd is None else crowd[n]) for _, v, n in triples]
        series[key] = (np.array([t for t, _, _ in triples]), np.array(values))
    return _Replayed(series, interference, one_machine, drift)


def call_legs(timeline: Mapping[str, Sequence[Any]]) -> Legs:
    """The :class:`Legs` (seconds) a live pool's calls measured, from its ``timeline``, each
    an array. A LOAD tells its leg there (``to_load``) when the worker's LOAD or UNLOAD before it
    had ended by its sending. A batch that waited on its worker tells no leg there: one
    sent while the worker still ran the batch before it, or right behind its model's LOAD (the
    INFER starts when the LOAD ends, in the simulator too). One sent while the batch ahead of
    it ran, by at least the last leg there measured before that batch's end, reached its
    worker while that batch ran and tells how long after its end it started (``behind``); one
    sent closer to that end tells neither, as the worker does not say when a call reached
    it."""
    return Legs(*(np.array([s for _, _, s in leg]) for leg in _legs(_rows(timeline))))


def _rows(timeline: Mapping[str, Sequence[Any]]) -> list[tuple[Any, ...]]:
    """A timeline's actions as rows of the ``_COLUMNS`` the simulator reads."""
    return list(zip(*(list(timeline[key]) for key in _COLUMNS), strict=True))


_Measured = list[tuple[int, float, float]]  # (worker, sent, seconds) per call


def _legs(rows: Sequence[tuple[Any, ...]]) -> tuple[_Measured, _Measured, _Measured, _Measured]:
    """What the calls in ``rows`` (the ``_COLUMNS`` of a timeline) that ran measured of each
    of the :class:`Legs`, as :func:`call_legs` reads them."""
    return (*_infer_legs(rows), _load_legs(rows))


def _infer_legs(rows: Sequence[tuple[Any, ...]]) -> tuple[_Measured, _Measured, _Measured]:
    """The legs there, back and behind that the calls of INFERs in ``rows`` measured."""
    loaded: dict[tuple[int, str], list[float]] = {}  # each LOAD's end, by worker and model
    runs: dict[int, list[tuple[float, float, float, str]]] = {}  # started, ended, sent, model
    back: _Measured = []
    for kind, worker, model, _, sent, started, ended, answered in rows:
        if not math.isfinite(ended - started):
            continue
        if kind == "load":
            loaded.setdefault((worker, model), []).append(ended)
        elif kind == "infer":
            runs.setdefault(worker, []).append((started, ended, sent, model))
            back.append((worker, sent, max(0.0, answered - ended)))
    there: _Measured = []
    behind: _Measured = []
    for worker, ran in runs.items():
        ran.sort()
        free = -math.inf  # when the worker's batch before ended
        leg = 0.0  # the last leg there measured on the worker
        for started, ended, sent, model in ran:
            if any(sent <= end <= started for end in loaded.get((worker, model), ())):
                pass  # it waited for its model's LOAD
            elif sent >= free:
                leg = max(0.0, started - sent)
                there.append((worker, sent, leg))
            elif sent + leg <= free:  # by the last leg there, it came while the worker ran
                behind.append((worker, sent, max(0.0, started - free)))
            free = max(free, ended)
    return there, back, behind


def _load_legs(rows: Sequence[tuple[Any, ...]]) -> _Measured:
    """The legs there of the LOADs in ``rows`` sent once the LOAD or UNLOAD before them on
    their worker had ended (the others waited for it)."""
    executor: dict[int, list[tuple[float, float, float, str]]] = {}  # sent, started, ended, kind
    for kind, worker, _, _, sent, started, ended, _ in rows:
        if kind in ("load", "unload") and math.isfinite(ended - started):
            executor.setdefault(worker, []).append((sent, started, ended, kind))
    legs: _Measured = []
    for worker, actions in executor.items():
        actions.sort()
        free = -math.inf  # when the worker's LOAD or UNLOAD before ended
        for sent, started, ended, kind in actions:
            if kind == "load" and sent >= free:
                legs.append((worker, sent, max(0.0, started - sent)))
            free = max(free, ended)
    return legs


def _interference(slowdowns: list[tuple[float, int]]) -> np.ndarray:
    """The median slowdown of the actions that started with each count of others running
    (index 0..``MOST_OTHERS``); a count with fewer than ``INTERFERENCE_ACTIONS`` takes the
    nearest count below it that has them, or above, or 1 with none."""
    by_count: list[list[float]] = [[] for _ in range(MOST_OTHERS + 1)]
    for value, count in slowdowns:
        by_count[count].append(value)
    known = [
        float(np.median(values)) if len(values) >= INTERFERENCE_ACTIONS else None
        for values in by_count
    ]
    factors = []
    for count in range(MOST_OTHERS + 1):
        nearest = [k for k in known[count::-1] if k is not None] or [
            k for k in known[count:] if k is not None
        ]
        factors.append(nearest[0] if nearest else 1.0)
    return np.array(factors)


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

    @property
    def answered(self) -> np.ndarray:
        return self.latencies[~self.rejected]

    def within(self, slo: float | np.ndarray) -> np.ndarray:
        """Queries answered within ``slo`` seconds of their arrival (per query or one value)."""
        return ~self.rejected & (self.latencies <= slo)


class _SimWorker:
    def __init__(self, capacity: int | None) -> None:
        # when its INFER and LOAD executors are next free: from the start, whatever the
        # clock's origin (a run's arrivals may begin before 0)
        self.infer_free = -math.inf
        self.load_free = -math.inf
        self.held: dict[str, int] = {}
        self.ready: dict[str, float] = {}  # model -> when its LOAD ends
        # the last action each executor was given: from when to when it runs
        never = (-math.inf, -math.inf)
        self.spans: dict[str, tuple[float, float]] = {"infer": never, "load": never}
        self.capacity = capacity
        self.peak = 0


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
        self.workers = [_SimWorker(capacity_bytes) for _ in range(workers)]
        if callable(hop_s):
            self.legs = hop_s
        else:
            way = float(hop_s) / 2
            self.legs = lambda: Legs(way, way)
        self.events: list[tuple[float, int, ActionResult]] = []
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
        self.done: dict[int, float] = {}
        self.cold: set[int] = set()

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
        i, n = 0, times.size
        while i < n or self.events or self.timer < math.inf:
            t_event = self.events[0][0] if self.events else math.inf
            t_arrival = float(times[i]) if i < n else math.inf
            now = min(t_event, t_arrival, self.timer)
            if self.timer <= now:
                self.timer = math.inf
            while self.events and self.events[0][0] <= now:
                self._finish(heapq.heappop(self.events)[2])
            while i < n and times[i] <= now:
                self._arrive(i, names[i], float(times[i]), float(deadlines[i]), int(prio[i]))
                i += 1
            self._step(now)

    def _arrive(self, i: int, name: str, t: float, deadline: float, priority: int) -> None:
        try:
            if self.scheduler.submit(name, QueuedQuery(i, t, deadline, priority)):
                self.cold.add(i)
        except QueueFull:
            self.refused[i] = "queue_full"

    def _step(self, now: float) -> None:
        step: Step = self.scheduler.step(now)
        for plan in step.plans:  # planning takes no simulated time
            self.scheduler.apply_plan(plan.model, plan.policy, plan.job())
        for refusal in step.refusals:
            for q in refusal.query_ids:
                self.refused[q] = refusal.reason
        for action in step.actions:
            self._carry_out(action, now)
        if step.wake_at is not None and now < step.wake_at < self.timer:
            self.timer = step.wake_at

    def _carry_out(self, action: Action, now: float) -> None:
        w = self.workers[action.worker]
        kind = type(action).__name__.lower()
        legs = self.legs() if self.weather is None else self.weather.legs(action.worker, now, kind)
        leg = legs.there if isinstance(action, Infer) or legs.to_load is None else legs.to_load
        arrives = now + leg
        ran, ok, error, size, weight = True, True, "", None, None
        if isinstance(action, Infer):
            # sent to its worker busy, it starts ``behind`` after the batch before it ends: live,
            # such batches started 0.26 ms after it at the p90, where a call to an idle worker
            # took 3.2 ms at the p90 to get there (``bench/RESULTS.md``, "The simulator
            # against the live system")
            begins = w.infer_free + legs.behind if now < w.infer_free else arrives
            start = max(begins, w.ready.get(action.model, begins))
        else:
            start = max(arrives, w.load_free)
        if isinstance(action, Unload):
            w.held.pop(action.model, None)
            w.ready.pop(action.model, None)
            duration = self.specs[action.model].unload_s if action.model in self.specs else 0.0
        elif start > action.latest:
            ran, duration = False, 0.0
        elif isinstance(action, Load):
            duration, weight = self._load(w, action)
            duration *= self._slowdown(action.worker, start, "load")
            if weight is None:  # as a live worker answers: not run
                ran, error = False, NO_ROOM
            else:
                w.ready[action.model] = start + duration
        elif action.model not in w.held:  # its LOAD did not run: as a live worker answers
            ran, duration, error = False, 0.0, NOT_LOADED
        else:
            duration, size = self._infer(action, start)
            duration *= self._slowdown(action.worker, start, "infer")
        end = start + duration
        if isinstance(action, Infer):
            w.infer_free = max(w.infer_free, end)
        else:
            w.load_free = end
        if ran:
            w.spans["infer" if isinstance(action, Infer) else "load"] = (start, end)
        when = (start, end) if ran else (math.nan, math.nan)  # as a live worker reports
        result = ActionResult(
            action, end + legs.back, ran, ok, duration, size, weight, error, *when
        )
        queries = len(action.query_ids) if isinstance(action, Infer) else 0
        row = (kind, action.worker, action.model, queries, now)
        self.timeline.append((*row, *when, result.finished))
        self.seq += 1
        heapq.heappush(self.events, (result.finished, self.seq, result))

    def _slowdown(self, worker: int, t: float, kind: str) -> float:
        if self.weather is None:
            return 1.0
        return self.weather.slowdown(worker, t, kind, self._others(worker, kind, t))

    def _others(self, worker: int, executor: str, t: float) -> int:
        """Actions running at ``t`` on the pool's executors other than ``worker``'s
        ``executor``, as far as those sent so far say."""
        return sum(
            start <= t < end
            for i, w in enumerate(self.workers)
            for name, (start, end) in w.spans.items()
            if (i, name) != (worker, executor)
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
        if isinstance(action, Infer) and result.ran:
            for q in action.query_ids:
                self.done[q] = result.finished
        elif isinstance(action, Infer):
            reason = result.error or LATE_START
            for q in action.query_ids:
                self.refused[q] = reason
        self.scheduler.finished(result)


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


def _result(run: _PoolRun, times: np.ndarray, names: list[str], due: np.ndarray) -> PoolSimResult:
    n = times.size
    cold = np.zeros(n, dtype=bool)
    cold[list(run.cold)] = True
    missing = set(range(n)) - run.done.keys() - run.refused.keys()
    if missing:
        raise RuntimeError(f"{len(missing)} queries were never answered nor refused")
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
