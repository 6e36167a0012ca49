"""``deadline``: Clockwork's deadline-driven batching (Clockwork, OSDI'20, Appendix B, §5.2, §6.4).

Every query carries a deadline (arrival + SLO). The policy plans, per batch size, with the p99 of
the last ``window`` run times the workers measured (clockwork §5.3's action profiles, read from
the model's ``runs``; an unseen size is interpolated between measured ones, or scaled from the
largest), of those among the model's last 100 batches where the size has any, so that a slow
spell of the machine ages out of a size run only now and then (:mod:`raysrv.batching.profile`).
Each size keeps its own estimate, with no running maximum over the sizes: onnxruntime ran the
live benchmark's model's batches of 8 in 204 ms and of 10 in 183 ms (p50), and a maximum planned
every full batch at 8's time. One step:

  (1) Refuse, before any work is spent, the latency-sensitive queries that cannot finish in time
      behind the work predicted in flight and the queries queued ahead of them
      ("cannot meet deadline"; Appendix B drops "strategies ... if their required start
      time has passed"; clockwork §4.4 cancels an action that cannot complete in time
      rather than run it late). The plan takes the queries by deadline into batches on the
      replica predicted to free first, as step (2) will: the largest batch that ends before
      the deadline of its first query, filled by the queries queued from that one on and
      the arrivals expected before it starts beyond what the replicas serve at best (the
      rate of the last 64 arrivals less the replicas' best rate by the estimates, times
      ``plan_arrivals``, 1); the queries ahead of its first one are refused now
      (:meth:`DeadlinePolicy._behind_queue`). That batch frees its replica for the next one
      of the plan when its planned run ends: the learned overrun (the trips) delays its own
      answers, not the next run, as for the work in flight (below). Planned on the queue
      alone, head first, the plan kept the queries that step (2) later passed over for the
      larger batch gathered behind them: at 3x overload the refusals' p99 was 119 ms, 40 ms
      counting on 0.75 of every expected arrival. Each such refusal is a bet: a head refused
      for a batch the arrivals would fill is lost if they do not come. Below the replicas'
      best rate they are served as they come, and in a burst only the excess piles up: on
      bursts at 120% of capacity, counting on 0.75 of every arrival, 380 of raysrv's 382
      refusals were such heads, which the queue alone would have kept. Counting on the
      excess, the simulator with 6% run-time noise kept 0.2-1.6 points more within the SLO
      on its bursty and overloaded loads, as much on the others, none more than 0.03% late
      (``bench/RESULTS.md``, "Run-time noise", "Peers side by side"). So the queue never
      holds more than the replicas can serve within the deadlines, capacity × SLO, and under
      overload a query is refused as it arrives or soon after, not once its required start
      has passed, most of its SLO later.
      An arriving query is admitted with time to spare (``admit_spare``): on the first step
      that sees it, it is refused unless the batch the plan puts it in ends before its
      deadline by the ``admit_quantile`` of how much later than planned the last
      ``overrun_window`` batches ended (as their answers re-anchor the plans, below); a query
      admitted before is kept while it fits. A batch that can start now is not held to it: no
      answer can move it, and on a noisy machine with a tight SLO the spare would refuse
      every query even on an idle replica. The plan puts each batch's first query within an
      arrival or two of the latest deadline it can take, the ones ahead being refused. Without
      the spare, the next batch that ended late, or a slow run that raised its size's p99,
      moved the plan and pushed those queries out of it 45-70 ms after they came: at 3x
      overload the refusals' p99 was 33.5-54.6 ms over ten runs, 15.9-36.0 ms over twenty-three
      with the spare, which was 6-20 ms there (``bench/RESULTS.md``, "Overload"). In the
      simulator, where batches end as planned, the spare stays small, and the share within the
      SLO moved by at most 0.4 points either way (``bench/RESULTS_ARCHIVE.md``, "jit8" against
      jit14 in "overrun_of").
      The spare holds only while queries come faster than the replicas serve them at best
      (the rate of the last 64 arrivals, as above). Below it the queue drains, and a query
      refused for the spare is one the replicas had time for: in a pool shared by many
      models, whose batches wait behind each other's and so end late often, a spare held at
      every rate kept 88.91% of the Zipf load within the SLO and 86.20% of the trace, against
      96.94% and 90.31% held only beyond the best rate (the same run replayed,
      ``bench/RESULTS.md``, "Many models on a shared pool").
      With ``refuse_behind_queue: false``, a query that could make it alone on a free
      replica waits (the work ahead may end early) and is refused once its required start
      passes, deadline < now + p99(1); with ``refuse_behind_work`` as well, at once if it
      cannot finish behind the work in flight (deadline < earliest predicted start + p99(1)).
  (2) With a free replica, order the latency-sensitive queries by deadline. Each (query, batch
      size b) is a strategy whose required start time is the query's deadline - p99(b)
      (Appendix B): the batch is that query and the next b-1 by deadline, so it finishes before
      every deadline in it. Strategies this replica can no longer start in time, or without b
      queries, are skipped, and of the rest the largest batch wins, "possibly at the expense of
      dropping an unfortunately timed earlier request" (Appendix B), which step (1) then
      refuses. Appendix B takes strategies in order of required start; choosing the largest
      outright kept more queries within their SLO on every workload of
      ``python -m bench.policies_sim --quick`` (at 150% overload, goodput of 100% of capacity
      against 92% in start-time order).
  (3) Batch clients (``priority >= 1``, clockwork §6.4) only fill idle time: they go to a
      replica with nothing in flight when no latency-sensitive query waits, in batches short
      enough (p99 <= SLO - p99(1)) that a latency-sensitive query arriving just after can still
      start behind them and make the model's SLO. They are not refused early, only when their
      deadline has passed.

  (4) Before step (2) cuts a batch for a replica with nothing in flight: while fewer urgent
      queries wait than the largest size and than the requests the ingress lately held at once
      (:attr:`BatcherView.concurrency`), the oldest waits for the rest up to
      ``busy_timeout_ms`` (by default a tenth of the SLO, ``HOLD_SHARE``), but never past the
      latest start at which a batch of that many still ends before the earliest deadline
      queued. This is the hold ``fixed`` and ``delayed`` take (Clipper §4.3.2's delayed
      batching where more queries are on their way), bounded by the deadlines as ``delayed``
      bounds it. Clients that send their next query as an answer or a refusal arrives come
      back in groups, and unheld the policy cuts a batch per group. Where a batch takes much of
      the SLO the groups never merge: each group's queries wait behind the other's batch, and
      those that could no longer finish are refused, sent again and refused until the batch
      ahead nearly ends. In the pool simulator, 16 such clients starting 10 ms apart ran
      batches of 8 on average, with refusals, unheld, and batches of 16, none refused, held
      (``tests/unit/test_closed_loop.py``); live, the saturation loop of ``bench.peers`` ran
      112-122 answers a second held against 76-119 unheld (``bench/RESULTS.md``, "Peers side
      by side"). A batch cut behind work still running is not held: its replica is busy
      anyway, and its clients are not on their way until that work ends. Held there as well,
      at 150% overload 48-54% of the queries were answered within the SLO against 56-61%
      unheld; not held there, 54-56%.

Run-time spread: the p99 of 10 runs is about their largest, so about one run in eleven exceeds
it, and a batch planned to end just before its earliest deadline then ends after it. Where
overruns are measured beyond the planned run (``overrun_of``, below), the overrun takes that
excess in, and nothing more is needed: in the simulator with 6% lognormal noise at most 0.03% of
the answers were late (``bench/RESULTS.md``, "Run-time noise"), and within the SLO at most 0.11
points fewer (150% overload) and up to 0.53 more than with the spread and overruns measured
beyond the run (``bench/RESULTS_ARCHIVE.md``, "ov196-ov205 and jit19": jit17 against jit14);
adding the spread there cost up to 1.05 points (``bench/RESULTS_ARCHIVE.md``, "overrun_of").
Where overruns are measured beyond the run (``learn_spread``, by default there), every run of a
size measured ``window`` times records its excess over that size's estimate
before it (run / estimate - 1); the estimates are scaled by 1 + the
``spread_quantile`` of the last ``spread_window`` excesses (the group's, as the overruns
below), within 0 and ``max_spread``. Under run times jittered by a lognormal of log-spread 6% in
``bench.policies_sim``, at the 0.95 quantile, at most 0.04% of the answers were late on every
workload, and as many queries or more were answered within the SLO as without the spread
(``ctmc`` within 0.2 points); without it, up to 0.11% were late at 150% overload. At the 0.99
quantile, at most 0.03% late, but up to 1.3 points fewer within the SLO on the long bursts and at
150% overload (``bench/RESULTS_ARCHIVE.md``, "jit8", before the admission's spare). Live, at 3x
overload of one CPU model, the 0.95 quantile was 0.01-0.05 where the 0.99 sat at the cap
(``bench/RESULTS_ARCHIVE.md``, "ov138-ov148"). CPU run times can be heavy-tailed (the excess's
p99 near 0.8 on the many-model trace): uncapped, at the 0.999 quantile, a trace point refused 37%
of its queries and answered 63% within the SLO, against 82-91% before, so the cap leaves those
tails to the drop at the deadline and the pool's slowdown.

Overruns (clockwork §5.3 keeps predictions honest by measuring): a batch's answers come back
later than its run alone explains: the trips to the replica and back, queueing there. That
overrun is the time from the batch's planned start (as re-anchored, below) to its answers, less
the run time the replica measured. With ``learn_overrun`` the ``overrun_quantile`` of the last
``overrun_window`` overruns (never below zero) is added to the estimate of the batch being
planned, so a noisy machine makes the policy plan with the slack its hops need instead of a
hand-set ``margin_ms``. Each source of lateness is learned once, by what forgets it soonest:
  - a slow run is the run-time window's (10 batches of its size), not an overrun (beyond
    the measured run; beyond the plan it is both, below);
  - a batch delayed by the one ahead of it is re-anchored on when that one ended on the replica
    (on its answer, where the replica does not say), so the delay is not charged to it again,
    and the slack is added once to a plan, not to each batch ahead of it (in flight or
    planned by step (1));
  - a window of 200 keeps one pause of the machine (one late batch) out of the 99th percentile;
  - a pause of the process that takes the answers up delays every answer due during it, and
    those come back together: answers back within ``TOGETHER_S`` of the first of them count as
    one overrun, the largest. Each alone, the 3-4 batches in flight of a hot model put a
    127 ms stall of the ingress into the 99th percentile of the next 200 batches, beyond a
    100 ms SLO (``bench/RESULTS_ARCHIVE.md``, "the first rule for the way back, run 7 through
    the simulator").
  - the hops are the pool's, not one model's: every overrun also goes into a window its
    group shares (the models one bulk entry declares, :meth:`RunTimes.shared`), and a model
    with fewer than ``OWN_OVERRUNS`` of its own (one just loaded, or rarely asked for) plans
    with the group's. Planned with none, such models made 2.5% of the batches of a live run
    of the many-model trace and 42% of those dropped at their deadline
    (``bench/RESULTS_ARCHIVE.md``, "Batches dropped at their deadline").
Measured against the whole plan instead, with a window of 50, one pause of the machine set the
slack to 137-148 ms for the next 50 batches, doubled in every chain; at 50% load the policy then
refused 43 queries on arrival with 562-582 ms left before their deadline
(``bench/RESULTS_ARCHIVE.md``, batching policies live, run 11).
What the overrun is measured beyond (``overrun_of``) depends on whom the replicas serve. For a
model with its replicas to itself, beyond the planned run (the run-time estimate): estimate plus
overrun is then the ``overrun_quantile`` of the time from a planned start to the answer, one
quantile of the run and the hops together rather than the sum of their tails, and a run longer
than its estimate counts in the overrun as well as in its size's window. Planned on the sum, a
burst's queries were refused that the replicas had time for: on the bursty load of
``bench.peers``, eight rounds alternating, the plan's measure refused 59-102 queries a round
against 107-143, and kept 97.49-98.55% within the SLO against 96.54-97.41%, none late either
way; at 150% overload it made no difference (``bench/RESULTS_ARCHIVE.md``, "overrun_of").
On a shared pool (one that loads models on demand, :meth:`bind`'s ``shared``), beyond the
measured run: there a batch's start waits behind other models' work, and measured beyond the
plan the many-model run 27 replayed kept 95.63% of its Zipf load within the SLO and 91.20% of
its trace, against 96.89% and 91.74%. Only batches of sizes measured before count (an
unmeasured size's estimate says nothing). In a deterministic simulation the overruns are zero.

Planned starts: a replica may take its next batch while the last one still runs (the batcher's
``pipeline_depth``; its ``busy_until`` is a running average, early about half the time). The
policy plans such a batch to start at its own planned finish of the work in flight (run-time
estimates, no slack), and moves those plans by how late or early each answer comes back.
Planning on the batcher's average instead left most of the overrun to be learned, and charged it
to every batch (``bench/RESULTS_ARCHIVE.md``, "What the policies learned").
While queries arrive more slowly than the replicas serve them at best (the last 64 arrivals'
rate against the best of a size over its estimate, per replica), the work in flight is planned
at the median of its sizes' last ``window`` runs: the tail is planned once, on the batch whose
deadlines are at stake. Planned at the tail there too, a batch and the one behind it counted as
if both ran at their slowest, and single queries were refused at half load for seconds after an
overload. Under overload the tail stays: at the median there, a batch that ran past it left the
one behind unable to start in time, and its queries were refused 70-88 ms after they came
(``bench/RESULTS.md``, "Overload"; ``bench/RESULTS_ARCHIVE.md``, "ov23-ov28, and ov33-ov35,
ov39-ov58").

Schedule ahead (clockwork §5.2: "instead of eagerly sending actions to workers, it ensures only a
minimal amount of work is outstanding on each worker ... Clockwork schedules 5ms into the
future"): with ``schedule_ahead_ms`` set, a replica with work in flight gets its next batch only
once that work is planned to end within it; until then the policy waits, for the answer or for
that time. A batch chosen behind work still running is planned on that work's p99 finish, so it
skips queries the answer, once back, would have shown to have time. With no hops (the live
benchmark's 80% trace replayed through the real batcher with a sleeping replica,
``bench/RESULTS_ARCHIVE.md``, "Schedule ahead") 5 ms cut the refusals from 21-24 to 11-14 of 1,933,
what the simulator gives on that trace. Live on Ray it did not pay: every batch then waits for
the answer's trip back and its own trip out, and at 150% overload goodput was 89-96% of
capacity against 94-103% without it, while the 80% point did not improve. So the default (None)
commits as soon as the batcher offers the replica.

With ``busy_timeout_ms`` 0, or without a count of the ingress (``concurrency`` 0, as in
:func:`~raysrv.analytics.simulate_pool`), the policy is work-conserving: it dispatches as soon
as a replica is free rather than holding queries back for a fuller batch; under load the queue,
and with it the batch, grows on its own.
Before the first query the model is profiled (clockwork §4, "a brief profiling step to produce a
seed estimate"): batches of the smallest and largest size and the powers of two between run on
every replica, and their run times seed the windows; a policy swapped in live is seeded with the
run times the batcher measured. Without either (a batcher nobody profiled) the estimates are zero
until measured: the first batches go out optimistically and teach the profile.

Cost per step: O(n log n) in the queue length (the sort), plus O(s log n) over the s batch sizes.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterator, Sequence, Set
from dataclasses import replace
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from raysrv.batching.base import (
    BatcherView,
    BatchingPolicy,
    BatchOutcome,
    Decision,
    Dispatch,
    PolicyParams,
    QueuedQuery,
    Reject,
    ReplicaSlot,
    Wait,
)
from raysrv.batching.profile import RunTimes, SortedWindow

__all__ = [
    "HOLD_SHARE",
    "LOCKED_OUT",
    "OWN_OVERRUNS",
    "STALE_S",
    "TOGETHER_S",
    "DeadlineParams",
    "DeadlinePolicy",
    "Overruns",
    "strategy_sizes",
]

STALE_S = 1.0  # with LOCKED_OUT refusals in a row on an idle replica and no batch back for
LOCKED_OUT = 20  # this long, the estimates are measured again (``DeadlinePolicy._probe``)
TOGETHER_S = 0.002  # answers back within this of each other met one pause: one overrun
OWN_OVERRUNS = 20  # a model plans with its own overruns once it has this many
ARRIVALS, MIN_ARRIVALS = 64, 8  # the arrivals the rate is taken over, and the fewest it needs
HOLD_SHARE = 0.1  # of the SLO, step (4)'s hold where busy_timeout_ms is not given


class Overruns:
    """The last ``capacity`` overruns, answers back within ``TOGETHER_S`` of the first of a
    group counting once, at the largest of theirs (they met the same pause)."""

    def __init__(self, capacity: int) -> None:
        self._window = SortedWindow(capacity)
        self._together: tuple[float, float] | None = None  # when the last group's answers
        # began to come back, and the largest of their overruns

    def __len__(self) -> int:
        return len(self._window)

    def add(self, back: float, overrun: float) -> None:
        if self._together is not None and 0.0 <= back - self._together[0] <= TOGETHER_S:
            first, largest = self._together
            if overrun > largest:
                self._window.replace_last(overrun)
            self._together = (first, max(largest, overrun))
        else:
            self._window.add(overrun)
            self._together = (back, overrun)

    def quantile(self, q: float) -> float:
        """The ``q`` quantile, never below zero (0 when empty)."""
        return max(0.0, self._window.quantile(q)) if self._window else 0.0


class DeadlineParams(PolicyParams):
    max_batch_size: int = Field(32, ge=1, le=4096, description="Largest batch cut.")
    batch_sizes: list[int] | None = Field(
        None,
        description="Batch sizes the model runs (one strategy each); default every size "
        "from 1 to max_batch_size.",
    )
    window: int = Field(10, ge=1, le=10_000, description="Run times kept per batch size.")
    quantile: float = Field(0.99, gt=0.0, le=1.0, description="Run-time quantile planned for.")
    margin_ms: float = Field(
        0.0, ge=0.0, le=60_000.0, description="Added to every run-time estimate, for safety."
    )
    learn_spread: bool | None = Field(
        None,
        description="Also scale every run-time estimate by the learned spread: the "
        "spread_quantile of how far recent runs exceeded the estimate of their size, at most "
        "max_spread. None: where overruns are measured beyond the run (overrun_of), which "
        "beyond the plan take a run's excess in already.",
    )
    spread_window: int = Field(1000, ge=1, le=100_000, description="Runs' excesses kept.")
    spread_quantile: float = Field(
        0.95, gt=0.0, le=1.0, description="Quantile of the excesses planned for."
    )
    max_spread: float = Field(
        0.1,
        ge=0.0,
        le=10.0,
        description="Largest learned spread (0.1: estimates at most 10% above the measured "
        "tail); heavier tails are the deadline's drop and the pool's slowdown to absorb.",
    )
    learn_overrun: bool = Field(
        True,
        description="Also add the quantile of recent overruns: how much longer than their run "
        "batches took to come back from their planned start (hops, queueing at the replica).",
    )
    overrun_window: int = Field(200, ge=1, le=10_000, description="Overruns kept.")
    overrun_quantile: float = Field(
        0.99, gt=0.0, le=1.0, description="Quantile of the overruns added to the estimates."
    )
    overrun_of: Literal["run", "plan"] | None = Field(
        None,
        description="What an overrun is measured beyond: the batch's measured run (the "
        "run-time estimate and the overrun each cover their own tail) or its planned run (the "
        "estimate plus the overrun is then the overrun_quantile of the time from a batch's "
        "planned start to its answer). None: the plan for a model with its replicas to "
        "itself, the run for one on a shared pool.",
    )
    refuse_behind_queue: bool = Field(
        True,
        description="Refuse a query as soon as it could not finish behind the work predicted "
        "in flight and the queries queued ahead of it, planned in batches of up to the "
        "largest size on the replica that frees first: refusals come at arrival, and the "
        "queue holds no more than the replicas serve within the deadlines. False: "
        "refuse_behind_work decides.",
    )
    plan_arrivals: float = Field(
        1.0,
        ge=0.0,
        le=4.0,
        description="With refuse_behind_queue, the share of the queries expected before each "
        "batch of the plan starts beyond what the replicas serve at best (the rate of the "
        "last 64 arrivals less the replicas' best rate by the estimates) that the plan counts "
        "on to fill it: a query that the batch they fill would pass over is refused now, not "
        "once that batch has gathered. 0: the plan takes the queued queries alone, head "
        "first.",
    )
    admit_spare: bool = Field(
        True,
        description="With refuse_behind_queue, admit an arriving query only if the batch the "
        "plan puts it in ends before its deadline with admit_quantile of the recent delays to "
        "spare (how much later than planned the replicas' batches ended): queued queries are "
        "kept while they fit, so a batch that ends late refuses arrivals, not queries that "
        "have waited. Held only while queries come faster than the replicas serve at best.",
    )
    admit_quantile: float = Field(
        0.99, gt=0.0, le=1.0, description="Quantile of the recent delays admit_spare spares."
    )
    refuse_behind_work: bool = Field(
        False,
        description="Refuse a query as soon as it could not finish behind the work predicted "
        "in flight on every replica; default: once it could not finish even on a replica free "
        "now (its required start passed), waiting meanwhile for a replica to free.",
    )
    busy_timeout_ms: float | None = Field(
        None,
        ge=0.0,
        le=60_000.0,
        description="How long the oldest query may wait for a fuller batch while fewer wait "
        "than the ingress's concurrency, never past the time its batch must start to meet the "
        "first deadline in it (None: a tenth of the model's SLO; 0: off).",
    )
    schedule_ahead_ms: float | None = Field(
        None,
        ge=0.0,
        le=60_000.0,
        description="If set, a replica with work in flight gets its next batch only once that "
        "work is planned to end within this (clockwork §5.2 schedules 5 ms ahead); None: as "
        "soon as the batcher offers it.",
    )

    @model_validator(mode="after")
    def _sizes_within_max(self) -> DeadlineParams:
        if self.batch_sizes is not None:
            bad = [b for b in self.batch_sizes if not 1 <= b <= self.max_batch_size]
            if bad or not self.batch_sizes:
                raise ValueError(
                    f"batch_sizes must be non-empty, each in 1..max_batch_size "
                    f"({self.max_batch_size}), got {self.batch_sizes}"
                )
        return self


class DeadlinePolicy(BatchingPolicy):
    name = "deadline"
    Params = DeadlineParams
    params: DeadlineParams

    def __init__(self, params: DeadlineParams, slo_s: float) -> None:
        super().__init__(params, slo_s)
        self._sizes = strategy_sizes(params)
        self._largest = self._sizes[0]
        # per quantile of the runs, seconds per size, as of the runs' version ``_seen``
        self._tables: dict[float, np.ndarray | None] = {}
        self._seen: tuple[int, int] | None = None
        self._overruns = Overruns(params.overrun_window)
        self._pooled: Overruns | None = None  # its group's (``bind``)
        self._excesses = SortedWindow(params.spread_window)  # its group's once bound to one
        # Per replica, for each batch sent there that has not come back, oldest first: the start
        # it was planned as it left (which names it), then its planned start and finish, both
        # re-anchored on every answer, and its size.
        self._inflight: dict[int, deque[tuple[float, float, float, int]]] = {}
        self._light = False  # during one decide: arrivals below the replicas' best rate
        self._beyond: float | None = None  # during one decide: arrivals/s past that rate
        self._slack = 0.0  # this model's own learned overrun, seconds
        self._last_back = -np.inf  # when the last batch came back
        self._probing = False  # the last batch was sent as a probe (``_probe``)
        self._resolve()
        self._idle_refusals = 0  # refusals in a row with a replica idle
        self._arrivals: deque[float] = deque(maxlen=ARRIVALS)  # the last ones seen
        self._fresh: frozenset[int] = frozenset()  # during one decide: the queries new to it
        self._delays = SortedWindow(params.overrun_window)  # how much later batches ended
        self._memo: dict[int, float] | None = None  # estimates by size, during one decide
        self._kept: Callable[[int], float] | None = None  # the view's, during one decide
        busy = params.busy_timeout_ms
        self._busy_s = HOLD_SHARE * slo_s if busy is None else busy / 1000.0  # step (4)'s hold

    @property
    def max_batch_size(self) -> int:
        return self._sizes[0]

    def estimate(self, size: int) -> float:
        """Planned time from a batch's start to its answers being back: p99 of the measured run
        times of ``size`` (interpolated for sizes not measured; its own, even where a larger
        size runs faster) scaled by the learned spread, plus the margin and the learned
        overrun; 0 before any measurement. Within one :meth:`decide`, where none of these
        change, each size's is worked out once."""
        memo = self._memo
        if memo is None:
            return self._planned(size) + self._learned()
        found = memo.get(size)
        if found is None:
            found = memo[size] = self._planned(size) + self._learned()
        return found

    def bind(self, runs: RunTimes, *, shared: bool = False) -> None:
        """Also learn overruns and the runs' spread with the other models of ``runs``'s group
        (one kept per group and window length)."""
        super().bind(runs, shared=shared)
        self._resolve()
        window = self.params.overrun_window
        self._pooled = runs.shared(("deadline.overruns", window), lambda: Overruns(window))
        spread = self.params.spread_window
        pooled = runs.shared(("deadline.excesses", spread), lambda: SortedWindow(spread))
        if pooled is not None:
            self._excesses = pooled

    def run_window(self) -> int:
        return self.params.window

    def _planned(self, size: int) -> float:
        """The run planned for a batch of ``size``: its measured tail scaled by the learned
        spread, plus the margin."""
        spread = self._spread() if self._learns_spread else 0.0
        return self._measured(size) * (1.0 + spread) + self.params.margin_ms / 1000.0

    def _measured(self, size: int) -> float:
        """The ``quantile`` of the last ``window`` runs of ``size`` (0 before any)."""
        return self._runs_at(self.params.quantile, size)

    def _typical(self, size: int) -> float:
        """The median of the last ``window`` runs of ``size`` (0 before any)."""
        return self._runs_at(0.5, size)

    def _runs_at(self, quantile: float, size: int) -> float:
        """The ``quantile`` of the last ``window`` runs of ``size``, worked out once per
        version of the runs (0 before any)."""
        if self._seen != self.runs.version:
            self._tables, self._seen = {}, self.runs.version
        if quantile not in self._tables:
            self._tables[quantile] = self.runs.service_times(
                self._largest, quantile, self.params.window, running_max=False
            )
        table = self._tables[quantile]
        return 0.0 if table is None else float(table[size - 1])

    def _best_rate(self) -> float:
        """Queries a second one replica serves at best, by the estimates (inf before any)."""
        rates = [k / e for k in self._sizes if (e := self.estimate(k)) > 0.0]
        return max(rates, default=math.inf)

    def _spread(self) -> float:
        """The ``spread_quantile`` of the runs' excesses over their size's measured tail, within
        0 and ``max_spread``: the group's where the model has one, else its own (0 before
        any)."""
        if not self._excesses:
            return 0.0
        spread = self._excesses.quantile(self.params.spread_quantile)
        return min(max(0.0, spread), self.params.max_spread)

    def observe(self, outcome: BatchOutcome) -> None:
        self._last_back = max(self._last_back, outcome.finished)
        plan = self._reanchor(outcome)
        if not outcome.ok:
            self._probing = False  # a probe the replica did not run measured nothing
            return
        if self._learns_spread and self.runs.count(outcome.size) >= self.params.window:
            tail = self._measured(outcome.size)  # the runs before this one's
            if tail > 0.0:
                self._excesses.add(outcome.duration / tail - 1.0)
        if plan is None:
            if outcome.expected_start is None:
                return
            plan = (outcome.expected_start, outcome.expected_start + self._planned(outcome.size))
        start, finish = plan
        run = outcome.duration if self._overrun_of == "run" else finish - start
        if self.params.learn_overrun and self.runs.count(outcome.size):
            self._learn(outcome.finished, outcome.finished - start - run)

    def _resolve(self) -> None:
        """``overrun_of`` and ``learn_spread`` as set, or where None, by the pool: beyond the
        run with the spread learned on a shared pool, beyond the plan without it else."""
        self._overrun_of = self.params.overrun_of or ("run" if self.shared else "plan")
        spread = self.params.learn_spread
        self._learns_spread = self._overrun_of == "run" if spread is None else spread

    def _spare(self) -> float:
        """What an arriving query is admitted with to spare (step (1)): the ``admit_quantile``
        of how much later than planned the last ``overrun_window`` batches this policy planned
        ended (:meth:`_reanchor`), never below zero (0 before any)."""
        if not self._delays:
            return 0.0
        return max(0.0, self._delays.quantile(self.params.admit_quantile))

    def _learn(self, back: float, overrun: float) -> None:
        """One overrun into this model's window and its group's."""
        self._overruns.add(back, overrun)
        if self._pooled is not None:
            self._pooled.add(back, overrun)
        self._slack = self._overruns.quantile(self.params.overrun_quantile)

    def _learned(self) -> float:
        """The overrun planned for: this model's own once it has ``OWN_OVERRUNS``, its
        group's until then (0 with neither, or with ``learn_overrun`` off)."""
        if not self.params.learn_overrun:
            return 0.0
        if len(self._overruns) >= OWN_OVERRUNS or not self._pooled:
            return self._slack
        return self._pooled.quantile(self.params.overrun_quantile)

    def profile_sizes(self) -> tuple[int, ...]:
        smallest, largest = self._sizes[-1], self._sizes[0]
        return tuple(
            s for s in reversed(self._sizes) if s in (smallest, largest) or s & (s - 1) == 0
        )

    def describe(self) -> dict[str, object]:
        """Adds what a batch is planned for now: the learned overrun and spread, what an
        arrival is admitted with to spare, and, per profiled size, the run-time estimate
        before it (ms)."""
        planned = {str(k): self._planned(k) * 1000.0 for k in self.profile_sizes()}
        return {
            **super().describe(),
            "learned_overrun_ms": self._learned() * 1000.0,
            "overrun_of": self._overrun_of,
            "learned_spread": self._spread() if self._learns_spread else 0.0,
            "admit_spare_ms": self._spare() * 1000.0,
            "planned_run_ms": planned,
        }

    def decide(self, view: BatcherView) -> Decision:
        self._memo, self._kept = {}, view.kept
        self._count_arrivals(view.queue)
        if any(self._inflight.values()):  # only the work in flight is planned by the rate
            self._light = self._beyond_best(view.now, len(view.replicas)) < 0.0
        try:
            return self._decide(view)
        finally:
            self._memo = self._kept = self._beyond = None
            self._light = False

    def _decide(self, view: BatcherView) -> Decision:
        urgent = [q for q in view.queue if q.priority <= 0]
        past = tuple(q.query_id for q in view.queue if q.priority > 0 and q.deadline < view.now)
        if past:
            return Reject(past, "deadline passed while queued")
        doomed = self._doomed(urgent, view)
        if doomed:
            probe = self._probe(urgent, doomed, view)
            return probe or Reject(doomed, "cannot meet deadline")  # step (1)
        free = [r for r in view.replicas if r.free]
        if not free:
            return self._wait(urgent, view.now)
        slot = min(free, key=lambda r: self._start(r, view.now))
        if self.params.schedule_ahead_ms is not None:
            ahead = self._start(slot, view.now) - self.params.schedule_ahead_ms / 1000.0
            if ahead > view.now:
                return Wait(ahead)  # no commitment yet behind the work in flight
        if urgent:
            held = self._busy_hold(urgent, view, slot)  # step (4)
            if held is not None:
                return held
            decision = self._most_urgent(urgent, slot, view.now)  # step (2)
            if isinstance(decision, Wait) and decision.until is None:
                return self._wait(urgent, view.now)
            return decision
        return self._fill(view, slot)  # step (3)

    def _busy_hold(
        self, urgent: Sequence[QueuedQuery], view: BatcherView, slot: ReplicaSlot
    ) -> Wait | None:
        """Step (4): hold for ``busy_timeout_ms`` (:meth:`_held`) a batch for a replica with
        nothing in flight while fewer urgent queries wait than the largest size and than the
        requests the ingress lately held at once, less the batch clients' queries queued
        (those are inside, not on their way)."""
        if slot.busy_until is not None:
            return None
        batch_clients = len(view.queue) - len(urgent)
        expected = min(self._largest, view.concurrency - batch_clients)
        return self._held(urgent, expected, self._busy_s, view.now)

    def _held(
        self, urgent: Sequence[QueuedQuery], size: int, hold_s: float, now: float
    ) -> Wait | None:
        """While fewer than ``size`` urgent queries wait, wait for the rest until ``hold_s``
        past the oldest's arrival, but not past the latest start at which a batch of ``size``
        still ends before the earliest deadline queued, by this policy's estimate or by what
        its worker keeps (:attr:`BatcherView.kept`), whichever is earlier: held past the
        worker's, a held batch is refused unrun, and once the runs slow down every one is
        (bench/RESULTS_ARCHIVE.md, "pr12"). None: cut now."""
        if hold_s <= 0.0 or len(urgent) >= size:
            return None
        oldest = min(q.arrival for q in urgent)
        kept = self.estimate(size)
        if self._kept is not None:
            kept = max(kept, self._kept(size))
        until = min(oldest + hold_s, min(q.deadline for q in urgent) - kept)
        return Wait(until) if until > now else None

    def _wait(self, urgent: Sequence[QueuedQuery], now: float) -> Wait:
        """Wait for a replica to take the urgent queries, at the latest until just past the
        first one's required start, when step (1) refuses it (at the required start itself it
        could still make it, on a replica freed then). With ``refuse_behind_queue``, of the
        batch size planned shortest, which need not be 1 (a batch of 2 measured faster than
        one of 1), of any size while the plan counts on arrivals to fill its batches: past it
        every plan of step (1) refuses it. A required start already past (the plan keeps the
        query in a batch faster than those) waits for the next event, never for a time just
        past now, which would step again and again at the same moment."""
        if not urgent:
            return Wait()
        shortest = self.estimate(1)
        if self.params.refuse_behind_queue:
            most = len(urgent) if self.params.plan_arrivals == 0.0 else self._largest
            shortest = min(self.estimate(k) for k in _sizes_up_to(self._sizes, most))
        last = min(q.deadline for q in urgent) - shortest
        return Wait(math.nextafter(last, math.inf)) if last >= now else Wait()

    def _probe(
        self, urgent: Sequence[QueuedQuery], doomed: tuple[int, ...], view: BatcherView
    ) -> Dispatch | None:
        """Estimates only answers can correct: one slow batch among the last ``window`` of a
        size, or a burst of overruns, can refuse every query, and a refused query runs no
        batch to measure. So once ``LOCKED_OUT`` queries in a row were refused with a replica
        idle and no batch has come back for ``STALE_S``, the doomed query with the most time
        left runs alone on the idle replica instead, and so on after each such probe that
        ran, until the estimates let a batch through again. A probe may start until its
        deadline less the answer's way back (``Dispatch.probe``): planned on the estimates in
        doubt, its window would already be shut. (Probing on every refusal with a
        replica idle, rarely used models, never "fresh", probed all the time and took the
        workers from the rest: ``bench/RESULTS_ARCHIVE.md``, issue 17's run 4.)"""
        idle = [r for r in view.replicas if r.free and r.busy_until is None]
        if not idle or any(self._inflight.values()):
            return None
        self._idle_refusals += 1
        locked = self._idle_refusals >= LOCKED_OUT and view.now - self._last_back >= STALE_S
        if not (self._probing or locked):
            return None
        ids = set(doomed)
        query = max((q for q in urgent if q.query_id in ids), key=lambda q: q.deadline)
        if query.deadline <= view.now:
            return None
        self._probing = True
        return replace(self._send([query], idle[0], view.now), probe=True)

    def _doomed(self, urgent: Sequence[QueuedQuery], view: BatcherView) -> tuple[int, ...]:
        if not urgent or not view.replicas:
            return ()
        if self.params.refuse_behind_queue:
            return self._behind_queue(urgent, view)
        earliest = view.now
        if self.params.refuse_behind_work:
            earliest = min(self._start(r, view.now) for r in view.replicas)
        finish = earliest + self.estimate(1)
        return tuple(q.query_id for q in urgent if q.deadline < finish)

    def _behind_queue(self, urgent: Sequence[QueuedQuery], view: BatcherView) -> tuple[int, ...]:
        """The queries that fit no batch of the plan of step (1) (:meth:`_unplanned`). A replica
        whose start is unknown (behind a LOAD never measured) takes no batch of the plan; with
        none known, a query is refused once its required start has passed."""
        frees = sorted(t for r in view.replicas if (t := self._start(r, view.now)) < math.inf)
        if not frees:  # every replica waits on a LOAD of unknown length: as if free now
            finish = view.now + self.estimate(1)
            return tuple(q.query_id for q in urgent if q.deadline < finish)
        planned = sorted((q.deadline, q.query_id) for q in urgent)
        beyond = self._beyond_best(view.now, len(view.replicas))
        rate = self.params.plan_arrivals * beyond if beyond > 0.0 else 0.0
        spare = self._spare() if self.params.admit_spare and beyond > 0.0 else 0.0
        return self._unplanned(planned, frees, view.now, rate, self._fresh, spare)

    def _beyond_best(self, now: float, replicas: int) -> float:
        """Arrivals a second beyond what ``replicas`` serve at best: the last 64 arrivals' rate
        less ``replicas`` times the best rate by the estimates (negative below it). Worked out
        once per :meth:`decide`, which both the work in flight's plan and step (1) ask."""
        if self._beyond is None:
            self._beyond = self._rate(now) - replicas * self._best_rate()
        return self._beyond

    def _count_arrivals(self, queue: Sequence[QueuedQuery]) -> None:
        """Note the arrival of each query not seen before (later than the last seen), and keep
        those queries as new to this decide (the ones step (1) admits with the spare)."""
        newest = self._arrivals[-1] if self._arrivals else -math.inf
        fresh = [q for q in queue if q.arrival > newest]
        self._fresh = frozenset(q.query_id for q in fresh)
        self._arrivals.extend(sorted(q.arrival for q in fresh))

    def _rate(self, now: float) -> float:
        """Arrivals a second over the last ``ARRIVALS`` seen, up to ``now`` (0 before
        ``MIN_ARRIVALS``): it falls as soon as they stop."""
        seen = self._arrivals
        if len(seen) < MIN_ARRIVALS:
            return 0.0
        span = max(now, seen[-1]) - seen[0]
        return (len(seen) - 1) / span if span > 0.0 else 0.0

    def _unplanned(
        self,
        planned: list[tuple[float, int]],
        frees: list[float],
        now: float,
        rate: float,
        fresh: Set[int] = frozenset(),
        spare: float = 0.0,
    ) -> tuple[int, ...]:
        """Of the queries ``planned`` (deadline, id, by deadline), those the plan leaves out,
        counting on ``rate`` arrivals a second. By deadline, from the head: the replica
        predicted to free first (of ``frees``, their starts, sorted) takes a batch as step (2)
        will. With arrivals expected before it starts, not counted on by a batch before it:
        the largest batch they and the queued queries fill that ends before the deadline of
        its first query, and the queries ahead of that one are left out. With none: the
        largest batch from the head that ends before the head's deadline. A head that cannot
        end in time even alone there is left out, and the plan goes on without it. A query
        new to this step (in ``fresh``) whose batch, starting later than now, ends less than
        ``spare`` before its deadline is left out as well; the plan still counts it in its
        batch."""
        doomed = []
        i, counted = 0, 0.0  # the plan's next query; the arrivals counted on so far
        while i < len(planned):
            start, left = frees[0], len(planned) - i
            coming = max(0.0, rate * (start - now) - counted)
            first, size = i, 0
            for k in _sizes_up_to(self._sizes, int(left + coming)):
                j = bisect_left(planned, (start + self.estimate(k), -math.inf), i)
                if j < len(planned) and (j == i or coming > 0.0) and len(planned) - j + coming >= k:
                    first, size = j, k
                    break
            if not size:
                doomed.append(planned[i][1])
                i += 1
                continue
            doomed.extend(query for _, query in planned[i:first])
            queued = min(size, len(planned) - first)
            if fresh and spare > 0.0 and start > now:  # no answer can move a batch due now
                bound = start + self.estimate(size) + spare
                doomed.extend(
                    q for d, q in planned[first : first + queued] if d < bound and q in fresh
                )
            counted += size - queued
            heapq.heapreplace(frees, start + self._planned(size))
            i = first + queued
        return tuple(doomed)

    def _most_urgent(self, urgent: list[QueuedQuery], slot: ReplicaSlot, now: float) -> Decision:
        """The largest batch this replica can still finish before every deadline in it.

        Strategy (query i in deadline order, size b): run queries i..i+b-1, required to start by
        d_i - p99(b). For each b, largest first, the earliest eligible i is the first with
        d_i >= start + p99(b), and it needs b queries from i on. A query more urgent than the
        chosen ones is left to a smaller batch elsewhere, or to step (1).
        """
        ordered = sorted(urgent, key=lambda q: (q.deadline, q.arrival))
        deadlines = [q.deadline for q in ordered]
        start = self._start(slot, now)
        for size in self._sizes:
            i = bisect_left(deadlines, start + self.estimate(size))
            if len(ordered) - i >= size:
                self._probing, self._idle_refusals = False, 0
                return self._send(ordered[i : i + size], slot, start)
        return Wait()  # another replica frees earlier and can still make it

    def _fill(self, view: BatcherView, slot: ReplicaSlot) -> Decision:
        if not view.queue or slot.busy_until is not None:
            return Wait()
        budget = self.slo_s - self.estimate(1)
        fits = [b for b in self._sizes if b <= len(view.queue) and self.estimate(b) <= budget]
        size = fits[0] if fits else 1
        return self._send(view.queue[:size], slot, view.now)

    def _start(self, slot: ReplicaSlot, now: float) -> float:
        """When a batch sent to ``slot`` now would start. With work in flight, not before that
        work's planned finish by this policy's own estimates (re-anchored on every answer): the
        batcher's ``busy_until`` is a running average, early about half the time. Below the
        replicas' best rate, that work runs for its sizes' medians from the start of its oldest
        batch (the module's docstring, "Planned starts")."""
        start = slot.start_time(now)
        planned = self._inflight.get(slot.index)
        if slot.busy_until is not None and planned:
            if self._light:
                finish = planned[0][1] + sum(self._typical(size) for *_, size in planned)
            else:
                finish = planned[-1][2]
            start = max(start, finish)
        return start

    def _send(self, batch: Sequence[QueuedQuery], slot: ReplicaSlot, start: float) -> Dispatch:
        planned = self._inflight.setdefault(slot.index, deque())
        planned.append((start, start, start + self._planned(len(batch)), len(batch)))
        return Dispatch(tuple(q.query_id for q in batch), slot.index, start)

    def _reanchor(self, outcome: BatchOutcome) -> tuple[float, float] | None:
        """Drop the plan of the batch that came back (and of any older one that never ran), move
        the plans still in flight on that replica by how late or early it ended there (when it
        came back, if the replica did not say), and return its planned start and finish as
        re-anchored (None if this policy did not plan it)."""
        planned = self._inflight.get(outcome.replica)
        if not planned or outcome.expected_start is None:
            return None
        mine = None
        while planned and planned[0][0] <= outcome.expected_start + 1e-9:
            mine = planned.popleft()
        if mine is None:
            return None
        ended = outcome.finished if outcome.ended is None else outcome.ended
        shift = ended - mine[2]
        self._delays.add(shift)
        self._inflight[outcome.replica] = deque(
            (n, s + shift, f + shift, k) for n, s, f, k in planned
        )
        return mine[1], mine[2]


def _sizes_up_to(sizes: Sequence[int], most: int) -> Iterator[int]:
    """``sizes`` (largest first) with each capped at ``most``, each once."""
    last = None
    for size in sizes:
        size = min(size, most)
        if size != last:
            yield size
            last = size


def strategy_sizes(params: DeadlineParams) -> list[int]:
    """The batch sizes of the strategies, largest first (Appendix B)."""
    sizes = params.batch_sizes or range(1, params.max_batch_size + 1)
    return sorted(set(sizes), reverse=True)
