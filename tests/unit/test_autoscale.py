"""The scalers' rules (``raysrv.batching.autoscale``): the analytic scaler's count meets the SLO
in the simulator that runs the live scheduler and is the fewest its bound allows; a rising rate
with a cold start asks for more ahead of time; hysteresis; scale to zero; the reactive rule; a
shared pool's run times, its models' weighted by their arrivals."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from raysrv.analytics import simulate
from raysrv.batching import FixedParams, FixedPolicy
from raysrv.batching.autoscale import (
    AutoscalingSpec,
    Hysteresis,
    PoolLoad,
    make_scaler,
    mixed_run_times,
)

RUNS = {k: 0.010 + 0.002 * k for k in (1, 2, 4, 8, 16)}  # a GPU-like curve: 12 ms to 42 ms
SLO_S = 0.05


def _poisson(rate: float, seconds: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.cumsum(rng.exponential(1.0 / rate, int(rate * seconds)))


def _load(arrivals: np.ndarray, workers: int = 1, **kw: float) -> PoolLoad:
    fields = {"ongoing": 0.0, "cold_start_s": 0.0} | kw
    return PoolLoad(float(arrivals[-1]), workers, arrivals, run_times=RUNS, max_batch=16,
                    slo_s=SLO_S, **fields)  # fmt: skip


@pytest.mark.parametrize("rate", [300.0, 1200.0])
def test_the_analytic_count_meets_the_slo_on_the_live_scheduler_and_one_fewer_misses_its_bound(
    rate: float,
) -> None:
    arrivals = _poisson(rate, 10.0)
    spec = AutoscalingSpec(max=32, headroom=0.0)
    decision = make_scaler(spec).decide(_load(arrivals))
    assert decision.predicted_s is not None
    assert decision.predicted_s <= SLO_S
    assert decision.workers == decision.needed > 1

    # the simulator runs the pool's own scheduler with that many workers and the batch the
    # bound was met with: the p99 meets the SLO (the bound is an upper one)
    later = _poisson(rate, 30.0, seed=1)
    service = [RUNS[1] + (RUNS[2] - RUNS[1]) * (k - 1) for k in range(1, 17)]
    params = FixedParams(max_batch_size=decision.max_batch, timeout_ms=0.0)
    run = simulate(
        later, service, FixedPolicy(params, slo_s=1.0), replicas=decision.workers, slo=1.0
    )
    assert np.nanpercentile(run.latencies, 99) <= SLO_S

    # one worker fewer: no buffer searched meets the bound (the count is the fewest)
    from raysrv.analytics import fit_map2
    from raysrv.batching.autoscale import _fewest, _service_times

    measured = fit_map2(np.diff(arrivals)).rate
    assert decision.rate == pytest.approx(measured, rel=0.01)  # steady: planned as measured
    arrival = fit_map2(np.diff(arrivals) * measured / decision.rate)
    assert _fewest(arrival, _service_times(RUNS, 16), SLO_S, 0.99, decision.workers - 1) is None


def test_more_load_needs_more_workers() -> None:
    spec = AutoscalingSpec(max=64, headroom=0.0)
    needs = [make_scaler(spec).decide(_load(_poisson(r, 10.0))).needed for r in (100, 600, 2400)]
    assert needs[0] < needs[1] < needs[2]


def test_a_rising_rate_is_planned_ahead_by_the_cold_start() -> None:
    """A ramp from 200/s to 1,200/s over 10 s: with a 5 s cold start the scaler asks for the
    workers the rate 5 s on will need, more than for the rate of the window."""
    rng = np.random.default_rng(3)
    t, arrivals = 0.0, []
    while t < 10.0:
        t += rng.exponential(1.0 / (200.0 + 100.0 * t))
        arrivals.append(t)
    ramp = np.array(arrivals)
    spec = AutoscalingSpec(max=64, headroom=0.0)
    now = make_scaler(spec).decide(_load(ramp))
    ahead = make_scaler(spec).decide(_load(ramp, cold_start_s=5.0))
    assert ahead.rate > 1.3 * now.rate
    assert ahead.needed > now.needed


def test_a_trickle_is_planned_as_poisson_and_nothing_measured_keeps_the_workers() -> None:
    spec = AutoscalingSpec(max=8, down_after_s=0.0)
    decision = make_scaler(spec).decide(_load(_poisson(10.0, 1.0), workers=3))
    assert decision.workers == 1
    assert decision.reason.endswith("(few arrivals: Poisson)")
    unmeasured = PoolLoad(10.0, 3, _poisson(100.0, 10.0), 0.0, {}, 16, SLO_S)
    kept = make_scaler(spec).decide(unmeasured)
    assert (kept.workers, kept.reason) == (3, "no run times measured yet")


def test_the_slo_out_of_reach_asks_for_the_most() -> None:
    runs = {1: 0.06}  # one query alone takes longer than the SLO
    load = PoolLoad(10.0, 2, _poisson(100.0, 10.0), 0.0, runs, 16, SLO_S)
    decision = make_scaler(AutoscalingSpec(max=5)).decide(load)
    assert (decision.workers, decision.reason) == (5, "the SLO is out of reach: max")


def test_hysteresis_goes_up_at_once_and_down_after_the_span_to_its_largest_need() -> None:
    h = Hysteresis(up_after_s=0.0, down_after_s=10.0)
    assert h.apply(0.0, 2, 5) == 5
    assert h.apply(1.0, 5, 3) == 5  # below for 0 s
    assert h.apply(6.0, 5, 2) == 5
    assert h.apply(10.5, 5, 2) == 5  # the need at 1.0 s and on: not yet 10 s
    assert h.apply(11.5, 5, 2) == 3  # 10 s below: the largest need of the span (3 at 1.0 s)
    assert h.apply(12.0, 3, 4) == 4

    slow = Hysteresis(up_after_s=2.0, down_after_s=10.0)
    assert slow.apply(0.0, 1, 3) == 1
    assert slow.apply(1.0, 1, 4) == 1
    assert slow.apply(2.5, 1, 4) == 3  # above for 2 s: the least need of the span


def test_scale_to_zero_after_the_idle_time_and_never_sooner_than_ten_cold_starts() -> None:
    arrivals = _poisson(50.0, 10.0)
    last = float(arrivals[-1])
    spec = AutoscalingSpec(min=0, max=4, idle_s=30.0, down_after_s=0.0)
    at = lambda now, cold: PoolLoad(now, 1, arrivals, 0.0, RUNS, 16, SLO_S, cold)  # noqa: E731
    assert make_scaler(spec).decide(at(last + 31.0, 0.5)).workers == 0
    assert make_scaler(spec).decide(at(last + 31.0, 5.0)).workers == 1  # 10 cold starts: 50 s
    assert make_scaler(spec).decide(at(last + 51.0, 5.0)).workers == 0
    kept = AutoscalingSpec(min=1, max=4, idle_s=30.0, down_after_s=0.0)
    assert make_scaler(kept).decide(at(last + 100.0, 0.0)).workers == 1
    # a query waiting with no worker gets one at once
    waiting = PoolLoad(last + 100.0, 0, arrivals, 1.0, RUNS, 16, SLO_S, 5.0)
    assert make_scaler(spec).decide(waiting).workers >= 1


def test_the_reactive_rule_is_queries_in_flight_over_the_target() -> None:
    spec = AutoscalingSpec(policy="reactive", max=10, target_ongoing=4.0, look_back_s=5.0,
                           down_after_s=0.0)  # fmt: skip
    scaler = make_scaler(spec)
    arrivals = _poisson(100.0, 10.0)

    def ongoing(now: float, n: float, workers: int) -> int:
        load = PoolLoad(now, workers, arrivals, n, RUNS, 16, SLO_S)
        return scaler.decide(load).workers

    assert ongoing(0.0, 10.0, 1) == 3  # ceil(10 / 4)
    assert ongoing(2.0, 30.0, 3) == 5  # the mean over the look-back: 20
    assert ongoing(20.0, 0.0, 5) == 1  # the window moved on: one at the least (min)


def test_the_spec_names_the_bound_it_breaks() -> None:
    with pytest.raises(ValidationError, match=r"min \(5\) is above max \(2\)"):
        AutoscalingSpec(min=5, max=2)
    with pytest.raises(ValidationError, match="policy"):
        AutoscalingSpec(policy="magic", max=2)


def test_a_change_of_rate_is_found_where_it_happened_and_a_steady_rate_has_none() -> None:
    from raysrv.batching.autoscale import _change

    rng = np.random.default_rng(4)
    for rate in (5.0, 50.0, 500.0):
        for _ in range(50):
            steady = np.cumsum(rng.exponential(1.0 / rate, int(rate * 20)))
            steady = steady[steady < 10.0]
            assert _change(steady, 0.0, 10.0) is None
    burst = _poisson(1200.0, 6.0, seed=1)
    burst = burst[burst < 5.0]
    mixed = np.concatenate([burst, 5.0 + _poisson(100.0, 4.9, seed=2)])
    split = _change(mixed, 0.0, 10.0)
    assert split is not None
    assert abs(split - burst.size) <= 2  # within two arrivals of the burst's end


def test_a_rise_is_fitted_since_it_began_and_a_fall_keeps_the_burst_in_view() -> None:
    """100/s, then 1,200/s for the last 5 s: fitted since the rise, as the 1,200/s it is now
    (whole, the window would read as one bursty process at the mean rate). The other way
    round the burst that ended stays in the fit, and more workers than 100/s needs are kept."""
    quiet = _poisson(100.0, 5.0, seed=2)
    quiet = quiet[quiet < 5.0]
    burst = 5.0 + _poisson(1200.0, 4.99, seed=1)
    spec = AutoscalingSpec(max=32, headroom=0.0)
    rise = make_scaler(spec).decide(_load(np.concatenate([quiet, burst])))
    alone = make_scaler(spec).decide(_load(burst))
    assert "since the rate changed" in rise.reason
    assert rise.rate == pytest.approx(alone.rate, rel=0.02)
    assert rise.needed == alone.needed > 1

    ended = np.concatenate([burst - 5.0, 5.0 + quiet])
    fall = make_scaler(spec).decide(_load(ended))
    after = make_scaler(spec).decide(_load(5.0 + quiet))
    assert "since the rate changed" not in fall.reason
    assert fall.needed > after.needed == 1


def test_a_shared_pools_run_times_are_its_models_weighted_by_their_arrivals() -> None:
    fast = {1: 0.010, 4: 0.016}  # 2 ms a query beyond the first
    slow = {1: 0.040, 2: 0.050, 3: 0.060, 4: 0.070}
    mixed = mixed_run_times({"fast": fast, "slow": slow, "new": {}}, {"fast": 3, "slow": 1}, 4)
    assert list(mixed) == [1, 2, 3, 4]  # every size, the ones fast has not run filled in
    assert mixed[1] == pytest.approx(0.75 * 0.010 + 0.25 * 0.040)
    assert mixed[2] == pytest.approx(0.75 * 0.012 + 0.25 * 0.050)
    assert mixed[4] == pytest.approx(0.75 * 0.016 + 0.25 * 0.070)
    alike = mixed_run_times({"fast": fast, "slow": slow}, {}, 4)  # no arrivals yet
    assert alike[1] == pytest.approx((0.010 + 0.040) / 2)
    assert mixed_run_times({"new": {}}, {"new": 5}, 4) == {}
