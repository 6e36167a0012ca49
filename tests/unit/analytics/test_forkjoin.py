"""EMG transfer delays and the fork-join maximum (gillis §IV-A), checked against Monte Carlo."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, stats

from raysrv.analytics.forkjoin import EMG, fit_emg, fit_emg_moments

DELAY = EMG(mu=0.050, sigma=0.005, tau=0.020)  # seconds: a 50 ms transfer with a 20 ms tail


def test_moments_and_distribution_functions_match_scipy() -> None:
    assert DELAY.mean == pytest.approx(0.070)
    assert DELAY.var == pytest.approx(0.005**2 + 0.020**2)
    assert DELAY.rate == pytest.approx(50.0)
    ref = stats.exponnorm(DELAY.tau / DELAY.sigma, loc=DELAY.mu, scale=DELAY.sigma)
    x = np.linspace(0.0, 0.4, 401)
    np.testing.assert_allclose(DELAY.cdf(x), ref.cdf(x), atol=1e-14)
    np.testing.assert_allclose(DELAY.pdf(x), ref.pdf(x), rtol=1e-12)
    assert ref.mean() == pytest.approx(DELAY.mean)
    assert ref.var() == pytest.approx(DELAY.var)
    assert ref.stats(moments="s") == pytest.approx(DELAY.skewness)
    area, _ = integrate.quad(lambda t: float(DELAY.pdf(t)), 0.0, 1.0)
    assert area == pytest.approx(1.0, abs=1e-9)


def test_ppf_inverts_cdf_including_far_tails() -> None:
    q = np.array([1e-9, 0.01, 0.5, 0.99, 1 - 1e-9])
    x = DELAY.ppf(q)
    np.testing.assert_allclose(DELAY.cdf(x[:4]), q[:4], rtol=1e-9)
    assert float(np.exp(DELAY.logsf(x[4]))) == pytest.approx(1e-9, rel=1e-6)


def test_sample_matches_the_distribution() -> None:
    draws = DELAY.sample(100_000, np.random.default_rng(0))
    assert stats.kstest(draws, DELAY.cdf).pvalue > 0.01


def test_fit_recovers_parameters() -> None:
    draws = DELAY.sample(20_000, np.random.default_rng(1))
    mle = fit_emg(draws)
    assert mle.mu == pytest.approx(DELAY.mu, rel=0.02)
    assert mle.sigma == pytest.approx(DELAY.sigma, rel=0.08)
    assert mle.tau == pytest.approx(DELAY.tau, rel=0.05)
    mom = fit_emg(draws, method="moments")
    assert mom == fit_emg_moments(draws)
    assert mom.mean == pytest.approx(draws.mean())
    assert mom.tau == pytest.approx(DELAY.tau, rel=0.1)

    def loglik(d: EMG) -> float:
        return float(np.sum(np.log(d.pdf(draws))))

    assert loglik(mle) >= loglik(mom)


def test_fit_of_a_purely_exponential_sample_stays_proper() -> None:
    draws = 0.03 + np.random.default_rng(2).exponential(0.01, 5000)  # sigma = 0: a boundary MLE
    fit = fit_emg(draws)
    assert 0 < fit.sigma <= 1e-3 * draws.std() * 1.01
    assert fit.tau == pytest.approx(0.01, rel=0.05)
    assert fit.expected_max(4) == pytest.approx(0.03 + 0.01 * (1 + 1 / 2 + 1 / 3 + 1 / 4), rel=0.03)


def test_expected_max_of_one_is_the_mean() -> None:
    assert DELAY.expected_max(1) == pytest.approx(DELAY.mean, rel=1e-9)


@pytest.mark.parametrize("n", [2, 8, 64])
def test_expected_max_matches_monte_carlo(n: int) -> None:
    trials = 400_000 // n
    maxima = DELAY.sample(trials * n, np.random.default_rng(n)).reshape(trials, n).max(axis=1)
    assert DELAY.expected_max(n) == pytest.approx(maxima.mean(), rel=0.01)


def test_expected_max_limits_are_order_statistics_of_the_parts() -> None:
    nearly_exponential = EMG(mu=1.0, sigma=1e-6, tau=1.0)  # max of n Exp(1): harmonic number H_n
    for n in (1, 5, 100):
        harmonic = sum(1 / k for k in range(1, n + 1))
        assert nearly_exponential.expected_max(n) == pytest.approx(1.0 + harmonic, rel=1e-6)
    nearly_normal = EMG(mu=0.0, sigma=1.0, tau=1e-6)  # max of 2 N(0, 1) is 1/sqrt(pi)
    assert nearly_normal.expected_max(2) == pytest.approx(1 / math.sqrt(math.pi), abs=1e-5)


def test_max_cdf_and_percentile_agree() -> None:
    for n in (1, 4, 50):
        for q in (0.05, 0.5, 0.99):
            t = DELAY.max_percentile(q, n)
            assert float(DELAY.max_cdf(t, n)) == pytest.approx(q, rel=1e-9)
    assert DELAY.max_percentile(0.5, 1) == pytest.approx(float(DELAY.ppf(0.5)))


def test_expected_max_of_one_is_the_mean_even_where_the_cdf_bends_sharply() -> None:
    """Found by the property test below: with sigma 1/128 the integral missed it by 1.5e-5."""
    d = EMG(mu=1.0, sigma=0.0078125, tau=1.0)
    assert d.expected_max(1) == d.mean
    assert d.expected_max(2) > d.mean


@settings(max_examples=40, deadline=None)
@given(
    sigma=st.floats(1e-3, 1.0),
    tau=st.floats(1e-3, 1.0),
    n=st.integers(1, 200),
)
def test_expected_max_grows_with_n_and_sits_between_bounds(
    sigma: float, tau: float, n: int
) -> None:
    d = EMG(mu=1.0, sigma=sigma, tau=tau)
    here, more = d.expected_max(n), d.expected_max(n + 1)
    assert d.mean * (1 - 1e-9) <= here <= more * (1 + 1e-9)
    # Hartley-David / Gumbel bound for i.i.d. maxima: E[max] <= mean + sd (n - 1) / sqrt(2n - 1)
    assert here <= d.mean + math.sqrt(d.var) * (n - 1) / math.sqrt(2 * n - 1) + 1e-9


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"mu": 0.0, "sigma": 0.0, "tau": 1.0}, "sigma must be positive and finite, got 0.0"),
        ({"mu": 0.0, "sigma": 1.0, "tau": -1.0}, "tau must be positive and finite, got -1.0"),
        ({"mu": math.nan, "sigma": 1.0, "tau": 1.0}, "mu must be finite, got nan"),
    ],
)
def test_invalid_parameters(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        EMG(**kwargs)


def test_invalid_calls() -> None:
    for n in (0, 2.5, "3", None):
        with pytest.raises(ValueError, match=r"n \(the number .*\) must be an integer >= 1"):
            DELAY.expected_max(n)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="q must lie strictly between 0 and 1, got 1.0"):
        DELAY.max_percentile(1.0, 3)
    with pytest.raises(ValueError, match=r"q must lie strictly between 0 and 1, got \[0.0\]"):
        DELAY.ppf([0.5, 0.0])
    with pytest.raises(ValueError, match="at least 10"):
        fit_emg([0.1, 0.2])
    with pytest.raises(ValueError, match="zero spread"):
        fit_emg(np.full(20, 0.1))
    with pytest.raises(ValueError, match="method"):
        fit_emg(DELAY.sample(100, np.random.default_rng(0)), method="em")  # type: ignore[arg-type]
