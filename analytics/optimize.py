"""Choose batch size, timeout and a resource knob from the latency model (BATCH eq. 1-3).

Eq. 2: minimize cost subject to the q-th percentile latency <= SLO. Eq. 3: minimize the q-th
percentile subject to cost <= budget. Both by exhaustive search (batch §IV, "solved via
exhaustive search within a space that is quickly built by the analytical model"), made cheap by
two facts: the buffer's CTMC depends on (arrival, B, T) only, so every knob value reuses it;
and cost needs only the batch-size pmf, so eq. 2 walks the configurations from the cheapest up
and stops at the first one that meets the SLO, computing few percentiles.

The knob stands in for Lambda's memory (batch §III):

* ``knob="units"`` (threads, CPUs or GB per batch, paid per use as in eq. 1): service times
  depend on the knob; servers are unbounded, as on a serverless platform.
* ``knob="replicas"`` (raysrv's reserved workers): service times do not depend on it; a
  configuration's latency is the finite-server *upper bound*
  (:meth:`BatchBufferModel.latency_bounds`), so a plan that meets the SLO meets it for sure,
  and cost is replicas x ``per_unit_second`` / arrival rate plus ``per_call`` per batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from raysrv.analytics.buffer import ArrivalLike, BatchBufferModel, Pricing

__all__ = ["BatchingPlan", "ServiceSource", "optimize_batching"]


class _HasServiceTimes(Protocol):
    def service_times(self, max_batch: int, resource: float | None = None) -> np.ndarray: ...


ServiceSource = (
    Callable[[float], Sequence[float]] | Mapping[float, Sequence[float]] | _HasServiceTimes
)


@dataclass(frozen=True)
class BatchingPlan:
    """The chosen configuration and what the model predicts for it."""

    max_batch: int
    timeout: float
    knob: float
    percentile: float  # predicted q-quantile latency, seconds
    q: float
    mean_latency: float  # infinite-server mean (a lower bound when knob="replicas")
    cost_per_query: float
    mean_batch_size: float
    feasible: bool  # False: nothing met the constraint; this is the closest configuration
    evaluated: int  # configurations whose percentile was computed
    searched: int  # configurations in the grid


@dataclass
class _Candidate:
    B: int
    T: float
    knob: float
    model: BatchBufferModel
    cost: float
    replicas: int | None
    _p: float | None = None

    def percentile(self, q: float) -> float:
        if self._p is None:
            if self.replicas is None:
                self._p = self.model.latency_percentile(q)
            else:
                try:
                    self._p = self.model.latency_bounds(q, self.replicas).upper
                except ValueError:  # too few replicas for the load: unbounded
                    self._p = math.inf
        return self._p


def optimize_batching(
    arrival: ArrivalLike,
    service: ServiceSource,
    *,
    batch_sizes: Sequence[int],
    timeouts: Sequence[float],
    knobs: Sequence[float] = (1.0,),
    knob: Literal["units", "replicas"] = "units",
    slo: float | None = None,
    budget: float | None = None,
    q: float = 0.95,
    pricing: Pricing | None = None,
    grid: int = 128,
) -> BatchingPlan:
    """The cheapest configuration whose ``q``-percentile meets ``slo`` (eq. 2), or with
    ``budget`` ($ per query) the fastest one within it (eq. 3). Give exactly one of them.

    ``service`` gives the service times per knob value: a callable ``knob -> S``, a mapping
    ``knob -> S`` or an object with ``service_times(max_batch, resource)`` such as
    :class:`raysrv.analytics.profiles.ServiceProfile`; ``S[k-1]`` is a batch of k.
    """
    if (slo is None) == (budget is None):
        raise ValueError(f"give exactly one of slo or budget, got slo={slo!r} budget={budget!r}")
    if knob not in ("units", "replicas"):
        raise ValueError(f"knob must be 'units' or 'replicas', got {knob!r}")
    if not 0 < q < 1:
        raise ValueError(f"q must be in (0, 1), got {q!r}")
    _check_grid(batch_sizes, timeouts, knobs)
    pricing = pricing or Pricing()
    candidates = _candidates(arrival, service, batch_sizes, timeouts, knobs, knob, pricing, grid)
    if slo is not None:
        return _min_cost(candidates, slo, q)
    assert budget is not None
    return _min_latency(candidates, budget, q)


def _candidates(
    arrival: ArrivalLike,
    service: ServiceSource,
    batch_sizes: Sequence[int],
    timeouts: Sequence[float],
    knobs: Sequence[float],
    knob: str,
    pricing: Pricing,
    grid: int,
) -> list[_Candidate]:
    largest = max(batch_sizes)
    out = []
    for value in knobs:
        times = _service_times(service, 1.0 if knob == "replicas" else value, largest)
        for B in batch_sizes:
            for T in timeouts:
                model = BatchBufferModel(arrival, times[:B], B, T, grid=grid)
                if knob == "replicas":
                    reserved = value * pricing.per_unit_second / model.rate
                    cost = reserved + pricing.per_call / model.mean_batch_size()
                    out.append(_Candidate(B, T, value, model, cost, int(value)))
                else:
                    out.append(
                        _Candidate(B, T, value, model, model.cost_per_query(pricing, value), None)
                    )
    return out


def _min_cost(candidates: list[_Candidate], slo: float, q: float) -> BatchingPlan:
    """Eq. 2: cheapest first; the first that meets the SLO is the answer."""
    ordered = sorted(candidates, key=lambda c: (c.cost, c.B, c.T))
    for evaluated, cand in enumerate(ordered, start=1):
        if cand.percentile(q) <= slo:
            return _plan(cand, q, True, evaluated, len(candidates))
    fastest = min(ordered, key=lambda c: c.percentile(q))
    return _plan(fastest, q, False, len(ordered), len(candidates))


def _min_latency(candidates: list[_Candidate], budget: float, q: float) -> BatchingPlan:
    """Eq. 3: among those within budget, the lowest percentile (then the cheapest)."""
    within = [c for c in candidates if c.cost <= budget]
    if not within:
        cheapest = min(candidates, key=lambda c: c.cost)
        return _plan(cheapest, q, False, 1, len(candidates))
    best = min(within, key=lambda c: (c.percentile(q), c.cost))
    return _plan(best, q, True, len(within), len(candidates))


def _plan(c: _Candidate, q: float, feasible: bool, evaluated: int, searched: int) -> BatchingPlan:
    return BatchingPlan(
        max_batch=c.B,
        timeout=c.T,
        knob=c.knob,
        percentile=c.percentile(q),
        q=q,
        mean_latency=c.model.mean_latency(),
        cost_per_query=c.cost,
        mean_batch_size=c.model.mean_batch_size(),
        feasible=feasible,
        evaluated=evaluated,
        searched=searched,
    )


def _service_times(service: ServiceSource, value: float, largest: int) -> np.ndarray:
    if hasattr(service, "service_times"):
        times = service.service_times(largest, value)
    elif isinstance(service, Mapping):
        if value not in service:
            raise ValueError(f"service has no times for knob {value!r}: {sorted(service)}")
        times = service[value]
    else:
        times = service(value)
    out = np.asarray(times, dtype=float)
    if out.ndim != 1 or out.size < largest:
        raise ValueError(
            f"service times for knob {value!r} cover batches up to {out.size}, need {largest}"
        )
    return out


def _check_grid(
    batch_sizes: Sequence[int], timeouts: Sequence[float], knobs: Sequence[float]
) -> None:
    if not batch_sizes or any(int(b) != b or b < 1 for b in batch_sizes):
        raise ValueError(f"batch_sizes must be ints >= 1, got {list(batch_sizes)!r}")
    if not timeouts or any(not (t >= 0 and math.isfinite(t)) for t in timeouts):
        raise ValueError(f"timeouts must be finite seconds >= 0, got {list(timeouts)!r}")
    if not knobs or any(not (k > 0 and math.isfinite(k)) for k in knobs):
        raise ValueError(f"knobs must be finite and > 0, got {list(knobs)!r}")
