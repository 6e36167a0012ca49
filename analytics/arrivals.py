"""Arrival processes as Markovian Arrival Processes (BATCH §IV eq. 11-16, §III-A).

A MAP with n phases is a pair of n x n rate matrices in 1/s: D0 holds the hidden phase changes
(off-diagonal >= 0, negative diagonal), D1 the changes that emit an arrival (>= 0), and
Q = D0 + D1 is an irreducible generator. BATCH's buffer CTMC (eq. 11) is built from exactly this
pair: Poisson is D0 = [-l], D1 = [l] (the chain of eq. 4), MMPP(2) is eq. 12, MAP(2) eq. 16.

With theta Q = 0, theta 1 = 1 and M = (-D0)^-1:
  rate            l = theta D1 1                      (fundamental arrival rate, 1/s)
  arrival phase   pi_a = theta D1 / l, the stationary vector of P = M D1 (phase just after one)
  moments         E[X^k] = k! pi_a M^k 1              (stationary inter-arrival time X, s^k)
  lag-k acf       (pi_a M P^k M 1 - E[X]^2) / Var[X]

:func:`fit_map2` stands in for the KPC-Toolbox step of the Profiler (§III-A): it matches the mean,
SCV, E[X^3] and lag-1 autocorrelation of a trace with a MAP(2) (steps in ``_mapfit``), or returns
Poisson when the trace is not measurably bursty.

Assumptions and caveats:
  - The trace is stationary; only lag-1 correlation is fitted, and a MAP(2)'s acf then decays
    geometrically (rho_k = rho_1 g^(k-1)), so longer-range burstiness is not reproduced.
  - A MAP(2) has SCV >= 0.5; with SCV > 1 its E[X^3] exceeds 1.5 E[X^2]^2 / E[X], and with a
    hyperexponential marginal rho_1 < (SCV - 1) / (2 SCV) < 0.5. Beyond these, fit_map2 returns
    the closest feasible fit and says so in ``MapFit.note``.
  - :meth:`MAP.sample` starts just after an arrival in phase pi_a, so its output is stationary.
    It is exact: Poisson draws exponentials, a MAP2 its arrival-phase chain (O(N) whatever the
    rates), more phases simulate their phase path, whose cost grows with the phase changes.
Complexity: construction O(n^3); moment(k) O(k n^3); sample(N) O(N) for n <= 2, else
O(E n log C) for E simulated phase pieces (about N / 32 plus the phase changes) in chunks of C;
fit_map2 O(N) plus O(1) matching.
"""

from __future__ import annotations

import math
from typing import Any, NoReturn

import numpy as np
import numpy.typing as npt
from scipy.sparse.csgraph import connected_components

from raysrv.analytics._mapfit import (
    Map2Sampler,
    MapFit,
    MapMoments,
    Matrix,
    PieceSampler,
    map_moments,
    match_map2,
    stationary,
    trace_moments,
)

__all__ = [
    "MAP",
    "MAP2",
    "MMPP2",
    "MapFit",
    "MapMoments",
    "Poisson",
    "fit_map2",
    "map2_from_moments",
]

MIN_TRACE = 30  # inter-arrival times fit_map2 needs at the least
POISSON_Z = 4.0  # fit_map2 keeps Poisson unless SCV or rho_1 is this many std errors away
_ROW_TOL = 1e-9  # |row sum of D0 + D1| allowed, relative to the largest rate


class MAP:
    """A Markovian Arrival Process (D0, D1), validated and immutable; times in seconds."""

    __slots__ = ("_D0", "_D1", "_theta", "_pi_a", "_M", "_P", "_rate", "_sampler")
    _D0: Matrix
    _D1: Matrix
    _theta: Matrix
    _pi_a: Matrix
    _M: Matrix
    _P: Matrix
    _rate: float
    _sampler: Map2Sampler | PieceSampler | None

    def __init__(self, D0: npt.ArrayLike, D1: npt.ArrayLike) -> None:
        d0, d1 = _checked(D0, D1)
        theta = stationary(d0 + d1)
        rate = float(theta @ d1.sum(axis=1))
        M = np.linalg.inv(-d0)
        self._set("_D0", d0)
        self._set("_D1", d1)
        self._set("_theta", theta)
        self._set("_rate", rate)
        self._set("_pi_a", (theta @ d1) / rate)
        self._set("_M", M)
        self._set("_P", M @ d1)
        self._set("_sampler", _sampler(d0, d1, M @ d1, rate))

    def _set(self, name: str, value: Any) -> None:
        if isinstance(value, np.ndarray):
            value.flags.writeable = False
        object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self._args(), getattr(self, "_fit", None)))

    def _args(self) -> tuple[Any, ...]:
        return (self._D0, self._D1)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(D0={_fmt(self._D0)}, D1={_fmt(self._D1)})"

    @property
    def phases(self) -> int:
        return int(self._D0.shape[0])

    @property
    def D0(self) -> Matrix:
        """Hidden phase-change rates (1/s), read-only."""
        return self._D0

    @property
    def D1(self) -> Matrix:
        """Arrival rates by phase change (1/s), read-only."""
        return self._D1

    @property
    def rate(self) -> float:
        """Fundamental arrival rate l = theta D1 1 (1/s)."""
        return self._rate

    @property
    def mean_interarrival(self) -> float:
        return 1.0 / self._rate

    @property
    def scv(self) -> float:
        """Squared coefficient of variation of the stationary inter-arrival time."""
        m1 = self.moment(1)
        return self.moment(2) / (m1 * m1) - 1.0

    @property
    def skewness(self) -> float:
        m1, m2, m3 = (self.moment(k) for k in (1, 2, 3))
        var = m2 - m1 * m1
        return (m3 - 3.0 * m1 * var - m1**3) / var**1.5

    @property
    def lag1_autocorrelation(self) -> float:
        return self.autocorrelation(1)

    def moment(self, k: int) -> float:
        """E[X^k] = k! pi_a M^k 1 of the stationary inter-arrival time (s^k)."""
        if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
            raise ValueError(f"k must be an integer >= 1, got {k!r}")
        v = np.linalg.matrix_power(self._M, int(k)).sum(axis=1)
        return math.factorial(int(k)) * float(self._pi_a @ v)

    def autocorrelation(self, lag: int = 1) -> float:
        """Correlation of inter-arrival times ``lag`` apart: (pi_a M P^lag M 1 - m1^2) / var."""
        if isinstance(lag, bool) or not isinstance(lag, int | np.integer) or lag < 1:
            raise ValueError(f"lag must be an integer >= 1, got {lag!r}")
        m1, m2 = self.moment(1), self.moment(2)
        v = np.linalg.matrix_power(self._P, int(lag)) @ self._M.sum(axis=1)
        return (float(self._pi_a @ self._M @ v) - m1 * m1) / (m2 - m1 * m1)

    def stationary_phase(self) -> Matrix:
        """theta: the time-stationary phase distribution (theta (D0 + D1) = 0)."""
        return self._theta

    def arrival_phase(self) -> Matrix:
        """pi_a: the phase distribution just after an arrival (pi_a P = pi_a)."""
        return self._pi_a

    def next_arrival_phase_matrix(self) -> Matrix:
        """P = (-D0)^-1 D1: phase after the next arrival given the phase after this one."""
        return self._P

    def sample(self, n: int, rng: np.random.Generator) -> Matrix:
        """``n`` consecutive inter-arrival times (s), starting just after an arrival in pi_a."""
        n = _count(n)
        if self._sampler is None:
            return rng.exponential(self.mean_interarrival, size=n)
        start = int(rng.choice(self.phases, p=self._pi_a))
        return self._sampler.sample(n, start, rng)

    def arrival_times(self, n: int, rng: np.random.Generator) -> Matrix:
        """Times (s) of the next ``n`` arrivals after one at time 0."""
        return np.cumsum(self.sample(n, rng))


class MAP2(MAP):
    """A two-phase MAP (batch eq. 16). ``fit`` says how well it matched a trace, if fitted."""

    __slots__ = ("_fit",)
    _fit: MapFit | None

    def __init__(self, D0: npt.ArrayLike, D1: npt.ArrayLike) -> None:
        super().__init__(D0, D1)
        if self.phases != 2:
            raise ValueError(f"D0 must be 2x2 for a MAP2, got shape {self._D0.shape}")
        self._set("_fit", None)

    @property
    def fit(self) -> MapFit | None:
        """Target and achieved moments when made by :func:`fit_map2`, else None."""
        return self._fit


class MMPP2(MAP2):
    """Two-phase Markov-modulated Poisson process (batch eq. 12): Poisson at ``rate_i`` in phase
    i, which it leaves at ``switch_i`` (1/s). Equal rates make it a Poisson process."""

    __slots__ = ("_params",)
    _params: tuple[float, float, float, float]

    def __init__(self, rate1: float, rate2: float, switch1: float, switch2: float) -> None:
        r1, r2 = _nonneg(rate1, "rate1"), _nonneg(rate2, "rate2")
        s1, s2 = _positive(switch1, "switch1"), _positive(switch2, "switch2")
        if r1 == 0.0 and r2 == 0.0:
            raise ValueError("rate1 and rate2 are both 0: an MMPP2 needs a positive rate")
        super().__init__([[-(r1 + s1), s1], [s2, -(r2 + s2)]], [[r1, 0.0], [0.0, r2]])
        self._set("_params", (r1, r2, s1, s2))

    def _args(self) -> tuple[Any, ...]:
        return self._params

    def __repr__(self) -> str:
        r1, r2, s1, s2 = self._params
        return f"MMPP2(rate1={r1!r}, rate2={r2!r}, switch1={s1!r}, switch2={s2!r})"

    @property
    def rate1(self) -> float:
        return float(self._params[0])

    @property
    def rate2(self) -> float:
        return float(self._params[1])

    @property
    def switch1(self) -> float:
        return float(self._params[2])

    @property
    def switch2(self) -> float:
        return float(self._params[3])


class Poisson(MAP):
    """A Poisson process of ``rate`` arrivals/s: one phase, D0 = [-rate], D1 = [rate]."""

    __slots__ = ()

    def __init__(self, rate: float) -> None:
        r = _positive(rate, "rate")
        super().__init__([[-r]], [[r]])

    def _args(self) -> tuple[Any, ...]:
        return (self._rate,)

    def __repr__(self) -> str:
        return f"Poisson(rate={self._rate!r})"


def fit_map2(interarrivals: npt.ArrayLike, *, poisson_z: float = POISSON_Z) -> MAP2:
    """Fit a MAP2 to a trace of inter-arrival times (s) by its moments (batch §III-A).

    A trace that is not measurably bursty, |SCV - 1| <= 2 z / sqrt(N) and |rho_1| <= z / sqrt(N)
    with z = ``poisson_z``, gives Poisson at the trace's rate: an MMPP2 with equal rates (its
    switching then changes nothing), so the type is always MAP2. 2 / sqrt(N) and 1 / sqrt(N) are
    the large-N standard errors of the sample SCV and lag-1 autocorrelation of i.i.d.
    exponential gaps; z = 4 keeps a Poisson trace with probability about 0.9999. Any other trace
    gets the moment match of ``_mapfit``. ``.fit`` holds target, achieved moments and notes.
    """
    x = _trace(interarrivals)
    z = _nonneg(poisson_z, "poisson_z")
    target = trace_moments(x)
    noise = z / math.sqrt(x.size)
    if abs(target.scv - 1.0) <= 2.0 * noise and abs(target.lag1) <= noise:
        rate = 1.0 / target.mean
        model: MAP2 = MMPP2(rate1=rate, rate2=rate, switch1=rate, switch2=rate)
        return _with_fit(model, target, poisson=True, note="", n=x.size)
    D0, D1, note = match_map2(target)
    return _with_fit(MAP2(D0, D1), target, poisson=False, note=note, n=x.size)


def map2_from_moments(mean: float, scv: float, third: float, lag1: float) -> MAP2:
    """The MAP2 closest to these moments (s, -, s^3, -), with ``.fit`` as in :func:`fit_map2`."""
    m1, c2 = _positive(mean, "mean"), _positive(scv, "scv")
    m3, rho = _positive(third, "third"), _number(lag1, "lag1")
    if not -1.0 < rho < 1.0:
        raise ValueError(f"lag1 must lie in (-1, 1), got {lag1!r}")
    target = MapMoments(mean=m1, scv=c2, third=m3, lag1=rho)
    D0, D1, note = match_map2(target)
    return _with_fit(MAP2(D0, D1), target, poisson=False, note=note, n=None)


def _sampler(D0: Matrix, D1: Matrix, P: Matrix, rate: float) -> Map2Sampler | PieceSampler | None:
    """Exponential gaps for one phase, the arrival-phase chain for two, phase pieces beyond."""
    if D0.shape[0] == 1:
        return None
    return Map2Sampler(D0, D1, P) if D0.shape[0] == 2 else PieceSampler(D0, D1, rate)


def _with_fit(model: MAP2, target: MapMoments, *, poisson: bool, note: str, n: int | None) -> MAP2:
    got = map_moments(model.D0, model.D1)
    object.__setattr__(model, "_fit", MapFit(target, got, poisson, note, n))
    return model


def _rebuild(cls: type[MAP], args: tuple[Any, ...], fit: MapFit | None) -> MAP:
    model = cls(*args)
    if fit is not None:
        object.__setattr__(model, "_fit", fit)
    return model


def _checked(D0: npt.ArrayLike, D1: npt.ArrayLike) -> tuple[Matrix, Matrix]:
    """Copies of D0, D1 as float arrays, or ValueError naming the argument and the value."""
    d0, d1 = _square(D0, "D0"), _square(D1, "D1")
    if d0.shape != d1.shape:
        raise ValueError(f"D0 and D1 must have the same shape, got {d0.shape} and {d1.shape}")
    off = ~np.eye(d0.shape[0], dtype=bool)
    if np.any(d0[off] < 0):
        i, j = np.argwhere((d0 < 0) & off)[0]
        raise ValueError(f"D0 off-diagonal entries must be >= 0, got D0[{i}, {j}] = {d0[i, j]}")
    if np.any(d1 < 0):
        i, j = np.argwhere(d1 < 0)[0]
        raise ValueError(f"D1 entries must be >= 0, got D1[{i}, {j}] = {d1[i, j]}")
    if not np.any(d1 > 0):
        raise ValueError(f"D1 must have a positive entry (the arrival rate is 0), got {_fmt(d1)}")
    rows = (d0 + d1).sum(axis=1)
    if np.any(np.abs(rows) > _ROW_TOL * max(np.abs(d0).max(), np.abs(d1).max())):
        raise ValueError(
            f"rows of D0 + D1 must sum to 0, got row sums {_fmt(rows)} for D0={_fmt(d0)}, "
            f"D1={_fmt(d1)}"
        )
    if not _irreducible(d0 + d1):
        raise ValueError(
            "D0 + D1 must be irreducible (every phase reaches every other), "
            f"got D0={_fmt(d0)}, D1={_fmt(d1)}"
        )
    return d0, d1


def _square(a: npt.ArrayLike, name: str) -> Matrix:
    try:
        m = np.array(a, dtype=float)  # a copy: the caller's array stays theirs
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} must be a matrix of numbers: {err}") from None
    if m.ndim != 2 or m.shape[0] != m.shape[1] or m.shape[0] == 0:
        raise ValueError(f"{name} must be a non-empty square matrix, got shape {m.shape}")
    if not np.all(np.isfinite(m)):
        raise ValueError(f"{name} must be finite, got {_fmt(m)}")
    return m


def _irreducible(Q: Matrix) -> bool:
    """One strongly connected component in the graph of Q's nonzero rates."""
    count, _ = connected_components(Q != 0, directed=True, connection="strong")
    return bool(count == 1)


def _positive(value: float, name: str) -> float:
    v = _number(value, name)
    if not v > 0.0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return v


def _nonneg(value: float, name: str) -> float:
    v = _number(value, name)
    if not v >= 0.0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return v


def _number(value: float, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return float(value)


def _count(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
        raise ValueError(f"n must be an integer >= 0, got {n!r}")
    return int(n)


def _trace(interarrivals: npt.ArrayLike) -> Matrix:
    try:
        x = np.asarray(interarrivals, dtype=float)
    except (TypeError, ValueError) as err:
        raise ValueError(f"interarrivals must be numbers (seconds): {err}") from None
    if x.ndim != 1:
        raise ValueError(f"interarrivals must be one-dimensional, got shape {x.shape}")
    if x.size < MIN_TRACE:
        raise ValueError(f"interarrivals needs at least {MIN_TRACE} values, got {x.size}")
    bad = np.flatnonzero(~(np.isfinite(x) & (x > 0)))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"interarrivals must be positive and finite (seconds), got interarrivals[{i}] = {x[i]}"
        )
    return x


def _fmt(a: Matrix) -> str:
    """Nested-list text of a vector or matrix, six significant digits (reads back as Python)."""
    if np.ndim(a) == 1:
        return "[" + ", ".join(f"{float(v) + 0.0:.6g}" for v in a) + "]"
    return "[" + ", ".join(_fmt(row) for row in a) + "]"
