"""A pool's autoscaler live, on in-process workers whose batches are asyncio sleeps of a GPU-like
curve (an emulated accelerator, so that many workers fit on two cores): a burst adds workers, a
lull drains them, and every query gets exactly one answer, none sent to a worker once it is
draining; the same for a shared pool, whose new workers load its models on demand; and a pool
scaled to zero starts a worker for the next query."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import numpy as np
import pytest

from raysrv import batching
from raysrv._pool import Pool
from raysrv.config import ModelSpec, PoolSpec, resolve_pools
from raysrv.testing import EchoModel, LocalWorkers, model_spec

RUN_S = {"base": 0.010, "per_query": 0.005}  # a batch of k: 10 ms + 5 ms per query


def _pool(policy: str, workers: LocalWorkers, **autoscaling: Any) -> Pool:
    scaling = {"policy": policy, "min": 1, "max": 6, "every_s": 0.2, "window_s": 2.0,
               "down_after_s": 0.6, "slo_ms": 100, **autoscaling}  # fmt: skip
    raw = model_spec("m", replicas=1, autoscaling=scaling, slo_ms=1_000, pipeline_depth=2)
    model = ModelSpec.model_validate(raw)
    pool = Pool(resolve_pools([], [model])[0], workers)
    policy_ = batching.make_policy("fixed", {"max_batch_size": 4}, 1.0)
    pool.add_model(model, policy_)
    return pool


def _sent_to_draining(pool: Pool, workers: LocalWorkers) -> list[int]:
    """The workers of the calls sent while the worker was draining, filled as they are sent."""
    sent: list[int] = []
    original = workers.run

    def run(worker: int, calls: list[Any]) -> Any:
        if worker in pool.describe_scaling()["draining"]:
            sent.append(worker)
        return original(worker, calls)

    workers.run = run  # type: ignore[method-assign]
    return sent


def _shared_pool(workers: LocalWorkers, policy: str) -> Pool:
    """Models ``a`` and ``b`` on a shared pool of one worker to start with, both fitting it."""
    scaling = {"policy": policy, "min": 1, "max": 6, "every_s": 0.2, "window_s": 2.0,
               "down_after_s": 0.6, "slo_ms": 100, "target_ongoing": 2.0}  # fmt: skip
    spec = PoolSpec(name="shared", workers=1, memory_mb=2, autoscaling=scaling)
    models = [
        ModelSpec.model_validate(model_spec(n, pool="shared", slo_ms=1_000, weights_mb=1))
        for n in ("a", "b")
    ]
    pool = Pool(resolve_pools([spec], models)[0], workers)
    for model in models:
        pool.add_model(model, batching.make_policy("fixed", {"max_batch_size": 4}, 1.0))
    return pool


async def _offer(
    pool: Pool,
    rate: float,
    seconds: float,
    rng: np.random.Generator,
    models: tuple[str, ...] = ("m",),
) -> list[Any]:
    """Poisson arrivals at ``rate`` for ``seconds``, each of one of ``models`` at random."""
    futures = []
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while loop.time() < end:
        model = models[rng.integers(len(models))]
        futures.append(pool.submit(model, np.zeros(4, dtype=np.float32), deadline=math.inf))
        await asyncio.sleep(rng.exponential(1.0 / rate))
    return futures


async def _burst_then_lull(
    pool: Pool, models: tuple[str, ...] = ("m",)
) -> tuple[list[Any], list[int]]:
    """Scaling on: 1 s within one worker's reach, a 2.5 s burst beyond it (4 in 30 ms), a 3 s
    lull, then idle until the pool is back at one worker (10 s at most). The queries, and the
    workers in service every 50 ms."""
    counts: list[int] = []

    async def watch() -> None:
        while True:
            await asyncio.sleep(0.05)
            counts.append(len(pool.scheduler.workers))

    watcher = asyncio.create_task(watch())
    pool.start_scaling()
    rng = np.random.default_rng(0)
    futures = await _offer(pool, 20.0, 1.0, rng, models)
    futures += await _offer(pool, 400.0, 2.5, rng, models)
    futures += await _offer(pool, 10.0, 3.0, rng, models)
    await asyncio.gather(*futures, return_exceptions=True)
    for _ in range(100):
        if len(pool.scheduler.workers) == 1 and not pool.describe_scaling()["draining"]:
            break
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.1)  # the watcher's last count after it
    watcher.cancel()
    await pool.close()
    return futures, counts


@pytest.mark.parametrize("policy", ["analytic", "reactive"])
def test_a_burst_adds_workers_a_lull_drains_them_and_every_query_is_answered_once(
    policy: str,
) -> None:
    workers = LocalWorkers(
        1,
        dedicated=EchoModel(),
        delay_s=lambda k: RUN_S["base"] + RUN_S["per_query"] * k,
    )
    workers.start_s = 0.05  # a worker's start
    pool = _pool(policy, workers, target_ongoing=2.0)
    to_draining = _sent_to_draining(pool, workers)

    futures, counts = asyncio.run(_burst_then_lull(pool))
    assert to_draining == []
    assert all(f.done() for f in futures)
    errors = [f.exception() for f in futures if f.exception() is not None]
    assert errors == []  # each answered, none refused or failed
    assert all(len(f.result()) for f in futures)
    assert max(counts) >= 3  # the burst brought workers in
    assert counts[-1] == 1  # and the lull took them out again
    assert workers.removed  # ended once drained
    assert pool.describe_scaling()["draining"] == []
    assert pool.decision is not None
    assert pool.describe_scaling()["in_service"] == counts[-1]


@pytest.mark.parametrize("policy", ["analytic", "reactive"])
def test_a_shared_pool_adds_workers_that_load_its_models_on_demand_and_drains_them_after(
    policy: str,
) -> None:
    workers = LocalWorkers(
        1,
        {n: EchoModel() for n in ("a", "b")},
        capacity_bytes=2 << 20,
        weight_bytes=1 << 20,
        delay_s=lambda k: RUN_S["base"] + RUN_S["per_query"] * k,
        load_s=0.02,
    )
    workers.start_s = 0.05
    pool = _shared_pool(workers, policy)
    to_draining = _sent_to_draining(pool, workers)

    futures, counts = asyncio.run(_burst_then_lull(pool, ("a", "b")))
    assert to_draining == []
    errors = [f.exception() for f in futures if f.exception() is not None]
    assert errors == []  # each answered, none refused or failed
    assert max(counts) >= 3  # the burst brought workers in
    assert counts[-1] == 1  # and the lull took them out again
    loaded_on = {worker for worker, kind, _ in workers.actions if kind == "load"}
    assert len(loaded_on) >= 3  # each new worker loaded what it served
    assert workers.removed


def test_a_pool_scaled_to_zero_starts_a_worker_for_the_next_query_which_waits_for_it() -> None:
    """``min: 0``: once idle the pool ends its last worker. A query that comes then starts one
    at once, with no decision due (the scaling loop is stopped here), and is answered by it
    within its deadline rather than refused for want of a worker."""
    workers = LocalWorkers(1, dedicated=EchoModel(), delay_s=0.01)
    workers.start_s = 0.1
    pool = _pool("analytic", workers, min=0, idle_s=0.3, down_after_s=0.0, every_s=0.1)

    async def scenario() -> tuple[int, Any, int]:
        pool.start_scaling()
        await pool.submit("m", np.zeros(4, dtype=np.float32), deadline=pool._clock() + 1.0)
        for _ in range(100):  # idle: down to none within 10 s
            if not pool.scheduler.workers and not pool.describe_scaling()["draining"]:
                break
            await asyncio.sleep(0.1)
        stopped = len(pool.scheduler.workers)
        assert pool._scaling is not None
        pool._scaling.cancel()
        answer = await pool.submit("m", np.ones(4, np.float32), deadline=pool._clock() + 1.0)
        serving = len(pool.scheduler.workers)
        await pool.close()
        return stopped, answer, serving

    stopped, answer, serving = asyncio.run(scenario())
    assert stopped == 0
    assert answer["sum"] == 4.0
    assert serving == 1
    assert 0 in workers.removed  # the first worker was ended, another started


def test_until_it_has_started_a_worker_a_pool_plans_on_the_time_its_first_workers_took() -> None:
    """A pool at zero workers that has never started one plans the cold start its first workers
    took: a query whose deadline comes sooner is refused at the step after it arrives, not held
    for a worker that cannot come in time; one with room waits for the worker."""
    from raysrv.errors import Rejected

    workers = LocalWorkers(1, dedicated=EchoModel(), delay_s=0.01)
    workers.start_s = 0.5
    pool = _pool("analytic", workers, min=0)
    assert pool.describe_scaling()["cold_start_s"] == 0.5

    async def scenario() -> tuple[Any, Any]:
        pool._shrink(1)  # idle: the pool at zero
        assert not pool.scheduler.workers
        hurried = pool.submit("m", np.zeros(4, np.float32), deadline=pool._clock() + 0.2)
        patient = pool.submit("m", np.ones(4, np.float32), deadline=pool._clock() + 5.0)
        await asyncio.sleep(0)  # the step after they arrived
        refused_at_once = hurried.done()
        answer = await patient
        await pool.close()
        return refused_at_once, hurried.exception() if hurried.done() else None, answer

    refused_at_once, error, answer = asyncio.run(scenario())
    assert refused_at_once
    assert isinstance(error, Rejected)
    assert "cannot meet deadline (cold start)" in str(error)
    assert answer["sum"] == 4.0


def test_the_queries_in_flight_count_queued_and_running_alike() -> None:
    """What the reactive rule reads: a batch sent to a worker still counts until it answers."""
    workers = LocalWorkers(1, dedicated=EchoModel(), delay_s=0.2)
    pool = _pool("reactive", workers)

    async def scenario() -> list[float]:
        futures = [pool.submit("m", np.zeros(4, dtype=np.float32)) for _ in range(6)]
        await asyncio.sleep(0.05)  # a batch of 4 running, 2 queued behind it
        during = pool._load(pool._clock()).ongoing
        await asyncio.gather(*futures)
        after = pool._load(pool._clock()).ongoing
        await pool.close()
        return [during, after]

    assert asyncio.run(scenario()) == [6, 0]


def test_a_pool_never_drains_below_its_workers_starting_and_none_goes_to_zero() -> None:
    """A decision to shrink while a worker is still starting waits for it: draining the
    worker in service then would leave none to serve until the new one is ready."""
    from raysrv.batching.autoscale import ScaleDecision

    workers = LocalWorkers(1, dedicated=EchoModel())
    workers.start_s = 0.3
    pool = _pool("reactive", workers)
    asked = iter([2, 1, 1])
    pool._scaler.decide = lambda load: ScaleDecision(next(asked), 0, "told")  # type: ignore[union-attr]

    async def scenario() -> list[tuple[int, int]]:
        seen = []
        await pool.scale()  # one more asked for: starting
        await pool.scale()  # back to one while it starts: nothing drained
        seen.append((len(pool.scheduler.workers), len(pool.describe_scaling()["starting"])))
        await asyncio.sleep(0.5)  # it is in service
        seen.append((len(pool.scheduler.workers), 0))
        await pool.scale()  # now one goes
        seen.append((len(pool.scheduler.workers), len(pool.describe_scaling()["draining"])))
        await pool.close()
        return seen

    assert asyncio.run(scenario()) == [(1, 1), (2, 0), (1, 0)]


def test_a_switch_brings_workers_of_new_threads_and_lanes_in_before_it_drains_the_old() -> None:
    """SERF's reconfiguration as a rolling replacement: under steady load, two one-thread
    workers become one of two threads, then two one-thread lanes of a process; every query is
    answered once and in time, no call reaches a worker once it drains, and the old workers
    serve until the new are in."""
    from raysrv.batching.autoscale import ScaleDecision

    workers = LocalWorkers(2, dedicated=EchoModel(), delay_s=0.01)
    workers.start_s = 0.2
    pool = _pool("serf", workers, max=2)
    asked = iter([(1, 2, 1), (1, 2, 1), (2, 1, 2)])

    def decide(load: Any) -> ScaleDecision:
        count, threads, lanes = next(asked)
        return ScaleDecision(count, count, "told", threads=threads, lanes=lanes)

    pool._scaler.decide = decide  # type: ignore[union-attr,method-assign]
    to_draining = _sent_to_draining(pool, workers)

    async def scenario() -> tuple[list[Any], list[tuple[int, int, int]], list[int]]:
        seen: list[tuple[int, int, int]] = []
        serving: list[int] = []
        loop = asyncio.get_running_loop()

        async def offer(seconds: float) -> list[Any]:
            futures = []
            end = loop.time() + seconds
            while loop.time() < end:
                deadline = pool._clock() + 0.5
                futures.append(pool.submit("m", np.zeros(4, np.float32), deadline=deadline))
                serving.append(len(pool.scheduler.workers))
                await asyncio.sleep(0.01)
            return futures

        futures = []
        for _ in range(3):
            await pool.scale()
            futures += await offer(0.5)  # the new workers start within it and take over
            in_service = sorted(w.index for w in pool.scheduler.workers)
            shown = pool.describe_scaling()
            seen.append((len(in_service), shown["threads"], shown["lanes"]))
        await asyncio.gather(*futures, return_exceptions=True)
        await asyncio.sleep(0.05)
        pool._forget_drained()
        await pool.close()
        return futures, seen, serving

    futures, seen, serving = asyncio.run(scenario())
    assert seen == [(1, 2, 1), (1, 2, 1), (2, 1, 2)]
    errors = [f.exception() for f in futures if f.exception() is not None]
    assert errors == []  # each answered within its deadline
    assert to_draining == []
    assert serving[:10] == [2] * 10  # the first new worker is starting: the old two serve
    assert min(serving) >= 1
    assert workers.removed == {0, 1, 2}  # the two first, then the two-thread one
    assert [workers.threads[i] for i in (2, 3, 4)] == [2, 1, 1]
    assert [workers.lanes_given[i] for i in (2, 3, 4)] == [1, 2, 2]


def test_a_new_worker_runs_a_batch_of_one_before_it_serves() -> None:
    """Its first call is a batch of one of the model's example input, sent while the worker
    is not yet in service; queries reach it only after."""
    from raysrv.batching.autoscale import ScaleDecision

    workers = LocalWorkers(1, dedicated=EchoModel(), delay_s=0.01)
    workers.start_s = 0.05
    pool = _pool("reactive", workers)
    pool._scaler.decide = lambda load: ScaleDecision(2, 2, "told")  # type: ignore[union-attr]
    calls: list[tuple[int, int, bool]] = []  # worker, batch size, in service when sent
    original = workers.run

    def run(worker: int, batch: list[Any]) -> Any:
        in_service = worker in {w.index for w in pool.scheduler.workers}
        calls.extend((worker, len(c.inputs), in_service) for c in batch if c.kind == "infer")
        return original(worker, batch)

    workers.run = run  # type: ignore[method-assign]

    async def scenario() -> None:
        await pool.scale()
        await asyncio.sleep(0.2)  # started, warmed, in service
        futures = [pool.submit("m", np.ones(4, np.float32)) for _ in range(16)]
        await asyncio.gather(*futures)
        await pool.close()

    asyncio.run(scenario())
    new = [(size, in_service) for worker, size, in_service in calls if worker == 1]
    assert new[0] == (1, False)  # the warm-up, before it serves
    assert len(new) > 1  # then queries
    assert all(in_service for _, in_service in new[1:])


def test_a_switch_called_off_ends_the_workers_it_had_started() -> None:
    """A switch to two threads is under way when the load turns back: the worker started for
    it is ended once it is up, never put in service beside the one-thread workers."""
    from raysrv.batching.autoscale import ScaleDecision

    workers = LocalWorkers(2, dedicated=EchoModel(), delay_s=0.01)
    workers.start_s = 0.2
    pool = _pool("serf", workers, max=2)
    asked = iter([(1, 2), (2, 1)])

    def decide(load: Any) -> ScaleDecision:
        count, threads = next(asked)
        return ScaleDecision(count, count, "told", threads=threads)

    pool._scaler.decide = decide  # type: ignore[union-attr,method-assign]

    async def scenario() -> tuple[list[int], int]:
        await pool.scale()  # a two-thread worker starts
        await pool.scale()  # called off while it starts
        await asyncio.sleep(0.4)  # it is up, and unwanted
        in_service = sorted(w.index for w in pool.scheduler.workers)
        threads = pool.describe_scaling()["threads"]
        await pool.close()
        return in_service, threads

    in_service, threads = asyncio.run(scenario())
    assert (in_service, threads) == ([0, 1], 1)
    assert workers.threads == {2: 2}
    assert workers.removed == {2}
