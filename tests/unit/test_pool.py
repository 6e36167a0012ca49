"""The live driver of a pool over in-process workers: batches form, each executor of a worker
runs one action at a time, models load and unload within capacity, and every query gets exactly
one answer."""

from __future__ import annotations

import asyncio
import math
import os
import re
import sys
import threading
import time
from collections.abc import Awaitable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

import raysrv._pool
from bench.zoo import build_zoo, model_size
from raysrv import batching
from raysrv._pool import PROFILE_RUNS, Pool
from raysrv._workers import Call, ColocatedWorkers, LoadFailed, PoolWorker, Report
from raysrv.batching.actions import COLD_DOOMED, LATE_START
from raysrv.config import ModelSpec, PoolSpec, resolve_pools
from raysrv.errors import ModelFailed, NotFound, Overloaded, Rejected
from raysrv.testing import EchoModel, LocalWorkers, fake_workers, model_spec, one_model_pool


def _fixed(max_batch_size: int = 8, **params: Any) -> batching.BatchingPolicy:
    return batching.make_policy("fixed", {"max_batch_size": max_batch_size, **params}, 1.0)


def _echo_pool(log: list[int], delay_s: float = 0.02, replicas: int = 1, **kw: Any) -> Pool:
    workers = fake_workers(EchoModel(), delay_s=delay_s, log=log, replicas=replicas)
    return one_model_pool(_fixed(kw.pop("max_batch_size", 8)), workers, **kw)


def _x(value: float = 0.0) -> np.ndarray:
    return np.full(4, value, dtype=np.float32)


def test_batches_form_while_the_worker_is_busy_and_every_query_gets_its_answer() -> None:
    async def scenario() -> None:
        log: list[int] = []
        pool = _echo_pool(log)
        futures = [pool.submit("echo", _x(0))]
        await asyncio.sleep(0.005)  # the loop dispatches the first query alone
        futures += [pool.submit("echo", _x(i)) for i in range(1, 20)]
        answers = await asyncio.gather(*futures)
        assert [a["sum"] for a in answers] == [4.0 * i for i in range(20)]
        assert log == [1, 8, 8, 3]  # the first query found the worker free
        described = pool.describe_model("echo")
        assert (described["batches"], described["batched_queries"]) == (4, 20)
        await pool.close()

    asyncio.run(scenario())


def test_each_outcome_says_when_its_batch_was_expected_to_start() -> None:
    """A batch is sent once the worker's last one should have ended, so each is expected to
    start as it leaves; the policy learns its overruns from that."""

    class Recording(batching.FixedPolicy):
        def __init__(self, params: batching.FixedParams, slo_s: float) -> None:
            super().__init__(params, slo_s)
            self.outcomes: list[batching.BatchOutcome] = []

        def observe(self, outcome: batching.BatchOutcome) -> None:
            self.outcomes.append(outcome)

    async def scenario() -> list[batching.BatchOutcome]:
        policy = Recording(batching.FixedParams(max_batch_size=2), 1.0)
        pool = one_model_pool(policy, fake_workers(EchoModel(), delay_s=0.01))
        await asyncio.gather(*(pool.submit("echo", _x(1)) for _ in range(12)))
        await pool.close()
        return policy.outcomes

    outcomes = asyncio.run(scenario())
    assert len(outcomes) == 6
    for o in outcomes:
        assert o.expected_start == o.dispatched
        assert o.finished - o.dispatched >= 0.01  # the fake worker's 10 ms


def test_a_withdrawn_query_leaves_the_queue_and_never_runs() -> None:
    async def scenario() -> None:
        log: list[int] = []
        pool = _echo_pool(log)
        running = pool.submit("echo", _x(0))
        await asyncio.sleep(0.005)  # in a batch now: too late to withdraw
        queued = [pool.submit("echo", _x(i)) for i in (1, 2)]
        assert not pool.withdraw("echo", running)
        assert pool.withdraw("echo", queued[0])
        assert not pool.withdraw("echo", queued[0])
        queued[0].cancel()
        assert (await running)["sum"] == 0.0
        assert (await queued[1])["sum"] == 8.0
        assert log == [1, 1]  # the withdrawn query was in no batch
        await pool.close()

    asyncio.run(scenario())


class _Counting(LocalWorkers):
    """Counts the actions each worker has received and not yet answered."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.outstanding = [0] * len(self)
        self.peak = [0] * len(self)

    def run(self, worker: int, calls: list[Call]) -> Awaitable[list[Report]]:
        self.outstanding[worker] += len(calls)
        self.peak[worker] = max(self.peak[worker], self.outstanding[worker])
        pending = super().run(worker, calls)

        async def counted() -> list[Report]:
            try:
                return await pending
            finally:
                self.outstanding[worker] -= len(calls)

        return counted()


def test_never_more_actions_in_flight_per_worker_than_the_depth() -> None:
    async def scenario(depth: int) -> list[int]:
        workers = _Counting(3, dedicated=EchoModel(), delay_s=0.005)
        pool = one_model_pool(_fixed(2), workers, depth=depth)
        await asyncio.gather(*(pool.submit("echo", _x(1)) for _ in range(60)))
        described = pool.describe_model("echo")
        assert described["busy_replicas"] == 0
        for table in described["batch_seconds"].values():  # one record of run times per size
            assert table
            assert all(0.005 <= v < 0.05 for v in table.values())  # the workers' 5 ms sleeps
        await pool.close()
        return workers.peak

    assert asyncio.run(scenario(1)) == [1, 1, 1]
    assert max(asyncio.run(scenario(2))) == 2


def test_a_full_queue_refuses_at_once() -> None:
    async def scenario() -> None:
        pool = _echo_pool([], delay_s=0.05, max_queue=3)
        first = pool.submit("echo", _x())
        await asyncio.sleep(0.01)  # the first batch is running; three more may wait
        waiting = [pool.submit("echo", _x()) for _ in range(3)]
        with pytest.raises(Overloaded, match="3 queries waiting"):
            pool.submit("echo", _x())
        await asyncio.gather(first, *waiting)
        await pool.close()

    asyncio.run(scenario())


class _DiesOnce(EchoModel):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def predict_batch(self, inputs: Any) -> list[dict[str, Any]]:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("worker died")
        return super().predict_batch(inputs)


def test_a_failing_batch_fails_its_queries_and_the_loop_goes_on() -> None:
    async def scenario() -> None:
        pool = one_model_pool(_fixed(), fake_workers(_DiesOnce()))
        with pytest.raises(ModelFailed, match="worker died"):
            await pool.submit("echo", _x())
        assert (await pool.submit("echo", _x(1)))["sum"] == 4.0
        await pool.close()

    asyncio.run(scenario())


def test_callers_that_gave_up_are_not_run() -> None:
    async def scenario() -> None:
        log: list[int] = []
        pool = _echo_pool(log, delay_s=0.03)
        first = pool.submit("echo", _x())
        await asyncio.sleep(0.005)
        abandoned = [pool.submit("echo", _x()) for _ in range(3)]
        kept = pool.submit("echo", _x(1))
        for future in abandoned:
            future.cancel()
        await first
        assert (await kept)["sum"] == 4.0
        assert log == [1, 1]
        await pool.close()

    asyncio.run(scenario())


class _OneOutput:
    def predict_batch(self, inputs: Any) -> list[int]:
        return [1]


def test_a_wrong_number_of_outputs_is_an_error_not_a_hang() -> None:
    async def scenario() -> None:
        pool = one_model_pool(_fixed(timeout_ms=20), fake_workers(_OneOutput()))
        futures = [pool.submit("echo", np.zeros(4)) for _ in range(2)]
        results = await asyncio.gather(*futures, return_exceptions=True)
        assert all(isinstance(r, ModelFailed) for r in results)
        assert "1 outputs for 2 inputs" in str(results[0])
        await pool.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("name", sorted(batching.POLICIES))
def test_every_registered_policy_keeps_the_contract_in_the_live_driver(name: str) -> None:
    """The real loop on the event loop's clock, overloaded in bursts, with deadlines: every
    query is answered or refused exactly once, for a reason, and batches stay within the cap."""

    async def scenario() -> None:
        log: list[int] = []
        policy = batching.make_policy(name, {}, 0.05)
        pool = one_model_pool(policy, fake_workers(EchoModel(), 0.01, log, replicas=2))
        loop = asyncio.get_running_loop()
        futures = []
        for burst in range(4):
            for i in range(30):
                futures.append(pool.submit("echo", _x(i), deadline=loop.time() + 0.05))
            await asyncio.sleep(0.03 * (burst % 2))
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
        answered = [o for o in outcomes if isinstance(o, dict)]
        refused = [o for o in outcomes if isinstance(o, Exception)]
        assert len(answered) + len(refused) == len(futures) == 120
        assert sum(log) == len(answered)  # every answer came from exactly one batch
        assert all(1 <= size <= policy.params.max_batch_size for size in log)  # type: ignore[attr-defined]
        assert all("deadline" in str(e) or "queue" in str(e) for e in refused), refused
        await pool.close()

    asyncio.run(scenario())


def test_a_batch_not_started_in_time_is_planned_again_and_serves_what_still_fits() -> None:
    """With depth 2 the next batch is sent before the worker is free. It waits behind one that
    runs long, and the worker does not start it once the earliest deadline in it leaves no time
    for it to run (Clockwork §4.4). Its queries are planned again from there: the one whose
    deadline has passed is refused, the other, with time left, is answered by a batch of its
    own."""

    async def scenario() -> None:
        log: list[int] = []
        delays = [0.01, 0.08, 0.01, 0.01]
        workers = LocalWorkers(1, dedicated=EchoModel(), delay_s=lambda _: delays.pop(0), log=log)
        pool = one_model_pool(_fixed(2), workers, depth=2)
        loop = asyncio.get_running_loop()
        await pool.submit("echo", _x(1))  # teaches the scheduler: about 10 ms per batch
        slow = pool.submit("echo", _x(1))  # runs 80 ms
        await asyncio.sleep(0.001)
        tight = pool.submit("echo", _x(1), deadline=loop.time() + 0.04)
        loose = pool.submit("echo", _x(2), deadline=loop.time() + 0.5)
        assert (await slow)["sum"] == 4.0
        with pytest.raises(Rejected, match="deadline passed while queued"):
            await tight
        assert (await loose)["sum"] == 8.0
        assert log == [1, 1, 1]  # the batch of both never ran; the loose query ran alone
        await pool.close()

    asyncio.run(scenario())


def test_a_query_whose_batch_is_late_a_second_time_is_refused() -> None:
    """Queued again once, not for ever: a worker that finds every batch past its window
    refuses the query's first and second batch, and the query gets the late start's 429."""
    infers: list[float] = []

    class AlwaysLate(LocalWorkers):
        def run(self, worker: int, calls: list[Call]) -> Awaitable[list[Report]]:
            late = [replace(c, latest=time.time() - 1.0) for c in calls if c.kind == "infer"]
            infers.extend(c.latest for c in late)
            return super().run(worker, late or calls)

    async def scenario() -> None:
        log: list[int] = []
        pool = one_model_pool(_fixed(1), AlwaysLate(1, dedicated=EchoModel(), log=log))
        loop = asyncio.get_running_loop()
        with pytest.raises(Rejected, match=LATE_START):
            await pool.submit("echo", _x(1), deadline=loop.time() + 5.0)
        assert (len(infers), log) == (2, [])  # sent twice, run never
        await pool.close()

    asyncio.run(scenario())


def test_a_profiling_step_seeds_the_run_times_before_the_first_query() -> None:
    """clockwork §4: "a brief profiling step to produce a seed estimate". ``deadline`` asks for
    its smallest and largest batch and the powers of two between; on every worker each runs
    once to warm up, then ``PROFILE_RUNS`` times measured."""

    async def scenario() -> tuple[list[int], batching.BatchingPolicy, Pool]:
        log: list[int] = []
        policy = batching.make_policy("deadline", {"max_batch_size": 6}, 1.0)
        pool = one_model_pool(policy, fake_workers(EchoModel(), 0.01, log, replicas=2))
        assert isinstance(policy, batching.DeadlinePolicy)
        assert policy.estimate(6) == 0.0  # nothing measured: optimistic
        await pool.profile()
        return log, policy, pool

    log, policy, pool = asyncio.run(scenario())
    assert sorted(log) == sorted([6, 4, 2, 1] * (1 + PROFILE_RUNS) * 2)
    assert isinstance(policy, batching.DeadlinePolicy)
    assert policy.estimate(6) >= 0.01
    assert policy.describe()["learned_overrun_ms"] == 0.0  # no plan, so no overrun
    described = pool.describe_model("echo")
    assert set(described["batch_seconds"]["p50"]) == {"1", "2", "4", "6"}
    assert described["batch_counts"] == {str(k): PROFILE_RUNS * 2 for k in (1, 2, 4, 6)}
    assert described["batches"] == 0  # no query was served


def test_policies_that_keep_no_run_times_are_not_profiled() -> None:
    log: list[int] = []
    asyncio.run(_echo_pool(log).profile())
    assert log == []


class _FailsOnBig(EchoModel):
    def predict_batch(self, inputs: Any) -> list[dict[str, Any]]:
        if len(inputs) > 2:
            raise ValueError("out of memory")
        return super().predict_batch(inputs)


def test_a_model_that_fails_while_profiled_is_served_with_what_was_measured(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log: list[int] = []
    policy = batching.make_policy("deadline", {"max_batch_size": 4}, 1.0)
    pool = one_model_pool(policy, fake_workers(_FailsOnBig(), 0.01, log), name="big")
    asyncio.run(pool.profile())
    assert log == [1] * 4 + [2] * 4 + [4]  # smallest first; nothing after the failure
    assert "profiling big failed" in caplog.text
    assert "out of memory" in caplog.text
    assert isinstance(policy, batching.DeadlinePolicy)
    assert policy.estimate(2) == pytest.approx(0.01, abs=0.01)


def test_a_policy_swapped_in_live_starts_from_the_run_times_measured() -> None:
    async def scenario() -> tuple[batching.BatchingPolicy, batching.BatchingPolicy]:
        first = batching.make_policy("deadline", {"max_batch_size": 4}, 1.0)
        pool = one_model_pool(first, fake_workers(EchoModel(), delay_s=0.01))
        await pool.profile()
        swapped = batching.make_policy("deadline", {"max_batch_size": 4}, 1.0)
        pool.set_policy("echo", swapped)
        await pool.close()
        return first, swapped

    first, swapped = asyncio.run(scenario())
    assert isinstance(first, batching.DeadlinePolicy)
    assert isinstance(swapped, batching.DeadlinePolicy)
    assert [swapped.estimate(k) for k in (1, 2, 3, 4)] == [first.estimate(k) for k in (1, 2, 3, 4)]
    assert swapped.estimate(1) >= 0.01


def test_an_arrival_leaves_for_a_free_worker_at_the_loops_next_turn() -> None:
    """The step an arrival asks for runs at the loop's next turn, not on the caller's stack and
    not turns later, and the pool shows how long such steps waited."""

    async def scenario() -> None:
        workers = fake_workers(EchoModel())
        calls: list[int] = []
        run = workers.run
        workers.run = lambda worker, sent: (calls.append(len(sent)), run(worker, sent))[1]
        pool = one_model_pool(_fixed(), workers)
        future = pool.submit("echo", _x(1))
        assert calls == []
        await asyncio.sleep(0)  # one turn
        assert calls == [1]
        assert (await future)["sum"] == 4.0
        lags = (await pool.describe())["step_lag_ms"]
        assert 0.0 <= lags["p50"] <= lags["p99"]
        await pool.close()

    asyncio.run(scenario())


def test_a_scheduler_fault_fails_the_queries_queued_and_the_pool_steps_on() -> None:
    async def scenario() -> None:
        pool = _echo_pool([])
        step, calls = pool.scheduler.step, []

        def faulty(now: float, busy: bool = False) -> Any:
            calls.append(now)
            if len(calls) == 1:
                raise RuntimeError("boom")
            return step(now, busy)

        pool.scheduler.step = faulty  # type: ignore[method-assign]
        with pytest.raises(ModelFailed, match="scheduling failed: boom"):
            await pool.submit("echo", _x(1))
        assert (await pool.submit("echo", _x(2)))["sum"] == 8.0
        await pool.close()

    asyncio.run(scenario())


def test_closing_stops_a_pool_whose_step_is_due() -> None:
    """A query arriving while the pool waits towards a time asks for a step at the loop's next
    turn; a close before that turn must still stop it: nothing steps after it, and every
    query queued is answered."""

    class WaitLong(batching.FixedPolicy):
        def decide(self, view: batching.BatcherView) -> batching.Decision:
            return batching.Wait(view.now + 60.0)

    async def scenario() -> None:
        policy = WaitLong(batching.FixedParams(max_batch_size=2), 1.0)
        pool = one_model_pool(policy, fake_workers(EchoModel()))
        step, steps = pool.scheduler.step, []

        def counted(now: float, busy: bool = False) -> Any:
            steps.append(now)
            return step(now, busy)

        pool.scheduler.step = counted  # type: ignore[method-assign]
        first = pool.submit("echo", _x(1))
        await asyncio.sleep(0.01)  # the pool waits towards now + 60 s
        second = pool.submit("echo", _x(1))  # a step is due at the next turn
        before = len(steps)
        await pool.close()  # before that turn
        await asyncio.sleep(0.01)
        assert len(steps) == before
        for future in (first, second):
            with pytest.raises(Overloaded, match="shutting down"):
                future.result()

    asyncio.run(scenario())


# -- a shared pool: LOAD, UNLOAD, capacity --------------------------------------------------


def _shared(
    names: list[str], workers: LocalWorkers, capacity_mb: float, slo_ms: float = 10_000
) -> Pool:
    pool_spec = PoolSpec(name="shared", workers=len(workers), memory_mb=capacity_mb)
    models = [
        ModelSpec.model_validate(model_spec(n, pool="shared", slo_ms=slo_ms, weights_mb=1))
        for n in names
    ]
    pool = Pool(resolve_pools([pool_spec], models)[0], workers)
    for m in models:
        pool.add_model(m, batching.make_policy("deadline", {"max_batch_size": 4}, slo_ms / 1e3))
    return pool


def test_a_shared_pool_loads_on_demand_and_evicts_the_least_recently_used() -> None:
    async def scenario() -> None:
        names = ["a", "b", "c"]
        workers = LocalWorkers(
            1, {n: EchoModel() for n in names}, capacity_bytes=2 << 20, weight_bytes=1 << 20
        )
        pool = _shared(names, workers, capacity_mb=2)
        for name in ["a", "b", "a", "c", "a", "b"]:
            assert (await pool.submit(name, _x(1)))["sum"] == 4.0
        loads = [m for _, kind, m in workers.actions if kind == "load"]
        evicted = [m for _, kind, m in workers.actions if kind == "unload"]
        assert loads == ["a", "b", "c", "b"]
        assert evicted == ["b", "c"]  # b was used before a, when c came; then c, for b
        assert workers.peak_bytes == [2 << 20]
        described = pool.describe_model("a")
        assert described["loaded_on"] == [0]
        assert not described["cold"]
        assert set(described["load_ms"]) == {"p10", "p50", "p90", "p99"}
        assert described["load_ms"]["p10"] <= described["load_ms"]["p99"]
        assert pool.describe_model("c")["cold"]
        assert pool.describe_model("c")["evictions"] == 1
        await pool.close()

    asyncio.run(scenario())


def test_a_cold_query_that_the_load_would_make_late_is_refused_before_any_work() -> None:
    async def scenario() -> None:
        workers = LocalWorkers(1, {"a": EchoModel()}, weight_bytes=1, load_s=0.05)
        pool = _shared(["a"], workers, capacity_mb=1)
        await pool.profile()  # the deadline policy asks: a LOAD measured at about 50 ms
        loop = asyncio.get_running_loop()
        with pytest.raises(Rejected, match="cold start"):
            await pool.submit("a", _x(), deadline=loop.time() + 0.01)
        assert (await pool.submit("a", _x(1), deadline=loop.time() + 5.0))["sum"] == 4.0
        kinds = [kind for _, kind, _ in workers.actions]
        # 1 + PROFILE_RUNS while profiled, and one on the idle worker after the refusal
        assert kinds.count("load") == 1 + PROFILE_RUNS + 1
        await pool.close()

    asyncio.run(scenario())


def test_a_batch_sent_beside_a_load_of_another_model_is_answered_before_that_load_ends() -> None:
    """One step gives the worker a LOAD of ``b`` (300 ms) and a batch of ``a``, held: the
    batch's answer comes back as the batch ends, not with the LOAD's report."""

    async def scenario() -> tuple[bool, list[str]]:
        workers = LocalWorkers(1, {"a": EchoModel(), "b": EchoModel()}, weight_bytes=1, load_s=0.3)
        pool = _shared(["a", "b"], workers, capacity_mb=2)
        await pool.submit("a", _x(1))  # a is held from now on
        cold = pool.submit("b", _x(1))
        await pool.submit("a", _x(1))
        b_held_when_a_answered = "b" in workers.held[0]
        await cold
        await pool.close()
        return b_held_when_a_answered, [kind for _, kind, _ in workers.actions]

    b_held, kinds = asyncio.run(scenario())
    assert sorted(kinds) == ["infer", "infer", "infer", "load", "load"]
    assert not b_held


def test_a_model_that_cannot_load_fails_its_queries_with_the_reason() -> None:
    async def scenario() -> None:
        workers = LocalWorkers(1, {}, weight_bytes=1)  # knows no model: every LOAD fails
        pool = _shared(["a"], workers, capacity_mb=1)
        with pytest.raises(ModelFailed, match="could not be loaded: no model 'a'"):
            await pool.submit("a", _x())
        await pool.close()

    asyncio.run(scenario())


def test_a_removed_model_answers_its_queued_queries_and_leaves_its_workers() -> None:
    async def scenario() -> None:
        workers = LocalWorkers(1, {"a": EchoModel()}, weight_bytes=1, delay_s=0.05)
        pool = _shared(["a"], workers, capacity_mb=1)
        running = pool.submit("a", _x(1))
        await asyncio.sleep(0.02)  # loaded, first batch running
        queued = pool.submit("a", _x(2))
        pool.remove_model("a")
        assert (await running)["sum"] == 4.0  # already in a batch: answered
        with pytest.raises(NotFound, match="removed"):
            await queued
        for _ in range(50):
            if not workers.held[0]:
                break
            await asyncio.sleep(0.01)
        assert workers.held == [{}]
        await pool.close()

    asyncio.run(scenario())


def test_a_worker_that_lost_its_models_is_loaded_again() -> None:
    """A worker restarted by Ray holds nothing: its INFER answers ``not_loaded``; the batch
    is refused (429: no work was done for it) and the scheduler forgets the model there, so
    the next query loads it again."""

    async def scenario() -> None:
        workers = LocalWorkers(1, {"a": EchoModel()}, weight_bytes=1)
        pool = _shared(["a"], workers, capacity_mb=1)
        assert (await pool.submit("a", _x(1)))["sum"] == 4.0
        workers.held[0].clear()  # the restart
        with pytest.raises(Rejected, match="not loaded on its worker"):
            await pool.submit("a", _x(1))
        assert (await pool.submit("a", _x(1)))["sum"] == 4.0
        assert [kind for _, kind, _ in workers.actions].count("load") == 2
        await pool.close()

    asyncio.run(scenario())


def test_a_load_the_worker_finds_no_room_for_is_tried_again_later_not_failed() -> None:
    """The worker's own account of its memory has the last word: a LOAD it refuses for want
    of room (here another model the scheduler does not know of fills it) did not run. The
    model is not marked failed, and the worker takes no LOAD for ``load_backoff_s`` (no storm
    of LOADs), after which the waiting query is served."""

    async def scenario() -> None:
        mb = 1 << 20
        workers = LocalWorkers(1, {"a": EchoModel()}, capacity_bytes=mb, weight_bytes=mb)
        pool = _shared(["a"], workers, capacity_mb=1)
        workers.held[0]["stranger"] = mb
        answer = pool.submit("a", _x(1))
        while not workers.actions:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.1)
        assert [kind for _, kind, _ in workers.actions] == ["load"]  # and no other since
        assert pool.scheduler.load_error("a") == ""
        assert not answer.done()
        del workers.held[0]["stranger"]
        assert (await answer)["sum"] == 4.0
        assert [kind for _, kind, _ in workers.actions] == ["load", "load", "infer"]
        await pool.close()

    asyncio.run(scenario())


def test_deadlines_travel_to_the_worker_as_wall_clock_times() -> None:
    seen: list[float] = []

    class Spy(LocalWorkers):
        def run(self, worker: int, calls: list[Call]) -> Awaitable[list[Report]]:
            seen.extend(c.latest - time.time() for c in calls)
            return super().run(worker, calls)

    async def scenario() -> None:
        pool = one_model_pool(_fixed(), Spy(1, dedicated=EchoModel()))
        loop = asyncio.get_running_loop()
        await pool.submit("echo", _x(), deadline=loop.time() + 0.5)
        await pool.submit("echo", _x())
        await pool.close()

    asyncio.run(scenario())
    assert seen[0] == pytest.approx(0.5, abs=0.05)
    assert seen[1] == math.inf


def test_an_infer_behind_a_load_that_came_too_late_is_refused_not_failed() -> None:
    """A worker whose LOAD executor reaches a LOAD after its window refuses it; the batch sent
    behind it, waiting for it, is refused with it. Its query, planned again, has no time left
    for another LOAD: 429, not a model failure."""

    class HeldUp(LocalWorkers):
        async def _load(self, worker: int, call: Call) -> Report:
            await asyncio.sleep(0.4)  # the executor reaches it after its window
            return await super()._load(worker, call)

    async def scenario() -> None:
        workers = HeldUp(1, {"a": EchoModel()}, weight_bytes=1)
        pool = _shared(["a"], workers, capacity_mb=1)
        pool.scheduler.runs("a").observe_load(0.05)
        pool.scheduler.runs("a").observe(1, 0.001)
        loop = asyncio.get_running_loop()
        with pytest.raises(Rejected, match=re.escape(COLD_DOOMED)):
            await pool.submit("a", _x(), deadline=loop.time() + 0.3)
        assert [kind for _, kind, _ in workers.actions] == ["load"]  # the INFER never ran
        await pool.close()

    asyncio.run(scenario())


# -- a worker's two executors ----------------------------------------------------------------

_GATE = threading.Event()


class _Gated:
    """A model whose batches of non-zero inputs wait up to 5 s for the gate to open, and say
    whether it did."""

    def predict_batch(self, inputs: Any) -> list[dict[str, bool]]:
        opened = _GATE.wait(5.0) if np.asarray(inputs).any() else True
        return [{"opened": opened}] * len(inputs)


class _Opener(EchoModel):
    """Opens the gate as it loads."""

    def __init__(self) -> None:
        super().__init__()
        _GATE.set()


def _worker_spec(name: str, source: str) -> dict[str, Any]:
    spec = model_spec(name, pool="shared", source=source, weights_mb=1)
    return ModelSpec.model_validate(spec).model_dump(mode="json")


def test_a_worker_whose_dedicated_model_cannot_load_says_why_when_asked_if_ready() -> None:
    """It stays up rather than fail as it starts, which Ray would answer by starting it again
    and again on the same failure; ``ready`` raises one line naming the model and the cause,
    the line the ingress's failed start then carries (``cause_line``), also from inside the
    error Ray wraps a remote call's in."""
    from raysrv._deployments import cause_line

    good = _worker_spec("good", "raysrv.testing:EchoModel")
    bad = _worker_spec("bad", "raysrv.testing:UnloadableModel")
    with pytest.raises(LoadFailed) as raised:
        PoolWorker(None, [good, bad]).ready()
    said = "model 'bad' cannot be loaded: OSError: weights.bin: truncated\nat byte 512"
    assert str(raised.value) == said
    line = "LoadFailed: model 'bad' cannot be loaded: OSError: weights.bin: truncated at byte 512"
    assert cause_line(raised.value) == line

    class RemoteError(Exception):  # as Ray raises it: a traceback, the error as ``cause``
        cause = raised.value

    assert cause_line(RemoteError("Traceback (most recent call last):\n  ...")) == line
    assert PoolWorker(None, [good]).ready()["models"] == {"good": 1 << 20}


def test_a_worker_loads_one_model_while_it_runs_a_batch_of_another() -> None:
    """clockwork §4.4: a dedicated executor per action type. The batch of ``gated`` waits for a
    gate that only the LOAD of ``opener`` opens: run one after the other, it would wait in
    vain."""
    _GATE.clear()
    worker = PoolWorker(None, [])

    async def scenario() -> None:
        (loaded,) = await worker.run([Call("load", "gated", spec=_worker_spec("gated", GATED))], 1)
        assert loaded.status == "ok"
        batch = asyncio.ensure_future(worker.run([Call("infer", "gated", inputs=_ones(2))], 2))
        opener = _worker_spec("opener", OPENER)
        (load,) = await worker.run([Call("load", "opener", spec=opener)], 3)
        (infer,) = await batch
        assert load.status == infer.status == "ok"
        assert infer.outputs == [{"opened": True}] * 2

    asyncio.run(scenario())


def test_an_infer_waits_for_the_load_sent_before_it_even_if_ray_delivers_it_first() -> None:
    """The ingress numbers its calls to a worker: the INFER numbered after a LOAD of its model
    waits for that LOAD, even when it reaches the worker first; behind a LOAD refused for its
    window, it is refused too (``late``), not failed."""
    worker = PoolWorker(None, [])
    spec = _worker_spec("a", "raysrv.testing:EchoModel")

    async def scenario() -> None:
        await worker.run([], 1)
        infer = asyncio.ensure_future(worker.run([Call("infer", "a", inputs=_ones(1))], 3))
        await asyncio.sleep(0.01)  # the INFER is in first
        (load,) = await worker.run([Call("load", "a", spec=spec)], 2)
        (answer,) = await infer
        assert (load.status, answer.status, answer.outputs[0]["sum"]) == ("ok", "ok", 4.0)
        late = Call("load", "b", latest=time.time() - 1.0, spec={**spec, "name": "b"})
        reports = await worker.run([late, Call("infer", "b", inputs=_ones(1))], 4)
        assert [r.status for r in reports] == ["late", "late"]

    asyncio.run(scenario())


def _niceness() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


class _Niceness:
    """Answers the niceness of the thread that loaded it and of the one running its batch."""

    def __init__(self) -> None:
        self.loaded_at = _niceness()

    def predict_batch(self, inputs: Any) -> list[tuple[int, int]]:
        return [(self.loaded_at, _niceness())] * len(inputs)


@pytest.mark.skipif(sys.platform != "linux", reason="a thread's own niceness is Linux's")
def test_a_worker_runs_loads_and_batches_at_the_niceness_its_resources_give() -> None:
    """``resources.niceness`` and ``load_niceness``: a worker's INFERs and LOADs run that many
    steps below the thread that receives its calls, which stays as it was."""
    here = _niceness()
    spec = _worker_spec("nice", f"{__name__}:_Niceness")

    async def scenario(worker: PoolWorker) -> tuple[int, int, int]:
        (load,) = await worker.run([Call("load", "nice", spec=spec)])
        assert load.status == "ok"
        (infer,) = await worker.run([Call("infer", "nice", inputs=_ones(1))])
        loaded_at, run_at = infer.outputs[0]
        return loaded_at, run_at, _niceness()

    lowered = asyncio.run(scenario(PoolWorker(None, [], niceness=(3, 5))))
    assert lowered == (min(19, here + 5), min(19, here + 3), here)
    assert asyncio.run(scenario(PoolWorker(None, []))) == (here, here, here)


class _Unrunnable:
    """A model that loads but cannot run."""

    def predict_batch(self, inputs: Any) -> list[Any]:
        raise RuntimeError("this model cannot run")


def test_a_load_runs_its_model_once_unless_warm_up_is_off() -> None:
    """With ``warm_up`` (the default) a LOAD ends with a run of one, so a model that cannot run
    fails its LOAD; without it the LOAD only brings the model in, and its first batch fails."""
    source = f"{__name__}:_Unrunnable"

    async def scenario(warm_up: bool) -> Report:
        spec = ModelSpec.model_validate({**_worker_spec("broken", source), "warm_up": warm_up})
        worker = PoolWorker(None, [])
        (load,) = await worker.run([Call("load", "broken", spec=spec.model_dump(mode="json"))])
        if load.status == "ok":
            with pytest.raises(RuntimeError, match="this model cannot run"):
                await worker.run([Call("infer", "broken", inputs=_ones(1))])
        return load

    warmed = asyncio.run(scenario(True))
    assert warmed.status == "failed"
    assert "this model cannot run" in warmed.error
    assert asyncio.run(scenario(False)).status == "ok"


def _ones(n: int) -> np.ndarray:
    return np.ones((n, 4), dtype=np.float32)


class _Device:
    """A stand-in for ``torch.cuda``'s allocator (no GPU runs here): ``allocated`` bytes."""

    allocated = 0

    @staticmethod
    def is_initialized() -> bool:
        return True

    @classmethod
    def memory_allocated(cls) -> int:
        return cls.allocated


class _OnDevice(EchoModel):
    """Puts 3 MiB on the stand-in device as it loads and takes them back when dropped."""

    def __init__(self) -> None:
        super().__init__()
        _Device.allocated += 3 << 20

    def __del__(self) -> None:
        _Device.allocated -= 3 << 20


def test_a_gpu_worker_reports_what_the_device_grew_by_as_each_model_loaded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a GPU worker the weights live in device memory, which the process's resident memory
    does not show: a LOAD reports what torch's allocator came to hold on the device (a
    stand-in allocator here), ``GET /v1/models/{model}`` shows it, and an UNLOAD gives it
    back. A CPU worker, where torch never started CUDA, reports none."""
    cpu = asyncio.run(PoolWorker(None, []).run([Call("load", "a", spec=_worker_spec("a", ECHO))]))
    assert cpu[0].device_growth is None
    assert raysrv._pool._memory_shown(cpu[0]).keys() == {"weights_bytes", "rss_growth_bytes"}

    monkeypatch.setitem(sys.modules, "torch", type("torch", (), {"cuda": _Device}))
    _Device.allocated = 1 << 20  # what another model left there
    worker = PoolWorker(None, [])
    source = f"{__name__}:_OnDevice"

    async def scenario() -> list[Report]:
        loads = [Call("load", n, spec=_worker_spec(n, source)) for n in ("a", "b")]
        return [*await worker.run(loads), *await worker.run([Call("unload", "a")])]

    first, second, _ = asyncio.run(scenario())
    assert first.device_growth == second.device_growth == 3 << 20
    assert worker.ready()["device_growth"] == {"b": 3 << 20}
    assert worker.ready()["device_bytes"] == 4 << 20  # the other model's and b's
    assert raysrv._pool._memory_shown(second)["device_growth_bytes"] == 3 << 20


GATED, OPENER = f"{__name__}:_Gated", f"{__name__}:_Opener"
ECHO = "raysrv.testing:EchoModel"


def test_the_timeline_shows_each_action_as_it_ran_on_the_wall_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A LOAD and the batches behind it, each sent before it started, ended and came back; a
    call of batches says its round trip beyond the runs; ``since`` keeps the later ones,
    ``after`` those numbered past it, and only the last ``TIMELINE_ACTIONS`` are kept."""
    monkeypatch.setattr(raysrv._pool, "TIMELINE_ACTIONS", 3)

    async def scenario() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], float]:
        workers = LocalWorkers(
            1, {"a": EchoModel()}, weight_bytes=1, load_s=0.02, delay_s=0.005, reply_s=0.0
        )
        pool = _shared(["a"], workers, capacity_mb=1)
        before = time.time()
        for _ in range(3):
            await pool.submit("a", _x(1))
        middle = time.time()
        await pool.submit("a", _x(1))
        timeline, later = pool.timeline(), pool.timeline(since=middle)
        past = pool.timeline(after=3)
        await pool.close()
        return timeline, later, past, before

    timeline, later, past, before = asyncio.run(scenario())
    assert timeline["kind"] == ["infer", "infer", "infer"]  # the LOAD and first batch dropped
    assert timeline["seq"] == [2, 3, 4]  # numbered as kept: the LOAD was 0
    assert later["kind"] == ["infer"]
    assert later["sent"] == timeline["sent"][-1:]
    assert past["seq"] == [4]
    assert set(timeline["model"]) == {"a"}
    assert timeline["size"] == [1, 1, 1]
    for sent, started, ended, back in zip(
        timeline["sent"], timeline["started"], timeline["ended"], timeline["back"], strict=True
    ):
        # the fake worker reports its start as its end less the run time: within a clock tick
        assert before <= sent <= started + 1e-3
        assert started < ended <= back <= time.time()
    assert all(0.0 <= o < 1.0 for o in timeline["overhead"])


def test_the_timeline_says_which_step_made_each_action_and_which_took_its_report_up() -> None:
    """A worker's second batch waits for its first's report: the step that takes that report
    up, kept as the first's ``acted``, makes the second (its ``decided``), after the report was
    back; each call leaves after its step began; the step that keeps a report runs before the
    batch's callers resume, so a caller that asks for the timeline finds its own batch."""

    async def scenario() -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        pool = one_model_pool(_fixed(max_batch_size=1), fake_workers(EchoModel(), delay_s=0.005))
        first, second = pool.submit("echo", _x(1)), pool.submit("echo", _x(2))
        await first
        after_first = pool.timeline()
        await second
        timeline = pool.timeline()
        await pool.close()
        return after_first, timeline

    after_first, timeline = asyncio.run(scenario())
    assert after_first["seq"] == [0]
    assert timeline["seq"] == [0, 1]
    assert timeline["acted"][0] == timeline["decided"][1]
    for i in (0, 1):
        assert timeline["back"][i] <= timeline["acted"][i]
        assert timeline["decided"][i] <= timeline["sent"][i]


def test_a_load_in_the_timeline_has_no_call_overhead() -> None:
    async def scenario() -> dict[str, list[Any]]:
        workers = LocalWorkers(1, {"a": EchoModel()}, weight_bytes=1, load_s=0.02, reply_s=0.0)
        pool = _shared(["a"], workers, capacity_mb=1)
        await pool.submit("a", _x(1))
        timeline = pool.timeline()
        await pool.close()
        return timeline

    timeline = asyncio.run(scenario())
    assert timeline["kind"] == ["load", "infer"]
    (load,) = [i for i, kind in enumerate(timeline["kind"]) if kind == "load"]
    assert timeline["ended"][load] - timeline["started"][load] >= 0.02
    assert math.isnan(timeline["overhead"][load])
    assert timeline["size"][load] == 0


# -- a colocated pool: the workers are threads of the ingress's process ---------------------


class _ThreadName:
    """Answers the name of the thread that runs its batch."""

    def predict_batch(self, inputs: Any) -> list[str]:
        return [threading.current_thread().name] * len(inputs)


def test_a_colocated_pool_runs_real_models_off_the_loop_within_its_capacity(
    tmp_path: Path,
) -> None:
    """``placement: colocated``: ONNX models load, answer exactly as offline and are evicted
    within each worker's capacity, in this process, and every batch runs on a worker's INFER
    thread, not on the event loop's."""
    paths = build_zoo(tmp_path, 4, width=64, narrow=32)
    size = model_size(64, 32)
    pool_spec = PoolSpec(
        name="shared", workers=2, memory_mb=size / (1 << 20) + 0.001, placement="colocated"
    )
    onnx = {"runtime": "onnx", "pool": "shared", "input": {"shape": [64]}, "slo_ms": 10_000}
    models = [ModelSpec.model_validate({**onnx, "name": p.stem, "source": str(p)}) for p in paths]
    threads = ModelSpec.model_validate(
        model_spec("threads", pool="shared", source=f"{__name__}:_ThreadName", weights_mb=1e-4)
    )
    resolved = resolve_pools([pool_spec], [*models, threads])[0]
    x = np.random.default_rng(1).random(64).astype(np.float32)

    async def scenario() -> tuple[list[list[float]], list[str], dict[str, Any]]:
        workers = ColocatedWorkers(resolved, metrics=False)
        pool = Pool(resolved, workers)
        for model in [*models, threads]:
            pool.add_model(model, batching.make_policy("deadline", {"max_batch_size": 4}, 10.0))
        order = [0, 1, 2, 0, 3, 1, 0]
        outputs = [await pool.submit(paths[i].stem, x) for i in order]
        ran_on = [await pool.submit("threads", _x()) for _ in range(3)]
        described = await pool.describe()
        await pool.close()
        return outputs, [*ran_on, threading.current_thread().name], described

    outputs, ran_on, described = asyncio.run(scenario())
    for i, output in zip([0, 1, 2, 0, 3, 1, 0], outputs, strict=True):
        session = ort.InferenceSession(str(paths[i]), providers=["CPUExecutionProvider"])
        offline = session.run(None, {session.get_inputs()[0].name: x[None]})[0][0]
        np.testing.assert_allclose(output, offline, rtol=1e-5)
    *batches, loop_thread = ran_on
    assert all(name.startswith("infer") for name in batches)
    assert loop_thread not in batches
    assert described["placement"] == "colocated"
    assert described["evictions"] >= 1  # 5 models on 2 workers that hold one ONNX model each
    for worker in described["workers"]:
        assert worker["process"]["pid"] == os.getpid()
        assert 0 < worker["process"]["peak_bytes"] <= resolved.capacity_bytes
