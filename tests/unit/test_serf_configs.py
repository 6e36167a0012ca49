"""SERF's configurations (serf §IV): the profile measures queries running at once, the scaler
looks the measured load up in the table built from it, with hysteresis, and a python model is
given its worker's threads."""

from __future__ import annotations

import numpy as np
import pytest

from raysrv._workers import concurrent_rates
from raysrv.analytics import serf_latency
from raysrv.batching.autoscale import AutoscalingSpec, PoolLoad, SerfScaler
from raysrv.config import ModelSpec, PoolSpec, resolve_pools
from raysrv.runtimes import load_runtime
from raysrv.testing import model_spec

# mu_1 .. mu_n per thread count: two threads make a query 1.6x faster, but two one-thread
# workers serve more between them (2 x 90 = 180 per second against 160)
RATES = {1: (100.0, 90.0), 2: (160.0,)}


def _scaler(**spec: float) -> SerfScaler:
    scaler = SerfScaler(AutoscalingSpec(policy="serf", max=4, headroom=0.0, **spec))
    scaler.set_profile(RATES, cores=2)
    return scaler


def _load(rate: float, now: float, workers: int, threads: int, seconds: float = 10.0) -> PoolLoad:
    arrivals = np.linspace(now - seconds, now, int(rate * seconds), endpoint=False)
    return PoolLoad(now, workers, arrivals, ongoing=1.0, run_times={}, max_batch=1, slo_s=1.0,
                    threads=threads)  # fmt: skip


def test_the_table_holds_the_lowest_predicted_mean_at_each_load_within_the_cores() -> None:
    scaler = _scaler()
    configs = {(1, 1): RATES[1][:1], (2, 1): RATES[1], (1, 2): RATES[2]}  # workers x threads <= 2
    for row in scaler.table:
        by_hand = {k: serf_latency(row.load, mu) for k, mu in configs.items()}
        best = min(by_hand, key=by_hand.__getitem__)
        assert row.best is not None
        assert (row.best.config.service, row.best.config.intra_threads) == best
    picks = {(r.best.config.service, r.best.config.intra_threads) for r in scaler.table if r.best}
    assert picks == {(1, 2), (2, 1)}  # the faster worker at light load, two at heavy load


def test_a_light_load_takes_the_threads_a_heavy_one_the_workers() -> None:
    light = _scaler().decide(_load(50.0, 100.0, workers=1, threads=1))
    heavy = _scaler().decide(_load(170.0, 100.0, workers=1, threads=2))  # past one worker's 160
    assert (light.workers, light.threads) == (1, 2)
    assert light.predicted_s == pytest.approx(serf_latency(_row_load(50.0), RATES[2]))
    assert (heavy.workers, heavy.threads) == (2, 1)


def _row_load(rate: float) -> float:
    return min(row.load for row in _scaler().table if row.load >= rate)


def test_beyond_the_table_the_configuration_that_serves_the_most() -> None:
    decision = _scaler().decide(_load(500.0, 100.0, workers=1, threads=2))
    assert (decision.workers, decision.threads) == (2, 1)
    assert "beyond the table" in decision.reason


def test_a_switch_to_less_capacity_waits_for_the_span_one_to_more_does_not() -> None:
    scaler = _scaler(down_after_s=5.0)
    decisions = [
        scaler.decide(_load(rate, now, workers=2, threads=1)) for now, rate in
        [(100.0, 50.0), (102.0, 50.0), (104.0, 50.0), (105.5, 50.0)]
    ]  # fmt: skip
    assert [(d.workers, d.threads) for d in decisions] == [(2, 1)] * 3 + [(1, 2)]
    assert {d.needed for d in decisions} == {1}
    up = _scaler(up_after_s=0.0).decide(_load(170.0, 100.0, workers=1, threads=2))
    assert (up.workers, up.threads) == (2, 1)


def test_min_raises_the_workers_and_an_unprofiled_scaler_keeps_them() -> None:
    decision = _scaler(min=2).decide(_load(50.0, 100.0, workers=2, threads=1))
    assert (decision.workers, decision.threads) == (2, 1)  # 2 x 2 threads would pass the cores
    fresh = SerfScaler(AutoscalingSpec(policy="serf", max=4))
    kept = fresh.decide(_load(50.0, 100.0, workers=3, threads=1))
    assert (kept.workers, kept.threads, kept.reason) == (3, None, "not profiled yet")


def test_no_configuration_within_the_bounds_is_refused_by_name() -> None:
    scaler = SerfScaler(AutoscalingSpec(policy="serf", min=3, max=4))
    with pytest.raises(ValueError, match="no configuration fits"):
        scaler.set_profile(RATES, cores=2)


def test_the_profile_runs_queries_at_once_and_a_model_gets_its_threads() -> None:
    """A CurveModel batch is stretched by each other batch running with it and sped up by
    threads: the profile sees both (the sleeps are long against the host's timer)."""
    raw = model_spec("c", source="raysrv.testing:CurveModel", init_kwargs={
        "base_s": 0.02, "interference": 1.0, "scaling": 1.0},
        autoscaling={"policy": "serf", "max": 2})  # fmt: skip
    model = ModelSpec.model_validate(raw)
    (pool,) = resolve_pools([], [model])
    one, two = concurrent_rates(pool, model, 1, 2, 5)
    (faster,) = concurrent_rates(pool, model, 2, 1, 5)
    assert two < 0.8 * one  # two at once: each about twice as long
    assert faster > 1.5 * one  # two threads: about twice as fast
    assert load_runtime(model).model.speedup == 1.0  # type: ignore[attr-defined]


def test_the_spec_refuses_thread_counts_out_of_range() -> None:
    with pytest.raises(ValueError, match="threads must each lie in 1..256"):
        AutoscalingSpec(policy="serf", max=2, threads=(1, 0))


def test_serf_on_a_gpu_is_refused_by_name() -> None:
    raw = model_spec("g", device="gpu", resources={"num_gpus": 1.0},
                     autoscaling={"policy": "serf", "max": 2})  # fmt: skip
    with pytest.raises(ValueError, match="autoscaling.policy 'serf' with device 'gpu'"):
        ModelSpec.model_validate(raw)


def test_serf_on_a_shared_pool_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="pool 'shared': autoscaling.policy 'serf'"):
        PoolSpec(name="shared", memory_mb=64, autoscaling={"policy": "serf", "max": 2})
