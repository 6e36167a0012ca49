"""The batch-buffer model against closed forms, the simulator and its own invariants."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raysrv.analytics.arrivals import MMPP2, Poisson
from raysrv.analytics.buffer import BatchBufferModel, Pricing
from raysrv.analytics.simulate import simulate
from raysrv.batching import FixedParams, FixedPolicy

BURSTY = MMPP2(rate1=200.0, rate2=20.0, switch1=2.0, switch2=1.0)


def linear_service(B: int, base: float = 0.005, per: float = 0.002) -> np.ndarray:
    return base + per * np.arange(1, B + 1)


def fixed(B: int, T: float) -> FixedPolicy:
    return FixedPolicy(FixedParams(max_batch_size=B, timeout_ms=T * 1000), slo_s=10.0)


def test_poisson_batch_sizes_follow_eq_7() -> None:
    lam, B, T = 100.0, 6, 0.03
    model = BatchBufferModel(Poisson(lam), linear_service(B), B, T)
    pmf = model.batch_size_pmf()
    k = np.arange(B - 1)
    poisson = np.exp(-lam * T) * (lam * T) ** k / np.array([math.factorial(i) for i in k])
    np.testing.assert_allclose(pmf[:-1], poisson, rtol=1e-9)
    assert pmf.sum() == pytest.approx(1.0)
    rho = model.batch_size_pmf("query")
    np.testing.assert_allclose(rho, np.arange(1, B + 1) * pmf / (np.arange(1, B + 1) @ pmf))


def test_batch_of_one_waits_the_whole_timeout() -> None:
    """B = 2, Poisson: a lone query waits T; the exact law has the atom eq. 9 spreads out."""
    lam, T, S = 10.0, 0.05, np.array([0.01, 0.012])
    model = BatchBufferModel(Poisson(lam), S, 2, T)
    alone = math.exp(-lam * T)  # batches of one, and one query each
    mean_k = 2 - alone
    # Just below S_1 + T only queries of full batches can be done (they wait < T).
    before_atom = model.latency_cdf(S[0] + T - 1e-9)
    at_atom = model.latency_cdf(S[0] + T)
    assert at_atom - before_atom == pytest.approx(alone / mean_k, rel=1e-6)


def test_degenerate_settings_have_no_buffer_wait() -> None:
    S = np.array([0.01, 0.02, 0.03])
    for B, T in [(1, 0.1), (3, 0.0)]:
        model = BatchBufferModel(Poisson(50.0), S, B, T)
        assert model.latency_percentile(0.99) == pytest.approx(0.01)
        assert model.mean_latency() == pytest.approx(0.01)
        assert model.batch_size_pmf()[0] == 1.0


@pytest.mark.parametrize(
    ("arrival", "B", "T"),
    [
        (Poisson(100.0), 4, 0.01),
        (Poisson(100.0), 16, 0.2),
        (Poisson(300.0), 8, 0.01),
        (BURSTY, 8, 0.05),
        (BURSTY, 16, 0.02),
    ],
)
def test_exact_model_matches_the_simulator(arrival: Poisson | MMPP2, B: int, T: float) -> None:
    """The paper's setting: infinite servers, the ``fixed`` policy is the buffer."""
    rng = np.random.default_rng(7)
    arrivals = arrival.arrival_times(60_000, rng)
    S = linear_service(B)
    sim = simulate(arrivals, S, fixed(B, T))
    model = BatchBufferModel(arrival, S, B, T)
    assert model.latency_percentile(0.95) == pytest.approx(sim.percentile(0.95), rel=0.03)
    assert model.mean_latency() == pytest.approx(float(sim.answered.mean()), rel=0.03)
    assert model.mean_batch_size() == pytest.approx(float(sim.batch_sizes.mean()), rel=0.03)


def test_cdf_is_monotone_and_reaches_one() -> None:
    model = BatchBufferModel(BURSTY, linear_service(8), 8, 0.05)
    t = np.linspace(0.0, 0.2, 500)
    cdf = model.latency_cdf(t)
    assert np.all(np.diff(cdf) >= -1e-12)
    assert cdf[0] == 0.0
    assert cdf[-1] == pytest.approx(1.0)


def test_paper_method_is_close_for_poisson_and_documented_worse_for_bursts() -> None:
    S = linear_service(16)
    exact = BatchBufferModel(Poisson(100.0), S, 16, 0.05)
    paper = BatchBufferModel(Poisson(100.0), S, 16, 0.05, method="paper")
    np.testing.assert_allclose(paper.batch_size_pmf(), exact.batch_size_pmf(), atol=1e-9)
    assert paper.latency_percentile(0.95) == pytest.approx(exact.latency_percentile(0.95), rel=0.1)


def test_cost_per_query_is_eq_1_over_the_mean_batch() -> None:
    S = linear_service(4)
    model = BatchBufferModel(Poisson(100.0), S, 4, 0.02)
    pricing = Pricing(per_unit_second=2.0, per_call=3.0)
    pmf = model.batch_size_pmf()
    expected = (float(pmf @ S) * 1.5 * 2.0 + 3.0) / float(np.arange(1, 5) @ pmf)
    assert model.cost_per_query(pricing, units=1.5) == pytest.approx(expected)


@pytest.mark.parametrize(("lam", "B", "T", "c"), [(100.0, 8, 0.02, 1), (300.0, 8, 0.02, 2)])
def test_finite_server_bounds_hold_in_simulation(lam: float, B: int, T: float, c: int) -> None:
    rng = np.random.default_rng(3)
    arrivals = Poisson(lam).arrival_times(60_000, rng)
    S = 0.01 + 0.003 * np.arange(1, B + 1)
    model = BatchBufferModel(Poisson(lam), S, B, T)
    bounds = model.latency_bounds(0.95, replicas=c)
    sim = simulate(arrivals, S, fixed(B, T), replicas=c, queue_batches=True)
    assert bounds.lower <= sim.percentile(0.95) * 1.01
    assert sim.percentile(0.95) <= bounds.upper * 1.01


def test_finite_server_bound_refuses_an_overloaded_setting() -> None:
    model = BatchBufferModel(Poisson(400.0), 0.01 + 0.003 * np.arange(1, 17), 16, 0.01)
    with pytest.raises(ValueError, match="too few replicas"):
        model.latency_bounds(0.95, replicas=2)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_batch": 0}, "max_batch"),
        ({"timeout": -1.0}, "timeout"),
        ({"service_times": [0.1]}, "service_times"),
        ({"replicas": 0}, "replicas"),
        ({"method": "guess"}, "method"),
    ],
)
def test_bad_arguments_name_themselves(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {
        "arrival": Poisson(10.0),
        "service_times": [0.1, 0.2],
        "max_batch": 2,
        "timeout": 0.01,
    }
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        BatchBufferModel(**args)  # type: ignore[arg-type]


arrivals = st.one_of(
    st.floats(5.0, 500.0).map(Poisson),
    st.tuples(
        st.floats(20.0, 400.0), st.floats(1.0, 40.0), st.floats(0.2, 5.0), st.floats(0.2, 5.0)
    ).map(lambda p: MMPP2(*p)),
)


@settings(max_examples=25, deadline=None)
@given(arrival=arrivals, B=st.integers(1, 12), T=st.floats(0.0, 0.1))
def test_properties_of_the_distribution(arrival: Poisson | MMPP2, B: int, T: float) -> None:
    model = BatchBufferModel(arrival, linear_service(B), B, T, grid=64)
    pmf = model.batch_size_pmf()
    assert np.all(pmf >= -1e-12)
    assert pmf.sum() == pytest.approx(1.0)
    t = np.linspace(0.0, float(linear_service(B)[-1]) + T + 0.01, 200)
    cdf = model.latency_cdf(t)
    assert np.all((cdf >= 0) & (cdf <= 1))
    assert np.all(np.diff(cdf) >= -1e-9)
    qs = [0.1, 0.5, 0.9, 0.95, 0.99]
    ps = [model.latency_percentile(q) for q in qs]
    assert all(a <= b + 1e-12 for a, b in zip(ps, ps[1:], strict=False))


@settings(max_examples=20, deadline=None)
@given(lam=st.floats(5.0, 300.0), factor=st.floats(1.05, 4.0), B=st.integers(2, 12))
def test_latency_does_not_grow_with_load(lam: float, factor: float, B: int) -> None:
    """Infinite servers, service time growing with batch size slower than the timeout:
    more load fills batches sooner, so waits shrink and no percentile may rise by more than
    the service-time growth of fuller batches. With equal service times it never rises."""
    S = np.full(B, 0.01)
    T = 0.05
    low = BatchBufferModel(Poisson(lam), S, B, T)
    high = BatchBufferModel(Poisson(lam * factor), S, B, T)
    for q in (0.5, 0.95):
        assert high.latency_percentile(q) <= low.latency_percentile(q) + 1e-9
    assert high.mean_latency() <= low.mean_latency() + 1e-9
