"""The live driver of one pool: the scheduler's step loop on the ingress's event loop.

:class:`Pool` holds what the pure scheduler (:mod:`raysrv.batching.scheduler`) leaves out:
each query's input and future, the workers, and the clock. On every arrival, result or wake-up
it calls ``scheduler.step(now)`` at the loop's next turn, answers the refusals, sends the
actions and steps again at the step's wake time unless an event comes first. The actions of
one step for one worker (an UNLOAD, a LOAD and the INFER behind it) travel as one call, and the
worker hands each to its executor in the order they were made. Each report goes back to
``scheduler.finished``. Planning jobs of the policies (``ctmc``'s optimizer) run in a worker
thread, off the loop.

A model's queue is bounded (``max_queue``): past it :meth:`Pool.submit` refuses at once with 503.
Every accepted query gets exactly one answer: its output, or the error of its refusal or failure.

The pool keeps a timeline of its last ``TIMELINE_ACTIONS`` actions as they ran (``timeline``):
when each was sent, started and ended on its worker, and came back, on the wall clock. It is
Clockwork's action telemetry (§5): what the workers did, for a dashboard or to replay a run's
slow spells in the simulator (:func:`raysrv.analytics.poolsim.replayed_weather`).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np

from raysrv._planner import PlanSnapshot
from raysrv._workers import Call, Report, Shape, Workers, concurrent_rates, wall
from raysrv.batching import BatchingPolicy, QueuedQuery
from raysrv.batching.actions import (
    LATE_START,
    NO_ROOM,
    NOT_LOADED,
    Action,
    ActionResult,
    Infer,
    Load,
    PlanJob,
    QueueFull,
    Refusal,
)
from raysrv.batching.autoscale import (
    PoolLoad,
    ScaleDecision,
    Scaler,
    SerfScaler,
    make_scaler,
    mixed_run_times,
)
from raysrv.batching.profile import SortedWindow
from raysrv.batching.scheduler import PoolScheduler
from raysrv.config import Input, InputSpec, ModelSpec, ResolvedPool
from raysrv.errors import ModelFailed, NotFound, Overloaded, RaysrvError, Rejected
from raysrv.metrics import Metrics

__all__ = ["PROFILE_RUNS", "Pool"]

PROFILE_RUNS = 3  # measured runs per batch size in the profiling step, after one to warm up
ARRIVAL_WINDOW = 2000  # arrival times kept per model for the plan view
SHOWN_WINDOW = 100  # batches per size behind the run times ``GET /v1/models`` shows
SHOWN_QUANTILES = (0.1, 0.5, 0.9, 0.99)  # the ones it shows
OVERHEAD_WINDOW = 500  # calls behind the round-trip overhead ``GET /v1/pools`` shows
TRIP_SHOWN = 10_000  # queries behind the trips to the ingress ``GET /v1/pools`` shows
TIMELINE_ACTIONS = 20_000  # the last actions ``timeline`` shows: some 5 MB of tuples
TIMELINE_COLUMNS = (
    "seq",  # the action's number in the order the pool kept them, from 0
    "kind",  # infer, load or unload
    "worker",
    "model",
    "size",  # queries in an INFER (0 for the others)
    "decided",  # wall seconds: the step that made the action began
    "sent",  # the call left the ingress
    "started",  # on the worker (NaN: it did not run)
    "ended",
    "back",  # its report reached the ingress's loop
    "acted",  # the step that took its report up began
    "overhead",  # of an INFER's call: the round trip beyond the runs (NaN for the others)
)
_SEQ, _SENT = TIMELINE_COLUMNS.index("seq"), TIMELINE_COLUMNS.index("sent")
OVERHEAD_QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9, 0.99)  # the ones it shows
FAULT_RETRY_S = 0.01  # after the scheduler raised, step again this much later
NOT_LOADED_REASON = "not loaded on its worker when the batch came (its LOAD ran too late)"

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _Entry:
    model: str
    x: Input
    future: asyncio.Future[Any]
    cold: bool
    query: QueuedQuery
    again: bool = False  # queued again once already, its first batch not started in time


class Pool:
    """One pool's workers, scheduler and queries (call from one asyncio event loop)."""

    def __init__(
        self,
        pool: ResolvedPool,
        workers: Workers,
        clock: Callable[[], float] = time.monotonic,
        metrics: Metrics | None = None,
        replies: Callable[[float], None] | None = None,
        lags: Callable[[float], None] | None = None,
        concurrency: Callable[[], int] | None = None,
    ) -> None:
        """``replies``: told, of each batch, the seconds its answer took from the worker's end
        of it to this loop's taking it up; ``lags``: of each step, how long it waited for the
        loop after an event asked for it (the ingress's trip-back rule reads both);
        ``concurrency``: the most requests inside the ingress at once lately, which the
        policies see as ``BatcherView.concurrency``."""
        self.spec = pool
        self.name = pool.name
        self.scheduler = PoolScheduler(
            len(workers), capacity_bytes=pool.capacity_bytes, depth=pool.depth, kind=pool.kind
        )
        self._workers = workers
        self._clock = clock
        self._metrics = metrics or Metrics()
        self._specs: dict[str, dict[str, Any]] = {}  # each model as the workers load it
        # (worker, model) -> the Report of its LOAD: the weights and what the process grew by
        self._memory: dict[tuple[int, str], Report] = {}
        self._entries: dict[int, _Entry] = {}
        self._queued: dict[asyncio.Future[Any], int] = {}
        self._arrivals: dict[str, collections.deque[float]] = {}
        self._ids = itertools.count()
        self._due: asyncio.Handle | None = None  # the step asked for at the loop's next turn
        self._timer: asyncio.TimerHandle | None = None  # the step at the last one's wake time
        self._poked: float | None = None  # when the step due was first asked for
        self._closed = False
        self._running: set[asyncio.Future[Any]] = set()
        # a call's round trip beyond its actions' run times: the hop to the worker and back
        self._overheads = SortedWindow(OVERHEAD_WINDOW)
        # of each batch: how much later it started than the scheduler expected (how long its
        # answer took back here, the scheduler keeps: ``return_ms``)
        self._late_starts = SortedWindow(OVERHEAD_WINDOW)
        self._replies = replies
        self._lags = lags
        self._concurrency = concurrency
        # from an arrival, result or plan to the step that acts on it: the loop's other work
        self._step_lags = SortedWindow(OVERHEAD_WINDOW)
        # of each query that said when it was sent: its trip to the ingress, and the time kept
        # back from its deadline for the answer's way back; sorted only when shown, since
        # every query adds to them
        self._trips_in: collections.deque[float] = collections.deque(maxlen=TRIP_SHOWN)
        self._kept_back: collections.deque[float] = collections.deque(maxlen=TRIP_SHOWN)
        # when each worker's last call came back
        self._back: collections.defaultdict[int, float] = collections.defaultdict(lambda: -math.inf)
        # the autoscaler (``start_scaling``): its arrivals, workers starting and draining
        scaling = pool.autoscaling
        self._scaler: Scaler | None = None if scaling is None else make_scaler(scaling)
        self._scaling: asyncio.Task[None] | None = None
        self._recent: collections.deque[float] = collections.deque()
        self._starting: set[int] = set()
        self._draining: set[int] = set()
        # the last worker's, from asking for it to its being ready; until the autoscaler has
        # started one, the time the pool's first workers took
        self._cold_start_s = workers.start_s
        self._in_flight = 0  # queries in batches sent whose answers are not back
        # the highest worker number used yet: a Ray actor ended under one may still hold its name
        self._last_index = max(workers.indices(), default=-1)
        # each worker's shape (its process's threads and lanes), where the autoscaler chose
        # it; the shape of the workers in service, and the workers and shape a switch is
        # bringing in (SerfScaler)
        self._shapes: dict[int, Shape] = {}
        self._in_force = pool.shape
        self._switch_to: tuple[int, Shape] | None = None
        self.decision: ScaleDecision | None = None
        self._timeline: collections.deque[tuple[Any, ...]] = collections.deque(
            maxlen=TIMELINE_ACTIONS
        )
        self._kept = itertools.count()  # numbers the actions kept in the timeline
        # the timeline's rows, but for ``acted``, of the actions reported since the last step
        self._reported: list[tuple[tuple[Any, ...], float]] = []

    # -- models ----------------------------------------------------------------------------

    def add_model(self, model: ModelSpec, policy: BatchingPolicy) -> None:
        """Serve ``model`` here with ``policy``; a dedicated pool's model is already loaded."""
        spec = self.spec.worker_model(model)
        weight = spec.weight_bytes()
        self.scheduler.add_model(
            model.name,
            policy,
            weight_bytes=weight,
            group=model.group,
            max_queue=model.max_queue,
        )
        if any(m.name == model.name for m in self.spec.pinned):
            for worker in self._workers.indices():
                self.scheduler.pin(worker, model.name, weight or 0)
        self._specs[model.name] = spec.model_dump(mode="json")
        self._arrivals[model.name] = collections.deque(maxlen=ARRIVAL_WINDOW)

    def remove_model(self, name: str) -> None:
        """Stop serving ``name``: its queued queries get 404, its workers unload it."""
        ids = self.scheduler.remove_model(name)
        self._answer(ids, NotFound(f"model {name!r} was removed while the query waited"))
        self._specs.pop(name, None)
        self._arrivals.pop(name, None)
        self._poke()

    def models(self) -> list[str]:
        return self.scheduler.models()

    def set_policy(self, name: str, policy: BatchingPolicy) -> None:
        """Swap a model's policy live; it starts from the run times already measured."""
        self.scheduler.set_policy(name, policy)
        self._poke()

    def policy(self, name: str) -> BatchingPolicy:
        return self.scheduler.policy(name)

    # -- queries ---------------------------------------------------------------------------

    def submit(
        self,
        model: str,
        x: Input,
        deadline: float = math.inf,
        priority: int = 0,
        trip: tuple[float, float] | None = None,
    ) -> asyncio.Future[Any]:
        """Queue one input of ``model``; the future resolves to its output, or raises why it
        could not (503 at once when the model's queue is full). ``trip``: seconds the query took
        to reach the ingress and seconds kept back from its deadline for the answer's way back,
        when its caller said when it sent it."""
        now = self._clock()
        if trip is not None:
            self._trips_in.append(trip[0])
            self._kept_back.append(trip[1])
        query_id = next(self._ids)
        query = QueuedQuery(query_id, now, deadline, priority)
        try:
            cold = self.scheduler.submit(model, query)
        except QueueFull as exc:
            self._metrics.rejection(model, "queue_full")
            raise Overloaded(str(exc)) from None
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._entries[query_id] = _Entry(model, x, future, cold, query)
        self._queued[future] = query_id
        self._arrivals[model].append(now)
        if self._scaler is not None:
            self._recent.append(now)
            if not self.scheduler.workers and not self._starting and not self._closed:
                # a pool scaled to zero: a worker now, not at the next decision, and the query
                # waits for it if its cold start fits the deadline (refused at once otherwise)
                self._grow(1, self._in_force)
        self._poke()
        return future

    def withdraw(self, model: str, future: asyncio.Future[Any]) -> bool:
        """Take a query out of its queue because its caller stopped waiting; False when it is
        no longer queued (in a batch, or answered)."""
        query_id = self._queued.get(future)
        if query_id is None or not self.scheduler.withdraw(model, query_id):
            return False
        self._take((query_id,))
        return True

    def queue_length(self, model: str) -> int:
        return self.scheduler.queue_length(model)

    # -- the loop --------------------------------------------------------------------------

    def _poke(self) -> None:
        """Step at the loop's next turn, once however many ask before it. An arrival, a result
        or a plan is acted on one turn after it, not several: each turn first runs every
        callback ready then, the other queries' too (``step_lag_ms`` shows the wait)."""
        if self._due is not None or self._closed:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not on a loop yet, so nothing is queued: the first query pokes
            return
        if self._poked is None:
            self._poked = self._clock()
        self._due = loop.call_soon(self._step)

    def _step(self) -> None:
        """One step of the scheduler: answer its refusals, send its actions, and step again at
        its wake time unless something pokes it first."""
        for handle in (self._due, self._timer):
            if handle is not None:
                handle.cancel()
        self._due = self._timer = None
        now, decided = self._clock(), time.time()
        self._keep_reported(decided)
        if self._poked is not None:
            self._step_lags.add(now - self._poked)
            if self._lags is not None:
                self._lags(now - self._poked)
            self._poked = None
        wake_at: float | None = None
        try:
            concurrency = 0 if self._concurrency is None else self._concurrency()
            step = self.scheduler.step(now, concurrency)
            wake_at = step.wake_at
            self._start_plans(step.plans)
            for refusal in step.refusals:
                self._refuse(refusal)
            per_worker: dict[int, list[Action]] = {}
            for action in step.actions:
                per_worker.setdefault(action.worker, []).append(action)
            for worker, actions in per_worker.items():
                self._send(worker, actions, now, decided)
        except Exception as exc:  # a scheduler fault must not strand the queries
            logger.exception("scheduling pool %s failed", self.name)
            self._answer(list(self._queued.values()), ModelFailed(f"scheduling failed: {exc}"))
            wake_at = self._clock() + FAULT_RETRY_S
        finally:
            if wake_at is not None and not self._closed:
                delay = max(0.0, wake_at - self._clock())
                self._timer = asyncio.get_running_loop().call_later(delay, self._step)

    def _keep_reported(self, acted: float) -> None:
        """Keep in the timeline the actions reported since the last step, which the step begun
        at the wall time ``acted`` takes up."""
        for row, overhead in self._reported:
            self._timeline.append((next(self._kept), *row, acted, overhead))
        self._reported.clear()

    def _start_plans(self, plans: tuple[PlanJob, ...]) -> None:
        for plan in plans:
            task = asyncio.ensure_future(asyncio.to_thread(plan.job))

            def adopt(done: asyncio.Future[object], plan: PlanJob = plan) -> None:
                result = None
                if done.cancelled():
                    return
                if done.exception() is not None:
                    logger.warning("planning for %s failed: %s", plan.model, done.exception())
                else:
                    result = done.result()
                self.scheduler.apply_plan(plan.model, plan.policy, result)
                self._poke()

            task.add_done_callback(adopt)

    def _take(self, ids: tuple[int, ...] | list[int]) -> list[_Entry]:
        entries = []
        for query_id in ids:
            entry = self._entries.pop(query_id, None)
            if entry is not None:
                self._queued.pop(entry.future, None)
                entries.append(entry)
        return entries

    def _answer(self, ids: tuple[int, ...] | list[int], error: RaysrvError) -> None:
        for entry in self._take(ids):
            if not entry.future.done():
                entry.future.set_exception(error)

    def _refuse(self, refusal: Refusal) -> None:
        model = refusal.model
        self._metrics.rejection(model, refusal.reason)
        if refusal.error == "failed":
            error: RaysrvError = ModelFailed(f"model {model!r}: {refusal.reason}")
        else:
            error = Rejected(f"model {model!r}: {refusal.reason}")
        self._answer(refusal.query_ids, error)
        if model in self.scheduler:
            self._metrics.queue_length(model, self.scheduler.queue_length(model))

    def _send(self, worker: int, actions: list[Action], now: float, decided: float) -> None:
        """``actions`` to ``worker``: one call per executor, the LOADs and UNLOADs first, so
        that a batch's answers do not wait in the worker's reply for a LOAD of another model
        (a call's reports come back together). The worker takes its calls in the order they
        were made, and an INFER behind its model's LOAD still waits for it there."""
        infers = [a for a in actions if isinstance(a, Infer)]
        others = [a for a in actions if not isinstance(a, Infer)]
        for part in (others, infers):
            if part:
                self._call(worker, part, now, decided)

    def _call(self, worker: int, actions: list[Action], now: float, decided: float) -> None:
        """One call to ``worker`` carrying ``actions`` in order (an INFER whose callers all
        left meanwhile is reported back unsent), decided by the step begun at the wall time
        ``decided``."""
        sent: list[tuple[Action, list[_Entry]]] = []
        calls = []
        earliest = time.time()
        for action in actions:
            entries: list[_Entry] = []
            latest = wall(now, getattr(action, "latest", math.inf))
            if isinstance(action, Infer):
                entries = [e for e in self._take(action.query_ids) if not e.future.done()]
                if not entries:  # every caller gave up while it waited
                    self.scheduler.finished(ActionResult(action, now, ran=False, size=0))
                    continue
                if action.model in self.scheduler:  # sampled before each batch
                    length = self.scheduler.queue_length(action.model)
                    self._metrics.queue_length(action.model, length)
                inputs = _batch([e.x for e in entries])
                calls.append(Call("infer", action.model, earliest, latest, inputs=inputs))
                self._in_flight += len(entries)
            elif isinstance(action, Load):
                spec = self._specs[action.model]
                calls.append(Call("load", action.model, earliest, latest, spec=spec))
            else:
                calls.append(Call("unload", action.model))
            sent.append((action, entries))
        if not calls:
            self._poke()
            return
        # its reports taken up by a callback, with no task of its own (a colocated worker's
        # call is a future already; a worker actor's call gets a task to await it)
        pending = asyncio.ensure_future(self._workers.run(worker, calls))
        self._running.add(pending)
        pending.add_done_callback(partial(self._finish, worker, now, earliest - now, decided, sent))

    def _track(self, coroutine: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    def _finish(
        self,
        worker: int,
        now: float,
        offset: float,
        decided: float,
        sent: list[tuple[Action, list[_Entry]]],
        pending: asyncio.Future[list[Report]],
    ) -> None:
        """Take up a call's reports; ``offset`` is the wall clock less the clock at ``now``.
        The step that keeps them in the timeline and acts on them is due before any of their
        callers resume: whoever asks for the timeline after an answer finds its batch there."""
        self._running.discard(pending)
        if pending.cancelled():  # the loop is closing
            return
        self._poke()
        try:
            reports = pending.result()
        except Exception as exc:
            logger.warning("%d actions for pool %s failed: %s", len(sent), self.name, exc)
            failed = Report("failed", error=f"{type(exc).__name__}: {exc}")
            reports = [failed] * len(sent)
        finished = self._clock()
        overhead = math.nan
        if all(isinstance(action, Infer) for action, _ in sent):  # one executor: run in turn
            ran = sum(r.duration for r in reports if math.isfinite(r.duration))
            overhead = finished - max(now, self._back[worker]) - ran
            self._overheads.add(overhead)
            self._back[worker] = finished
        back = time.time()
        for (action, entries), wall_report in zip(sent, reports, strict=True):
            kind = type(action).__name__.lower()
            ran = (wall_report.started, wall_report.ended)
            row = (kind, worker, action.model, len(entries), decided, now + offset, *ran, back)
            self._reported.append((row, overhead))
            # the worker's start and end, on this loop's clock
            report = replace(
                wall_report, started=wall_report.started - offset, ended=wall_report.ended - offset
            )
            if isinstance(action, Infer) and math.isfinite(report.started):
                self._late_starts.add(report.started - action.expected_start)
                if self._replies is not None:
                    self._replies(back - wall_report.ended)
            if isinstance(action, Infer):
                self._in_flight -= len(entries)
                self._infer_done(action, entries, report, finished)
            elif isinstance(action, Load):
                self._load_done(action, report, finished)
            else:
                self._unload_done(action, report, finished)

    def _infer_done(
        self, action: Infer, entries: list[_Entry], report: Report, finished: float
    ) -> None:
        model = action.model
        status, error = report.status, report.error
        again: list[_Entry] = []  # to queue again: of a batch not started in time
        if status == "ok" and (report.outputs is None or len(report.outputs) != len(entries)):
            count = None if report.outputs is None else len(report.outputs)
            status, error = "failed", f"returned {count} outputs for {len(entries)} inputs"
        if status == "ok":
            for entry, output in zip(entries, report.outputs or (), strict=True):
                if not entry.future.done():
                    entry.future.set_result(output)
                if entry.cold:
                    self._metrics.cold_start(self.name, finished - entry.query.arrival)
        elif status == "late":
            again = self._late(model, entries)
        elif status == "not_loaded" and self.scheduler.load_error(model):  # its LOAD failed
            reason = f"could not be loaded: {self.scheduler.load_error(model)}"
            self._fail(entries, ModelFailed(f"model {model!r}: {reason}"))
        elif status == "not_loaded":  # its LOAD came too late, or the worker restarted
            self._metrics.rejection(model, "not_loaded")
            self._fail(entries, Rejected(f"model {model!r}: {NOT_LOADED_REASON}"))
        else:
            self._fail(entries, ModelFailed(f"model {model!r} failed on a batch: {error}"))
        ran = status in ("ok", "failed")
        result = ActionResult(
            action,
            finished,
            ran,
            status == "ok",
            report.duration if ran else math.nan,
            len(entries),
            error=NOT_LOADED if status == "not_loaded" else error,
            started=report.started,
            ended=report.ended,
        )
        self.scheduler.finished(result)
        self._metrics.batch(model, len(entries), finished - action.sent)
        self._queue_again(model, again)

    def _late(self, model: str, entries: list[_Entry]) -> list[_Entry]:
        """Of a batch not started in time, the queries to queue again (:meth:`_queue_again`);
        those queued again once already are refused."""
        late = [e for e in entries if e.again]
        if late:
            self._metrics.rejection(model, "deadline_before_start")
            self._fail(late, Rejected(f"model {model!r}: {LATE_START}"))
        return [e for e in entries if not e.again and not e.future.done()]

    def _queue_again(self, model: str, entries: list[_Entry]) -> None:
        """The queries of a batch its worker did not start by its latest start (Clockwork
        §4.4: an action whose window passed is dropped, not run late), back in their model's
        queue, so that the policy plans them anew from the worker's state now: what can still
        meet its deadline is served, in a batch the time left allows, and the rest is refused
        as any query is. Once each: a query whose second batch is late too is refused then."""
        if not entries:
            return
        if not self.scheduler.requeue(model, [e.query for e in entries]):  # the model is gone
            self._fail(entries, Rejected(f"model {model!r}: {LATE_START}"))
            return
        for entry in entries:
            entry.again = True
            self._entries[entry.query.query_id] = entry
            self._queued[entry.future] = entry.query.query_id
        self._poke()

    def _load_done(self, action: Load, report: Report, finished: float) -> None:
        ok = report.status == "ok"
        if ok:
            self._memory[(action.worker, action.model)] = report
        result = ActionResult(
            action,
            finished,
            report.status not in ("late", "no_room"),  # not run: the model may load later
            ok,
            report.duration,
            weight_bytes=report.weight_bytes,
            error=NO_ROOM if report.status == "no_room" else report.error or report.status,
            started=report.started,
            ended=report.ended,
        )
        self.scheduler.finished(result)
        self._metrics.load(self.name, report.status, report.duration)
        self._report_memory(action.worker)

    def _unload_done(self, action: Action, report: Report, finished: float) -> None:
        self._memory.pop((action.worker, action.model), None)
        ok = report.status == "ok"
        self.scheduler.finished(
            ActionResult(action, finished, ok, ok, report.duration, error=report.error)
        )
        self._metrics.unload(self.name, getattr(action, "evicted", False))
        self._report_memory(action.worker)

    def _report_memory(self, worker: int) -> None:
        for shown in self.scheduler.describe_workers(self._clock()):
            if shown["worker"] == worker:
                held = int(shown["resident_bytes"])  # type: ignore[call-overload]
                self._metrics.worker_memory(self.name, worker, held)

    @staticmethod
    def _fail(entries: list[_Entry], error: Exception) -> None:
        for entry in entries:
            if not entry.future.done():
                entry.future.set_exception(error)

    # -- profiling -------------------------------------------------------------------------

    async def profile(self) -> None:
        """Clockwork's profiling step (§4), before the first query, for every model whose
        policy asks (``profile_sizes``): batches of zeros of each size on one worker after
        another, once to warm up and ``PROFILE_RUNS`` times measured, into the model's run
        times. A shared pool profiles one model of each group on its first worker: it is
        loaded, run and unloaded, then loaded and unloaded ``PROFILE_RUNS`` times measured. If
        an action fails, profiling of that model stops there (logged) and it is served with
        what was measured."""
        pinned = {m.name for m in self.spec.pinned}
        seen: set[str] = set()
        for name in self.models():
            sizes = self.policy(name).profile_sizes()
            group = self._specs[name].get("group") or name
            if not sizes or (name not in pinned and group in seen):
                continue
            seen.add(group)
            try:
                if name in pinned:
                    for worker in self._workers.indices():
                        await self._profile_sizes(name, worker, sizes)
                else:
                    await self._profile_loaded(name, sizes)
            except Exception as exc:
                logger.warning("profiling %s failed: %s", name, exc)
        if isinstance(self._scaler, SerfScaler):
            try:
                await self._profile_configurations(self._scaler)
            except Exception as exc:  # served as deployed, the scaler unprofiled
                logger.warning("profiling the configurations of %s failed: %s", self.name, exc)

    async def _profile_configurations(self, scaler: SerfScaler) -> None:
        """SERF's profile (serf §IV-B) of each thread count and lanes the spec allows, up to
        as many queries at once as workers of it fit the cores, into the scaler's table."""
        spec = self.spec.autoscaling
        assert spec is not None
        (model,) = self.spec.pinned
        cores = spec.cores or os.cpu_count() or 1
        rates = {}
        for threads, lanes in itertools.product(spec.threads, spec.lanes or (self.spec.lanes,)):
            most = min(spec.max, cores // threads)
            if most >= 1:
                rates[threads, lanes] = await asyncio.to_thread(
                    concurrent_rates,
                    self.spec,
                    model,
                    threads,
                    most,
                    spec.profile_queries,
                    lanes=lanes,
                    seconds=spec.profile_s,
                )
        scaler.set_profile(rates, cores)

    async def _profile_loaded(self, name: str, sizes: tuple[int, ...]) -> None:
        runs = self.scheduler.runs(name)
        for run in range(1 + PROFILE_RUNS):  # the first LOAD warms the runtime up
            loaded = await self._one(0, Call("load", name, spec=self._specs[name]))
            _expect(loaded, f"loading {name}")
            if not run:
                await self._profile_sizes(name, 0, sizes)
            unloaded = await self._one(0, Call("unload", name))
            _expect(unloaded, f"unloading {name}")
            if run:
                runs.observe_load(loaded.duration, loaded.weight_bytes)
                runs.observe_unload(unloaded.duration)

    async def _profile_sizes(self, name: str, worker: int, sizes: tuple[int, ...]) -> None:
        example = InputSpec.model_validate(self._specs[name]["input"])
        runs = self.scheduler.runs(name)
        for size in sizes:
            batch = example.batch(size)
            for run in range(1 + PROFILE_RUNS):
                report = await self._one(worker, Call("infer", name, inputs=batch))
                _expect(report, f"a batch of {size} of {name}")
                if run:  # the first run warms up
                    runs.observe(size, report.duration)

    async def _one(self, worker: int, call: Call) -> Report:
        (report,) = await self._workers.run(worker, [call])
        return report

    # -- autoscaling -----------------------------------------------------------------------

    def start_scaling(self) -> None:
        """Decide every ``every_s`` from now on (:meth:`scale`), if the pool's spec has an
        autoscaler (on the loop, once profiled)."""
        spec = self.spec.autoscaling
        if spec is None or self._scaling is not None or self._closed:
            return
        self._scaling = asyncio.get_running_loop().create_task(self._scale_every(spec.every_s))

    async def _scale_every(self, every_s: float) -> None:
        while not self._closed:
            await asyncio.sleep(every_s)
            try:
                await self.scale()
            except Exception:  # a failed step must not end the scaling
                logger.exception("scaling pool %s failed", self.name)

    async def scale(self) -> ScaleDecision:
        """One decision of the autoscaler, carried out: workers started (and in service once
        ready), or drained (and ended once their work is back)."""
        if self._scaler is None or self.spec.autoscaling is None:
            raise ValueError(f"pool {self.name!r} has no autoscaling")
        self._forget_drained()
        now = self._clock()
        window = self.spec.autoscaling.window_s
        while self._recent and self._recent[0] < now - window:
            self._recent.popleft()
        load = self._load(now)
        decision = await asyncio.to_thread(self._decide, load, self._mix(now))
        self.decision = decision
        shape = (decision.threads or self._in_force[0], decision.lanes or self._in_force[1])
        if shape != self._in_force or self._switch_to is not None:
            self._switch(decision.workers, shape)
            return decision
        serving = len(self.scheduler.workers) + len(self._starting)
        if decision.workers > serving:
            self._grow(decision.workers - serving, shape)
        elif decision.workers < serving and not self._starting:
            # with workers starting, the ones in service stay until they are: drained now,
            # the pool could be left with none that serves
            self._shrink(serving - decision.workers)
        return decision

    def _load(self, now: float) -> PoolLoad:
        """What the autoscaler reads of the pool now. A shared pool's models are taken as one:
        the largest batch cap of their policies, the tightest SLO, and run times that
        :meth:`_decide` mixes off the loop (empty here)."""
        names = self.models()
        policies = [self.scheduler.policy(name) for name in names]
        one = len(names) == 1
        return PoolLoad(
            now=now,
            workers=len(self.scheduler.workers),
            arrivals=tuple(self._recent),
            ongoing=len(self._entries) + self._in_flight,  # queued and running
            run_times=self.scheduler.runs(names[0]).table(0.5, SHOWN_WINDOW) if one else {},
            max_batch=max((p.max_batch_size for p in policies), default=1),
            slo_s=min((p.slo_s for p in policies), default=math.inf),
            cold_start_s=self._cold_start_s,
            threads=self._in_force[0],
            lanes=self._in_force[1],
        )

    def _mix(self, now: float) -> tuple[dict[str, dict[int, float]], dict[str, int]] | None:
        """A shared pool's run times of each model and its arrivals over the window, read on
        the loop for :meth:`_decide`; None for a pool of one model."""
        names = self.models()
        if len(names) == 1:
            return None
        assert self.spec.autoscaling is not None
        opens = now - self.spec.autoscaling.window_s
        tables = {name: self.scheduler.runs(name).table(0.5, SHOWN_WINDOW) for name in names}
        return tables, {name: _count_since(self._arrivals[name], opens) for name in names}

    def _decide(
        self, load: PoolLoad, mix: tuple[dict[str, dict[int, float]], dict[str, int]] | None
    ) -> ScaleDecision:
        """The scaler's decision, in a thread: a shared pool's run times first mixed, each
        model's weighted by its arrivals (:func:`mixed_run_times`), which for many models is
        work to keep off the event loop."""
        assert self._scaler is not None
        if mix is not None:
            load = replace(load, run_times=mixed_run_times(*mix, load.max_batch))
        return self._scaler.decide(load)

    def _switch(self, workers: int, shape: Shape) -> None:
        """Towards ``workers`` workers of ``shape`` (threads, lanes), a rolling replacement:
        start the ones missing, and once that many are in service, drain all others. Until
        then the old workers serve, so the switch costs no capacity and loses no query."""
        ready = [w.index for w in self.scheduler.workers if self._shape_of(w.index) == shape]
        starting = [i for i in self._starting if self._shape_of(i) == shape]
        if len(ready) + len(starting) < workers:
            self._grow(workers - len(ready) - len(starting), shape)
        if len(ready) < workers or starting:
            self._switch_to = (workers, shape)
            return
        self._switch_to = None
        self._in_force = shape
        keep = set(sorted(ready)[:workers])
        for worker in list(self.scheduler.workers):
            if worker.index not in keep:
                self.scheduler.drain(worker.index)
                self._draining.add(worker.index)
        self._poke()
        self._forget_drained()

    def _shape_of(self, index: int) -> Shape:
        return self._shapes.get(index, self.spec.shape)

    def _grow(self, count: int, shape: Shape) -> None:
        """Start ``count`` workers, each in service as soon as it is ready (not when the last
        is); a cold query that only they can serve in time waits for them."""
        asked = self._clock()
        # numbers never used before: a Ray actor ended under one may still hold its name
        known = [*self.scheduler.indices(), *self._workers.indices(), self._last_index]
        first = max(known) + 1
        self._last_index = first + count - 1
        for index in range(first, first + count):
            self._starting.add(index)
            self._shapes[index] = shape
            self._track(self._start_worker(index, asked, shape))
        self._expect(asked)

    async def _start_worker(self, index: int, asked: float, shape: Shape) -> None:
        try:
            await self._workers.add(index, *shape)
            await self._warm(index)
        except Exception as exc:  # a worker that cannot start: the next decision asks again
            logger.warning("pool %s: worker %d did not start: %s", self.name, index, exc)
            return
        finally:
            self._starting.discard(index)
            self._expect(asked)
        wanted = self._in_force if self._switch_to is None else self._switch_to[1]
        if self._closed or shape != wanted:  # a switch called off while it started
            self._workers.remove(index)
            self._shapes.pop(index, None)
            return
        self.scheduler.add_worker(index)
        for model in self.spec.pinned:
            weight = self.spec.worker_model(model).weight_bytes()
            self.scheduler.pin(index, model.name, weight or 0)
        self._cold_start_s = self._clock() - asked
        if self._switch_to is not None:
            self._switch(*self._switch_to)
        self._poke()

    async def _warm(self, index: int) -> None:
        """Run a batch of one of each model on new worker ``index``, untimed, before it serves,
        so that what its first call sets up is not paid by a query. If the batch fails, the
        worker is ended and the error raised."""
        try:
            for model in self.spec.pinned:
                first = Call("infer", model.name, inputs=model.input.batch(1))
                report = await self._one(index, first)
                _expect(report, f"a first batch of {model.name} on worker {index}")
        except Exception:
            self._workers.remove(index)
            raise

    def _expect(self, asked: float) -> None:
        """Tell the scheduler when the workers starting should be in service."""
        self.scheduler.expect_workers([asked + self._cold_start_s] * len(self._starting))

    def _shrink(self, count: int) -> None:
        """Drain ``count`` workers, the newest first: they take no more work, and end once
        what they were sent is back (:meth:`_forget_drained`), so no query is lost."""
        for index in sorted((w.index for w in self.scheduler.workers), reverse=True)[:count]:
            self.scheduler.drain(index)
            self._draining.add(index)
        self._poke()
        self._forget_drained()

    def _forget_drained(self) -> None:
        for index in sorted(self._draining):
            if self.scheduler.drained(index):
                self._draining.discard(index)
                self.scheduler.forget(index)
                self._workers.remove(index)
                self._back.pop(index, None)
                self._shapes.pop(index, None)
                for key in [k for k in self._memory if k[0] == index]:
                    del self._memory[key]

    def describe_scaling(self) -> dict[str, Any]:
        """The autoscaler's spec, the workers in service, starting and draining, and its last
        decision."""
        spec = self.spec.autoscaling
        assert spec is not None
        decision = self.decision
        return {
            "policy": spec.policy,
            "min": spec.min,
            "max": spec.max,
            "in_service": len(self.scheduler.workers),
            "starting": sorted(self._starting),
            "draining": sorted(self._draining),
            "cold_start_s": self._cold_start_s,
            "threads": self._in_force[0],
            "lanes": self._in_force[1],
            "switching_to": None
            if self._switch_to is None
            else {
                "workers": self._switch_to[0],
                "threads": self._switch_to[1][0],
                "lanes": self._switch_to[1][1],
            },
            "last": None if decision is None else dataclasses.asdict(decision),
        }

    def describe_configurations(self) -> dict[str, Any] | None:
        """SERF's profile and table, and the configuration in force; None without them."""
        if not isinstance(self._scaler, SerfScaler) or not self._scaler.table:
            return None
        threads, lanes = self._in_force
        in_force = {"workers": len(self.scheduler.workers), "threads": threads, "lanes": lanes}
        return {**self._scaler.describe(), "in_force": in_force}

    # -- what users see --------------------------------------------------------------------

    def describe_model(self, name: str) -> dict[str, Any]:
        runs = self.scheduler.runs(name)
        memory = {
            str(worker): _memory_shown(loaded)
            for (worker, model), loaded in sorted(self._memory.items())
            if model == name
        }
        load_ms = {
            f"p{round(q * 100)}": None
            if (t := runs.load_time(q, SHOWN_WINDOW)) is None
            else t * 1e3
            for q in SHOWN_QUANTILES
        }
        return {
            "pool": self.name,
            "shared": self.spec.capacity_bytes is not None,
            "replicas": len(self._workers),
            "busy_replicas": self.scheduler.busy(),
            **self.scheduler.describe_model(name),
            "memory": memory,
            "load_ms": load_ms,
            "batching": self.policy(name).describe(),
            "batch_seconds": {
                f"p{round(q * 100)}": {str(k): v for k, v in runs.table(q, SHOWN_WINDOW).items()}
                for q in SHOWN_QUANTILES
            },
            "batch_counts": {str(k): len(v) for k, v in runs.samples(SHOWN_WINDOW).items()},
        }

    async def describe(self) -> dict[str, Any]:
        """The pool and each worker: what it holds, against its capacity, and its process's
        memory as measured."""
        s = self.scheduler
        workers = s.describe_workers(self._clock())
        # read with the workers, before the wait below, in which the autoscaler may act
        scaling = {"autoscaling": self.describe_scaling()} if self._scaler is not None else {}
        indices = self._workers.indices()
        try:
            measured = dict(zip(indices, await self._workers.ready(), strict=True))
        except Exception as exc:  # a worker restarting: show what the scheduler knows
            logger.warning("reading pool %s's workers failed: %s", self.name, exc)
            measured = {}
        for shown in workers:
            seen = measured.get(shown["worker"], {})  # type: ignore[call-overload]
            shown["process"] = {
                k: v for k, v in seen.items() if k not in ("rss_growth", "device_growth")
            }
        return {
            "name": self.name,
            "shared": self.spec.capacity_bytes is not None,
            "device": self.spec.device,
            "placement": self._workers.placement or self.spec.placement,
            **({"auto": self._workers.auto} if self._workers.auto else {}),
            "call_overhead_ms": _quantiles_ms(self._overheads),
            "start_late_ms": _quantiles_ms(self._late_starts),
            "return_ms": _quantiles_ms(self.scheduler.returns),
            "step_lag_ms": _quantiles_ms(self._step_lags),
            "trip_in_ms": _recent_quantiles_ms(self._trips_in),
            "kept_back_ms": _recent_quantiles_ms(self._kept_back),
            "capacity_bytes": self.spec.capacity_bytes,
            "models": len(s.models()),
            "loads": s.loads,
            "unloads": s.unloads,
            "evictions": s.evictions,
            "cold_starts": s.cold_starts,
            "workers": workers,
            **scaling,
        }

    def timeline(self, since: float = 0.0, after: int = -1) -> dict[str, list[Any]]:
        """The actions kept (the last ``TIMELINE_ACTIONS``) sent at or after the wall time
        ``since`` and numbered past ``after``, in the order they were kept, as columns
        (``TIMELINE_COLUMNS``). An action is kept once the step that takes its report up begins,
        before the batch's callers resume, so a caller that passes the last ``seq`` it has gets
        each action once, and only the new ones are read."""
        rows: list[tuple[Any, ...]] = []
        for row in reversed(self._timeline):
            if row[_SEQ] <= after:
                break
            if row[_SENT] >= since:
                rows.append(row)
        rows.reverse()
        return {name: [row[i] for row in rows] for i, name in enumerate(TIMELINE_COLUMNS)}

    def last_arrival(self, name: str) -> float | None:
        """When the last query of ``name`` arrived (this pool's clock), None before any."""
        arrivals = self._arrivals.get(name)
        return arrivals[-1] if arrivals else None

    def plan_snapshot(self, name: str) -> PlanSnapshot:
        """Copies of what the plan view needs (``raysrv._planner``), taken on the loop."""
        policy = self.policy(name)
        holders = self.scheduler.describe_model(name)["loaded_on"]
        return PlanSnapshot(
            name,
            policy.describe(),
            np.fromiter(self._arrivals[name], dtype=float),
            self.scheduler.runs(name).table(0.99, SHOWN_WINDOW),
            max(1, len(holders)),  # type: ignore[arg-type]
            policy.slo_s,
        )

    async def close(self) -> None:
        """Stop stepping and scaling, and fail whatever is still queued."""
        self._closed = True
        if self._scaling is not None:
            self._scaling.cancel()
        for handle in (self._due, self._timer):
            if handle is not None:
                handle.cancel()
        self._answer(list(self._entries), Overloaded(f"pool {self.name!r} is shutting down"))


def _memory_shown(loaded: Report) -> dict[str, int | None]:
    shown = {"weights_bytes": loaded.weight_bytes, "rss_growth_bytes": loaded.rss_growth}
    if loaded.device_growth is not None:  # a GPU worker's device
        shown["device_growth_bytes"] = loaded.device_growth
    return shown


def _count_since(times: collections.deque[float], opens: float) -> int:
    """How many of ``times`` (ascending) are at or after ``opens``."""
    count = 0
    for t in reversed(times):
        if t < opens:
            break
        count += 1
    return count


def _recent_quantiles_ms(seconds: collections.deque[float]) -> dict[str, float | None]:
    """As :func:`_quantiles_ms`, of values kept in arrival order (the same linear rule)."""
    if not seconds:
        return {f"p{round(q * 100)}": None for q in OVERHEAD_QUANTILES}
    shown = np.quantile(np.fromiter(seconds, float), OVERHEAD_QUANTILES) * 1e3
    return {f"p{round(q * 100)}": float(v) for q, v in zip(OVERHEAD_QUANTILES, shown, strict=True)}


def _quantiles_ms(window: SortedWindow) -> dict[str, float | None]:
    return {
        f"p{round(q * 100)}": window.quantile(q) * 1e3 if window else None
        for q in OVERHEAD_QUANTILES
    }


def _expect(report: Report, what: str) -> None:
    if report.status != "ok":
        raise RuntimeError(f"{what}: {report.status} {report.error}")


def _batch(inputs: list[Input]) -> np.ndarray | list[Any]:
    """A batch's inputs as its model takes them: tensors stacked into one array, strings and
    bytes as a list."""
    return np.stack(inputs) if isinstance(inputs[0], np.ndarray) else inputs
