"""One scheduler per worker pool: Clockwork's central controller as a pure core.

Clockwork (OSDI'20) §4.5 and §5.3 put every choice in one place: a controller that sees every
model's queue and every worker's state and decides what each worker does next, as actions
(§4.4): ``LOAD`` a model's weights, ``UNLOAD`` them, ``INFER`` a batch. :class:`PoolScheduler`
is that controller for one pool of identical workers, without a clock, an event loop or Ray:
its caller (the live driver, or :func:`raysrv.analytics.simulate_pool`) submits queries, calls
:meth:`~PoolScheduler.step` with the time, carries out the returned actions and reports each
result (:meth:`~PoolScheduler.finished`). Simulated and live scheduling are the same code.

What a step decides:

1. **Which model gets a worker** whose INFER executor can take work (idle, or busy with work
   predicted to end by now and fewer than ``depth`` calls in flight: the next call travels
   while the last one runs). Each worker has two executors, as Clockwork's (§4.4): one runs
   INFERs, one LOADs and UNLOADs, each one at a time, so a LOAD goes on beside the batches of
   the models already loaded. Models are served earliest deadline first (their earliest
   latency-sensitive query's; batch-priority queries, clockwork §6.4, only count once no
   latency-sensitive one waits), a model loaded nowhere too. (Ordered instead by the latest
   time its LOAD could start, a cold query would jump ahead of every query of a loaded model
   up to a LOAD's time younger.) The actions a step gives one worker travel as one call:
   after the first, more models may add a batch each while the call's predicted work ends
   within ``ahead_s`` (clockwork §5.3 "schedules 5ms into the future"), so a call to a worker
   serves many cold-ish models at once.
2. **Which batch**, asked of the model's own :class:`~raysrv.batching.BatchingPolicy`, shown
   the workers that hold the model (free only those offered to it in this step): the policy
   dispatches, waits (the worker is offered to the next model) or refuses queries. A pool with
   one model always loaded (a dedicated pool) is exactly the per-model batcher.
3. **LOAD and UNLOAD** (clockwork Appendix B, "Loading Models"). A model loaded nowhere takes,
   when its turn comes, the worker whose LOAD executor can take work and which would finish its
   first batch soonest, after UNLOADs of the least recently used models there that no queued
   query needs, if that makes room within the worker's capacity. Its first INFER is sent once
   the LOAD should end within ``ahead_s`` (§4.1's example: "a LOAD action ... followed by an
   INFER action"), so it starts as the weights are in; sent earlier it would hold the INFER
   executor, waiting, while other models' batches queue behind it. A model loaded
   somewhere is loaded on another worker too when its load priority, Appendix B's
   ``p_m = d_m - sum_g a_mg * capacity_g / l_g``, exceeds the LOAD's cost: ``d_m`` is the run
   time of its queued queries, ``a_mg`` that demand split over the workers holding the model in
   inverse proportion to their load ``l_g`` (their work in flight plus the demand split evenly
   over holders), and ``capacity_g`` one SLO of work (a worker that would need longer serves
   only its share). A model with steady traffic (a query per SLO or more: its arrival rate,
   decayed over a second) is loaded on every worker with room, so that every INFER executor
   can serve it.
4. **Cold refusals**: a query for a model loaded nowhere whose deadline falls before the
   earliest a worker could load the model (after the LOADs in flight there) and run it alone
   (after the LOAD and the INFERs in flight) is refused before any work
   (``cannot meet deadline (cold start)``); one that can make it is served. A worker left
   idle loads the model all the same, so that LOAD times measured slow once are measured
   again rather than refuse every later cold query.

Every action carries the window in which the worker may start it (clockwork §4.4), from when it
is sent to ``latest``; a worker refuses to start an action after that. An INFER's ``latest`` is
Appendix B's "required start time": its earliest deadline less its run time and less the median
of its pool's last ``RETURN_WINDOW`` answers' ways back (from a batch's end on the worker to its
report here), so that a batch whose answer could only arrive late is never run. The run time is
the median at the machine's present speed: the model's median for the size times the pool's
:meth:`~PoolScheduler.slowdown` (the ``SLOW_Q`` quantile of its last ``SLOW_WINDOW`` INFERs'
runs over their medians, 1 at the least). A burst of requests takes the CPU from the batches
within 100 ms, while a model's median moves only after several of its own runs; a batch refused
this way costs no work, where it would have been dropped at its deadline after it
(``bench/RESULTS_ARCHIVE.md``, "spikes on a faster machine, as summarized on run 25's day"); its
queries are queued again once (:meth:`~PoolScheduler.requeue`) and planned anew. A
probe, sent to measure a model whose estimates refuse every query, plans no run time, or its
window would be shut by the very estimate it is sent to test. A LOAD's ``latest`` is the last
moment it still helps a waiting query. Each result carries the duration the worker measured,
recorded in the model's :class:`~raysrv.batching.profile.RunTimes` after the policy has seen it.
No worker is ever sent a LOAD that would take its models' weights past ``capacity_bytes``; the
worker checks again with the bytes it measures, and one that refuses a LOAD for want of room
takes no LOAD for ``load_backoff_s``.

Cost of a step: O(q log q) over the queued queries of the models consulted (those with a new
event, a due wait, or an offered worker), plus O(workers x loaded models) for evictions.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from functools import partial
from operator import attrgetter

from raysrv.batching._placement import Placement
from raysrv.batching._pool_state import (
    PREDICT_Q,
    _estimate,
    _ids,
    _Model,
    _Out,
    _Worker,
)
from raysrv.batching.actions import (
    NO_ROOM,
    NOT_LOADED,
    ActionResult,
    Infer,
    Load,
    PlanJob,
    QueueFull,
    Refusal,
    Step,
    Unload,
)
from raysrv.batching.base import (
    BatcherView,
    BatchingPolicy,
    BatchOutcome,
    Dispatch,
    QueuedQuery,
    Reject,
)
from raysrv.batching.profile import RunProfile, RunTimes, SortedWindow

__all__ = ["PoolScheduler"]

logger = logging.getLogger(__name__)

RETURN_WINDOW = 200  # INFERs behind the answer's way back that an INFER's latest start keeps
# the pool's last INFERs whose slowdown (run over its median) an INFER's latest start keeps,
# and at what quantile: a burst of requests takes the CPU from the batches within 100 ms
SLOW_WINDOW, SLOW_Q = 8, 0.75


class PoolScheduler(Placement):
    """The controller of one pool of ``workers`` identical workers (see the module docstring).

    ``capacity_bytes``: the model weights one worker may hold (None: no limit, for a dedicated
    pool whose models stay loaded); ``depth``: calls a worker may have in flight; ``kind``:
    the worker kind the run times are recorded under; ``load_backoff_s``: how long a model
    whose LOAD failed answers its queries with that failure before it is tried again, and how
    long a worker that refused a LOAD for want of room is sent none;
    ``ahead_s``: how much predicted work one call may carry for several models (clockwork §5.3
    schedules 5 ms ahead).
    """

    def __init__(
        self,
        workers: int,
        *,
        capacity_bytes: int | None = None,
        depth: int = 2,
        kind: str = "",
        profile: RunProfile | None = None,
        load_backoff_s: float = 1.0,
        ahead_s: float = 0.005,
    ) -> None:
        if workers < 0 or depth < 1:
            raise ValueError(f"need workers >= 0 and depth >= 1, got {workers} and {depth}")
        self.workers = [_Worker(i, depth) for i in range(workers)]  # in service, by index
        self._all = {w.index: w for w in self.workers}  # and those draining
        self._depth = depth
        self._coming: list[float] = []  # when the workers asked for should be in service
        self.capacity_bytes = capacity_bytes
        self.kind = kind
        self.profile = profile or RunProfile()
        self._backoff = load_backoff_s
        self._ahead = ahead_s
        self._calls = 0
        self._concurrency = 0  # the last step's
        # of each INFER that ran: from its end on the worker to its report here
        self._returns = SortedWindow(RETURN_WINDOW)
        # of the last INFERs that ran: their run over the median of their model's size
        self._slowdowns = SortedWindow(SLOW_WINDOW)
        self._models: dict[str, _Model] = {}
        self._active: dict[str, _Model] = {}  # models with queued queries
        self._removals: list[tuple[int, str]] = []  # (worker, model) to UNLOAD at the next step
        self._stash: list[Refusal] = []
        self.loads = self.unloads = self.evictions = self.cold_starts = 0

    # -- the catalogue ---------------------------------------------------------------------

    def add_model(
        self,
        name: str,
        policy: BatchingPolicy,
        *,
        weight_bytes: int | None = None,
        group: str | None = None,
        max_queue: int = 1024,
    ) -> None:
        """Serve ``name`` with ``policy``; ``weight_bytes`` (if known before a LOAD) is what
        it takes in a worker's memory, ``group`` names models whose run times are alike."""
        if name in self._models:
            raise ValueError(f"model {name!r} is already in this pool")
        too_big = weight_bytes is not None and self.capacity_bytes is not None
        if too_big and weight_bytes > self.capacity_bytes:  # type: ignore[operator]
            raise ValueError(
                f"model {name!r} has {weight_bytes} bytes of weights, more than a worker's "
                f"capacity of {self.capacity_bytes}"
            )
        runs = self.profile.runs(name, self.kind, group)
        if weight_bytes is not None:
            runs.weight_bytes = weight_bytes
        policy.bind(runs, shared=self.capacity_bytes is not None)
        self._models[name] = _Model(name, policy, runs, weight_bytes, max_queue)

    def pin(self, worker: int, name: str, weight_bytes: int) -> None:
        """``name`` is loaded on ``worker`` for good (a dedicated pool's model, loaded at start)."""
        w = self._all[worker]
        w.held[name] = weight_bytes
        w.pinned.add(name)
        w.peak_bytes = max(w.peak_bytes, w.resident)

    def remove_model(self, name: str) -> tuple[int, ...]:
        """Stop serving ``name``: its queued queries' ids (the caller answers them) and, at the
        next step, an UNLOAD from every worker holding it."""
        model = self._models.pop(name)
        self._active.pop(name, None)
        for w in self.workers:
            if name in w.held:
                w.pinned.discard(name)
                self._removals.append((w.index, name))
        self.profile.forget(name, self.kind)
        return tuple(q.query_id for q in model.queue)

    def set_policy(self, name: str, policy: BatchingPolicy) -> None:
        """Swap a model's policy live; its queue and its run times stay."""
        model = self._models[name]
        policy.bind(model.runs, shared=self.capacity_bytes is not None)
        model.policy, model.planning, model.dirty = policy, False, True

    def policy(self, name: str) -> BatchingPolicy:
        return self._models[name].policy

    def runs(self, name: str) -> RunTimes:
        return self._models[name].runs

    def models(self) -> list[str]:
        return list(self._models)

    def __contains__(self, name: object) -> bool:
        return name in self._models

    # -- workers in and out ----------------------------------------------------------------

    def add_worker(self, index: int | None = None) -> int:
        """A new worker in service, holding nothing yet: its index (``index``, or the next
        after the highest known)."""
        if index is None:
            index = max(self._all, default=-1) + 1
        elif index in self._all:
            raise ValueError(f"worker {index} is already known")
        w = _Worker(index, self._depth)
        self._all[index] = w
        self.workers.append(w)
        if self._coming:
            self._coming.pop(0)
        return index

    def expect_workers(self, ready_at: list[float]) -> None:
        """Workers asked for, and when each should be in service: a cold query that only one
        of them can serve in time waits for it rather than being refused."""
        self._coming = sorted(ready_at)
        for model in self._active.values():
            model.dirty = True  # a cold one's doom changes

    def drain(self, index: int) -> None:
        """Take worker ``index`` out of service: it gets no more work, and the actions already
        sent to it report as before (:meth:`finished`). It is :meth:`drained` once they have."""
        w = self._all[index]
        if w not in self.workers:
            raise ValueError(f"worker {index} is not in service")
        self.workers.remove(w)
        self._removals = [(i, name) for i, name in self._removals if i != index]
        for model in self._models.values():
            model.dirty = True  # its policy sees one worker fewer

    def indices(self) -> list[int]:
        """Every worker known, in service or draining, ascending."""
        return sorted(self._all)

    def drained(self, index: int) -> bool:
        """Whether a worker out of service has no action in flight any more."""
        w = self._all[index]
        return w not in self.workers and not w.busy

    def forget(self, index: int) -> None:
        """Forget a drained worker (its process can go)."""
        if not self.drained(index):
            raise ValueError(f"worker {index} is in service or has actions in flight")
        del self._all[index]

    # -- queries ---------------------------------------------------------------------------

    def submit(self, name: str, query: QueuedQuery) -> bool:
        """Queue ``query`` for ``name``; True when no worker holds the model (a cold start).
        Raises :class:`QueueFull` past the model's ``max_queue`` and ``KeyError`` for an
        unknown model."""
        model = self._models[name]
        if len(model.queue) >= model.max_queue:
            raise QueueFull(f"model {name!r} has {len(model.queue)} queries waiting (max_queue)")
        cold = not any(name in w.held and name not in w.loading for w in self.workers)
        model.arrived(query.arrival)
        model.queue.append(query)
        model.dirty = True
        self._active[name] = model
        if cold:
            model.cold_starts += 1
            self.cold_starts += 1
        return cold

    def requeue(self, name: str, queries: list[QueuedQuery]) -> bool:
        """Queue ``queries`` again, of a batch whose worker did not start it by its latest
        start: among those waiting in order of arrival, not counted as arrivals twice nor
        held to ``max_queue`` (they were let in). False when the model is gone."""
        model = self._models.get(name)
        if model is None:
            return False
        model.queue = sorted([*queries, *model.queue], key=attrgetter("arrival"))
        model.dirty = True
        self._active[name] = model
        return True

    def withdraw(self, name: str, query_id: int) -> bool:
        """Take a query out of its queue (its caller left); False when it is not queued."""
        model = self._models.get(name)
        if model is None:
            return False
        for i, q in enumerate(model.queue):
            if q.query_id == query_id:
                del model.queue[i]
                if not model.queue:
                    self._active.pop(name, None)
                return True
        return False

    def queue_length(self, name: str) -> int:
        return len(self._models[name].queue)

    def load_error(self, name: str) -> str:
        """Why the model's last LOAD failed ("" if it did not)."""
        model = self._models.get(name)
        return "" if model is None else model.error

    # -- one step --------------------------------------------------------------------------

    def step(self, now: float, concurrency: int = 0) -> Step:
        """Everything to do at ``now``: actions for workers, refusals and planning jobs.
        ``concurrency``: what the policies see as :attr:`BatcherView.concurrency`."""
        self._calls += 1
        self._concurrency = concurrency
        offered = [w for w in self.workers if w.infers.can_take(now)]
        loadable = {w.index for w in self.workers if w.loads.can_take(now) and w.full_until <= now}
        out = _Out(self._calls, {w.index: now + self._ahead for w in offered}, loadable)
        out.refusals.extend(self._stash)
        self._stash.clear()
        self._emit_removals(now, out)
        if loadable and len(self.workers) > 1:
            self._replicate(now, out)
        for model in self._consulted(now, offered, bool(loadable)):
            self._plan(model, now, out)
            if self._holders(model.name):
                self._serve(model, now, out)
            else:
                self._cold(model, now, out)
        if loadable - out.loaded:
            self._scale_out(now, out)
        for w in self.workers if self._active else ():
            for executor in (w.infers, w.loads):
                opening = executor.opening(now)
                if opening is not None:
                    out.wake = min(out.wake, opening)
            if w.full_until > now:
                out.wake = min(out.wake, w.full_until)
        wake = out.wake if out.wake < math.inf else None
        return Step(tuple(out.actions), tuple(out.refusals), wake, tuple(out.plans))

    def _consulted(self, now: float, offered: list[_Worker], cold_room: bool) -> list[_Model]:
        """Models with queries that have something new, a due wait or an offered worker (a
        worker that may LOAD, for a cold model), most urgent first."""
        held = {name for w in offered for name in w.held}
        chosen = []
        for model in list(self._active.values()):
            holders = self._holders(model.name)
            if (
                model.dirty
                or model.wake <= now
                or model.name in held
                or (cold_room and not holders)
            ):
                chosen.append(model)
        # each urgency reads the model's whole queue: only worth it when there is an order
        return sorted(chosen, key=self._urgency) if len(chosen) > 1 else chosen

    def _urgency(self, model: _Model) -> tuple[int, float, float]:
        """Earliest deadline first; batch clients' queries after every latency-sensitive one."""
        urgent = [q.deadline for q in model.queue if q.priority <= 0]
        oldest = min(q.arrival for q in model.queue)
        if not urgent:
            return (1, oldest, oldest)
        return (0, min(urgent), oldest)

    def _plan(self, model: _Model, now: float, out: _Out) -> None:
        if model.planning:
            return
        job = model.policy.plan_request(now)
        if job is not None:
            model.planning = True
            out.plans.append(PlanJob(model.name, model.policy, job))

    def apply_plan(self, name: str, policy: BatchingPolicy, plan: object | None) -> None:
        """The result of a :class:`PlanJob` (None if it failed); ignored if the policy was
        swapped meanwhile."""
        model = self._models.get(name)
        if model is None or model.policy is not policy:
            return
        model.planning = False
        if plan is not None:
            policy.apply_plan(plan)
            model.dirty = True

    # -- INFER -----------------------------------------------------------------------------

    def _serve(self, model: _Model, now: float, out: _Out) -> None:
        """Ask the model's policy until it waits, offering it the workers holding it whose
        INFER executor can take work, where it is loaded or its LOAD should end within
        ``ahead_s``: an INFER sent earlier would hold the INFER executor, waiting for the LOAD,
        while other models' batches queue behind it."""
        model.dirty, model.wake = False, math.inf
        holders = self._holders(model.name)
        soon = now + self._ahead
        loading = [w.loading[model.name] - self._ahead for w in holders if model.name in w.loading]
        if loading and min(loading) > now:  # look again when the first LOAD is nearly done
            model.wake = min(loading)
            out.wake = min(out.wake, model.wake)
        kept = partial(self._kept, model.runs)  # what a batch's latest start keeps, by size
        for _ in range(10_000):
            if not model.queue:
                return
            offer = {
                w.index
                for w in holders
                if out.open_for(w, model.name) and w.loading.get(model.name, now) <= soon
            }
            slots = [w.slot(model.name, now, w.index in offer) for w in holders]
            view = BatcherView(now, model.queue, slots, self._concurrency, kept)
            try:
                decision = model.policy.decide(view)
                if isinstance(decision, Dispatch):
                    self._dispatch(model, decision, offer, now, out)
                    continue
                if isinstance(decision, Reject):
                    self._refuse(model, decision.query_ids, decision.reason, out)
                    continue
            except Exception as exc:  # a broken policy must not strand the queue
                logger.exception("batching policy of %s failed", model.name)
                reason = f"batching policy failed: {exc}"
                self._refuse(model, _ids(model.queue), reason, out, "failed")
                return
            else:
                if decision.until is not None and decision.until > now:
                    model.wake = min(model.wake, decision.until)
                    out.wake = min(out.wake, decision.until)
                return
        raise RuntimeError(f"policy of {model.name!r} did not wait after 10,000 decisions")

    def _dispatch(
        self,
        model: _Model,
        decision: Dispatch,
        offer: set[int],
        now: float,
        out: _Out,
    ) -> None:
        if not decision.query_ids or decision.replica not in offer:
            raise RuntimeError(
                f"policy {model.policy.name!r} of {model.name!r} dispatched {decision} to a "
                f"worker not offered to it"
            )
        queries = self._take(model, decision.query_ids)
        w = self._all[decision.replica]
        ready = w.ready_at(model.name, now)
        expected = ready if decision.expected_start is None else decision.expected_start
        predicted = _estimate(model.runs, len(queries), PREDICT_Q, default=math.inf)
        # a probe, sent to test the estimate, is not planned on it
        kept = self._back() if decision.probe else self._kept_for(predicted)
        latest = min(q.deadline for q in queries) - kept  # Appendix B's required start
        action = Infer(w.index, model.name, decision.query_ids, now, expected, latest)
        w.infers.sent(action, predicted, now, out.call, ready)
        w.running[model.name] += 1
        w.last_used[model.name] = now
        out.used.add(w.index)
        out.used_by.setdefault(model.name, set()).add(w.index)
        out.actions.append(action)

    def _take(self, model: _Model, ids: tuple[int, ...]) -> list[QueuedQuery]:
        n = len(ids)
        head = model.queue[:n]
        if len(head) == n and all(q.query_id == i for q, i in zip(head, ids, strict=True)):
            del model.queue[:n]  # FIFO fast path
            taken = head
        else:
            wanted = set(ids)
            taken = [q for q in model.queue if q.query_id in wanted]
            if len(taken) != len(wanted) or len(wanted) != n:
                raise RuntimeError(
                    f"policy {model.policy.name!r} named queries that are not queued: {ids}"
                )
            model.queue = [q for q in model.queue if q.query_id not in wanted]
        if not model.queue:
            self._active.pop(model.name, None)
        return taken

    def _refuse(
        self, model: _Model, ids: Iterable[int], reason: str, out: _Out, error: str = "rejected"
    ) -> None:
        ids = tuple(ids)
        if ids:
            self._take(model, ids)
            out.refusals.append(Refusal(model.name, ids, reason, error))

    # -- results ---------------------------------------------------------------------------

    def finished(self, result: ActionResult) -> None:
        """A worker's report of one action, at ``result.finished``."""
        action = result.action
        w = self._all[action.worker]
        w.executor(action).done(action, result.finished, result.ended)
        if isinstance(action, Infer):
            self._infer_done(w, action, result)
        elif isinstance(action, Load):
            self._load_done(w, action, result)
        else:
            self._unload_done(action, result)

    def _infer_done(self, w: _Worker, action: Infer, result: ActionResult) -> None:
        w.running[action.model] -= 1
        load = w.load_of.get(action.model)
        if result.error == NOT_LOADED and (load is None or load.sent <= action.sent):
            # its LOAD did not run, or the worker lost it (it restarted): forget it there,
            # unless a LOAD sent since will tell
            w.held.pop(action.model, None)
            w.loading.pop(action.model, None)
            w.load_of.pop(action.model, None)
        model = self._models.get(action.model)
        if model is None:
            return
        model.dirty = True
        size = result.size if result.size is not None else len(action.query_ids)
        model.batches += 1
        model.batched += size
        good = result.ran and result.ok and math.isfinite(result.duration)
        duration = result.duration if good else result.finished - action.sent
        model.policy.observe(
            BatchOutcome(
                size,
                action.worker,
                action.sent,
                result.finished,
                duration,
                result.ran and result.ok,
                action.expected_start,
                result.ended if math.isfinite(result.ended) else None,
            )
        )
        if good and size:
            median = _estimate(model.runs, size, PREDICT_Q)
            if median > 0:
                self._slowdowns.add(result.duration / median)
            model.runs.observe(size, result.duration)
        if result.ran and math.isfinite(result.ended):
            self._returns.add(max(0.0, result.finished - result.ended))

    def _load_done(self, w: _Worker, action: Load, result: ActionResult) -> None:
        """A LOAD's report. Only the LOAD last sent for the model to the worker says whether
        the model is there. The report of one sent before it can come back after it (a batch
        behind the first found the model missing, and the next query sent another); taken at
        its word, the scheduler forgot a model the worker then loaded, for good: it never
        evicted it, and every LOAD it sent there found no room. A LOAD that ran when no LOAD
        says the model is there (its batch's report came first) is taken at its word: the
        worker holds it."""
        current = w.load_of.get(action.model) is action
        if current:
            w.loading.pop(action.model, None)
        model = self._models.get(action.model)
        if model is not None:
            model.dirty = True
        if not (result.ran and result.ok):
            self._load_not_done(w, action, result, model, current)
            return
        self.loads += 1
        if model is not None:
            model.error = ""
        weight = result.weight_bytes if result.weight_bytes is not None else action.weight_bytes
        if action.model not in w.load_of and action.model in self._models:
            w.load_of[action.model] = action
            w.last_used.setdefault(action.model, result.finished)
            current = True
        if current:
            w.held[action.model] = weight or 0
            w.peak_bytes = max(w.peak_bytes, w.resident)
        if model is not None:
            model.loads += 1
            model.weight_bytes = weight
            if math.isfinite(result.duration):
                model.runs.observe_load(result.duration, weight)

    def _load_not_done(
        self, w: _Worker, action: Load, result: ActionResult, model: _Model | None, current: bool
    ) -> None:
        """A LOAD that was not run (late, or no room) or failed: the model is not there, unless
        a LOAD sent since (``current`` is False) will tell."""
        if current:
            w.held.pop(action.model, None)
            w.last_used.pop(action.model, None)
            w.load_of.pop(action.model, None)
        if result.error == NO_ROOM:  # its memory is not as this scheduler believes
            w.full_until = result.finished + self._backoff
            if model is not None and result.weight_bytes is not None:
                model.weight_bytes = result.weight_bytes  # what the worker measured
        if result.ran and model is not None:  # it failed: answer its queries with that
            model.failed_until = result.finished + self._backoff
            model.error = result.error
            reason = f"model could not be loaded: {result.error}"
            if model.queue:
                self._stash.append(Refusal(model.name, _ids(model.queue), reason, "failed"))
                model.queue = []
                self._active.pop(model.name, None)

    def _unload_done(self, action: Unload, result: ActionResult) -> None:
        model = self._models.get(action.model)
        if model is not None and result.ran and math.isfinite(result.duration):
            model.runs.observe_unload(result.duration)

    # -- what users see --------------------------------------------------------------------

    @property
    def returns(self) -> SortedWindow:
        """The last ``RETURN_WINDOW`` INFERs' ways back, from a batch's end on its worker to its
        report here (seconds): what an INFER's latest start keeps."""
        return self._returns

    def _back(self) -> float:
        """The answer's way back an INFER's latest start keeps."""
        return self._returns.quantile(PREDICT_Q) if self._returns else 0.0

    def _kept(self, runs: RunTimes, size: int) -> float:
        """Seconds an INFER of ``size`` keeps between its latest start and its earliest
        deadline: its median run at the machine's present speed and the way back (the
        module's docstring)."""
        return self._kept_for(_estimate(runs, size, PREDICT_Q, default=math.inf))

    def _kept_for(self, predicted: float) -> float:
        """:meth:`_kept` of a batch whose median run is ``predicted`` (inf: none measured)."""
        run = predicted * self.slowdown() if math.isfinite(predicted) else 0.0
        return run + self._back()

    def slowdown(self) -> float:
        """How much slower than their medians the pool's INFERs run now (1 at the least): the
        ``SLOW_Q`` quantile of the last ``SLOW_WINDOW`` runs over their medians."""
        return max(1.0, self._slowdowns.quantile(SLOW_Q)) if self._slowdowns else 1.0

    def describe_model(self, name: str) -> dict[str, object]:
        model = self._models[name]
        on = [w.index for w in self.workers if name in w.held and name not in w.loading]
        loading = [w.index for w in self.workers if name in w.loading]
        return {
            "loaded_on": on,
            "loading_on": loading,
            "cold": not on and not loading,
            "weights_bytes": model.weight_bytes,
            "queue_length": len(model.queue),
            "batches": model.batches,
            "batched_queries": model.batched,
            "loads": model.loads,
            "evictions": model.evictions,
            "cold_starts": model.cold_starts,
            "last_load_error": model.error or None,
        }

    def describe_workers(self, now: float) -> list[dict[str, object]]:
        return [
            {
                "worker": w.index,
                "models": sorted(n for n in w.held if n not in w.loading),
                "loading": sorted(w.loading),
                "resident_bytes": w.resident,
                "peak_bytes": w.peak_bytes,
                "capacity_bytes": self.capacity_bytes,
                "in_flight": len(w.infers.inflight) + len(w.loads.inflight),
                "busy": w.busy,
                "free_in_s": w.infers.outstanding(now),
                "draining": w not in self.workers,
            }
            for _, w in sorted(self._all.items())
        ]

    def busy(self) -> int:
        return sum(w.busy for w in self._all.values())
