"""The ``ctmc`` policy: plans from the analytic model, adopted in the simulator and live."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from raysrv.analytics import MMPP2, Poisson, fit_map2, optimize_batching, simulate
from raysrv.batching import (
    BatcherView,
    BatchOutcome,
    CTMCParams,
    CTMCPolicy,
    Dispatch,
    QueuedQuery,
    ReplicaSlot,
    Wait,
)
from raysrv.batching.ctmc import _PlanJob
from raysrv.testing import EchoModel, fake_workers, one_model_pool, teach

SERVICE = 0.002 + 0.001 * np.arange(1, 33)


def test_a_plan_is_what_the_optimizer_picks_for_the_fitted_arrivals() -> None:
    times = MMPP2(rate1=600.0, rate2=60.0, switch1=3.0, switch2=3.0).arrival_times(
        3000, np.random.default_rng(1)
    )
    params = CTMCParams()
    result = _PlanJob(params, 0.03, times, SERVICE, 1)()
    assert result is not None
    plan, inputs = result
    expected = optimize_batching(
        fit_map2(np.diff(times)),
        lambda _units: SERVICE,
        batch_sizes=params.candidates(),
        timeouts=[t / 1000 for t in params.timeouts_ms],
        slo=0.03,
        q=params.percentile,
    )
    assert (plan.max_batch, plan.timeout) == (expected.max_batch, expected.timeout)
    assert plan.feasible
    assert plan.percentile <= 0.03
    assert inputs.rate == pytest.approx(1 / np.diff(times).mean(), rel=1e-6)
    assert inputs.service_s == tuple(SERVICE)


def test_in_simulation_it_replans_and_answers_nothing_late() -> None:
    arrivals = Poisson(300.0).arrival_times(6000, np.random.default_rng(2))
    policy = CTMCPolicy(CTMCParams(replan_s=2.0, min_arrivals=200), slo_s=0.03)
    result = simulate(arrivals, SERVICE, policy, replicas=1, slo=0.03)
    assert policy.plan is not None
    described = policy.describe()
    assert described["batch_size"] == policy.plan.max_batch
    assert described["timeout_ms"] == pytest.approx(policy.plan.timeout * 1000)
    assert int(result.late.sum()) == 0
    assert result.batch_sizes.max() <= CTMCParams().max_batch_size


def test_the_live_driver_plans_off_the_loop_and_adopts_the_plan() -> None:
    async def scenario() -> None:
        policy = CTMCPolicy(CTMCParams(min_arrivals=60, replan_s=0.05), slo_s=0.5)
        pool = one_model_pool(policy, fake_workers(EchoModel(), delay_s=0.002))
        loop = asyncio.get_running_loop()
        for i in range(150):
            await pool.submit("echo", np.full(4, i, np.float32), deadline=loop.time() + 0.5)
        for _ in range(200):  # the plan arrives from a worker thread
            if policy.plan is not None:
                break
            await asyncio.sleep(0.01)
            await pool.submit("echo", np.zeros(4, np.float32), deadline=loop.time() + 0.5)
        assert policy.plan is not None
        described = pool.describe_model("echo")["batching"]
        assert described["plan"]["max_batch"] == described["batch_size"]
        assert described["timeout_ms"] == pytest.approx(described["plan"]["timeout"] * 1000)
        await pool.close()

    asyncio.run(scenario())


def _planned(batch: int, timeout_s: float, **params: object) -> CTMCPolicy:
    """A policy whose plan says B = ``batch``, T = ``timeout_s``, with run times measured."""
    policy = CTMCPolicy(CTMCParams(max_batch_size=16, **params), slo_s=0.5)
    for size in (1, 2, 4, 8, 16):
        duration = 0.002 + 0.001 * size
        teach(policy, BatchOutcome(size, 0, 0.0, duration, duration))
    policy._apply(batch, timeout_s)
    return policy


def test_a_short_batch_is_held_until_the_planned_timeout() -> None:
    policy = _planned(8, 0.020)
    queue = [QueuedQuery(i, 0.0, 0.5) for i in range(3)]
    assert policy.decide(BatcherView(0.005, queue, [ReplicaSlot(0)])) == Wait(0.020)
    assert policy.decide(BatcherView(0.020, queue, [ReplicaSlot(0)])) == Dispatch((0, 1, 2), 0)


def test_a_backlog_longer_than_b_is_served_in_larger_batches() -> None:
    # B = 2 is the buffer's cut; twelve queries waited for a busy replica, so one batch takes
    # the largest size that still makes every deadline, not two of them.
    policy = _planned(2, 0.0)
    queue = [QueuedQuery(i, 0.0, 0.5) for i in range(12)]
    decision = policy.decide(BatcherView(0.0, queue, [ReplicaSlot(0)]))
    assert isinstance(decision, Dispatch)
    assert len(decision.query_ids) == 12


def test_it_holds_for_the_ingress_concurrency_as_deadline_does() -> None:
    # the plan alone would cut the three at once (B = 2, no T); five were inside the ingress
    policy = _planned(2, 0.0, busy_timeout_ms=30)
    queue = [QueuedQuery(i, 0.0, 0.5) for i in range(3)]
    free = [ReplicaSlot(0)]
    assert policy.decide(BatcherView(0.0, queue, free, concurrency=5)) == Wait(0.030)
    assert policy.decide(BatcherView(0.0, queue, free, concurrency=3)) == Dispatch((0, 1, 2), 0)


def test_budget_objective_needs_a_budget() -> None:
    with pytest.raises(ValueError, match="objective budget needs budget"):
        CTMCParams(objective="budget")


def test_candidate_batch_sizes_default_to_powers_of_two_up_to_the_largest() -> None:
    assert CTMCParams(max_batch_size=24).candidates() == [1, 2, 4, 8, 16, 24]
    assert CTMCParams(max_batch_size=16).candidates() == [1, 2, 4, 8, 16]
    with pytest.raises(ValueError, match="candidate_batch_sizes"):
        CTMCParams(max_batch_size=8, candidate_batch_sizes=[16])
