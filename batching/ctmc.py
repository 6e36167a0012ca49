"""``ctmc``: BATCH's model-tuned buffer (BATCH, SC'20, §III-IV) with deadline-safe dispatch.

The batch size B and timeout T come from :mod:`raysrv.analytics`, as BATCH's performance
optimizer chooses them (§III-C, eq. 2-3): every ``replan_s`` the policy fits a MAP(2) to the
last ``arrivals`` inter-arrival times (``fit_map2``, §III-A), takes the p99 run time per batch
size its replicas measured, and runs ``optimize_batching`` over ``candidate_batch_sizes`` x
``timeouts_ms``, pricing a batch as eq. 1 does with the model's replicas as the units:

* ``objective: slo``: the cheapest configuration (largest batches, as eq. 1's per-call price
  rewards) whose ``percentile`` latency meets the model's SLO;
* ``objective: budget``: the lowest percentile within ``budget`` dollars per query.

The latency is the exact buffer model in BATCH's own setting, a server free for every batch:
fast enough to replan every few seconds. It leaves out the wait for a busy replica; the
finite-server bound would include it, but its Lindley recursion takes seconds near saturation,
and the dispatch below already protects the deadlines when replicas are the bottleneck.

Between plans the buffer runs as BATCH's does: hold a batch shorter than B until T after its
oldest query. Dispatch is then the ``deadline`` policy's (clockwork Appendix B), so a plan that
turns out wrong for the traffic costs throughput, not late answers: queries that cannot finish
in time are refused before any work, and the hold never outlasts what the oldest deadline
allows. When more than B queries wait, dispatch may take up to ``max_batch_size`` of them:
BATCH's buffer never holds more than B because its functions run at once, but a finite pool of
replicas makes queries wait while it is busy, and cutting that backlog at B would cap the
throughput at the planned batch size (on a fixed-cost model, below the offered load).

Until a plan exists (too few arrivals or no measured run time) B and T are
``initial_batch_size`` and ``initial_timeout_ms``. ``busy_timeout_ms`` holds for the ingress's
concurrency as ``deadline``'s does, before B and T are weighed.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
from pydantic import Field, model_validator

from raysrv.analytics.arrivals import fit_map2
from raysrv.analytics.buffer import Pricing
from raysrv.analytics.optimize import BatchingPlan, optimize_batching
from raysrv.batching.base import BatcherView, Decision, QueuedQuery, ReplicaSlot
from raysrv.batching.deadline import DeadlineParams, DeadlinePolicy

__all__ = ["CTMCParams", "CTMCPolicy", "PlanInputs"]


class CTMCParams(DeadlineParams):
    objective: Literal["slo", "budget"] = Field("slo", description="Eq. 2 (slo) or eq. 3.")
    percentile: float = Field(0.99, gt=0.0, lt=1.0, description="Latency percentile planned.")
    budget: float | None = Field(None, gt=0.0, description="$ per query, for objective budget.")
    per_replica_second: float = Field(1.66667e-5, ge=0.0, description="Price of a replica-s.")
    per_batch: float = Field(2e-7, ge=0.0, description="Price of one batch (eq. 1's K2).")
    candidate_batch_sizes: list[int] | None = Field(
        None,
        description="Batch sizes B the optimizer may choose; default: the powers of two up to "
        "max_batch_size, and max_batch_size.",
    )
    timeouts_ms: list[float] = Field(
        [0.0, 1.0, 2.0, 5.0, 10.0, 20.0], description="Timeouts T the optimizer may choose."
    )
    arrivals: int = Field(2000, ge=50, le=1_000_000, description="Arrivals the fit looks at.")
    min_arrivals: int = Field(200, ge=30, description="Arrivals needed before a first plan.")
    replan_s: float = Field(5.0, gt=0.0, description="Seconds between two plans.")
    initial_batch_size: int = Field(1, ge=1, description="B until the first plan.")
    initial_timeout_ms: float = Field(0.0, ge=0.0, description="T until the first plan.")

    @model_validator(mode="after")
    def _consistent(self) -> CTMCParams:
        if self.objective == "budget" and self.budget is None:
            raise ValueError("objective budget needs budget ($ per query)")
        sizes = self.candidate_batch_sizes
        if sizes is not None and (
            not sizes or any(not 1 <= b <= self.max_batch_size for b in sizes)
        ):
            raise ValueError(
                f"candidate_batch_sizes must be non-empty, each in 1..max_batch_size "
                f"({self.max_batch_size}), got {sizes}"
            )
        return self

    def candidates(self) -> list[int]:
        """The batch sizes the optimizer searches."""
        if self.candidate_batch_sizes is not None:
            return sorted(set(self.candidate_batch_sizes))
        powers = [2**i for i in range(13) if 2**i < self.max_batch_size]
        return [*powers, self.max_batch_size]


@dataclass(frozen=True)
class PlanInputs:
    """What one plan was computed from (shown with the plan)."""

    arrivals: int
    rate: float
    scv: float
    lag1: float
    service_s: tuple[float, ...]
    replicas: int


class CTMCPolicy(DeadlinePolicy):
    name = "ctmc"
    Params = CTMCParams
    params: CTMCParams

    def __init__(self, params: CTMCParams, slo_s: float) -> None:
        super().__init__(params, slo_s)
        self._times: deque[float] = deque(maxlen=params.arrivals)
        self._last_id = -1
        self._next_plan = -math.inf
        self._replicas = 1
        self.plan: BatchingPlan | None = None
        self.inputs: PlanInputs | None = None
        self._apply(params.initial_batch_size, params.initial_timeout_ms / 1000.0)

    def _apply(self, cap: int, hold_s: float) -> None:
        self._cap, self._hold = cap, hold_s

    def decide(self, view: BatcherView) -> Decision:
        self._record_arrivals(view)
        self._replicas = max(1, len(view.replicas))
        return super().decide(view)

    def _record_arrivals(self, view: BatcherView) -> None:
        """New queries sit at the end of the queue (arrival order): read back to the last seen."""
        fresh = []
        for i in range(len(view.queue) - 1, -1, -1):
            q = view.queue[i]
            if q.query_id <= self._last_id:
                break
            fresh.append(q.arrival)
        if fresh:
            self._times.extend(reversed(fresh))
            self._last_id = max(self._last_id, view.queue[len(view.queue) - 1].query_id)

    def _most_urgent(self, urgent: list[QueuedQuery], slot: ReplicaSlot, now: float) -> Decision:
        """BATCH's buffer: hold a short batch up to T after its oldest query (never past what
        the earliest deadline allows at B's run time), then dispatch as ``deadline`` does."""
        held = self._held(urgent, self._cap, self._hold, now)
        return held or super()._most_urgent(urgent, slot, now)

    # -- planning --------------------------------------------------------------------------

    def plan_request(self, now: float) -> Callable[[], object] | None:
        if now < self._next_plan or len(self._times) < self.params.min_arrivals:
            return None
        service = self.runs.service_times(self._largest, self.params.quantile, self.params.window)
        if service is None:
            return None
        self._next_plan = now + self.params.replan_s
        times = np.fromiter(self._times, dtype=float)
        return _PlanJob(self.params, self.slo_s, times, service, self._replicas)

    def apply_plan(self, plan: object) -> None:
        if not isinstance(plan, tuple):
            return
        self.plan, self.inputs = plan
        self._apply(self.plan.max_batch, self.plan.timeout)

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "batch_size": self._cap,
            "timeout_ms": self._hold * 1000.0,
            "plan": None if self.plan is None else asdict(self.plan),
            "plan_inputs": None if self.inputs is None else asdict(self.inputs),
        }


@dataclass(frozen=True)
class _PlanJob:
    """One optimization over copied inputs: safe to run off the batching loop."""

    params: CTMCParams
    slo_s: float
    times: np.ndarray
    service: np.ndarray
    replicas: int

    def __call__(self) -> tuple[BatchingPlan, PlanInputs] | None:
        gaps = np.diff(self.times)
        gaps = gaps[gaps > 0]
        if gaps.size < 30:
            return None
        arrival = fit_map2(gaps)
        p = self.params
        plan = optimize_batching(
            arrival,
            lambda _units: self.service,
            batch_sizes=p.candidates(),
            timeouts=[t / 1000.0 for t in p.timeouts_ms],
            knobs=[float(self.replicas)],
            knob="units",
            slo=self.slo_s if p.objective == "slo" else None,
            budget=p.budget if p.objective == "budget" else None,
            q=p.percentile,
            pricing=Pricing(per_unit_second=p.per_replica_second, per_call=p.per_batch),
        )
        inputs = PlanInputs(
            int(gaps.size) + 1,
            arrival.rate,
            arrival.scv,
            arrival.lag1_autocorrelation,
            tuple(float(s) for s in self.service),
            self.replicas,
        )
        return plan, inputs
