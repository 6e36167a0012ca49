"""Clipper's ``quantile`` (§4.3.1) and ``delayed`` (§4.3.2) batching on a fake clock."""

from __future__ import annotations

import numpy as np
import pytest

from raysrv.batching import (
    BatcherView,
    BatchOutcome,
    DelayedParams,
    DelayedPolicy,
    Dispatch,
    QuantileParams,
    QuantilePolicy,
    QueuedQuery,
    ReplicaSlot,
    Wait,
)
from raysrv.batching.clipper import fit_quantile_line
from raysrv.testing import saturated_batch_sizes, teach


def _queue(arrival: float, n: int, deadline: float = float("inf")) -> list[QueuedQuery]:
    return [QueuedQuery(i, arrival, deadline) for i in range(n)]


def test_quantile_line_leaves_the_asked_share_of_points_above_it() -> None:
    rng = np.random.default_rng(0)
    sizes = rng.integers(1, 33, 800).astype(float)
    durations = 0.01 + 0.002 * sizes + rng.exponential(0.002, sizes.size)
    a, b = fit_quantile_line(sizes, durations, 0.9)
    above = float(np.mean(durations > a + b * sizes))
    assert above == pytest.approx(0.10, abs=0.02)
    assert b == pytest.approx(0.002, rel=0.1)


def test_quantile_converges_to_the_largest_batch_meeting_the_slo() -> None:
    """10 ms + 2 ms per query and a 100 ms objective: the largest batch that fits is 45."""
    policy = QuantilePolicy(QuantileParams(max_batch_size=200), slo_s=0.1)
    sizes = saturated_batch_sizes(policy, 200, lambda k: 0.010 + 0.002 * k)
    assert sizes[-20:] == [45] * 20
    assert policy.line is not None


def test_delayed_holds_a_short_batch_briefly_for_more_queries() -> None:
    policy = DelayedPolicy(DelayedParams(initial_batch_size=8, delay_ms=2.0), slo_s=1.0)
    free = [ReplicaSlot(0)]
    assert policy.decide(BatcherView(0.0, _queue(0.0, 3), free)) == Wait(0.002)
    assert policy.decide(BatcherView(0.002, _queue(0.0, 3), free)) == Dispatch((0, 1, 2), 0)
    assert policy.decide(BatcherView(0.0, _queue(0.0, 8), free)) == Dispatch(tuple(range(8)), 0)


def test_delayed_never_holds_past_what_the_deadline_allows() -> None:
    params = DelayedParams(initial_batch_size=8, max_batch_size=8, delay_ms=50.0)
    policy = DelayedPolicy(params, slo_s=1.0)
    teach(policy, BatchOutcome(8, 0, 0.0, 0.02, 0.02))  # a batch of 8 takes 20 ms
    decision = policy.decide(BatcherView(0.0, _queue(0.0, 3, deadline=0.03), [ReplicaSlot(0)]))
    assert decision == Wait(pytest.approx(0.01))


def test_delayed_holds_for_busy_timeout_for_the_ingress_concurrency_within_the_deadline() -> None:
    params = DelayedParams(initial_batch_size=8, max_batch_size=8, delay_ms=2.0, busy_timeout_ms=6)
    policy = DelayedPolicy(params, slo_s=1.0)
    free = [ReplicaSlot(0)]
    assert policy.decide(BatcherView(0.0, _queue(0.0, 3), free, concurrency=3)) == Wait(0.002)
    assert policy.decide(BatcherView(0.0, _queue(0.0, 3), free, concurrency=4)) == Wait(0.006)
    teach(policy, BatchOutcome(8, 0, 0.0, 0.02, 0.02))  # a batch of 8 takes 20 ms
    late = BatcherView(0.0, _queue(0.0, 3, deadline=0.024), free, concurrency=4)
    assert policy.decide(late) == Wait(pytest.approx(0.004))


def test_delayed_takes_its_hold_from_delay_ms_only() -> None:
    with pytest.raises(ValueError, match="delay_ms, not timeout_ms"):
        DelayedParams(timeout_ms=5.0)
