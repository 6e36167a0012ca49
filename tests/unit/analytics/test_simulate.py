"""The simulator against queueing closed forms, and the accounting every run owes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raysrv.analytics.arrivals import Poisson
from raysrv.analytics.simulate import simulate
from raysrv.batching import POLICIES, FixedParams, FixedPolicy, make_policy
from raysrv.batching.base import BatcherView, BatchingPolicy, Decision, Dispatch, Wait


def fixed(B: int, T: float = 0.0) -> FixedPolicy:
    return FixedPolicy(FixedParams(max_batch_size=B, timeout_ms=T * 1000), slo_s=10.0)


def test_single_queries_on_one_replica_are_an_md1_queue() -> None:
    """B = 1, one replica, deterministic service: Pollaczek-Khinchine mean wait."""
    lam, s = 50.0, 0.012
    arrivals = Poisson(lam).arrival_times(80_000, np.random.default_rng(1))
    sim = simulate(arrivals, [s], fixed(1), replicas=1)
    rho = lam * s
    expected = s + rho * s / (2 * (1 - rho))
    assert float(sim.answered.mean()) == pytest.approx(expected, rel=0.04)
    assert np.all(sim.batch_sizes == 1)


def test_unbounded_replicas_never_queue() -> None:
    arrivals = Poisson(500.0).arrival_times(5_000, np.random.default_rng(2))
    sim = simulate(arrivals, [0.05], fixed(1))
    np.testing.assert_allclose(sim.latencies, 0.05)


def test_every_query_is_answered_or_rejected_once() -> None:
    arrivals = Poisson(400.0).arrival_times(4_000, np.random.default_rng(3))
    sim = simulate(arrivals, 0.004 + 0.002 * np.arange(1, 9), fixed(8, 0.01), replicas=1, slo=0.05)
    assert sim.rejected.any()
    assert np.all(np.isnan(sim.latencies) == sim.rejected)
    assert int(sim.batch_sizes.sum()) + int(sim.rejected.sum()) == arrivals.size
    assert sum(sim.reasons.values()) >= 1
    assert not np.any(sim.late & sim.rejected)
    assert np.array_equal(np.isfinite(sim.refused_after), sim.rejected)  # each refusal's time
    assert np.all(sim.refused_after[sim.rejected] >= 0.0)


def test_queued_batches_wait_for_a_free_replica() -> None:
    """Two queries 1 ms apart, B = 1, one server busy 10 ms: the second waits 9 ms."""
    sim = simulate([0.0, 0.001], [0.01], fixed(1), replicas=1, queue_batches=True)
    np.testing.assert_allclose(sim.latencies, [0.01, 0.019])


class _Backwards(BatchingPolicy):
    """Dispatches the newest query first: exercises removal from the middle of the queue."""

    name = "backwards"

    def decide(self, view: BatcherView) -> Decision:
        replica = view.free_replica()
        if replica is None or not view.queue:
            return Wait()
        return Dispatch((view.queue[len(view.queue) - 1].query_id,), replica)


def test_non_fifo_policies_are_supported() -> None:
    sim = simulate([0.0, 0.0, 0.0], [0.01], _Backwards(FixedParams(), 1.0), replicas=1)
    np.testing.assert_allclose(sim.latencies, [0.03, 0.02, 0.01])


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_registered_policies_keep_the_contract_in_simulation(name: str) -> None:
    policy = make_policy(name, {}, slo_s=0.05)
    arrivals = Poisson(300.0).arrival_times(3_000, np.random.default_rng(4))
    sim = simulate(arrivals, 0.003 + 0.001 * np.arange(1, 65), policy, replicas=2, slo=0.05)
    assert np.all((sim.batch_sizes >= 1) & (sim.batch_sizes <= 64))
    assert int(sim.batch_sizes.sum()) + int(sim.rejected.sum()) == arrivals.size


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="non-decreasing"):
        simulate([1.0, 0.5], [0.01], fixed(1))
    with pytest.raises(ValueError, match="queue_batches"):
        simulate([0.0], [0.01], fixed(1), queue_batches=True)
    with pytest.raises(ValueError, match="deadlines needs one value"):
        simulate([0.0, 1.0], [0.01], fixed(1), deadlines=[1.0])


@settings(max_examples=20, deadline=None)
@given(lam=st.floats(10.0, 70.0), factor=st.floats(1.1, 1.5))
def test_mean_latency_grows_with_load_on_one_replica(lam: float, factor: float) -> None:
    """The same uniform draws at a higher rate: every gap shrinks, so no wait can shrink."""
    gaps = np.random.default_rng(5).exponential(1.0, 3_000)
    low = simulate(np.cumsum(gaps / lam), [0.01], fixed(1), replicas=1)
    high = simulate(np.cumsum(gaps / (lam * factor)), [0.01], fixed(1), replicas=1)
    assert np.all(high.latencies >= low.latencies - 1e-12)


def test_a_service_profile_drives_the_simulation() -> None:
    from raysrv.analytics.profiles import TableProfile

    profile = TableProfile.from_mapping({1: 0.01, 4: 0.04})
    sim = simulate([0.0, 0.0, 0.0, 0.0, 1.0], profile, fixed(4))
    np.testing.assert_allclose(sim.latencies, [0.04, 0.04, 0.04, 0.04, 0.01])


class _Twice(BatchingPolicy):
    """Dispatches the same query over and over: the simulator must refuse, not answer twice."""

    name = "twice"

    def decide(self, view: BatcherView) -> Decision:
        return Dispatch((0,), -1)


def test_a_policy_naming_a_query_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="not waiting in the queue"):
        simulate([0.0, 0.0], [0.01], _Twice(FixedParams(), 1.0))
