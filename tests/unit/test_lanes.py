"""Lanes: several of a pool's workers in one process, on one copy of the model, each running
its own batches; and SERF's configurations over them (workers, threads, lanes)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import pytest

import raysrv._workers as workers_module
from raysrv._workers import Call, ColocatedWorkers, Lanes, LoadFailed, PoolWorker, Report
from raysrv.batching.autoscale import AutoscalingSpec, PoolLoad, SerfScaler
from raysrv.config import ModelSpec, resolve_pools
from raysrv.testing import model_spec

SLOW = {"delay_s": 0.2}  # an EchoModel batch: long against the host's timer


def _model(name: str = "m", **overrides: Any) -> ModelSpec:
    return ModelSpec.model_validate(model_spec(name, init_kwargs=SLOW, **overrides))


def _batch() -> list[Call]:
    return [Call("infer", "m", inputs=np.ones((1, 4), np.float32))]


def _span(report: Report) -> tuple[float, float]:
    assert report.started is not None
    assert report.ended is not None
    return report.started, report.ended


def _overlap(a: Report, b: Report) -> bool:
    (a_start, a_end), (b_start, b_end) = _span(a), _span(b)
    return a_start < b_end and b_start < a_end


def test_two_lanes_of_a_worker_run_their_batches_at_once_and_one_lane_in_turn() -> None:
    worker = PoolWorker(None, [_model().model_dump(mode="json")], lanes=2)

    async def scenario() -> tuple[list[Report], list[Report]]:
        apart = await asyncio.gather(worker.run(_batch(), 1, 0), worker.run(_batch(), 1, 1))
        together = await asyncio.gather(worker.run(_batch(), 2, 0), worker.run(_batch(), 3, 0))
        return [r for (r,) in apart], [r for (r,) in together]

    apart, together = asyncio.run(scenario())
    worker.stop()
    assert [r.status for r in apart + together] == ["ok"] * 4
    assert _overlap(*apart)  # two lanes: side by side
    assert not _overlap(*together)  # one lane: one after the other, in order
    assert _span(together[0])[1] <= _span(together[1])[0]


def test_a_lane_runs_its_calls_in_order_passes_on_what_one_raised_and_outlives_a_caller() -> None:
    ran: list[int] = []
    lane = workers_module._Lane("infer-test", lambda: None)

    def step(k: int) -> int:
        time.sleep(0.01)
        ran.append(k)
        if k == 2:
            raise ValueError("batch 2")
        return k * 10

    async def scenario() -> list[Any]:
        futures = [lane.submit(step, k) for k in range(5)]
        futures[3].cancel()  # its caller left: the lane still runs it, and those after it
        return await asyncio.gather(*futures, return_exceptions=True)

    outcomes = asyncio.run(scenario())
    lane.shutdown(wait=True)
    assert ran == [0, 1, 2, 3, 4]
    assert outcomes[:2] == [0, 10]
    assert outcomes[4] == 40
    assert isinstance(outcomes[2], ValueError)
    assert str(outcomes[2]) == "batch 2"
    assert isinstance(outcomes[3], asyncio.CancelledError)


def test_lanes_pack_workers_into_processes_of_their_shape_and_free_a_process_last() -> None:
    lanes = Lanes(3, (1, 2))
    assert lanes.of == {0: (0, 0), 1: (0, 1), 2: (1, 0)}
    assert lanes.processes() == [0, 1]
    assert lanes.place(3, (1, 2)) == (1, 1, False)  # the free lane of process 1
    assert lanes.place(4, (1, 2)) == (4, 0, True)  # both full: a process of its own
    assert lanes.place(5, (2, 2)) == (5, 0, True)  # another shape never shares
    assert lanes.free(3) is None  # worker 2 still runs in process 1
    assert lanes.free(2) == 1
    assert lanes.place(6, (1, 2)) == (4, 1, False)
    assert lanes.processes() == [0, 4, 5]


def test_colocated_workers_in_lanes_share_a_process_that_ends_with_the_last() -> None:
    (pool,) = resolve_pools([], [_model(replicas=3, lanes=2, placement="colocated")])

    async def scenario() -> tuple[Any, ...]:
        workers = ColocatedWorkers(pool, metrics=False)
        processes = dict(workers.processes)
        (a,), (b,) = await asyncio.gather(workers.run(0, _batch()), workers.run(1, _batch()))
        await asyncio.gather(workers.add(3), workers.add(4))  # a free lane, then a new process
        held = await workers.ready()
        workers.remove(0)
        kept = dict(workers.processes)
        workers.remove(1)
        return processes, a, b, held, kept, dict(workers.processes), workers.indices()

    processes, a, b, held, kept, left, indices = asyncio.run(scenario())
    assert sorted(processes) == [0, 1]  # three workers, two to a process
    assert _overlap(a, b)  # workers 0 and 1: two lanes of process 0
    assert len(held) == 5  # one report a worker
    assert sorted(kept) == [0, 1, 4]  # worker 3 took process 1's free lane
    assert sorted(left) == [1, 4]  # process 0 ended with its last worker
    assert indices == [2, 3, 4]


def test_workers_waiting_on_a_process_that_fails_to_start_all_fail() -> None:
    (pool,) = resolve_pools([], [_model(lanes=2, placement="colocated")])
    broken = model_spec("m", source="raysrv.testing:UnloadableModel", lanes=2)
    broken_pool = resolve_pools([], [ModelSpec.model_validate(broken)])[0]

    async def scenario() -> tuple[list[Any], list[int]]:
        workers = ColocatedWorkers(pool, metrics=False)
        workers._pool = broken_pool  # new processes load a model that cannot load
        results = await asyncio.gather(workers.add(1, 2), workers.add(2, 2), return_exceptions=True)
        return list(results), workers.indices()

    results, indices = asyncio.run(scenario())
    assert [type(r) for r in results] == [LoadFailed, LoadFailed]
    assert indices == [0]


# mu_1 .. mu_n per (threads, lanes): two lanes of one process serve more than two processes
RATES = {(1, 1): (100.0, 80.0), (1, 2): (100.0, 95.0), (2, 1): (160.0,)}


def _load(rate: float, now: float = 100.0, seconds: float = 10.0) -> PoolLoad:
    arrivals = np.linspace(now - seconds, now, int(rate * seconds), endpoint=False)
    return PoolLoad(now, 1, arrivals, ongoing=1.0, run_times={}, max_batch=1, slo_s=1.0,
                    threads=1)  # fmt: skip


def test_serf_picks_lanes_where_they_serve_best_and_the_threads_where_those_do() -> None:
    scaler = SerfScaler(AutoscalingSpec(policy="serf", max=2, headroom=0.0, lanes=(1, 2)))
    scaler.set_profile(RATES, cores=2)
    # one worker of a two-lane process runs as a one-lane process does: kept once, at one lane
    assert sorted(scaler.capacity) == [(1, 1, 1), (1, 2, 1), (2, 1, 1), (2, 1, 2)]
    light, heavy = scaler.decide(_load(40.0)), scaler.decide(_load(170.0))
    assert (light.workers, light.threads, light.lanes) == (1, 2, 1)
    assert (heavy.workers, heavy.threads, heavy.lanes) == (2, 1, 2)  # 190/s against 160/s
    shown = scaler.describe()
    assert {(r["threads"], r["lanes"]) for r in shown["rates"]} == set(RATES)
    assert {row["best"]["lanes"] for row in shown["table"]} == {1, 2}


def test_serf_takes_the_fewer_processes_of_two_configurations_predicted_alike() -> None:
    scaler = SerfScaler(AutoscalingSpec(policy="serf", max=2, headroom=0.0, threads=(1,)))
    scaler.set_profile({(1, 1): (100.0, 95.0), (1, 2): (100.0, 95.0)}, cores=2)
    decision = scaler.decide(_load(150.0))
    assert (decision.workers, decision.threads, decision.lanes) == (2, 1, 2)


def test_the_profile_of_lanes_shares_one_runtime_among_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loaded: list[Any] = []
    real = workers_module.load_runtime

    def counting(*args: Any, **kwargs: Any) -> Any:
        loaded.append(real(*args, **kwargs))
        return loaded[-1]

    monkeypatch.setattr(workers_module, "load_runtime", counting)
    model = ModelSpec.model_validate(model_spec("m"))
    (pool,) = resolve_pools([], [model])
    shared = workers_module.concurrent_rates(pool, model, 1, 3, 2, lanes=2)
    assert (len(shared), len(loaded)) == (3, 2)  # three at once: two in one runtime, one apart
    loaded.clear()
    alone = workers_module.concurrent_rates(pool, model, 1, 3, 2)
    assert (len(alone), len(loaded)) == (3, 3)


def test_lanes_are_refused_where_they_cannot_run() -> None:
    partitioned = model_spec("p", runtime="onnx", source="x.onnx", lanes=2,
                             partition={"memory_limit_mb": 8})  # fmt: skip
    with pytest.raises(ValueError, match="lanes 2 of a partitioned model"):
        ModelSpec.model_validate(partitioned)
    with pytest.raises(ValueError, match=r"\['lanes'\] belong to the pool"):
        ModelSpec.model_validate(model_spec("q", pool="shared", lanes=2))
    with pytest.raises(ValueError, match="lanes \\[2\\] with policy 'analytic'"):
        AutoscalingSpec(policy="analytic", max=2, lanes=(2,))
    with pytest.raises(ValueError, match="lanes must each lie in 1..64"):
        AutoscalingSpec(policy="serf", max=2, lanes=(0,))


def test_the_profile_runs_a_short_query_for_the_time_asked_not_only_its_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runs: list[int] = []
    real = workers_module._at_once

    def counting(runtimes: list[Any], batch: Any, queries: int) -> list[float]:
        runs.append(queries)
        return real(runtimes, batch, queries)

    monkeypatch.setattr(workers_module, "_at_once", counting)
    model = ModelSpec.model_validate(model_spec("m", init_kwargs={"delay_s": 0.01}))
    (pool,) = resolve_pools([], [model])
    workers_module.concurrent_rates(pool, model, 1, 2, 2, seconds=0.2)
    pilot, *points = runs
    assert pilot == 3  # three runs alone, timed, size the points
    assert len(points) == 2
    assert all(10 <= n <= 21 for n in points)  # 0.2 s of 10 ms batches (a slow timer: 20 ms), not 2
    runs.clear()
    workers_module.concurrent_rates(pool, model, 1, 2, 2)
    assert runs[1:] == [2, 2]
