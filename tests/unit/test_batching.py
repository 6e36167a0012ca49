"""Batching policies with a fake clock, and the contract every registered policy owes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from raysrv import batching
from raysrv.batching import (
    AIMDPolicy,
    BatcherView,
    BatchingPolicy,
    BatchOutcome,
    Dispatch,
    FixedPolicy,
    QueuedQuery,
    Reject,
    ReplicaSlot,
    Wait,
)
from raysrv.testing import FakeClock, saturated_batch_sizes, teach


def _queue(arrivals: list[float]) -> list[QueuedQuery]:
    return [QueuedQuery(i, t) for i, t in enumerate(arrivals)]


def _free(n: int = 1) -> tuple[ReplicaSlot, ...]:
    return tuple(ReplicaSlot(i) for i in range(n))


def _fixed(max_batch_size: int, timeout_ms: float = 0.0) -> FixedPolicy:
    return batching.make_policy(  # type: ignore[return-value]
        "fixed", {"max_batch_size": max_batch_size, "timeout_ms": timeout_ms}, slo_s=0.1
    )


def _aimd(**params: float) -> AIMDPolicy:
    return batching.make_policy("aimd", params, slo_s=0.1)  # type: ignore[return-value]


def test_fixed_waits_for_the_timeout_then_cuts_what_is_there() -> None:
    clock = FakeClock()
    policy = _fixed(4, timeout_ms=10)
    queue = _queue([clock(), clock()])
    decision = policy.decide(BatcherView(clock(), queue, _free()))
    assert decision == Wait(pytest.approx(clock() + 0.010))
    clock.advance(0.009)
    assert isinstance(policy.decide(BatcherView(clock(), queue, _free())), Wait)
    clock.advance(0.001)
    assert policy.decide(BatcherView(clock(), queue, _free())) == Dispatch((0, 1), 0)


def test_fixed_cuts_a_full_batch_at_once_and_no_more() -> None:
    clock = FakeClock()
    queue = _queue([clock()] * 7)
    decision = _fixed(4, timeout_ms=1000).decide(BatcherView(clock(), queue, _free()))
    assert decision == Dispatch((0, 1, 2, 3), 0)


def test_fixed_never_cuts_for_a_busy_replica() -> None:
    clock = FakeClock()
    busy = (ReplicaSlot(0, busy_since=clock(), batch_size=3),)
    queue = _queue([clock() - 5.0] * 9)
    assert _fixed(4).decide(BatcherView(clock(), queue, busy)) == Wait()
    two = (busy[0], ReplicaSlot(1))
    assert _fixed(4).decide(BatcherView(clock(), queue, two)) == Dispatch((0, 1, 2, 3), 1)


def test_fixed_holds_for_busy_timeout_while_fewer_wait_than_the_ingress_held() -> None:
    clock = FakeClock()
    policy = batching.make_policy(
        "fixed", {"max_batch_size": 4, "timeout_ms": 1, "busy_timeout_ms": 5}, slo_s=0.1
    )
    two = _queue([clock(), clock()])
    alone = BatcherView(clock(), two, _free(), concurrency=2)
    assert policy.decide(alone) == Wait(pytest.approx(clock() + 0.001))
    busy = BatcherView(clock(), two, _free(), concurrency=3)
    assert policy.decide(busy) == Wait(pytest.approx(clock() + 0.005))
    clock.advance(0.002)  # past timeout_ms: cut at once unless a third is expected
    assert policy.decide(BatcherView(clock(), two, _free(), concurrency=2)) == Dispatch((0, 1), 0)
    assert isinstance(policy.decide(BatcherView(clock(), two, _free(), concurrency=3)), Wait)
    three = _queue([clock() - 0.002] * 2 + [clock()])
    assert policy.decide(BatcherView(clock(), three, _free(), 3)) == Dispatch((0, 1, 2), 0)
    clock.advance(0.003)  # busy_timeout_ms passed: cut what is there
    assert policy.decide(BatcherView(clock(), two, _free(), 9)) == Dispatch((0, 1), 0)
    full = _queue([clock()] * 4)  # a full batch never waits, whatever the concurrency
    assert policy.decide(BatcherView(clock(), full, _free(), 9)) == Dispatch((0, 1, 2, 3), 0)


@pytest.mark.parametrize("name", ["fixed", "aimd"])
def test_a_busy_timeout_shorter_than_the_timeout_changes_nothing(name: str) -> None:
    params = {"max_batch_size": 4, "timeout_ms": 5, "busy_timeout_ms": 1}
    if name == "aimd":
        params["initial_batch_size"] = 4
    policy = batching.make_policy(name, params, slo_s=0.1)
    queue = _queue([0.0])
    assert policy.decide(BatcherView(0.0, queue, _free(), concurrency=8)) == Wait(0.005)


def _outcome(size: int, duration: float) -> BatchOutcome:
    return BatchOutcome(size, 0, 0.0, duration, duration)


def test_aimd_adds_after_full_batches_within_the_slo() -> None:
    policy = _aimd(initial_batch_size=2, step=3, max_batch_size=10)
    policy.observe(_outcome(2, 0.05))
    assert policy.max_batch_size == 5
    policy.observe(_outcome(3, 0.05))  # not full: says nothing about a larger batch
    assert policy.max_batch_size == 5
    policy.observe(_outcome(5, 0.05))
    policy.observe(_outcome(8, 0.05))
    assert policy.max_batch_size == 10  # capped


def test_aimd_backs_off_ten_percent_when_a_batch_exceeds_the_slo() -> None:
    policy = _aimd(initial_batch_size=50)
    policy.observe(_outcome(50, 0.101))
    assert policy.max_batch_size == 45
    for _ in range(100):
        policy.observe(_outcome(1, 1.0))
    assert policy.max_batch_size == 1


def test_aimd_uses_its_own_objective_when_given() -> None:
    policy = _aimd(initial_batch_size=10, slo_ms=20)
    policy.observe(_outcome(10, 0.030))
    assert policy.max_batch_size == 9


def test_aimd_converges_near_the_largest_batch_meeting_the_slo() -> None:
    """With latency 10 ms + 2 ms per query and a 100 ms SLO, the best batch is 45."""
    policy = _aimd(initial_batch_size=1, max_batch_size=200)
    sizes = saturated_batch_sizes(policy, 400, lambda k: 0.010 + 0.002 * k)
    assert min(sizes[-50:]) >= 40
    assert max(sizes[-50:]) <= 46


def test_registry_names_the_known_policies_and_takes_import_paths() -> None:
    with pytest.raises(
        ValueError,
        match="unknown batching policy 'nope'; known: aimd, ctmc, deadline, delayed, fixed, "
        "quantile",
    ):
        batching.policy_class("nope")
    assert batching.policy_class("raysrv.batching.fixed:FixedPolicy") is FixedPolicy
    with pytest.raises(ValueError, match="not a subclass"):
        batching.policy_class("raysrv.batching.fixed:FixedParams")
    with pytest.raises(ValueError, match="cannot import"):
        batching.policy_class("no_such_module:Policy")


def _simulate(
    policy: BatchingPolicy,
    seed: int,
    replicas: int = 2,
    n: int = 300,
    slo_s: float = math.inf,
    per_item_s: float = 0.001,
) -> tuple[list[int], int]:
    """Drive a policy with Poisson arrivals and linear service times on a fake clock.

    Returns the batch sizes and the number rejected; checks every decision against the
    contract on the way.
    """
    rng = np.random.default_rng(seed)
    clock = FakeClock(0.0)
    arrivals = list(np.cumsum(rng.exponential(0.004, n)))
    queue: list[QueuedQuery] = []
    slots = list(_free(replicas))
    running: list[tuple[float, int, int]] = []  # (finish, replica, size)
    answered: list[int] = []
    sizes: list[int] = []
    while len(answered) < n:
        while arrivals and arrivals[0] <= clock():
            arrival = arrivals.pop(0)
            queue.append(QueuedQuery(n - len(arrivals) - 1, arrival, deadline=arrival + slo_s))
        decision = policy.decide(BatcherView(clock(), tuple(queue), tuple(slots)))
        if isinstance(decision, Dispatch | Reject):
            ids = set(decision.query_ids)
            assert len(ids) == len(decision.query_ids), "a query named twice"
            assert ids <= {q.query_id for q in queue}, "named a query that is not queued"
            if isinstance(decision, Reject):
                # a query may be refused behind work in flight or queued ahead of it, never
                # while a replica is free and it could make it there, first by deadline
                alone = 0.003 + per_item_s  # the fastest any query could still be answered
                kept = [q for q in queue if q.query_id not in ids]
                for q in (q for q in queue if q.query_id in ids):
                    first = not any(k.deadline <= q.deadline for k in kept)
                    could = first and any(s.free for s in slots) and q.deadline >= clock() + alone
                    assert not could, "rejected a query that could still have met its deadline"
            else:
                cap = getattr(policy.params, "max_batch_size", n)
                assert 1 <= len(ids) <= cap, decision
                assert slots[decision.replica].free, "dispatched to a busy replica"
                late = [q for q in queue if q.query_id in ids and q.deadline < clock()]
                assert not late, "started work for queries already past their deadline"
                slots[decision.replica] = ReplicaSlot(decision.replica, clock(), len(ids))
                running.append(
                    (clock() + 0.003 + per_item_s * len(ids), decision.replica, len(ids))
                )
                sizes.append(len(ids))
            queue = [q for q in queue if q.query_id not in ids]
            answered += decision.query_ids
            continue
        events = [t for t, _, _ in running] + arrivals[:1]
        if decision.until is not None:
            events.append(decision.until)
        assert events, f"policy waits forever with {len(queue)} queued and a free replica"
        clock.advance(max(0.0, min(events) - clock()))
        for done in [r for r in running if r[0] <= clock()]:
            running.remove(done)
            slots[done[1]] = ReplicaSlot(done[1])
            duration = 0.003 + per_item_s * done[2]
            teach(policy, BatchOutcome(done[2], done[1], done[0] - duration, done[0], duration))
    assert sorted(answered) == list(range(n)), "a query was lost or answered twice"
    return sizes, n - sum(sizes)


@pytest.mark.parametrize("name", sorted(batching.POLICIES))
@pytest.mark.parametrize("seed", [0, 1])
def test_every_registered_policy_keeps_the_contract(name: str, seed: int) -> None:
    policy = batching.make_policy(name, {}, slo_s=0.05)
    sizes, rejected = _simulate(policy, seed)
    assert (sum(sizes), rejected) == (300, 0)


@pytest.mark.parametrize("name", sorted(batching.POLICIES))
def test_every_registered_policy_keeps_the_contract_under_overload_with_deadlines(
    name: str,
) -> None:
    """Arrivals every 4 ms on one replica taking 3 ms + 10 ms per query: some must be refused."""
    policy = batching.make_policy(name, {}, slo_s=0.05)
    sizes, rejected = _simulate(policy, seed=3, replicas=1, slo_s=0.05, per_item_s=0.010)
    assert sum(sizes) + rejected == 300
    assert rejected > 0


def test_fifo_policies_refuse_queries_past_their_deadline_before_cutting() -> None:
    clock = FakeClock()
    queue = [QueuedQuery(0, clock(), deadline=clock() + 0.01), QueuedQuery(1, clock())]
    clock.advance(0.02)
    for policy in (_fixed(4), _aimd(initial_batch_size=4)):
        decision = policy.decide(BatcherView(clock(), queue, _free()))
        assert decision == Reject((0,), "deadline passed while queued")
        assert policy.decide(BatcherView(clock(), queue[1:], _free())) == Dispatch((1,), 0)
