"""MAP(2) moment matching and MAP sampling behind ``raysrv.analytics.arrivals`` (BATCH §III-A,
§IV eq. 16). Private: the classes and their documentation live in ``arrivals``.

The BATCH Profiler fits a MAP(2) to the observed inter-arrival times with the KPC-Toolbox; this is
our own matcher for the same four descriptors: mean, SCV, third raw moment E[X^3] and lag-1
autocorrelation rho_1. Everything here works on plain (D0, D1) arrays in seconds. The samplers
behind ``MAP.sample`` live here too: :class:`Map2Sampler` (two phases, exact, O(N) whatever the
rates) and :class:`PieceSampler` (any number of phases, cost grows with the phase changes).

Steps of :func:`match_map2`:
  (1) SCV > 1: a two-branch hyperexponential (H2) matches mean, SCV and E[X^3] in closed form,
      as the two-point moment problem on the branch means r_k = E[X^k] / k!. E[X^3] below the H2
      floor 1.5 E[X^2]^2 / E[X] (where one branch mean reaches 0) is raised just above it.
  (2) With D0 = -diag(mu), every embedded phase chain P with alpha P = alpha keeps that marginal;
      for two phases they are P = (1 - g) 1 alpha + g I, D1 = diag(mu) P, and
      rho_1 = g (SCV - 1) / (2 SCV). g is clipped to [-min_i alpha_i / (1 - alpha_i), G_MAX], the
      range where D1 >= 0 and Q stays irreducible. Unless g was clipped, (1)-(2) is the answer:
      it matches all four moments, or all but an E[X^3] no MAP2 of that SCV reaches.
  (3) Otherwise (SCV <= 1, or a clip in (1)-(2)): bounded least squares over two acyclic MAP(2)
      families with D0 = [[-1, (1-a)], [0, -l2]] (after the canonical forms of Bodrog, Heindl,
      Horvath and Telek, 2008): D1 = [[a, 0], [b l2, (1-b) l2]] (g = a (1 - b) >= 0) and
      D1 = [[0, a], [b l2, (1-b) l2]] (g = -a b <= 0), from several starts; the mean is matched
      afterwards by scaling time. Residuals: relative SCV error, lag-1 error relative to
      max(|rho_1|, 0.05), and 0.1 log(E[X^3] / target) so mean, SCV and rho_1 come first.
      The solver is scipy's dogbox with a gradient tolerance far below the default: near SCV 1
      the renewal start already has a residual of ~1e-4, and the match lies far from it (with
      the defaults the search stopped there or ran out of evaluations, 1e-4 from the target).
  (4) The candidate with the least weighted residual wins; what it misses is explained in a note.

Cost: O(1) for (1)-(2). (3) is at most 16 bounded 3-parameter least-squares solves on 2x2
matrices (up to 2 renewal starts and 6 fixed ones per family); it stops at the first exact match,
so it is slowest when no MAP2 reaches the target and every start runs. Each solve stops after
``SOLVE_EVALUATIONS`` evaluations of the residuals, and the search after ``SEARCH_EVALUATIONS``
over all its solves: the fits run in threads of the process that serves the queries (plans,
``ctmc``, the analytic autoscaler) and hold the interpreter's lock while they run. Unbounded, a
target no MAP2 reaches (SCV > 1 with a negative rho_1, as the arrivals of an overloaded ingress)
took 200-800 ms of one core; bounded, at most 143 ms, with fits as close
(``bench/RESULTS.md``, "Overload"; ``tests/unit/analytics/test_arrivals.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.optimize import OptimizeResult, least_squares

__all__ = [
    "MapFit",
    "MapMoments",
    "Matrix",
    "Map2Sampler",
    "PieceSampler",
    "map_moments",
    "match_map2",
    "stationary",
    "trace_moments",
]

Matrix = npt.NDArray[np.float64]

G_MAX = 0.999  # largest eigenvalue of P we fit: g -> 1 switches phase ever more rarely
THIRD_MARGIN = 1e-3  # E[X^3] is kept this far (relatively) above the H2 floor
THIRD_WEIGHT = 0.1  # of the log E[X^3] residual in step (3): mean, SCV and rho_1 come first
# starts (log l2, a, b) of step (3)
_STARTS = [(z, a, b) for z in (-2.0, 2.0) for a, b in ((0.5, 0.5), (0.2, 0.8), (0.8, 0.2))]
_BOUNDS = ([-12.0, 0.0, 1e-6], [12.0, 1.0 - 1e-6, 1.0])
_PENALTY = np.full(3, 1e3)
PIECE_ARRIVALS = 32.0  # sampling: mean arrivals in one piece of a phase sojourn, at most
MAX_PIECES = 1 << 17  # sampling: phase pieces simulated per chunk (memory bound)
_SOLVED = 1e-12  # a least-squares cost this small is a match (residuals ~1e-6)
SOLVE_EVALUATIONS = 50  # of the residuals, by one least-squares solve of step (3) at most
SEARCH_EVALUATIONS = 200  # by all the solves of one search: no further start once reached


@dataclass(frozen=True)
class MapMoments:
    """Descriptors of a stationary inter-arrival sequence: seconds, s^3 for ``third``."""

    mean: float
    scv: float
    third: float
    lag1: float

    @property
    def skewness(self) -> float:
        """E[(X - mean)^3] / sd^3, NaN for a constant sequence."""
        var = self.scv * self.mean**2
        if var <= 0.0:
            return math.nan
        return (self.third - 3.0 * self.mean * var - self.mean**3) / var**1.5


@dataclass(frozen=True)
class MapFit:
    """How well a fitted MAP2 reproduces its target (``fit_map2``).

    ``rel_error`` maps mean, scv, third and lag1 to |achieved - target| / |target|; the lag-1
    error of a near-zero target is large by construction (a Poisson fallback has achieved 0).
    ``note`` is empty when every moment was matched, else it says which were not and why.
    """

    target: MapMoments
    achieved: MapMoments
    poisson_fallback: bool
    note: str = ""
    n_samples: int | None = None

    @property
    def rel_error(self) -> dict[str, float]:
        names = ("mean", "scv", "third", "lag1")
        return {k: _rel(getattr(self.achieved, k), getattr(self.target, k)) for k in names}

    @property
    def max_rel_error(self) -> float:
        """Worst relative error over the moments that come first: mean, SCV and lag-1."""
        err = self.rel_error
        return max(err["mean"], err["scv"], err["lag1"])


def _rel(got: float, want: float) -> float:
    if want == 0.0:
        return 0.0 if got == 0.0 else math.inf
    return abs(got - want) / abs(want)


def stationary(Q: Matrix) -> Matrix:
    """theta with theta Q = 0 and theta 1 = 1, for an irreducible Q (generator, or P - I)."""
    A = Q.T.copy()
    A[-1, :] = 1.0
    rhs = np.zeros(Q.shape[0])
    rhs[-1] = 1.0
    theta = np.clip(np.linalg.solve(A, rhs), 0.0, None)
    return theta / theta.sum()


def map_moments(D0: Matrix, D1: Matrix) -> MapMoments:
    """Mean, SCV, E[X^3] and lag-1 autocorrelation of a MAP's stationary inter-arrival time."""
    M = np.linalg.inv(-D0)
    P = M @ D1
    pi_a = stationary(P - np.eye(P.shape[0]))
    v1 = M.sum(axis=1)
    v2 = M @ v1
    m1, m2, m3 = float(pi_a @ v1), 2.0 * float(pi_a @ v2), 6.0 * float(pi_a @ (M @ v2))
    cross = float((pi_a @ M) @ (P @ v1))  # E[X_0 X_1] = pi_a M P M 1
    var = m2 - m1 * m1
    return MapMoments(mean=m1, scv=var / (m1 * m1), third=m3, lag1=(cross - m1 * m1) / var)


def trace_moments(x: Matrix) -> MapMoments:
    """Sample moments of an inter-arrival trace (population variance, pooled-mean lag-1 acf)."""
    mean = float(x.mean())
    dev = x - mean
    var = float(np.mean(dev * dev))
    lag1 = float(np.mean(dev[:-1] * dev[1:])) / var if var > 0.0 else 0.0
    return MapMoments(mean=mean, scv=var / mean**2, third=float(np.mean(x**3)), lag1=lag1)


def match_map2(goal: MapMoments) -> tuple[Matrix, Matrix, str]:
    """(D0, D1) of the MAP2 closest to ``goal`` (steps (1)-(4)), and a note on what it misses."""
    candidates: list[tuple[Matrix, Matrix]] = []
    if goal.scv > 1.0 + 1e-9:
        D0, D1, acf_matched = _h2_map(goal)
        if acf_matched:  # a raised E[X^3] is no loss: no MAP2 of SCV > 1 goes below the floor
            return D0, D1, _explain(goal, map_moments(D0, D1))
        candidates.append((D0, D1))
    candidates += _search(goal)
    D0, D1 = min(candidates, key=lambda c: _cost(map_moments(*c), goal))
    return D0, D1, _explain(goal, map_moments(D0, D1))


def _h2_branches(m1: float, m2: float, m3: float) -> tuple[Matrix, Matrix]:
    """Step (1): branch probabilities alpha and rates mu of the H2 with raw moments m1, m2, m3."""
    r1, r2, r3 = m1, m2 / 2.0, m3 / 6.0
    a = (r3 - r1 * r2) / (r2 - r1 * r1)  # branch means solve x^2 = a x + b
    b = r2 - a * r1
    x1 = (a + math.sqrt(a * a + 4.0 * b)) / 2.0
    x2 = -b / x1  # the product of the roots is -b: no cancellation for a tiny x2
    p = (r1 - x2) / (x1 - x2)
    return np.array([p, 1.0 - p]), np.array([1.0 / x1, 1.0 / x2])


def _h2_map(goal: MapMoments) -> tuple[Matrix, Matrix, bool]:
    """Steps (1)-(2); the flag says that rho_1 was matched (g needed no clip)."""
    m1 = goal.mean
    m2 = (1.0 + goal.scv) * m1 * m1
    m3 = max(goal.third, 1.5 * m2 * m2 / m1 * (1.0 + THIRD_MARGIN))
    alpha, mu = _h2_branches(m1, m2, m3)
    want = goal.lag1 / _acf_cap(goal.scv)
    low = float(alpha.min())  # D1 >= 0 needs g >= -alpha_i / (1 - alpha_i) for each i
    g = min(max(want, -low / (1.0 - low)), G_MAX)
    P = (1.0 - g) * np.outer(np.ones(2), alpha) + g * np.eye(2)
    return np.diag(-mu), mu[:, None] * P, g == want


def _acf_cap(scv: float) -> float:
    """Supremum of rho_1 over MAP2s with a hyperexponential marginal of this SCV (g -> 1)."""
    return (scv - 1.0) / (2.0 * scv)


def _family(z: Matrix, family: int) -> tuple[Matrix, Matrix]:
    """Step (3): the acyclic MAP2 with l1 = 1, l2 = exp(z0), a = z1, b = z2."""
    l2, a, b = math.exp(z[0]), z[1], z[2]
    D0 = np.array([[-1.0, 1.0 - a], [0.0, -l2]])
    row0 = [a, 0.0] if family == 0 else [0.0, a]
    return D0, np.array([row0, [b * l2, (1.0 - b) * l2]])


def _moments2(D0: Matrix, D1: Matrix) -> MapMoments:
    """:func:`map_moments` for two phases in plain floats (the search calls it many times)."""
    (a, b), (c, d) = (-D0).tolist()
    (e, f), (g, h) = D1.tolist()
    det = a * d - b * c
    m00, m01, m10, m11 = d / det, -b / det, -c / det, a / det  # M = (-D0)^-1
    p01, p10 = m00 * f + m01 * h, m10 * e + m11 * g  # off-diagonal of P = M D1
    w0, w1 = p10 / (p01 + p10), p01 / (p01 + p10)  # pi_a
    v0, v1 = m00 + m01, m10 + m11  # M 1
    u0, u1 = m00 * v0 + m01 * v1, m10 * v0 + m11 * v1  # M^2 1
    t0, t1 = m00 * u0 + m01 * u1, m10 * u0 + m11 * u1  # M^3 1
    m1, m2, m3 = w0 * v0 + w1 * v1, 2.0 * (w0 * u0 + w1 * u1), 6.0 * (w0 * t0 + w1 * t1)
    pv0, pv1 = v0 + p01 * (v1 - v0), v1 + p10 * (v0 - v1)  # P M 1, rows of P sum to 1
    cross = (w0 * m00 + w1 * m10) * pv0 + (w0 * m01 + w1 * m11) * pv1
    var = m2 - m1 * m1
    return MapMoments(mean=m1, scv=var / (m1 * m1), third=m3, lag1=(cross - m1 * m1) / var)


def _residuals(got: MapMoments, goal: MapMoments) -> Matrix:
    """Scale-free misfit of step (3): the mean is matched later by scaling time."""
    n3 = got.third / got.mean**3
    goal_n3 = goal.third / goal.mean**3
    return np.array(
        [
            (got.scv - goal.scv) / max(goal.scv, 1e-3),
            (got.lag1 - goal.lag1) / max(abs(goal.lag1), 0.05),
            THIRD_WEIGHT * math.log(n3 / goal_n3),
        ]
    )


def _cost(got: MapMoments, goal: MapMoments) -> float:
    return float(np.sum(_residuals(got, goal) ** 2))


def _family_residuals(z: Matrix, family: int, goal: MapMoments) -> Matrix:
    try:
        r = _residuals(_moments2(*_family(z, family)), goal)
    except (ValueError, ZeroDivisionError, OverflowError):
        return _PENALTY
    return r if np.all(np.isfinite(r)) else _PENALTY


def _search(goal: MapMoments) -> list[tuple[Matrix, Matrix]]:
    """Step (3): the likelier family first, the other unless it matched. rho_1 has the sign of
    g (SCV - 1) roughly, so family 0 (g >= 0) goes first when rho_1 and SCV - 1 agree in sign.
    Returns the best solution of each family tried, rescaled to the target mean."""
    found = []
    spent = [0]  # evaluations of the residuals, over every solve of this search
    for family in (0, 1) if (goal.lag1 >= 0.0) == (goal.scv >= 1.0) else (1, 0):
        best = _best_start(goal, family, spent)
        found.append(_rescaled(*_family(best.x, family), goal.mean))
        if best.cost < _SOLVED:
            break
    return found


def _best_start(goal: MapMoments, family: int, spent: list[int]) -> OptimizeResult:
    """Bounded least squares from each start in turn (moved into the bounds: a renewal start
    of an SCV at 1 has b of rounding size), stopping at an exact match, or once ``spent``
    (the search's evaluations so far, added to here) reaches ``SEARCH_EVALUATIONS``; the
    first start always runs."""
    best: OptimizeResult | None = None
    for start in _renewal_starts(goal) + _STARTS:
        inside = np.clip(start, *_BOUNDS)
        res = least_squares(
            _family_residuals,
            inside,
            bounds=_BOUNDS,
            method="dogbox",
            args=(family, goal),
            xtol=1e-10,
            ftol=1e-12,
            gtol=1e-14,
            max_nfev=SOLVE_EVALUATIONS,
        )
        spent[0] += res.nfev
        if best is None or res.cost < best.cost:
            best = res
        if best.cost < _SOLVED or spent[0] >= SEARCH_EVALUATIONS:
            break
    assert best is not None
    return best


def _renewal_starts(goal: MapMoments) -> list[tuple[float, float, float]]:
    """Starts at the renewal PH2 of the target marginal, when one exists (a = 0, b = P(phase 1)).

    Its Laplace transform is (c s + a0) / (s^2 + a1 s + a0); matching r_k = E[X^k] / k! gives
    a1 r1 - a0 r2 = 1 and a1 r2 - a0 r3 = r1, the phase rates are the roots of s^2 + a1 s + a0,
    and a start in the slower-to-leave phase 1 (rate l1, then on to l2) has weight 1 - c / l2.
    """
    r1, r2, r3 = goal.mean, (1.0 + goal.scv) * goal.mean**2 / 2.0, goal.third / 6.0
    det = r2 * r2 - r1 * r3
    if det == 0.0:
        return []
    a1, a0 = (r1 * r2 - r3) / det, (r1 * r1 - r2) / det
    disc = a1 * a1 - 4.0 * a0
    if disc < 0.0 or a0 <= 0.0 or a1 <= 0.0:
        return []
    c = a1 - a0 * r1
    starts = []
    for l1, l2 in _pairs((a1 - math.sqrt(disc)) / 2.0, (a1 + math.sqrt(disc)) / 2.0):
        b = 1.0 - c / l2
        if 0.0 < b <= 1.0:
            starts.append((math.log(l2 / l1), 0.0, b))
    return starts


def _pairs(x: float, y: float) -> tuple[tuple[float, float], tuple[float, float]]:
    return (x, y), (y, x)


def _rescaled(D0: Matrix, D1: Matrix, mean: float) -> tuple[Matrix, Matrix]:
    scale = map_moments(D0, D1).mean / mean  # rates scale inversely with time
    return D0 * scale, D1 * scale


def _explain(goal: MapMoments, got: MapMoments) -> str:
    """Step (4): which moments the chosen MAP2 misses, with the bound that forced it."""
    parts = []
    if abs(got.scv - goal.scv) > 1e-3 * goal.scv:
        why = " (a MAP2 has SCV >= 0.5)" if goal.scv < 0.5 else ""
        parts.append(f"SCV {got.scv:.4g} for {goal.scv:.4g}{why}")
    if abs(got.lag1 - goal.lag1) > 1e-3 * max(abs(goal.lag1), 1.0):
        cap = _acf_cap(goal.scv)
        why = f" (a MAP2 of this SCV has rho_1 < {cap:.4g})" if 0.0 < cap <= goal.lag1 else ""
        parts.append(f"lag-1 autocorrelation {got.lag1:.4g} for {goal.lag1:.4g}{why}")
    if abs(got.third - goal.third) > 1e-2 * goal.third:
        floor = 1.5 * ((1.0 + goal.scv) * goal.mean**2) ** 2 / goal.mean
        low = goal.scv > 1.0 and goal.third <= floor
        why = f" (a MAP2 of SCV > 1 needs E[X^3] > {floor:.4g})" if low else ""
        parts.append(f"E[X^3] {got.third:.4g} for {goal.third:.4g}{why}")
    return "closest feasible MAP2: " + "; ".join(parts) if parts else ""


class Map2Sampler:
    """Exact O(N) sampling of a MAP2 by its arrival-phase chain, however fast it switches.

    The phases just after arrivals, J_0, J_1, ..., are a Markov chain with matrix P; with two
    phases it is alternating runs of Geometric(1 - P_ii) length. Between arrivals started in
    phase i (o the other), each visit to a phase s lasts Exp(r_s), r_s = -D0_ss, and ends in a
    hidden move with probability q_s = D0_so / r_s, else in an arrival. So the number R of full
    i -> o -> i rounds is Geometric(1 - q_i q_o) - 1, independent of where the interval ends
    (in i with probability (1 - q_i) / (1 - q_i q_o)), and the gap is
    Gamma(R + 1, 1 / r_i) + Gamma(R + [ends in o], 1 / r_o). ``own[i, j]`` is the probability
    that it ends in i given the next phase j (Bayes with D1_sj / sum_l D1_sl).
    """

    def __init__(self, D0: Matrix, D1: Matrix, P: Matrix) -> None:
        self.exit = -np.diag(D0)
        q = np.array([D0[0, 1], D0[1, 0]]) / self.exit
        self.loop = float(q[0] * q[1])
        self.leave = 1.0 - np.diag(P)  # probability that J changes phase
        out = D1.sum(axis=1)
        share = np.divide(D1, out[:, None], out=np.zeros_like(D1), where=out[:, None] > 0)
        ends_own = ((1.0 - q) / (1.0 - self.loop))[:, None] * share  # P(ends in i, next j | i)
        self.own = np.divide(ends_own, P, out=np.ones_like(P), where=P > 0)

    def sample(self, n: int, start: int, rng: np.random.Generator) -> Matrix:
        phases = self._chain(n + 1, start, rng)
        i, j = phases[:-1], phases[1:]
        ends_in_o = rng.random(n) >= self.own[i, j]
        rounds = rng.geometric(1.0 - self.loop, size=n) - 1
        gap_i = rng.gamma(rounds + 1.0, 1.0 / self.exit[i])
        return gap_i + rng.gamma(rounds + ends_in_o, 1.0 / self.exit[1 - i])

    def _chain(self, m: int, start: int, rng: np.random.Generator) -> npt.NDArray[np.intp]:
        """J_0 = start, then m - 1 more phases of the arrival-phase chain, as runs."""
        parts, have, phase = [], 0, start
        pair = float(np.sum(1.0 / np.maximum(self.leave, 1.0 / m)))  # mean length of two runs
        while have < m:
            k = int(min(2.0 * (m - have) / pair + 8.0, m + 8))
            which = (phase + np.arange(k)) % 2
            p = self.leave[which]
            runs = np.where(p > 0, rng.geometric(np.where(p > 0, p, 0.5)), m)
            parts.append(np.repeat(which, runs))
            have += int(runs.sum())
            phase = (phase + k) % 2
        return np.concatenate(parts)[:m]


class PieceSampler:
    """Sampling of a MAP with n >= 3 phases by simulating its phase path in vectorized chunks.

    The path is cut into pieces: a piece in phase i lasts min(Exp(leave_i), cap_i); if the
    exponential wins, the phase jumps to j != i (an arrival with probability D1_ij / (D0 + D1)_ij),
    else it stays (memorylessness makes this exact). Inside a piece of length t, arrivals that
    keep the phase (D1_ii) are Poisson(D1_ii t), placed uniformly. cap_i bounds them to
    PIECE_ARRIVALS on average, which bounds memory. The phase sequence of the pieces is a Markov
    chain driven by shared uniforms, so it is the composition of per-step maps {phase -> phase},
    computed for a whole chunk by a doubling prefix scan: O(C n log C) numpy work per chunk.
    The cost grows with the phase changes per arrival: hidden switching much faster than the
    arrivals makes it slow.
    """

    def __init__(self, D0: Matrix, D1: Matrix, rate: float) -> None:
        move = D0 + D1
        np.fill_diagonal(move, 0.0)
        self.within = np.diag(D1).copy()  # arrival rate that keeps the phase
        self.leave = move.sum(axis=1)  # > 0: Q is irreducible
        safe = np.maximum(self.within, 1e-300)
        self.cap = np.where(self.within > 0, PIECE_ARRIVALS / safe, np.inf)  # longest piece
        cdf = np.cumsum(move / self.leave[:, None], axis=1)
        for i, row in enumerate(move):
            cdf[i, np.flatnonzero(row)[-1] :] = 1.0  # no round-off lands on a zero-rate phase
        self.cdf = cdf
        self.mark = np.divide(D1, D0 + D1, out=np.zeros_like(D1), where=move > 0)
        end = 1.0 - np.exp(-self.leave * self.cap)  # P(a piece ends in a jump)
        self.per_arrival = float(stationary(D0 + D1) @ (self.leave / end)) / rate

    def sample(self, n: int, start: int, rng: np.random.Generator) -> Matrix:
        parts, have, phase, since_last = [], 0, start, 0.0
        most = max(1024, MAX_PIECES // self.cdf.shape[0])
        while have < n:
            pieces = int(min(1.1 * (n - have) * self.per_arrival + 16.0, most))
            gaps, phase, since_last = self._chunk(phase, since_last, pieces, rng)
            parts.append(gaps)
            have += gaps.size
        return np.concatenate(parts)[:n] if parts else np.empty(0)

    def _chunk(
        self, phase: int, since_last: float, k: int, rng: np.random.Generator
    ) -> tuple[Matrix, int, float]:
        """Simulate ``k`` pieces from ``phase``: the gaps between the arrivals in them (the first
        counted from the last arrival, ``since_last`` before the chunk), end phase, time since."""
        u, e = rng.random(k), rng.standard_exponential(k)
        path = _phase_path(self._step_maps(u, e), phase)
        cur, nxt = path[:-1], path[1:]
        dur = np.minimum(e / self.leave[cur], self.cap[cur])
        end = np.cumsum(dur)
        start = np.concatenate([[0.0], end[:-1]])
        count = rng.poisson(self.within[cur] * dur)
        owner = np.repeat(np.arange(k), count)
        inside = start[owner] + rng.random(owner.size) * dur[owner]
        jumped = (nxt != cur) & (rng.random(k) < self.mark[cur, nxt])
        t = np.sort(np.concatenate([inside, end[jumped]]))
        if t.size == 0:
            return t, int(path[-1]), since_last + float(end[-1])
        return np.diff(t, prepend=-since_last), int(path[-1]), float(end[-1] - t[-1])

    def _step_maps(self, u: Matrix, e: Matrix) -> npt.NDArray[np.intp]:
        """F[k, s]: phase after piece k if it starts in s (shared uniforms u, e across s)."""
        n = self.cdf.shape[0]
        F = np.empty((u.size, n), dtype=np.intp)
        for s in range(n):
            jump = np.searchsorted(self.cdf[s], u, side="right")
            F[:, s] = np.where(e > self.leave[s] * self.cap[s], s, jump)
        return F


def _phase_path(F: npt.NDArray[np.intp], start: int) -> npt.NDArray[np.intp]:
    """Phases start, F_0(start), F_1(F_0(start)), ...: prefix compositions by doubling."""
    G = F.copy()
    d = 1
    while d < G.shape[0]:
        G[d:] = np.take_along_axis(G[d:], G[:-d], axis=1)  # G_k <- G_k o G_{k-d}
        d *= 2
    return np.concatenate([[start], G[:, start]])
