"""SERF's M/D_interf/c model (serf §IV-C): textbook values, the simulator referee, the table."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raysrv.analytics.arrivals import Poisson
from raysrv.analytics.interference import (
    interference_profile,
    serf_validation_grid,
    simulate_interference,
)
from raysrv.analytics.serf import (
    ParallelConfig,
    cosmetatos_factor,
    lookup_config,
    serf_config_table,
    serf_latency,
    serf_predict,
    state_probabilities,
)


def _erlang_c(c: int, offered: float) -> float:
    """Erlang C by the Erlang B recursion, independent of the model's product form."""
    b = 1.0
    for k in range(1, c + 1):
        b = offered * b / (k + offered * b)
    return c * b / (c - offered * (1 - b))


def _simulate(lam: float, mu: tuple[float, ...], n: int = 200_000, seed: int = 1, **kw) -> float:
    rng = np.random.default_rng(seed)
    return simulate_interference(Poisson(lam).arrival_times(n, rng), mu, **kw).mean_latency()


# --- textbook values ---------------------------------------------------------------------------


@pytest.mark.parametrize("rho", [0.1, 0.5, 0.9, 0.99])
def test_c1_without_interference_is_pollaczek_khinchine(rho: float) -> None:
    mu = 4.0  # requests per second
    expected = 1 / mu + rho / (2 * mu * (1 - rho))  # M/D/1 mean latency
    assert serf_latency(rho * mu, [mu]) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(("c", "rho"), [(1, 0.3), (2, 0.5), (4, 0.8), (8, 0.95), (32, 0.9)])
def test_equal_rates_give_erlang_c(c: int, rho: float) -> None:
    mu = 2.0
    lam = rho * c * mu
    pred = serf_predict(lam, [mu] * c)
    erlang = _erlang_c(c, lam / mu)
    assert pred.prob_wait == pytest.approx(erlang, rel=1e-10)
    assert pred.mm_waiting_time == pytest.approx(erlang / (c * mu - lam), rel=1e-10)  # M/M/c W_q
    assert pred.service_time == pytest.approx(1 / mu, rel=1e-12)
    exponential = serf_latency(lam, [mu] * c, method="exponential")
    assert exponential == pytest.approx(erlang / (c * mu - lam) + 1 / mu, rel=1e-10)


def test_state_probabilities_balance_and_sum() -> None:
    lam, mu = 1.7, [1.0, 0.9, 0.7, 0.6]
    p = state_probabilities(lam, mu, 400)
    assert p.sum() == pytest.approx(1.0, abs=1e-12)
    for n in range(1, 400):  # cut between n-1 and n: lambda p_{n-1} = k mu_k p_n, k = min(n, c)
        k = min(n, len(mu))
        assert lam * p[n - 1] == pytest.approx(k * mu[k - 1] * p[n], rel=1e-9)
    assert serf_predict(lam, mu).p0 == pytest.approx(p[0])


def test_service_time_is_littles_law_of_the_running_requests() -> None:
    lam, mu = 2.0, [1.0, 0.8, 0.75]
    p = state_probabilities(lam, mu, 2000)
    running = np.minimum(np.arange(p.size), len(mu))
    assert serf_predict(lam, mu).service_time == pytest.approx(p @ running / lam, rel=1e-9)


def test_cosmetatos_factor() -> None:
    assert cosmetatos_factor(1, 0.4) == 0.5  # f(1) = 0: M/D/1 waits half of M/M/1
    f4 = 3 * (math.sqrt(24) - 2) / 64
    assert cosmetatos_factor(4, 0.5) == pytest.approx(0.5 * (1 + f4))


def test_interference_raises_latency_and_unstable_is_inf() -> None:
    base = serf_latency(1.0, [1.0, 1.0, 1.0])
    assert serf_latency(1.0, [1.0, 0.9, 0.8]) > base
    pred = serf_predict(2.5, [1.0, 0.9, 0.8])  # rho = 2.5 / (3 * 0.8) > 1
    assert pred.latency == math.inf
    assert not pred.stable
    assert serf_latency(5.0, [1.0]) == math.inf


# --- the simulator and the model against it ----------------------------------------------------


def test_simulator_without_interference_matches_md1_and_mmc() -> None:
    assert _simulate(0.7, (1.0,), n=400_000) == pytest.approx(1 + 0.7 / (2 * 0.3), rel=0.02)
    rng = np.random.default_rng(3)
    lam, mu = 1.4, (1.0, 0.9, 0.8, 0.7)  # exponential work: the exact M/M_interf/c mean
    arrivals = Poisson(lam).arrival_times(300_000, rng)
    work = rng.exponential(1.0, arrivals.size)
    run = simulate_interference(arrivals, mu, work=work)
    assert run.mean_latency() == pytest.approx(
        serf_latency(lam, mu, method="exponential"), rel=0.03
    )


def test_simulator_bookkeeping() -> None:
    rng = np.random.default_rng(0)
    mu = (2.0, 1.5, 1.2)
    run = simulate_interference(Poisson(2.5).arrival_times(5000, rng), mu)
    assert np.all(run.wait >= 0)
    assert np.all(np.diff(run.start) >= 0)
    np.testing.assert_allclose(run.latency, run.wait + run.service)
    assert np.all(run.service >= 1 / mu[0] - 1e-9)
    assert np.all(run.service <= 1 / mu[-1] + 1e-9)
    events = np.concatenate([run.start, run.finish])
    order = np.lexsort((np.r_[np.ones(5000), -np.ones(5000)], events))  # finishes first on ties
    running = np.cumsum(np.r_[np.ones(5000), -np.ones(5000)][order])
    assert running.max() <= len(mu)


def test_fixed_and_shared_modes_agree_without_interference() -> None:
    arrivals = Poisson(2.0).arrival_times(20_000, np.random.default_rng(4))
    shared = simulate_interference(arrivals, (1.0, 1.0, 1.0))
    fixed = simulate_interference(arrivals, (1.0, 1.0, 1.0), mode="fixed")
    np.testing.assert_allclose(shared.finish, fixed.finish, rtol=1e-9)


@pytest.mark.parametrize(
    ("c", "slowdown", "shape", "rho"),
    [
        (2, 0.5, "linear", 0.5),
        (3, 0.5, "knee", 0.7),
        (4, 0.25, "linear", 0.6),
        (8, 0.5, "knee", 0.7),
    ],
)
def test_model_within_5_percent_of_simulation(c: int, slowdown: float, shape, rho: float) -> None:
    mu = interference_profile(c, slowdown, shape)
    lam = rho * c * mu[-1]
    assert serf_latency(lam, mu) == pytest.approx(_simulate(lam, mu), rel=0.05)


def test_validation_grid_helper() -> None:
    cases = serf_validation_grid(
        servers=(1, 3), slowdowns=(0.0, 0.5), utilisations=(0.5,), n_requests=50_000
    )
    assert len(cases) == 4  # c = 1: one profile; c = 3: none, linear and knee
    assert all(abs(case.relative_error) < 0.05 for case in cases)


# --- properties --------------------------------------------------------------------------------


@st.composite
def _profiles(draw: st.DrawFn) -> tuple[float, ...]:
    c = draw(st.integers(1, 12))
    drops = draw(st.lists(st.floats(0.0, 0.2), min_size=c - 1, max_size=c - 1))
    mu = [draw(st.floats(0.1, 100.0))]
    for d in drops:  # non-increasing: interference never speeds a request up
        mu.append(mu[-1] * (1 - d))
    return tuple(mu)


@settings(max_examples=150, deadline=None)
@given(mu=_profiles(), r1=st.floats(0.001, 0.999), r2=st.floats(0.001, 0.999))
def test_latency_non_decreasing_in_load(mu: tuple[float, ...], r1: float, r2: float) -> None:
    lo, hi = sorted((r1, r2))
    cap = len(mu) * mu[-1]
    for method in ("paper", "exponential"):
        w_lo = serf_latency(lo * cap, mu, method=method)
        w_hi = serf_latency(hi * cap, mu, method=method)
        assert math.isfinite(w_lo)
        assert math.isfinite(w_hi)
        assert w_lo <= w_hi * (1 + 1e-12)
        assert w_lo >= 1 / mu[0] * (1 - 1e-12)  # never faster than one request alone


@settings(max_examples=50, deadline=None)
@given(mu=_profiles(), over=st.floats(1.0, 10.0))
def test_saturated_is_inf(mu: tuple[float, ...], over: float) -> None:
    assert serf_latency(over * len(mu) * mu[-1], mu) == math.inf


# --- validation --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lam", "mu", "match"),
    [
        (0.0, [1.0], "arrival_rate"),
        (math.nan, [1.0], "arrival_rate"),
        (math.inf, [1.0], "arrival_rate"),
        (1.0, [], "service_rates"),
        (1.0, [1.0, -2.0], r"mu_2.*-2\.0"),
        (1.0, [1.0, math.inf], "mu_2"),
    ],
)
def test_invalid_inputs_name_the_argument(lam: float, mu: list[float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        serf_latency(lam, mu)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: cosmetatos_factor(0, 0.5), "servers must be >= 1, got 0"),
        (lambda: cosmetatos_factor(2, 1.0), r"utilisation must lie in \(0, 1\), got 1.0"),
        (lambda: state_probabilities(1.0, [2.0], -1), "n_max must be an integer >= 0, got -1"),
        (lambda: state_probabilities(3.0, [1.0], 5), "no steady state"),
        (lambda: serf_latency("fast", [1.0]), "arrival_rate .* got 'fast'"),  # type: ignore[arg-type]
        (lambda: interference_profile(0, 0.1), "servers must be >= 1, got 0"),
        (lambda: interference_profile(2, 1.0), r"slowdown must lie in \[0, 1\), got 1.0"),
        (lambda: simulate_interference([1.0], [1.0, 0.0]), r"mu_2.*got 0.0"),
    ],
)
def test_helpers_name_the_bad_argument(call: Callable[[], object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()


def test_invalid_method_and_simulator_inputs() -> None:
    with pytest.raises(ValueError, match="method"):
        serf_latency(1.0, [2.0], method="magic")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sorted"):
        simulate_interference([2.0, 1.0], [1.0])
    with pytest.raises(ValueError, match="mode"):
        simulate_interference([1.0], [1.0], mode="other")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="work"):
        simulate_interference([1.0, 2.0], [1.0], work=[1.0])


# --- configuration reference table (§IV-C last paragraph, §IV-D) ------------------------------

_PROFILE = {  # (inter_node, intra_threads) -> mu_1..mu_cmax, requests per second
    (1, 8): [2.0],
    (1, 4): [1.2, 1.1],
    (1, 2): [0.7, 0.65, 0.55, 0.4],
    (2, 4): [2.5, 2.3],
}


def test_config_table_picks_the_argmin_over_feasible_configs() -> None:
    loads = [8.0, 0.5, 3.0]
    table = serf_config_table(_PROFILE, loads, machines=4, cores_per_machine=8)
    assert [row.load for row in table] == sorted(loads)
    for row in table:
        assert row.best is not None
        assert row.runner_up is not None
        expected = {}
        for (inter, intra), rates in _PROFILE.items():
            units = 4 // inter
            for c in range(1, min(len(rates), 8 // intra) + 1):
                expected[(c, inter, intra)] = serf_latency(row.load / units, rates[:c])
        ranked = sorted(expected, key=expected.__getitem__)
        best = row.best.config
        assert (best.service, best.inter_node, best.intra_threads) == ranked[0]
        assert row.best.latency == pytest.approx(expected[ranked[0]])
        assert row.runner_up.latency == pytest.approx(expected[ranked[1]])
        assert row.best.unit_arrival_rate * row.best.units == pytest.approx(row.load)


def test_config_table_respects_cores_and_machines() -> None:
    table = serf_config_table(_PROFILE, [0.5, 1.0], machines=1, cores_per_machine=4)
    for row in table:
        for choice in (row.best, row.runner_up):
            assert choice is not None
            cfg = choice.config
            assert cfg.inter_node == 1
            assert cfg.service * cfg.intra_threads <= 4


def test_config_table_marks_unstable_loads() -> None:
    (row,) = serf_config_table({(1, 1): [1.0]}, [5.0], machines=2, cores_per_machine=1)
    assert row.best is None
    assert row.runner_up is None


def test_lookup_next_higher_and_nearest() -> None:
    table = serf_config_table(_PROFILE, [1.0, 2.0, 4.0], machines=4, cores_per_machine=8)
    assert lookup_config(table, 1.5).load == 2.0
    assert lookup_config(table, 2.0).load == 2.0
    assert lookup_config(table, 9.0).load == 4.0  # beyond the table: the top level
    assert lookup_config(table, 0.0).load == 1.0
    assert lookup_config(table, 1.4, rule="nearest").load == 1.0
    assert lookup_config(table, 3.0, rule="nearest").load == 4.0  # tie goes up
    assert isinstance(lookup_config(table, 1.0).best.config, ParallelConfig)  # type: ignore[union-attr]


def test_config_table_and_lookup_validation() -> None:
    with pytest.raises(ValueError, match="loads"):
        serf_config_table(_PROFILE, [-1.0], machines=4, cores_per_machine=8)
    with pytest.raises(ValueError, match="no profiled configuration"):
        serf_config_table({(8, 1): [1.0]}, [1.0], machines=4, cores_per_machine=8)
    with pytest.raises(ValueError, match="machines"):
        serf_config_table(_PROFILE, [1.0], machines=0, cores_per_machine=8)
    with pytest.raises(ValueError, match="empty"):
        lookup_config([], 1.0)
    table = serf_config_table(_PROFILE, [1.0], machines=4, cores_per_machine=8)
    with pytest.raises(ValueError, match="rule"):
        lookup_config(table, 1.0, rule="closest")  # type: ignore[arg-type]
