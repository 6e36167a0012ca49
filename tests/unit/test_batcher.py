"""The batcher loop with a fake replica group: batches form, slots are respected, nothing lost."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import pytest

from raysrv import batching
from raysrv._batcher import PROFILE_RUNS, Batcher
from raysrv.errors import ModelFailed, Overloaded
from raysrv.testing import EchoModel, fake_execute


def _batcher(log: list[int], delay_s: float = 0.02, replicas: int = 1, **kw: Any) -> Batcher:
    policy = batching.make_policy("fixed", {"max_batch_size": kw.pop("max_batch_size", 8)}, 1.0)
    execute = fake_execute(EchoModel(), delay_s=delay_s, log=log)
    return Batcher("echo", policy, execute, replicas, kw.pop("max_queue", 1000))


def test_batches_form_while_the_replica_is_busy_and_every_query_gets_its_answer() -> None:
    async def scenario() -> None:
        log: list[int] = []
        batcher = _batcher(log)
        futures = [batcher.submit(np.full(4, 0, dtype=np.float32))]
        await asyncio.sleep(0.005)  # the loop dispatches the first query alone
        futures += [batcher.submit(np.full(4, i, dtype=np.float32)) for i in range(1, 20)]
        answers = await asyncio.gather(*futures)
        assert [a["sum"] for a in answers] == [4.0 * i for i in range(20)]
        assert log[0] == 1  # the first query found the replica free
        assert log == [1, 8, 8, 3]
        described = batcher.describe()
        assert (described["batches"], described["batched_queries"]) == (4, 20)
        await batcher.close()

    asyncio.run(scenario())


def test_each_outcome_says_when_its_batch_was_expected_to_start() -> None:
    """The pipeline sends a batch once the replica's last one should have ended, so each is
    expected to start as it leaves; the policy learns its overruns from that."""

    class Recording(batching.FixedPolicy):
        def __init__(self, params: batching.FixedParams, slo_s: float) -> None:
            super().__init__(params, slo_s)
            self.outcomes: list[batching.BatchOutcome] = []

        def observe(self, outcome: batching.BatchOutcome) -> None:
            self.outcomes.append(outcome)

    async def scenario() -> list[batching.BatchOutcome]:
        policy = Recording(batching.FixedParams(max_batch_size=2), 1.0)
        batcher = Batcher("echo", policy, fake_execute(EchoModel(), delay_s=0.01), 1, 1000)
        await asyncio.gather(*(batcher.submit(np.ones(4, np.float32)) for _ in range(12)))
        await batcher.close()
        return policy.outcomes

    outcomes = asyncio.run(scenario())
    assert len(outcomes) == 6
    for o in outcomes:
        assert o.expected_start == o.dispatched
        assert o.finished - o.dispatched >= 0.01  # the fake replica's 10 ms


def test_a_withdrawn_query_leaves_the_queue_and_never_runs() -> None:
    async def scenario() -> None:
        log: list[int] = []
        batcher = _batcher(log)
        running = batcher.submit(np.zeros(4, dtype=np.float32))
        await asyncio.sleep(0.005)  # in a batch now: too late to withdraw
        queued = [batcher.submit(np.full(4, i, dtype=np.float32)) for i in (1, 2)]
        assert not batcher.withdraw(running)
        assert batcher.withdraw(queued[0])
        assert not batcher.withdraw(queued[0])
        queued[0].cancel()
        assert (await running)["sum"] == 0.0
        assert (await queued[1])["sum"] == 8.0
        assert log == [1, 1]  # the withdrawn query was in no batch
        await batcher.close()

    asyncio.run(scenario())


def test_never_more_batches_in_flight_than_replicas_and_one_per_replica() -> None:
    async def scenario() -> None:
        busy: set[int] = set()
        peak = 0

        async def execute(inputs: np.ndarray, replica: int, *_: float) -> tuple[list[Any], float]:
            nonlocal peak
            assert replica not in busy, f"replica {replica} got a second batch"
            busy.add(replica)
            peak = max(peak, len(busy))
            await asyncio.sleep(0.005)
            busy.discard(replica)
            return list(inputs.sum(axis=1)), 0.005

        policy = batching.make_policy("fixed", {"max_batch_size": 2}, 1.0)
        batcher = Batcher("m", policy, execute, 3, 1000)
        await asyncio.gather(*(batcher.submit(np.ones(2)) for _ in range(40)))
        assert peak == 3
        described = batcher.describe()
        assert described["busy_replicas"] == 0
        # Every batch reported 5 ms from its replica: the rolling quantiles per size say so.
        for table in described["batch_seconds"].values():
            assert table
            assert all(v == pytest.approx(0.005) for v in table.values())
        await batcher.close()

    asyncio.run(scenario())


def test_a_full_queue_refuses_at_once() -> None:
    async def scenario() -> None:
        batcher = _batcher([], delay_s=0.05, max_queue=3)
        first = batcher.submit(np.zeros(4))
        await asyncio.sleep(0.01)  # the first batch is running; three more may wait
        waiting = [batcher.submit(np.zeros(4)) for _ in range(3)]
        with pytest.raises(Overloaded, match="3 queries waiting"):
            batcher.submit(np.zeros(4))
        await asyncio.gather(first, *waiting)
        await batcher.close()

    asyncio.run(scenario())


def test_a_failing_batch_fails_its_queries_and_the_loop_goes_on() -> None:
    async def scenario() -> None:
        calls = 0

        async def execute(inputs: np.ndarray, replica: int, *_: float) -> tuple[list[Any], float]:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise RuntimeError("replica died")
            return [0] * len(inputs), 0.0

        batcher = Batcher("m", batching.make_policy("fixed", {}, 1.0), execute, 1, 100)
        with pytest.raises(ModelFailed, match="replica died"):
            await batcher.submit(np.zeros(1))
        assert await batcher.submit(np.zeros(1)) == 0
        await batcher.close()

    asyncio.run(scenario())


def test_callers_that_gave_up_are_not_run() -> None:
    async def scenario() -> None:
        log: list[int] = []
        batcher = _batcher(log, delay_s=0.03)
        first = batcher.submit(np.zeros(4))
        await asyncio.sleep(0.005)
        abandoned = [batcher.submit(np.zeros(4)) for _ in range(3)]
        kept = batcher.submit(np.ones(4))
        for future in abandoned:
            future.cancel()
        await first
        assert (await kept)["sum"] == 4.0
        assert log == [1, 1]
        await batcher.close()

    asyncio.run(scenario())


def test_a_wrong_number_of_outputs_is_an_error_not_a_hang() -> None:
    async def scenario() -> None:
        async def execute(inputs: np.ndarray, replica: int, *_: float) -> tuple[list[Any], float]:
            return [1], 0.0

        batcher = Batcher(
            "m", batching.make_policy("fixed", {"timeout_ms": 20}, 1.0), execute, 1, 10
        )
        futures = [batcher.submit(np.zeros(1)) for _ in range(2)]
        results = await asyncio.gather(*futures, return_exceptions=True)
        assert all(isinstance(r, ModelFailed) for r in results)
        assert "2 inputs" in str(results[0])
        await batcher.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("name", sorted(batching.POLICIES))
def test_every_registered_policy_keeps_the_contract_in_the_live_batcher(name: str) -> None:
    """The real loop on the event loop's clock, overloaded in bursts, with deadlines: every
    query is answered or refused exactly once, for a reason, and batches stay within the cap."""

    async def scenario() -> None:
        log: list[int] = []
        policy = batching.make_policy(name, {}, 0.05)
        execute = fake_execute(EchoModel(), delay_s=0.01, log=log)
        batcher = Batcher("echo", policy, execute, 2, 1000)
        loop = asyncio.get_running_loop()
        futures, deadlines = [], []
        for burst in range(4):
            for i in range(30):
                deadline = loop.time() + 0.05
                futures.append(batcher.submit(np.full(4, i, np.float32), deadline=deadline))
                deadlines.append(deadline)
            await asyncio.sleep(0.03 * (burst % 2))
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
        answered = [o for o in outcomes if isinstance(o, dict)]
        refused = [o for o in outcomes if isinstance(o, Exception)]
        assert len(answered) + len(refused) == len(futures) == 120
        assert sum(log) == len(answered)  # every answer came from exactly one batch
        assert all(1 <= size <= policy.params.max_batch_size for size in log)  # type: ignore[attr-defined]
        assert all("deadline" in str(e) or "queue" in str(e) for e in refused), refused
        await batcher.close()

    asyncio.run(scenario())


def test_a_replica_does_not_start_a_batch_whose_deadline_passed_while_it_waited() -> None:
    """Pipelining sends the next batch before the replica is free; if the batch ahead runs long,
    the waiting batch's deadline can pass in the replica's queue. It must be refused there."""
    from raysrv._batcher import LATE_START
    from raysrv.errors import Rejected

    async def scenario() -> None:
        lock = asyncio.Lock()  # a replica runs one batch at a time, like a Ray actor
        delays = [0.01, 0.08, 0.01]
        ran: list[int] = []

        async def execute(inputs: np.ndarray, replica: int, latest_start: float) -> Any:
            async with lock:
                if time.time() > latest_start:
                    return None, 0.0
                ran.append(len(inputs))
                await asyncio.sleep(delays.pop(0))
                return [float(x.sum()) for x in inputs], 0.01  # the replica measured 10 ms

        policy = batching.make_policy("fixed", {"max_batch_size": 1}, 1.0)
        batcher = Batcher("m", policy, execute, 1, 100, pipeline_depth=2)
        loop = asyncio.get_running_loop()
        await batcher.submit(np.ones(2))  # teaches the pipeline: 10 ms per batch
        slow = batcher.submit(np.ones(2))  # runs 80 ms
        await asyncio.sleep(0.001)
        doomed = batcher.submit(np.ones(2), deadline=loop.time() + 0.04)
        assert await slow == 2.0
        with pytest.raises(Rejected, match=LATE_START):
            await doomed
        assert ran == [1, 1]  # the doomed batch never ran
        await batcher.close()

    asyncio.run(scenario())


def test_a_profiling_step_seeds_the_run_times_before_the_first_query() -> None:
    """clockwork §4: "a brief profiling step to produce a seed estimate". ``deadline`` asks for
    its smallest and largest batch and the powers of two between; on every replica each runs
    once to warm up, then ``PROFILE_RUNS`` times measured."""

    async def scenario() -> tuple[list[int], batching.BatchingPolicy, Batcher]:
        log: list[int] = []
        policy = batching.make_policy("deadline", {"max_batch_size": 6}, 1.0)
        execute = fake_execute(EchoModel(), delay_s=0.01, log=log)
        batcher = Batcher("echo", policy, execute, 2, 1000)
        assert policy.estimate(6) == 0.0  # nothing measured: optimistic
        await batcher.profile(np.zeros(4, np.float32))
        return log, policy, batcher

    log, policy, batcher = asyncio.run(scenario())
    assert sorted(log) == sorted([6, 4, 2, 1] * (1 + PROFILE_RUNS) * 2)
    assert isinstance(policy, batching.DeadlinePolicy)
    assert policy.estimate(6) >= 0.01
    assert policy.describe()["learned_overrun_ms"] == 0.0  # no plan, so no overrun
    assert set(batcher.describe()["batch_seconds"]["p50"]) == {"1", "2", "4", "6"}
    assert batcher.batches == 0  # no query was served


def test_policies_that_keep_no_run_times_are_not_profiled() -> None:
    log: list[int] = []
    batcher = _batcher(log)
    asyncio.run(batcher.profile(np.zeros(4, np.float32)))
    assert log == []


def test_a_model_that_fails_while_profiled_is_served_with_what_was_measured(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[int] = []

    async def fails_on_big_batches(
        inputs: np.ndarray, replica: int, latest_start: float
    ) -> tuple[list[Any], float]:
        calls.append(len(inputs))
        if len(inputs) > 2:
            raise ValueError("out of memory")
        return [0] * len(inputs), 0.01 * len(inputs)

    policy = batching.make_policy("deadline", {"max_batch_size": 4}, 1.0)
    batcher = Batcher("big", policy, fails_on_big_batches, 1, 1000)
    asyncio.run(batcher.profile(np.zeros(4, np.float32)))
    assert calls == [1] * 4 + [2] * 4 + [4]  # smallest first; nothing after the failure
    assert "profiling big on a batch of 4 failed: out of memory" in caplog.text
    assert policy.estimate(2) == pytest.approx(0.02)


def test_a_policy_swapped_in_live_starts_from_the_run_times_measured() -> None:
    async def scenario() -> tuple[batching.BatchingPolicy, batching.BatchingPolicy]:
        first = batching.make_policy("deadline", {"max_batch_size": 4}, 1.0)
        batcher = Batcher("echo", first, fake_execute(EchoModel(), delay_s=0.01), 1, 1000)
        await batcher.profile(np.zeros(4, np.float32))
        swapped = batching.make_policy("deadline", {"max_batch_size": 4}, 1.0)
        batcher.set_policy(swapped)
        await batcher.close()
        return first, swapped

    first, swapped = asyncio.run(scenario())
    assert isinstance(first, batching.DeadlinePolicy)
    assert isinstance(swapped, batching.DeadlinePolicy)
    assert [swapped.estimate(k) for k in (1, 2, 3, 4)] == [first.estimate(k) for k in (1, 2, 3, 4)]
    assert swapped.estimate(1) >= 0.01


def test_closing_stops_a_loop_that_was_woken_in_the_same_step() -> None:
    """A query arriving while the loop sleeps towards a time wakes it; a close in that same
    step must still stop it. ``asyncio.wait_for`` (before Python 3.12) returns the finished
    wait and drops the cancellation then, and the loop slept on, forever."""

    class WaitLong(batching.FixedPolicy):
        def decide(self, view: batching.BatcherView) -> batching.Decision:
            return batching.Wait(view.now + 60.0)

    async def scenario() -> None:
        policy = WaitLong(batching.FixedParams(max_batch_size=2), 1.0)
        batcher = Batcher("echo", policy, fake_execute(EchoModel()), 1, 1000)
        first = batcher.submit(np.ones(4, np.float32))
        await asyncio.sleep(0.01)  # the loop sleeps towards now + 60 s
        second = batcher.submit(np.ones(4, np.float32))  # wakes it
        await asyncio.sleep(0)  # the wake lands, the loop has not run yet
        await asyncio.wait_for(batcher.close(), 2.0)
        for future in (first, second):
            with pytest.raises(Overloaded, match="shutting down"):
                future.result()

    asyncio.run(scenario())
