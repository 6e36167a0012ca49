"""A discrete-event simulator of one model's batching: the referee for the latency models.

Three ways to meet the replicas:

* ``replicas=k`` (raysrv's own): the model is a dedicated pool of k workers scheduled by the
  live system's scheduler (:func:`raysrv.analytics.simulate_pool`, which this calls): the
  policy sees the k workers and cuts a batch only for a free one, exactly as live, minus the
  network and the Python overheads.
* ``replicas=None``: the policy is given a fresh free slot whenever it asks, the infinite-server
  setting of BATCH (SC'20) §III-B (a serverless function per batch).
* ``queue_batches=True`` (BATCH §III-B's buffer in front of finite servers): the policy always
  sees a free slot, and a cut batch waits FCFS for one of ``replicas`` servers.

In the last two, after every arrival, completion or expired wait the policy is asked
``decide(view)`` until it waits, and each finished batch goes to ``policy.observe`` and then to
its run times (``policy.runs``), as the scheduler does.

Per-query deadlines (``slo`` seconds after arrival, or absolute times) are shown to the policy,
which may reject; the result counts rejections and answers later than their deadline.
Cost: O(log n) per event plus the policy's own cost; about 10^5 queries a second.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import overload

import numpy as np

from raysrv.analytics.poolsim import ServiceFn, ServiceSource, SimModel, service_fn, simulate_pool
from raysrv.batching.base import (
    BatcherView,
    BatchingPolicy,
    BatchOutcome,
    Dispatch,
    QueuedQuery,
    Reject,
    ReplicaSlot,
    Wait,
)

__all__ = ["ServiceFn", "ServiceSource", "SimResult", "simulate"]

_Event = tuple[float, int, int, tuple[int, ...], float]  # end, seq, replica, query ids, start


@dataclass(frozen=True)
class SimResult:
    """Per-query and per-batch outcomes of one run (times in seconds)."""

    arrivals: np.ndarray
    latencies: np.ndarray  # completion - arrival; NaN for rejected queries
    rejected: np.ndarray  # bool per query
    late: np.ndarray  # bool per query: answered after its deadline
    batch_sizes: np.ndarray
    batch_starts: np.ndarray
    reasons: dict[str, int] = field(default_factory=dict)
    refused_after: np.ndarray = field(default_factory=lambda: np.array([]))  # per query: its
    # refusal - arrival (NaN for those answered; empty where the run did not keep it)

    @property
    def answered(self) -> np.ndarray:
        """Latencies of the answered queries."""
        return self.latencies[~self.rejected]

    def percentile(self, q: float) -> float:
        """The q-quantile (0 < q < 1) of answered latency (numpy's 'inverted_cdf', no
        interpolation, so an atom of the true law is reproduced exactly)."""
        return float(np.quantile(self.answered, q, method="inverted_cdf"))


class _Window(Sequence[QueuedQuery]):
    """The queue from ``head`` on, without copying: what a policy sees as ``view.queue``."""

    def __init__(self, items: list[QueuedQuery], head: int) -> None:
        self._items, self._head = items, head

    def __len__(self) -> int:
        return len(self._items) - self._head

    @overload
    def __getitem__(self, i: int) -> QueuedQuery: ...

    @overload
    def __getitem__(self, i: slice) -> list[QueuedQuery]: ...

    def __getitem__(self, i: int | slice) -> QueuedQuery | list[QueuedQuery]:
        if isinstance(i, slice):
            start, stop, step = i.indices(len(self))
            return self._items[self._head + start : self._head + stop : step]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self._items[self._head + i]

    def __iter__(self) -> Iterator[QueuedQuery]:
        return (self._items[j] for j in range(self._head, len(self._items)))


class _Run:
    """State of one simulation without a pool (unbounded, or batches queued FCFS for servers)."""

    def __init__(
        self,
        arrivals: np.ndarray,
        service: ServiceFn,
        policy: BatchingPolicy,
        replicas: int | None,
        deadlines: np.ndarray,
        priorities: np.ndarray,
    ) -> None:
        self.arrivals, self.service, self.policy = arrivals, service, policy
        self.deadlines, self.priorities = deadlines, priorities
        self.unbounded = replicas is None
        n_slots = 0 if replicas is None else replicas
        self.slots: list[ReplicaSlot] = [ReplicaSlot(i) for i in range(n_slots)]
        self.queue: list[QueuedQuery] = []
        self.head = 0
        self.events: list[_Event] = []
        self.seq = 0
        self.timer = math.inf
        self.backlog: deque[tuple[tuple[int, ...], float]] = deque()  # queued batches
        n = arrivals.size
        self.done = np.full(n, np.nan)
        self.rejected = np.zeros(n, dtype=bool)
        self.reasons: dict[str, int] = {}
        self.sizes: list[int] = []
        self.starts: list[float] = []

    def run(self) -> None:
        i, n = 0, self.arrivals.size
        while i < n or self.events or self.timer < math.inf:
            t_event = self.events[0][0] if self.events else math.inf
            t_arrival = float(self.arrivals[i]) if i < n else math.inf
            now = min(t_event, t_arrival, self.timer)
            if now == math.inf:
                break
            if self.timer <= now:
                self.timer = math.inf
            while self.events and self.events[0][0] <= now:
                self._finish(heapq.heappop(self.events), now)
            while i < n and self.arrivals[i] <= now:
                self._arrive(i)
                i += 1
            self._decide(now)

    def _arrive(self, i: int) -> None:
        self.queue.append(
            QueuedQuery(
                i, float(self.arrivals[i]), float(self.deadlines[i]), int(self.priorities[i])
            )
        )

    def _view(self, now: float) -> BatcherView:
        return BatcherView(now, _Window(self.queue, self.head), [ReplicaSlot(-1)])

    def _decide(self, now: float) -> None:
        job = self.policy.plan_request(now)
        if job is not None:  # planning takes no simulated time
            self.policy.apply_plan(job())
        for _ in range(1_000_000):
            decision = self.policy.decide(self._view(now))
            if isinstance(decision, Wait):
                if decision.until is not None and now < decision.until < self.timer:
                    self.timer = decision.until
                return
            if isinstance(decision, Reject):
                self._take(decision.query_ids)
                self.rejected[list(decision.query_ids)] = True
                self.reasons[decision.reason] = self.reasons.get(decision.reason, 0) + 1
            elif isinstance(decision, Dispatch):
                ids = self._take(decision.query_ids)
                self._dispatch(ids, decision.replica, now)
        raise RuntimeError(f"{type(self.policy).__name__} did not wait after 10^6 decisions")

    def _take(self, ids: tuple[int, ...]) -> tuple[int, ...]:
        """Remove ``ids`` from the queue (a prefix in O(k), otherwise by filtering)."""
        k = len(ids)
        if k == 0:
            raise ValueError(f"{type(self.policy).__name__} answered with no queries")
        prefix = [q.query_id for q in self.queue[self.head : self.head + k]]
        if prefix == list(ids):
            self.head += k
        else:
            gone = set(ids)
            rest = [q for q in self.queue[self.head :] if q.query_id not in gone]
            if len(gone) != k or len(rest) != len(self) - k:
                raise ValueError(f"policy named queries not waiting in the queue: {ids}")
            self.queue, self.head = rest, 0
        if self.head > 4096 and self.head * 2 > len(self.queue):
            self.queue, self.head = self.queue[self.head :], 0
        return ids

    def __len__(self) -> int:
        return len(self.queue) - self.head

    def _dispatch(self, ids: tuple[int, ...], replica: int, now: float) -> None:
        if self.unbounded:
            self._start(ids, len(self.sizes), now)
            return
        self.backlog.append((ids, now))
        self._start_backlog(now)

    def _start_backlog(self, now: float) -> None:
        for slot in self.slots:
            if not self.backlog:
                return
            if slot.free:
                ids, _ = self.backlog.popleft()
                self._start(ids, slot.index, now)

    def _start(self, ids: tuple[int, ...], replica: int, now: float) -> None:
        duration = float(self.service(len(ids)))
        if not self.unbounded:
            self.slots[replica] = ReplicaSlot(replica, now, len(ids), now + duration)
        self.seq += 1
        heapq.heappush(self.events, (now + duration, self.seq, replica, ids, now))
        self.sizes.append(len(ids))
        self.starts.append(now)

    def _finish(self, event: _Event, now: float) -> None:
        end, _, replica, ids, started = event
        self.done[list(ids)] = end
        if not self.unbounded:
            self.slots[replica] = ReplicaSlot(replica)
        outcome = BatchOutcome(len(ids), replica, started, end, end - started, True, started)
        self.policy.observe(outcome)
        self.policy.runs.observe(len(ids), end - started)
        if not self.unbounded:
            self._start_backlog(now)


def simulate(
    arrivals: Sequence[float] | np.ndarray,
    service: ServiceSource,
    policy: BatchingPolicy,
    *,
    replicas: int | None = None,
    slo: float | None = None,
    deadlines: Sequence[float] | np.ndarray | None = None,
    priorities: Sequence[int] | np.ndarray | None = None,
    queue_batches: bool = False,
) -> SimResult:
    """Run ``arrivals`` (absolute, non-decreasing seconds) through ``policy`` and its replicas.

    ``service``: ``service[k-1]`` seconds for a batch of k, a callable ``k -> seconds`` (close
    over a ``numpy.random.Generator`` for noisy service) or a profile with ``predict(k)``.
    ``replicas=None`` is unbounded. Deadlines: ``slo`` seconds after each arrival, or absolute
    ``deadlines``, or none.
    """
    times = _check_arrivals(arrivals)
    n = times.size
    if replicas is not None and (int(replicas) != replicas or replicas < 1):
        raise ValueError(f"replicas must be None or an int >= 1, got {replicas!r}")
    if queue_batches and replicas is None:
        raise ValueError("queue_batches=True needs a finite number of replicas")
    due = _deadlines(times, slo, deadlines)
    prio = np.zeros(n, dtype=int) if priorities is None else _per_query("priorities", priorities, n)
    if replicas is not None and not queue_batches:
        return _on_a_pool(times, service, policy, int(replicas), due, prio)
    run = _Run(
        times,
        service_fn(service),
        policy,
        None if replicas is None else int(replicas),
        due,
        prio,
    )
    run.run()
    answered = ~run.rejected
    latencies = np.where(answered, run.done - times, np.nan)
    late = answered & (run.done > run.deadlines)
    return SimResult(
        times,
        latencies,
        run.rejected,
        late,
        np.asarray(run.sizes, dtype=int),
        np.asarray(run.starts, dtype=float),
        dict(run.reasons),
    )


def _check_arrivals(arrivals: Sequence[float] | np.ndarray) -> np.ndarray:
    times = np.asarray(arrivals, dtype=float)
    if times.ndim != 1 or not np.all(np.isfinite(times)):
        raise ValueError("arrivals must be a 1-D sequence of finite times (seconds)")
    if np.any(np.diff(times) < 0):
        raise ValueError("arrivals must be non-decreasing (absolute times, not gaps)")
    return times


def _on_a_pool(
    times: np.ndarray,
    service: ServiceSource,
    policy: BatchingPolicy,
    replicas: int,
    due: np.ndarray,
    prio: np.ndarray,
) -> SimResult:
    """One model pinned on a dedicated pool of ``replicas`` workers, one action at a time."""
    model = SimModel(policy, service, pinned=True)
    names = ["model"] * times.size
    pool = simulate_pool(
        times, names, {"model": model}, workers=replicas, deadlines=due, priorities=prio
    )
    return SimResult(
        times,
        pool.latencies,
        pool.rejected,
        pool.late,
        pool.batch_sizes,
        pool.batch_starts,
        pool.reasons,
        pool.refused_after,
    )


def _deadlines(
    times: np.ndarray, slo: float | None, deadlines: Sequence[float] | np.ndarray | None
) -> np.ndarray:
    if slo is not None and deadlines is not None:
        raise ValueError("give slo or deadlines, not both")
    if slo is not None:
        if not slo > 0:
            raise ValueError(f"slo must be > 0 seconds, got {slo!r}")
        return times + slo
    if deadlines is not None:
        return _per_query("deadlines", deadlines, times.size).astype(float)
    return np.full(times.size, math.inf)


def _per_query(name: str, values: Sequence[float] | np.ndarray, n: int) -> np.ndarray:
    out = np.asarray(values)
    if out.shape != (n,):
        raise ValueError(f"{name} needs one value per arrival ({n}), got shape {out.shape}")
    return out
