"""Arrival processes (BATCH §IV eq. 11-16) against textbook values, simulation and fits."""

from __future__ import annotations

import math
import pickle
from typing import Any, cast

import numpy as np
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from raysrv.analytics import _mapfit
from raysrv.analytics.arrivals import (
    MAP,
    MAP2,
    MMPP2,
    MapFit,
    Poisson,
    fit_map2,
    map2_from_moments,
)

BURSTY = [
    MMPP2(rate1=50.0, rate2=5.0, switch1=0.5, switch2=0.5),
    MMPP2(rate1=20.0, rate2=2.0, switch1=1.0, switch2=0.3),
    MMPP2(rate1=200.0, rate2=10.0, switch1=2.0, switch2=1.0),
    MMPP2(rate1=10.0, rate2=0.0, switch1=0.5, switch2=2.0),
    MAP2([[-12.0, 1.0], [0.2, -1.5]], [[10.0, 1.0], [0.3, 1.0]]),
    MAP2([[-30.0, 0.5], [0.3, -2.0]], [[29.0, 0.5], [0.2, 1.5]]),
]


def trace_stats(x: np.ndarray) -> tuple[float, float, float]:
    """Mean, SCV and lag-1 autocorrelation as a reader would compute them: numpy, by hand."""
    return (
        float(np.mean(x)),
        float(np.var(x) / np.mean(x) ** 2),
        float(np.corrcoef(x[:-1], x[1:])[0, 1]),
    )


def batch_se(x: np.ndarray, batches: int = 200) -> np.ndarray:
    """Standard errors of (mean, SCV, lag-1 acf) by non-overlapping batch means.

    Batch statistics are nearly independent when a batch is much longer than the correlation
    time, so their spread / sqrt(batches) is the sampling error of the whole-sample value,
    correlation included (an i.i.d. formula would understate it for bursty processes).
    """
    per = np.array([trace_stats(b) for b in np.array_split(x, batches)])
    return per.std(axis=0, ddof=1) / math.sqrt(batches)


def closed_forms(process: MAP) -> np.ndarray:
    return np.array([process.mean_interarrival, process.scv, process.lag1_autocorrelation])


class CountingRng:
    """A Generator that counts the variates it hands out: a sampler's work, free of wall time."""

    def __init__(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)
        self.draws = 0

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._rng, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            out = method(*args, **kwargs)
            self.draws += int(np.size(out))
            return out

        return counted


@pytest.fixture
def solves(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the least-squares solves of step (3) of ``_mapfit`` (one entry per call)."""
    calls: list[int] = []
    real = _mapfit.least_squares

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(_mapfit, "least_squares", counted)
    return calls


# ----------------------------------------------------------------------------- textbook values


def test_poisson_is_one_phase_with_exponential_moments() -> None:
    p = Poisson(rate=2.5)
    assert p.phases == 1
    assert p.D0.tolist() == [[-2.5]]
    assert p.D1.tolist() == [[2.5]]
    assert p.rate == 2.5
    assert p.mean_interarrival == pytest.approx(0.4)
    assert p.scv == pytest.approx(1.0)
    assert p.skewness == pytest.approx(2.0)
    assert p.lag1_autocorrelation == pytest.approx(0.0, abs=1e-12)
    for k in range(1, 6):  # E[X^k] = k! / rate^k
        assert p.moment(k) == pytest.approx(math.factorial(k) / 2.5**k)


def test_mmpp2_matrices_are_eq12() -> None:
    m = MMPP2(rate1=50.0, rate2=5.0, switch1=0.5, switch2=2.0)
    assert m.D0.tolist() == [[-50.5, 0.5], [2.0, -7.0]]
    assert m.D1.tolist() == [[50.0, 0.0], [0.0, 5.0]]
    assert (m.rate1, m.rate2, m.switch1, m.switch2) == (50.0, 5.0, 0.5, 2.0)
    assert isinstance(m, MAP2)
    assert isinstance(m, MAP)


@pytest.mark.parametrize(
    ("r1", "r2", "s1", "s2"), [(50, 5, 0.5, 0.5), (3, 0, 1, 4), (1, 9, 7, 0.1)]
)
def test_mmpp2_rate_is_time_average_of_phase_rates(
    r1: float, r2: float, s1: float, s2: float
) -> None:
    m = MMPP2(rate1=r1, rate2=r2, switch1=s1, switch2=s2)
    # phase i holds for 1/s_i on average, so it is occupied s_j / (s1 + s2) of the time
    assert m.rate == pytest.approx((r1 * s2 + r2 * s1) / (s1 + s2))
    assert m.stationary_phase() == pytest.approx([s2 / (s1 + s2), s1 / (s1 + s2)])
    # batch eq. 15 writes the same mean gap: tau / (B - 1) = (w1 + w2) / (l1 w2 + l2 w1)
    assert m.mean_interarrival == pytest.approx((s1 + s2) / (r1 * s2 + r2 * s1))


def test_mmpp2_with_equal_rates_is_poisson() -> None:
    m, p = MMPP2(rate1=4.0, rate2=4.0, switch1=0.3, switch2=7.0), Poisson(rate=4.0)
    assert m.rate == pytest.approx(4.0)
    assert m.scv == pytest.approx(1.0)
    assert m.lag1_autocorrelation == pytest.approx(0.0, abs=1e-12)
    for k in (1, 2, 3, 4):
        assert m.moment(k) == pytest.approx(p.moment(k))


@pytest.mark.parametrize(
    ("r1", "r2", "s1", "s2"), [(50, 5, 0.5, 0.5), (100, 1, 0.1, 1), (2, 3, 5, 0.2)]
)
def test_mmpp2_scv_matches_the_cookbook_closed_form(
    r1: float, r2: float, s1: float, s2: float
) -> None:
    m = MMPP2(rate1=r1, rate2=r2, switch1=s1, switch2=s2)
    # Fischer & Meier-Hellstern, "The MMPP cookbook" (1993), with s_i the rate of leaving phase i
    excess = 2 * s1 * s2 * (r1 - r2) ** 2 / ((s1 + s2) ** 2 * (r1 * r2 + r1 * s2 + r2 * s1))
    assert m.scv == pytest.approx(1.0 + excess)


def test_map2_acf_decays_with_the_second_eigenvalue_of_p() -> None:
    m = MAP2([[-12.0, 1.0], [0.2, -1.5]], [[10.0, 1.0], [0.3, 1.0]])
    g = sorted(np.linalg.eigvals(m.next_arrival_phase_matrix()).real)[0]
    assert m.autocorrelation(2) == pytest.approx(g * m.autocorrelation(1))
    assert m.autocorrelation(5) == pytest.approx(g**4 * m.lag1_autocorrelation)


def test_arrival_phase_is_the_phase_right_after_an_arrival() -> None:
    m = MMPP2(rate1=50.0, rate2=5.0, switch1=0.5, switch2=0.5)
    # an MMPP arrival does not move the phase: pi_a weights theta by the phase rates
    assert m.arrival_phase() == pytest.approx([50 / 55, 5 / 55])
    assert m.arrival_phase() @ m.next_arrival_phase_matrix() == pytest.approx(m.arrival_phase())


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("D0", "D1", "message"),
    [
        ([[-1.0, 1.0]], [[1.0]], "D0 must be a non-empty square matrix"),
        ([[-1.0]], [[0.5, 0.5]], "D1 must be a non-empty square matrix"),
        ([[-1.0]], [[1.0, 0.0], [0.0, 1.0]], "D0 and D1 must have the same shape"),
        ([[-1.0, -0.5], [1.0, -2.0]], [[1.5, 0.0], [0.0, 1.0]], r"D0\[0, 1\] = -0.5"),
        ([[-1.0, 1.0], [1.0, -2.0]], [[0.5, -0.5], [0.0, 1.0]], r"D1\[0, 1\] = -0.5"),
        ([[-1.0, 0.5], [1.0, -2.0]], [[1.0, 0.0], [0.0, 1.0]], "rows of D0 \\+ D1 must sum to 0"),
        ([[-1.0, 0.0], [0.0, -2.0]], [[1.0, 0.0], [0.0, 2.0]], "D0 \\+ D1 must be irreducible"),
        ([[0.0]], [[0.0]], "D1 must have a positive entry"),
        ([[-math.inf]], [[1.0]], "D0 must be finite"),
        ([["a"]], [[1.0]], "D0 must be a matrix of numbers"),
    ],
)
def test_bad_matrices_are_rejected_by_name(D0: list, D1: list, message: str) -> None:  # noqa: N803
    with pytest.raises(ValueError, match=message):
        MAP(D0, D1)


def test_map2_needs_two_phases() -> None:
    with pytest.raises(ValueError, match=r"D0 must be 2x2 for a MAP2, got shape \(1, 1\)"):
        MAP2([[-1.0]], [[1.0]])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"rate1": -1.0, "rate2": 1.0, "switch1": 1.0, "switch2": 1.0},
            "rate1 must be >= 0, got -1.0",
        ),
        ({"rate1": 1.0, "rate2": math.nan, "switch1": 1.0, "switch2": 1.0}, "rate2 must be finite"),
        (
            {"rate1": 1.0, "rate2": 1.0, "switch1": 0.0, "switch2": 1.0},
            "switch1 must be > 0, got 0.0",
        ),
        (
            {"rate1": 1.0, "rate2": 1.0, "switch1": 1.0, "switch2": "2"},
            "switch2 must be a real number",
        ),
        (
            {"rate1": 0.0, "rate2": 0.0, "switch1": 1.0, "switch2": 1.0},
            "rate1 and rate2 are both 0",
        ),
    ],
)
def test_bad_mmpp2_parameters_are_rejected_by_name(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MMPP2(**kwargs)


def test_bad_poisson_rate_is_rejected_by_name() -> None:
    with pytest.raises(ValueError, match="rate must be > 0, got -2"):
        Poisson(rate=-2)


def test_processes_are_immutable_copies() -> None:
    D0 = np.array([[-3.0, 1.0], [0.5, -1.0]])  # noqa: N806
    m = MAP2(D0, [[1.5, 0.5], [0.1, 0.4]])
    D0[0, 0] = -99.0
    assert m.D0[0, 0] == -3.0
    with pytest.raises(ValueError, match="read-only"):
        m.D0[0, 0] = 1.0
    with pytest.raises(AttributeError, match="immutable"):
        m.fit = None  # type: ignore[misc]
    with pytest.raises(AttributeError, match="immutable"):
        Poisson(1.0).rate_override = 2.0  # type: ignore[attr-defined]


def test_repr_and_pickle_round_trip() -> None:
    m = MMPP2(rate1=50.0, rate2=5.0, switch1=0.5, switch2=0.5)
    assert repr(m) == "MMPP2(rate1=50.0, rate2=5.0, switch1=0.5, switch2=0.5)"
    assert repr(Poisson(rate=2.0)) == "Poisson(rate=2.0)"
    m2 = MAP2([[-3.0, 1.0], [0.5, -1.0]], [[1.5, 0.5], [0.1, 0.4]])
    assert repr(m2) == "MAP2(D0=[[-3, 1], [0.5, -1]], D1=[[1.5, 0.5], [0.1, 0.4]])"
    fitted = fit_map2(m.sample(5_000, np.random.default_rng(0)))
    for obj in (m, m2, Poisson(rate=2.0), fitted):
        back = pickle.loads(pickle.dumps(obj))
        assert type(back) is type(obj)
        assert repr(back) == repr(obj)
        assert back.D0.tolist() == obj.D0.tolist()
    assert pickle.loads(pickle.dumps(fitted)).fit == fitted.fit


# ----------------------------------------------------------------------------- simulation


@pytest.mark.parametrize(
    "process",
    [
        Poisson(rate=3.0),
        MMPP2(rate1=20.0, rate2=2.0, switch1=1.0, switch2=0.3),
        MAP2([[-3.0, 1.0], [0.5, -1.0]], [[1.5, 0.5], [0.1, 0.4]]),
        MAP2([[-10.0, 0.0], [0.0, -1.0]], [[0.0, 10.0], [1.0, 0.0]]),  # alternating: acf < 0
        MAP(
            [[-5.0, 1.0, 0.0], [0.0, -2.0, 1.0], [1.0, 0.0, -20.0]],
            [[2, 1, 1], [0, 0.5, 0.5], [5, 4, 10]],
        ),
    ],
    ids=repr,
)
def test_sample_moments_match_the_closed_forms(process: MAP) -> None:
    x = process.sample(300_000, np.random.default_rng(11))
    assert x.shape == (300_000,)
    assert np.all(x > 0)
    se = batch_se(x)
    # 5 standard errors: a false alarm has chance ~1e-6 per check; the small fixed slack covers
    # the error of the batch-means estimate of se itself
    tol = 5 * se + np.array([0.0, 0.01 * process.scv, 0.005])
    assert np.all(np.abs(np.array(trace_stats(x)) - closed_forms(process)) <= tol)
    assert np.mean(x**3) == pytest.approx(process.moment(3), rel=0.1)


def test_sample_is_reproducible_and_arrival_times_accumulate() -> None:
    m = MMPP2(rate1=50.0, rate2=5.0, switch1=0.5, switch2=0.5)
    a, b = m.sample(1000, np.random.default_rng(3)), m.sample(1000, np.random.default_rng(3))
    assert np.array_equal(a, b)
    assert m.sample(0, np.random.default_rng(0)).shape == (0,)
    t = m.arrival_times(1000, np.random.default_rng(3))
    assert np.allclose(t, np.cumsum(a))
    assert np.all(np.diff(t) > 0)
    with pytest.raises(ValueError, match="n must be an integer >= 0"):
        m.sample(-1, np.random.default_rng(0))


@pytest.mark.parametrize(
    "process",
    [
        MMPP2(rate1=50.0, rate2=5.0, switch1=0.5, switch2=0.5),
        MAP2([[-10.0, 0.0], [0.0, -1.0]], [[0.0, 10.0], [1.0, 0.0]]),  # a phase change per arrival
        MMPP2(rate1=1.0, rate2=2.0, switch1=100.0, switch2=100.0),  # 130 switches per arrival
    ],
    ids=repr,
)
def test_map2_sampling_work_does_not_grow_with_switching(process: MAP2) -> None:
    # the arrival-phase chain draws a handful of variates per arrival whatever the phase
    # changes between arrivals (130 in the last case); simulating them would draw ~130 each
    rng = CountingRng(0)
    x = process.sample(1_000_000, cast(np.random.Generator, rng))
    assert rng.draws <= 6 * 1_000_000
    assert np.mean(x) == pytest.approx(process.mean_interarrival, rel=0.02)


def test_sample_of_many_phases_spans_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    # three phases take the phase-path simulator, in chunks of at most MAX_PIECES / 3 pieces
    m = MAP(
        [[-5.0, 1.0, 0.0], [0.0, -2.0, 1.0], [1.0, 0.0, -20.0]],
        [[2, 1, 1], [0, 0.5, 0.5], [5, 4, 10]],
    )
    pieces: list[int] = []
    real = _mapfit.PieceSampler._chunk

    def spy(self: Any, phase: int, since_last: float, k: int, rng: Any) -> Any:
        pieces.append(k)
        return real(self, phase, since_last, k, rng)

    monkeypatch.setattr(_mapfit.PieceSampler, "_chunk", spy)
    x = m.sample(1_000_000, np.random.default_rng(0))
    assert len(pieces) >= 2
    assert max(pieces) <= _mapfit.MAX_PIECES // 3
    assert x.shape == (1_000_000,)
    assert np.mean(x) == pytest.approx(m.mean_interarrival, rel=0.01)
    assert trace_stats(x)[1] == pytest.approx(m.scv, rel=0.03)


# ----------------------------------------------------------------------------- fitting


@pytest.mark.parametrize("process", BURSTY, ids=repr)
def test_fit_map2_reproduces_bursty_traces(process: MAP2, solves: list[int]) -> None:
    x = process.sample(100_000, np.random.default_rng(7))
    fitted = fit_map2(x)
    assert solves == []  # reachable SCV > 1 targets take the closed form, steps (1)-(2)
    assert isinstance(fitted, MAP2)
    assert isinstance(fitted.fit, MapFit)
    assert not fitted.fit.poisson_fallback
    assert fitted.fit.note == ""
    # exact up to trace_stats' lag-1 acf, whose np.corrcoef centres each half on its own mean
    assert closed_forms(fitted) == pytest.approx(np.array(trace_stats(x)), rel=1e-3)
    assert fitted.fit.max_rel_error < 1e-6
    assert fitted.moment(3) == pytest.approx(np.mean(x**3), rel=2e-3)
    assert fitted.fit.achieved.scv == pytest.approx(fitted.scv)


def test_fit_map2_falls_back_to_poisson_for_a_poisson_trace() -> None:
    for seed in range(5):
        x = np.random.default_rng(seed).exponential(0.25, size=50_000)
        fitted = fit_map2(x)
        assert fitted.fit is not None
        assert fitted.fit.poisson_fallback
        assert isinstance(fitted, MMPP2)
        assert fitted.rate1 == fitted.rate2
        assert fitted.mean_interarrival == pytest.approx(np.mean(x))
        assert fitted.scv == pytest.approx(1.0)
        assert fitted.fit.n_samples == 50_000


def test_fit_map2_poisson_tolerance_shrinks_with_the_sample() -> None:
    # SCV 1.05 and acf 0.015: within noise in 1,000 gaps (z = 4 tolerances 0.25 and 0.13),
    # a signal in 200,000 (tolerances 0.018 and 0.009)
    m = MMPP2(rate1=12.0, rate2=8.0, switch1=3.0, switch2=3.0)
    assert m.scv == pytest.approx(1.05128, abs=1e-4)
    x = m.sample(200_000, np.random.default_rng(1))
    assert fit_map2(x[:1000]).fit.poisson_fallback  # type: ignore[union-attr]
    fitted = fit_map2(x)
    assert not fitted.fit.poisson_fallback  # type: ignore[union-attr]
    assert fitted.scv == pytest.approx(trace_stats(x)[1], rel=1e-3)


def test_the_search_of_step_3_is_bounded_and_as_close_as_unbounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An overloaded ingress's arrivals (Poisson at 358/s, taken up in 3 ms ticks of its
    loop): SCV above 1 with a negative lag-1 correlation, which no MAP2 reaches, so the
    search runs start after start. Within its bounds it stops at a fit as close as the one an
    unbounded search ends with, after a third of the work."""
    rng = np.random.default_rng(0)
    arrivals = np.ceil(np.cumsum(rng.exponential(1 / 358, 2_000)) / 0.003) * 0.003
    gaps = np.diff(arrivals + np.arange(arrivals.size) * 2e-5)
    spent: list[int] = []
    real = _mapfit.least_squares

    def counted(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        spent.append(result.nfev)
        return result

    monkeypatch.setattr(_mapfit, "least_squares", counted)
    bounded = fit_map2(gaps)
    assert max(spent) <= _mapfit.SOLVE_EVALUATIONS
    assert sum(spent) < _mapfit.SEARCH_EVALUATIONS + _mapfit.SOLVE_EVALUATIONS
    spent.clear()
    bound = _mapfit.SEARCH_EVALUATIONS
    monkeypatch.setattr(_mapfit, "SOLVE_EVALUATIONS", 10**6)
    monkeypatch.setattr(_mapfit, "SEARCH_EVALUATIONS", 10**6)
    unbounded = fit_map2(gaps)
    assert sum(spent) > 2 * bound  # the bound was reached above
    assert bounded.fit is not None
    assert unbounded.fit is not None
    assert bounded.fit.target.scv > 1.0
    assert bounded.fit.target.lag1 < 0.0

    def cost(fit: MAP2) -> float:
        return _mapfit._cost(fit.fit.achieved, fit.fit.target)  # type: ignore[union-attr]

    assert cost(bounded) <= cost(unbounded) + 0.005


@pytest.mark.parametrize(
    ("trace", "says"),
    [
        (np.full(100, 0.5), "SCV 0.5 for 0 (a MAP2 has SCV >= 0.5)"),
        (np.random.default_rng(0).gamma(4.0, 1.0, 5_000), "a MAP2 has SCV >= 0.5"),
        (np.tile([0.01, 1.0], 500), "lag-1 autocorrelation"),
        (np.sort(np.random.default_rng(0).exponential(1.0, 2_000)), "lag-1 autocorrelation"),
    ],
    ids=["constant", "erlang4", "alternating", "sorted"],
)
def test_fit_map2_returns_the_closest_feasible_fit_and_says_why(
    trace: np.ndarray, says: str, solves: list[int]
) -> None:
    fitted = fit_map2(trace)
    assert 0 < len(solves) <= 16  # step (3): at most 8 starts in each of two families
    assert fitted.fit is not None
    assert says in fitted.fit.note
    assert fitted.fit.note.startswith("closest feasible MAP2")
    assert fitted.scv >= 0.5 - 1e-6
    assert fitted.mean_interarrival == pytest.approx(np.mean(trace))


def test_map2_from_moments_matches_a_reachable_acf_and_flags_the_rest() -> None:
    # SCV 3 admits rho_1 < (3 - 1) / 6 = 1/3: asking 0.2 is fine, 0.45 is not
    ok = map2_from_moments(mean=1.0, scv=3.0, third=30.0, lag1=0.2)
    assert ok.fit is not None
    assert ok.fit.note == ""
    assert ok.lag1_autocorrelation == pytest.approx(0.2)
    far = map2_from_moments(mean=1.0, scv=3.0, third=30.0, lag1=0.45)
    assert far.fit is not None
    assert "rho_1 < 0.3333" in far.fit.note
    assert far.lag1_autocorrelation < 0.45
    assert far.mean_interarrival == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("trace", "message"),
    [
        (np.ones(10), "at least 30 values, got 10"),
        (np.r_[np.ones(40), -1.0], r"interarrivals\[40\] = -1.0"),
        (np.r_[np.ones(40), math.nan], "positive and finite"),
        (np.r_[np.ones(40), 0.0], "positive and finite"),
        (np.ones((10, 10)), "one-dimensional"),
        (["x"] * 40, "interarrivals must be numbers"),
    ],
)
def test_fit_map2_rejects_bad_traces(trace: np.ndarray, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        fit_map2(trace)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mean": 0.0}, "mean must be > 0, got 0.0"),
        ({"scv": -1.0}, "scv must be > 0, got -1.0"),
        ({"lag1": 1.0}, r"lag1 must lie in \(-1, 1\), got 1.0"),
        ({"lag1": "0.2"}, "lag1 must be a real number, got '0.2'"),
    ],
)
def test_map2_from_moments_rejects_bad_moments_by_name(kwargs: dict, message: str) -> None:
    args = {"mean": 1.0, "scv": 2.0, "third": 20.0, "lag1": 0.1} | kwargs
    with pytest.raises(ValueError, match=message):
        map2_from_moments(**args)


# ----------------------------------------------------------------------------- properties

rates = st.floats(min_value=0.01, max_value=100.0)


@settings(max_examples=150, deadline=None)
@given(r1=rates, r2=rates, s1=rates, s2=rates)
def test_mmpp2_invariants(r1: float, r2: float, s1: float, s2: float) -> None:
    m = MMPP2(rate1=r1, rate2=r2, switch1=s1, switch2=s2)
    assert m.rate > 0
    assert m.scv >= 1 - 1e-9
    acf = m.lag1_autocorrelation
    assert -1e-9 <= acf < 0.5
    assert acf <= (m.scv - 1) / (2 * m.scv) + 1e-9
    check_phase_vectors(m)


def map2_from(entries: list[float]) -> MAP2:
    """A MAP2 from 6 rates: D0's off-diagonal, then D1 (+0.01, which keeps Q irreducible)."""
    d0 = np.array([[0.0, entries[0]], [entries[1], 0.0]])
    d1 = np.array(entries[2:6]).reshape(2, 2) + 0.01
    np.fill_diagonal(d0, -(d0.sum(axis=1) + d1.sum(axis=1)))
    return MAP2(d0, d1)


six_rates = st.lists(st.floats(min_value=0.0, max_value=50.0), min_size=6, max_size=6)


@settings(max_examples=150, deadline=None)
@given(entries=six_rates)
def test_map2_invariants(entries: list[float]) -> None:
    m = map2_from(entries)
    assert m.rate > 0
    assert m.scv >= 0.5 - 1e-9
    assert abs(m.lag1_autocorrelation) < 0.5
    check_phase_vectors(m)


def check_phase_vectors(m: MAP) -> None:
    theta, pi_a, jump = m.stationary_phase(), m.arrival_phase(), m.next_arrival_phase_matrix()
    for v in (theta, pi_a):
        assert np.all(v >= 0)
        assert v.sum() == pytest.approx(1.0)
    assert theta @ (m.D0 + m.D1) == pytest.approx(np.zeros(2), abs=1e-9 * np.abs(m.D0).max())
    assert jump.sum(axis=1) == pytest.approx(np.ones(2))
    assert pi_a @ jump == pytest.approx(pi_a, abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(r1=rates, r2=rates, s1=rates, s2=rates)
@example(r1=0.125, r2=0.125, s1=30.5, s2=64.75)  # equal rates: Poisson, a renewal start at b=0
def test_map2_from_moments_inverts_map_moments(r1: float, r2: float, s1: float, s2: float) -> None:
    m = MMPP2(rate1=r1, rate2=r2, switch1=s1, switch2=s2)
    # The fit's phase chain has eigenvalue g <= G_MAX; beyond it, see the test below.
    assume(np.trace(m.next_arrival_phase_matrix()) - 1.0 <= _mapfit.G_MAX)
    fitted = map2_from_moments(m.mean_interarrival, m.scv, m.moment(3), m.lag1_autocorrelation)
    assert fitted.mean_interarrival == pytest.approx(m.mean_interarrival, rel=1e-6)
    assert fitted.scv == pytest.approx(m.scv, rel=1e-6)
    assert fitted.lag1_autocorrelation == pytest.approx(m.lag1_autocorrelation, rel=1e-5, abs=1e-7)
    # E[X^3] of an SCV barely above 1 sits at the H2 floor, which the fit keeps 0.1% above
    assert fitted.moment(3) == pytest.approx(m.moment(3), rel=2e-3)


@pytest.mark.parametrize(("r1", "r2"), [(29.0, 49.0), (28.0, 50.0)])
def test_map2_from_moments_beyond_the_slowest_phase_switching_it_fits_comes_close(
    r1: float, r2: float
) -> None:
    """Phases that switch about once in a thousand arrivals (g 0.99902 > G_MAX): rho_1 and the
    SCV are then matched to about 2e-5, not to rounding (found by the property test above)."""
    m = MMPP2(rate1=r1, rate2=r2, switch1=0.01, switch2=0.03125)
    assert np.trace(m.next_arrival_phase_matrix()) - 1.0 > _mapfit.G_MAX
    fitted = map2_from_moments(m.mean_interarrival, m.scv, m.moment(3), m.lag1_autocorrelation)
    assert fitted.mean_interarrival == pytest.approx(m.mean_interarrival, rel=1e-6)
    assert fitted.scv == pytest.approx(m.scv, rel=1e-4)
    assert fitted.lag1_autocorrelation == pytest.approx(m.lag1_autocorrelation, rel=1e-4)


@settings(max_examples=40, deadline=None)
@given(entries=six_rates)
# SCV just below and just above 1, where the search must go far from its renewal start
@example(entries=[10.5, 1.125, 0.0, 43.5, 50.0, 11.25])
@example(entries=[0.0, 0.5, 1.125, 50.0, 50.0, 0.0])
def test_map2_from_moments_reaches_every_map2(entries: list[float]) -> None:
    m = map2_from(entries)  # any MAP2, acf of either sign, SCV either side of 1
    fitted = map2_from_moments(m.mean_interarrival, m.scv, m.moment(3), m.lag1_autocorrelation)
    assert fitted.fit is not None
    assert fitted.mean_interarrival == pytest.approx(m.mean_interarrival, rel=1e-6)
    assert fitted.scv == pytest.approx(m.scv, rel=1e-4)
    assert fitted.lag1_autocorrelation == pytest.approx(m.lag1_autocorrelation, abs=1e-4)
    assert fitted.moment(3) == pytest.approx(m.moment(3), rel=2e-3)
