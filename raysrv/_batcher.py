"""The batcher: raysrv's own batching loop for one model (not ``@serve.batch``).

It holds the model's queue and one slot per replica, asks the :class:`BatchingPolicy` what to do
(``decide``), acts (dispatch a batch to a free replica, reject, or sleep until a time or the next
event) and reports each finished batch back (``observe``), in the step-loop shape of STYLE §5.
A batch is only ever cut for a replica that can take it: an idle one, or, with
``pipeline_depth`` 2, one whose running batch should be about to end, so that the next batch
arrives as it frees up (``_pipeline``). Each replica executes exactly one batch at a time, and
queries accumulate while all are busy (RAY_NOTES: ``@serve.batch`` cuts batches regardless).
The queue is bounded: past ``max_queue`` waiting queries, :meth:`Batcher.submit` refuses at once.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from raysrv._pipeline import ReplicaPipeline
from raysrv._planner import PlanSnapshot
from raysrv.analytics.profiles import RollingQuantile
from raysrv.batching import (
    BatcherView,
    BatchingPolicy,
    BatchOutcome,
    Dispatch,
    QueuedQuery,
    Reject,
    Wait,
)
from raysrv.errors import ModelFailed, Overloaded, Rejected
from raysrv.metrics import Metrics

__all__ = ["DURATION_WINDOW", "PROFILE_RUNS", "Batcher", "Execute"]

DURATION_WINDOW = 100  # batches per size behind the rolling duration quantiles
PROFILE_RUNS = 3  # measured runs per batch size in the profiling step, after one to warm up
ARRIVAL_WINDOW = 2000  # arrival times kept for the plan view
LATE_START = "deadline passed before the batch could start"

logger = logging.getLogger(__name__)

Execute = Callable[..., Awaitable[tuple[list[Any] | None, float]]]
"""``execute(inputs, replica, latest_start)`` runs one stacked batch on the given replica and
returns (one output per input, run seconds); outputs are None when the replica found the batch's
``latest_start`` (wall-clock seconds) already past and did not run it."""


@dataclass(slots=True)
class _Entry:
    query: QueuedQuery
    x: np.ndarray
    future: asyncio.Future[Any]


class _QueueView(Sequence[QueuedQuery]):
    """The queue as the policy sees it: metadata only, no copies."""

    __slots__ = ("_entries",)

    def __init__(self, entries: list[_Entry]) -> None:
        self._entries = entries

    def __len__(self) -> int:
        return len(self._entries)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [e.query for e in self._entries[index]]
        return self._entries[index].query


class Batcher:
    """One model's queue, replica slots and batching loop (call from one asyncio event loop)."""

    def __init__(
        self,
        model: str,
        policy: BatchingPolicy,
        execute: Execute,
        replicas: int,
        max_queue: int,
        clock: Callable[[], float] = time.monotonic,
        metrics: Metrics | None = None,
        pipeline_depth: int = 1,
    ) -> None:
        self.model = model
        self.policy = policy
        self._execute = execute
        self._replicas = ReplicaPipeline(replicas, pipeline_depth)
        self._max_queue = max_queue
        self._clock = clock
        self._metrics = metrics or Metrics()
        self._queue: list[_Entry] = []
        self._ids = itertools.count()
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._running: set[asyncio.Task[None]] = set()
        self._planning: asyncio.Future[object] | None = None
        self._arrivals: collections.deque[float] = collections.deque(maxlen=ARRIVAL_WINDOW)
        self.batches = 0
        self.batched = 0  # queries in those batches
        # Replica-measured run time per batch size over the last batches (clockwork §5.3).
        self.durations = {
            q: RollingQuantile(window=DURATION_WINDOW, quantile=q) for q in (0.5, 0.99)
        }

    @property
    def queue_length(self) -> int:
        return len(self._queue)

    def set_policy(self, policy: BatchingPolicy) -> None:
        """Swap the policy live; queued queries stay queued. The new policy is seeded with the
        run times measured so far, as the profiling step seeds the first one."""
        for size, seconds in self.durations[0.5].samples().items():
            for duration in seconds:
                policy.seed(size, duration)
        self.policy = policy
        self._wake.set()

    def submit(
        self, x: np.ndarray, deadline: float = math.inf, priority: int = 0
    ) -> asyncio.Future[Any]:
        """Queue one input; the future resolves to its output, or raises why it could not."""
        if len(self._queue) >= self._max_queue:
            self._metrics.rejection(self.model, "queue_full")
            raise Overloaded(
                f"model {self.model!r} has {len(self._queue)} queries waiting (max_queue)"
            )
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        query = QueuedQuery(next(self._ids), self._clock(), deadline, priority)
        self._arrivals.append(query.arrival)
        self._queue.append(_Entry(query, x, future))
        if self._loop_task is None:
            self._loop_task = asyncio.create_task(self._run(), name=f"batcher-{self.model}")
        self._wake.set()
        return future

    async def profile(self, x: np.ndarray) -> None:
        """Clockwork's profiling step (§4), before the first query: batches of ``x`` repeated,
        of each size the policy asks for (``profile_sizes``), on one replica after another, so
        each run is measured alone. A size runs once to warm up (a runtime's first run of a
        shape allocates), then ``PROFILE_RUNS`` times; those run times seed the policy, the
        rolling duration quantiles and the pipeline's predictions. If a run fails, profiling
        stops there (logged) and the model is served with what was measured."""
        for replica in range(len(self._replicas)):
            for size in self.policy.profile_sizes():
                try:
                    await self._profile_size(np.stack([x] * size), replica)
                except Exception as exc:
                    logger.warning(
                        "profiling %s on a batch of %d failed: %s", self.model, size, exc
                    )
                    return

    async def _profile_size(self, batch: np.ndarray, replica: int) -> None:
        size = len(batch)
        for run in range(1 + PROFILE_RUNS):
            outputs, duration = await self._execute(batch, replica, math.inf)
            if run and outputs is not None:  # the first run warms up
                self._replicas.profile.observe(size, duration)
                self._observe_duration(size, duration)
                self.policy.seed(size, duration)

    def _observe_duration(self, size: int, duration: float) -> None:
        for rolling in self.durations.values():
            rolling.observe(size, duration)

    def withdraw(self, future: asyncio.Future[Any]) -> bool:
        """Take a query out of the queue because its caller stopped waiting (its deadline
        passed); False when it is no longer queued (in a batch, or answered)."""
        for i, entry in enumerate(self._queue):
            if entry.future is future:
                del self._queue[i]
                return True
        return False

    def describe(self) -> dict[str, Any]:
        return {
            "queue_length": len(self._queue),
            "replicas": len(self._replicas),
            "busy_replicas": self._replicas.busy(),
            "batches": self.batches,
            "batched_queries": self.batched,
            "batching": self.policy.describe(),
            "batch_seconds": {
                f"p{round(q * 100)}": {str(k): v for k, v in sorted(r.table().items())}
                for q, r in self.durations.items()
            },
        }

    def plan_snapshot(self) -> PlanSnapshot:
        """Copies of what the plan view needs (``raysrv._planner``), taken on the loop."""
        return PlanSnapshot(
            self.model,
            self.policy.describe(),
            np.fromiter(self._arrivals, dtype=float),
            self.durations[0.99].table(),
            len(self._replicas),
            self.policy.slo_s,
        )

    async def close(self) -> None:
        """Stop the loop and fail whatever is still queued."""
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        self._fail(self._queue, Overloaded(f"model {self.model!r} is shutting down"))
        self._queue = []

    def _plan(self, now: float) -> None:
        """Start the policy's planning job off the loop, if one is due and none is running."""
        if self._planning is not None and not self._planning.done():
            return
        job = self.policy.plan_request(now)
        if job is None:
            return
        policy = self.policy
        self._planning = asyncio.ensure_future(asyncio.to_thread(job))

        def adopt(task: asyncio.Future[object]) -> None:
            if task.cancelled():
                return
            if task.exception() is not None:
                logger.warning("planning for %s failed: %s", self.model, task.exception())
            elif policy is self.policy:  # not replaced meanwhile
                policy.apply_plan(task.result())
                self._wake.set()

        self._planning.add_done_callback(adopt)

    async def _run(self) -> None:
        while True:
            now = self._clock()
            self._plan(now)
            view = BatcherView(now, _QueueView(self._queue), self._replicas.view(now))
            try:
                decision = self.policy.decide(view)
                if isinstance(decision, Dispatch):
                    self._dispatch(decision)
                    continue
                if isinstance(decision, Reject):
                    self._reject(decision)
                    continue
            except Exception as exc:  # a broken policy must not strand the queue
                logger.exception("batching policy of %s failed", self.model)
                self._fail(
                    self._queue, ModelFailed(f"batching policy of {self.model!r} failed: {exc}")
                )
                self._queue = []
                decision = Wait()
            await self._sleep(self._wake_time(decision.until, now))

    def _wake_time(self, until: float | None, now: float) -> float | None:
        """The policy's wake-up time, or earlier if a busy replica can take a batch before it."""
        opening = self._replicas.next_opening(now)
        if opening is None:
            return until
        return opening if until is None else min(opening, until)

    async def _sleep(self, until: float | None) -> None:
        timeout = None if until is None else until - self._clock()
        if timeout is not None and timeout <= 0:
            # A time already past (the policy's or a replica's opening): yield, then decide again.
            await asyncio.sleep(0)
            return
        # Not ``asyncio.wait_for``: before Python 3.12 it drops a cancellation that lands in the
        # step the wait ends, and the loop would outlive ``close``.
        woken = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait((woken,), timeout=timeout)
        finally:
            woken.cancel()
        self._wake.clear()

    def _take(self, query_ids: tuple[int, ...]) -> list[_Entry]:
        n = len(query_ids)
        head = self._queue[:n]
        if len(head) == n and all(
            e.query.query_id == q for e, q in zip(head, query_ids, strict=True)
        ):
            del self._queue[:n]  # FIFO fast path
            return head
        wanted = set(query_ids)
        taken = [e for e in self._queue if e.query.query_id in wanted]
        if len(taken) != len(wanted):
            raise RuntimeError(f"policy {self.policy.name!r} named queries that are not queued")
        self._queue = [e for e in self._queue if e.query.query_id not in wanted]
        return taken

    def _dispatch(self, decision: Dispatch) -> None:
        now = self._clock()
        if not decision.query_ids or not self._replicas.can_take(decision.replica, now):
            raise RuntimeError(
                f"policy {self.policy.name!r} dispatched {decision} to a busy replica"
            )
        self._metrics.queue_length(self.model, len(self._queue))  # sampled before each batch
        entries = [e for e in self._take(decision.query_ids) if not e.future.done()]
        if not entries:  # every caller gave up while waiting
            return
        # A replica takes a batch only once its last one should be done (``can_take`` above), so
        # unless the policy planned otherwise the batch is expected to start now.
        expected = now if decision.expected_start is None else decision.expected_start
        self._replicas.sent(decision.replica, len(entries), now)
        task = asyncio.create_task(self._run_batch(entries, decision.replica, now, expected))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    def _reject(self, decision: Reject) -> None:
        entries = self._take(decision.query_ids)
        self._metrics.rejection(self.model, decision.reason)
        self._fail(entries, Rejected(f"model {self.model!r}: {decision.reason}"))
        self._metrics.queue_length(self.model, len(self._queue))

    async def _run_batch(
        self, entries: list[_Entry], replica: int, dispatched: float, expected: float
    ) -> None:
        ok = False
        duration = math.nan
        try:
            outputs, duration = await self._execute(
                np.stack([e.x for e in entries]), replica, self._latest_start(entries)
            )
            if outputs is None:  # the replica found the batch's earliest deadline already past
                self._metrics.rejection(self.model, "deadline_before_start")
                self._fail(entries, Rejected(f"model {self.model!r}: {LATE_START}"))
                return
            if len(outputs) != len(entries):
                raise ValueError(f"returned {len(outputs)} outputs for {len(entries)} inputs")
            for entry, output in zip(entries, outputs, strict=True):
                if not entry.future.done():
                    entry.future.set_result(output)
            ok = True
        except Exception as exc:
            logger.warning("batch of %d for %s failed: %s", len(entries), self.model, exc)
            self._fail(entries, ModelFailed(f"model {self.model!r} failed on a batch: {exc}"))
        finally:
            finished = self._clock()
            self._replicas.done(replica, len(entries), duration if ok else None, finished)
            if ok and math.isfinite(duration):
                self._observe_duration(len(entries), duration)
            self.batches += 1
            self.batched += len(entries)
            if not ok or not math.isfinite(duration):
                duration = finished - dispatched
            self.policy.observe(
                BatchOutcome(len(entries), replica, dispatched, finished, duration, ok, expected)
            )
            self._metrics.batch(self.model, len(entries), finished - dispatched)
            self._wake.set()

    def _latest_start(self, entries: list[_Entry]) -> float:
        """The batch's earliest deadline on the wall clock, which replicas share."""
        earliest = min(e.query.deadline for e in entries)
        return time.time() + (earliest - self._clock()) if math.isfinite(earliest) else math.inf

    @staticmethod
    def _fail(entries: list[_Entry], error: Exception) -> None:
        for entry in entries:
            if not entry.future.done():
                entry.future.set_exception(error)
