"""Fork-join communication delay: EMG transfer delays and the expected maximum over n workers.

Source: Gillis (ICDCS'21) §IV-A ("Function Communication Delay"): a master waits for
all ``n`` workers, so the fork-join delay is the maximum of ``n`` concurrent transfer delays; the
paper measures those delays to follow an exponentially modified Gaussian (EMG) and predicts the
maximum by the n-th order statistic.

EMG: ``X = G + E`` with ``G ~ Normal(mu, sigma^2)`` and ``E ~ Exponential(mean tau, rate
lambda = 1/tau)``, independent. Mean ``mu + tau``, variance ``sigma^2 + tau^2``, skewness
``2 tau^3 / (sigma^2 + tau^2)^(3/2)`` (always in ``(0, 2)``). The paper states the model in
words; the equations are numbered here. With ``u = (x - mu) / sigma``:

    F(x)     = Phi(u) - exp(-(x - mu)/tau + sigma^2/(2 tau^2)) Phi(u - sigma/tau)        (1)
    1 - F(x) = Phi(-u) + exp(-(x - mu)/tau + sigma^2/(2 tau^2)) Phi(u - sigma/tau)       (2)

Maximum of ``n`` i.i.d. delays: ``P(M <= t) = F(t)^n`` (3) and ``E[M] = int x dF(x)^n = a +
int_a^inf (1 - F(x)^n) dx`` (4) for any ``a`` far enough below the bulk of ``M``; ``(4)`` is
integrated by adaptive quadrature between the ``1e-13`` and ``1 - 1e-13`` quantiles of ``M``
(quadrature tolerance 1e-10 relative; the tails left out weigh below ``1e-12 (sigma + tau)``;
the tests check it against Monte Carlo and, for ``sigma -> 0``, the harmonic numbers to 1e-6).

Fitting: method of moments (mean, variance, skewness; the skewness is clipped into the EMG's
range), then maximum likelihood from there (Nelder-Mead on standardised data, log-scale
parameters; ``sigma`` and ``tau`` floored at 1e-3 sample standard deviations).

Caveats: transfers are assumed i.i.d.; concurrent transfers that share a link are positively
correlated in practice, which makes ``expected_max`` an overestimate. Seconds throughout.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import integrate, optimize, stats
from scipy.special import erfcx, log_ndtr

__all__ = ["EMG", "fit_emg", "fit_emg_moments"]

_EPS = 1e-13  # tail mass left out of the quadrature in eq. (4)
_SQRT2 = math.sqrt(2.0)
_FLOOR = 1e-3  # smallest fitted sigma and tau, in sample standard deviations


@dataclass(frozen=True)
class EMG:
    """Exponentially modified Gaussian ``Normal(mu, sigma) + Exponential(mean tau)``, seconds."""

    mu: float
    sigma: float
    tau: float

    def __post_init__(self) -> None:
        if not math.isfinite(self.mu):
            raise ValueError(f"mu must be finite, got {self.mu!r}")
        for name in ("sigma", "tau"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be positive and finite, got {value!r}")

    @property
    def rate(self) -> float:
        """lambda = 1 / tau, the exponential part's rate (per second)."""
        return 1.0 / self.tau

    @property
    def mean(self) -> float:
        return self.mu + self.tau

    @property
    def var(self) -> float:
        return self.sigma**2 + self.tau**2

    @property
    def skewness(self) -> float:
        return 2 * self.tau**3 / self.var**1.5

    def _scipy(self) -> stats.rv_continuous:
        return stats.exponnorm(self.tau / self.sigma, loc=self.mu, scale=self.sigma)

    def pdf(self, x: ArrayLike) -> NDArray[np.float64]:
        return np.asarray(self._scipy().pdf(x), dtype=np.float64)

    def logsf(self, x: ArrayLike) -> NDArray[np.float64]:
        """``log(1 - F(x))`` from eq. (2), accurate far into the upper tail."""
        u = (np.asarray(x, dtype=np.float64) - self.mu) / self.sigma
        r = self.sigma / self.tau
        return np.logaddexp(log_ndtr(-u), -u * r + r * r / 2 + log_ndtr(u - r))  # eq. (2)

    def logcdf(self, x: ArrayLike) -> NDArray[np.float64]:
        """``log F(x)``: eq. (1) below ``mu``, ``log1p(-sf)`` from eq. (2) above.

        Below ``mu`` eq. (1) is rewritten with ``erfcx(z) = exp(z^2) erfc(z)`` as
        ``F = exp(-u^2/2) (erfcx(-u/sqrt2) - erfcx((r - u)/sqrt2)) / 2``, ``r = sigma/tau``, which
        does not underflow. The difference still cancels when ``r`` is small: it loses a few
        digits at the fit's floor ``r = 1e-3``, more as ``r -> 0``.
        """
        u = (np.asarray(x, dtype=np.float64) - self.mu) / self.sigma
        r = self.sigma / self.tau
        neg = np.minimum(u, 0.0)
        diff = 0.5 * (erfcx(-neg / _SQRT2) - erfcx((r - neg) / _SQRT2))
        with np.errstate(divide="ignore", invalid="ignore"):
            lower = -0.5 * neg * neg + np.where(diff > 0, np.log(diff), -np.inf)  # eq. (1)
            upper = np.log1p(-np.exp(self.logsf(np.maximum(u, 0.0) * self.sigma + self.mu)))
        return np.where(u < 0, lower, upper)

    def cdf(self, x: ArrayLike) -> NDArray[np.float64]:
        return np.exp(self.logcdf(x))

    def ppf(self, q: ArrayLike) -> NDArray[np.float64]:
        """Quantile ``F^-1(q)`` for ``0 < q < 1``."""
        qs = np.asarray(q, dtype=np.float64)
        bad = ~((qs > 0) & (qs < 1))
        if np.any(bad):
            raise ValueError(f"q must lie strictly between 0 and 1, got {qs[bad].tolist()}")
        return np.vectorize(lambda p: self._quantile(math.log(p), math.log1p(-p)))(qs)

    def sample(self, n: int, rng: np.random.Generator) -> NDArray[np.float64]:
        """``n`` i.i.d. delays drawn with ``rng`` (seconds)."""
        return rng.normal(self.mu, self.sigma, n) + rng.exponential(self.tau, n)

    # --- maximum of n i.i.d. delays (gillis §IV-A: the slowest of n workers) ---------------------

    def max_cdf(self, t: ArrayLike, n: int) -> NDArray[np.float64]:
        """``P(max of n delays <= t) = F(t)^n``, eq. (3)."""
        return np.exp(_check_n(n) * self.logcdf(t))

    def max_percentile(self, q: float, n: int) -> float:
        """Level-``q`` quantile of the maximum of ``n`` delays: ``F^-1(q^(1/n))`` by eq. (3)."""
        if not 0.0 < q < 1.0:
            raise ValueError(f"q must lie strictly between 0 and 1, got {q!r}")
        log_p = math.log(q) / _check_n(n)  # log of F at the answer
        return self._quantile(log_p, math.log(-math.expm1(log_p)))

    def expected_max(self, n: int) -> float:
        """``E[max of n i.i.d. delays]`` by eq. (4), numeric integration (seconds); the mean
        itself for n = 1 (the integral of a sharply bent F can miss it by 1e-5)."""
        n = _check_n(n)
        if n == 1:
            return self.mean
        lo, hi = self.max_percentile(_EPS, n), self.max_percentile(1 - _EPS, n)

        def exceed(x: float) -> float:  # 1 - F(x)^n, without cancellation near F = 1
            return float(-np.expm1(n * self.logcdf(x)))

        scale = self.sigma + self.tau
        kink = [self.mu] if lo < self.mu < hi else None  # where a small sigma bends F sharply
        area, _ = integrate.quad(
            exceed, lo, hi, epsabs=1e-12 * scale, epsrel=1e-10, limit=200, points=kink
        )
        return lo + area

    def _quantile(self, log_p: float, log_s: float) -> float:
        """Solve ``F(x) = p`` given ``log p`` and ``log(1 - p)``, on whichever side is precise."""
        if log_p <= math.log(0.5):
            return _bracketed_root(lambda x: float(self.logcdf(x)) - log_p, self.mean, self)
        return _bracketed_root(lambda x: log_s - float(self.logsf(x)), self.mean, self)


def fit_emg_moments(samples: ArrayLike) -> EMG:
    """Method-of-moments EMG from mean ``m``, standard deviation ``s`` and skewness.

    ``tau = s (skew / 2)^(1/3)``, ``sigma^2 = s^2 - tau^2``, ``mu = m - tau``. The sample skewness
    is clipped into ``[0.01, 1.98]`` (the EMG's range is ``(0, 2)``).
    """
    x = _check_samples(samples)
    m, s = float(np.mean(x)), float(np.std(x, ddof=1))
    skew = float(np.clip(stats.skew(x, bias=False), 0.01, 1.98))
    tau = s * (skew / 2) ** (1 / 3)
    return EMG(m - tau, math.sqrt(s * s - tau * tau), tau)


def fit_emg(samples: ArrayLike, *, method: Literal["mle", "moments"] = "mle") -> EMG:
    """Fit an EMG to measured delays (seconds): maximum likelihood started from the moments fit.

    A purely exponential (or purely normal) sample puts the likelihood's maximum on the boundary
    ``sigma -> 0`` (``tau -> 0``); both are floored at ``1e-3`` sample standard deviations, which
    changes no quantile noticeably and keeps the EMG proper.
    """
    if method not in ("mle", "moments"):
        raise ValueError(f"method must be 'mle' or 'moments', got {method!r}")
    x = _check_samples(samples)
    start = fit_emg_moments(x)
    if method == "moments":
        return start
    m, s = float(np.mean(x)), float(np.std(x, ddof=1))
    z = (x - m) / s  # standardised, so the optimiser sees O(1) numbers

    def nll(theta: NDArray[np.float64]) -> float:
        mu, log_sigma, log_tau = np.clip(theta, -30.0, 30.0)  # keep exp() finite while exploring
        sigma, tau = math.exp(log_sigma), math.exp(log_tau)
        return -float(np.sum(stats.exponnorm.logpdf(z, tau / sigma, loc=mu, scale=sigma)))

    theta0 = np.array([(start.mu - m) / s, math.log(start.sigma / s), math.log(start.tau / s)])
    res = optimize.minimize(
        nll, theta0, method="Nelder-Mead", options={"xatol": 1e-8, "fatol": 1e-10, "maxiter": 4000}
    )
    mu = float(res.x[0])
    sigma, tau = (max(math.exp(t), _FLOOR) for t in res.x[1:])  # boundary optima: see docstring
    return EMG(m + s * mu, s * sigma, s * tau)


def _bracketed_root(f: Callable[[float], float], start: float, d: EMG) -> float:
    """Root of the increasing ``f`` by doubling steps out from ``start``, then Brent's method."""
    width = d.sigma + d.tau
    lo, step = start - width, width
    while f(lo) > 0:
        lo, step = lo - step, step * 2
    hi, step = start + width, width
    while f(hi) < 0:
        hi, step = hi + step, step * 2
    return float(optimize.brentq(f, lo, hi, xtol=1e-14 * (abs(start) + width), rtol=1e-14))


def _check_n(n: int) -> int:
    try:
        whole = not isinstance(n, bool) and int(n) == n and n >= 1
    except (TypeError, ValueError, OverflowError):
        whole = False
    if not whole:
        raise ValueError(
            f"n (the number of concurrent transfers) must be an integer >= 1, got {n!r}"
        )
    return int(n)


def _check_samples(samples: ArrayLike) -> NDArray[np.float64]:
    x = np.asarray(samples, dtype=np.float64)
    if x.ndim != 1 or x.size < 10 or not np.all(np.isfinite(x)):
        raise ValueError(
            f"samples must be a 1-d array of at least 10 finite delays, got shape {x.shape}"
        )
    if float(np.ptp(x)) <= 1e-12 * float(np.max(np.abs(x))):
        raise ValueError("samples have zero spread; an EMG needs sigma > 0 and tau > 0")
    return x
