"""The optimizer returns what an exhaustive look at the same grid would (batch eq. 2 and 3)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from raysrv.analytics.arrivals import MMPP2, Poisson
from raysrv.analytics.buffer import BatchBufferModel, Pricing
from raysrv.analytics.optimize import optimize_batching

ARRIVAL = MMPP2(rate1=200.0, rate2=20.0, switch1=2.0, switch2=1.0)
BATCHES = [1, 2, 4, 8, 16]
TIMEOUTS = [0.0, 0.005, 0.01, 0.02, 0.05]
KNOBS = [1.0, 2.0, 4.0]


def service(threads: float) -> np.ndarray:
    return (0.004 + 0.0015 * np.arange(1, 17)) / threads**0.9 + 0.002


def table() -> list[tuple[float, float, int, float, float]]:
    rows = []
    for knob, B, T in itertools.product(KNOBS, BATCHES, TIMEOUTS):
        model = BatchBufferModel(ARRIVAL, service(knob)[:B], B, T, grid=128)
        rows.append(
            (model.cost_per_query(Pricing(), knob), model.latency_percentile(0.95), B, T, knob)
        )
    return rows


@pytest.mark.parametrize("slo", [0.012, 0.02, 0.05])
def test_min_cost_under_an_slo_is_the_cheapest_feasible(slo: float) -> None:
    plan = optimize_batching(
        ARRIVAL, service, batch_sizes=BATCHES, timeouts=TIMEOUTS, knobs=KNOBS, slo=slo
    )
    feasible = [r for r in table() if r[1] <= slo]
    assert plan.feasible
    assert plan.percentile <= slo
    assert plan.cost_per_query == pytest.approx(min(r[0] for r in feasible), rel=1e-9)
    assert plan.evaluated <= plan.searched == len(BATCHES) * len(TIMEOUTS) * len(KNOBS)


def test_min_latency_within_a_budget_is_the_fastest_affordable() -> None:
    rows = table()
    budget = float(np.median([r[0] for r in rows]))
    plan = optimize_batching(
        ARRIVAL, service, batch_sizes=BATCHES, timeouts=TIMEOUTS, knobs=KNOBS, budget=budget
    )
    assert plan.feasible
    assert plan.cost_per_query <= budget
    assert plan.percentile == pytest.approx(min(r[1] for r in rows if r[0] <= budget), rel=1e-9)


def test_an_impossible_slo_returns_the_fastest_configuration_marked_infeasible() -> None:
    plan = optimize_batching(
        ARRIVAL, service, batch_sizes=BATCHES, timeouts=TIMEOUTS, knobs=KNOBS, slo=1e-4
    )
    assert not plan.feasible
    assert plan.percentile == pytest.approx(min(r[1] for r in table()), rel=1e-9)


def test_replicas_knob_uses_the_guaranteed_bound() -> None:
    plan = optimize_batching(
        Poisson(300.0),
        service,
        batch_sizes=[4, 8, 16],
        timeouts=[0.01, 0.02],
        knobs=[1, 2, 4],
        knob="replicas",
        slo=0.06,
    )
    assert plan.feasible
    model = BatchBufferModel(
        Poisson(300.0), service(1.0)[: plan.max_batch], plan.max_batch, plan.timeout
    )
    assert plan.percentile == pytest.approx(
        model.latency_bounds(0.95, int(plan.knob)).upper, rel=1e-6
    )


def test_the_objective_and_grid_are_checked() -> None:
    with pytest.raises(ValueError, match="exactly one of slo or budget"):
        optimize_batching(ARRIVAL, service, batch_sizes=[1], timeouts=[0.0])
    with pytest.raises(ValueError, match="batch_sizes"):
        optimize_batching(ARRIVAL, service, batch_sizes=[0], timeouts=[0.0], slo=1.0)
    with pytest.raises(ValueError, match="cover batches up to"):
        optimize_batching(ARRIVAL, {1.0: [0.1]}, batch_sizes=[4], timeouts=[0.0], slo=1.0)
