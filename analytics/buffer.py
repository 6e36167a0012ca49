"""The batch buffer's latency distribution (BATCH §IV, eq. 4-15), exact and as the paper has it.

The setting (batch §III-B): a query arriving at an empty buffer starts a timer of ``timeout`` T;
the batch leaves when it holds ``max_batch`` B queries or when the timer expires, and starts at
once (a serverless platform has a server for every batch); the next query opens a new buffer.
A batch of k runs for the deterministic ``service_times[k-1]`` = S_k. A query's latency is its
wait in the buffer plus S_k of its batch.

Two ways to compute it:

* ``method="exact"`` (default). The buffer is the CTMC of batch eq. 4/11/16: states (n, phase)
  for n = 1..B-1 queries in the buffer, absorbed when the B-th arrives; the timer is a
  deterministic horizon T. On a grid of N cells over [0, T] the cell integrals are exact
  (Van Loan's block exponential gives ``int_0^d e^{Qs} A e^{Q(d-s)} ds`` and ``int e^{Qs} ds``),
  so the query-weighted joint law of (buffer wait, batch size) is exact at the grid points and
  linear between them (error O(1/N^2), N = 256 by default). The phase seen by the first query of
  a buffer is the stationary law of the cycle-to-cycle chain (phase at dispatch, then the next
  arrival), not eq. 13-14's heuristic. Holds for Poisson, MMPP(2) and any MAP. Cost per
  (B, T): one exponential of a 2(B-1)m square matrix (m phases) and O(N (B m)^2); tables
  are cached per (arrival, B, T, N), so other service times reuse them.
* ``method="paper"``: eq. 5-10 (Poisson), eq. 13-15 (MMPP(2)); a MAP(2) takes "the exact same
  steps" with lambda_m its phase's arrival rate and omega_m its hidden switching rate. A query in
  a timer batch of k waits Uniform(0, T) (eq. 9 case 2), in a full batch Uniform(0, tau) with
  tau = (B-1)/lambda (eq. 10, 15), capped at T.

Where the uniform-timeout assumption (eq. 9 case 2) loses accuracy:

* Small batches. The query that opened the buffer waits exactly T, not Uniform(0, T): an atom
  of mass 1/k in a batch of k. At low load most queries sit in batches of 1 or 2: a lone query
  always waits T (eq. 9 spreads it over (0, T)), and in a pair one of the two waits T. Eq. 9
  then puts the tail too early.
  (For Poisson the other k-1 arrival times given k-1 arrivals in (0, T] are exactly uniform;
  eq. 9 case 1 notes the S_1 + T minimum but case 2 does not apply it.)
* Bursty arrivals. Under MMPP/MAP the arrivals inside one buffer cluster in the busy phase;
  they are not uniform over (0, T], and eq. 13-14's initial phase is a heuristic.
* Full batches. The fill time is random, not tau = (B-1)/lambda; near B = lambda T the batch
  is sometimes full and sometimes not, and a single tau misplaces the mass of both.

``tests/unit/analytics/test_buffer.py`` and ``bench/validate_analytics.py`` measure the two
methods against the simulator (:func:`raysrv.analytics.simulate`).

Finite servers (a cut batch waits FCFS for one of ``replicas`` workers) are *bounded*, not
solved: :meth:`BatchBufferModel.latency_bounds`. Lower bound: the infinite-server latency (a
batch's extra wait is >= 0, path by path). Upper bound, path by path as well:

* one replica: FCFS on one server is Lindley's recursion, W_{n+1} = max(0, W_n + S_n - gap);
* c > 1 replicas: charge every batch the longest service S_B (waits only grow); with equal
  service times FCFS on c servers is the cyclic assignment, so batch n+c waits behind batch n:
  W_{n+c} = max(0, W_n + S_B - (t_{n+c} - t_n));
* the gap before a batch is split into the part before its buffer opened (independent of the
  batch) and its own buffer time D, which is exactly T for a timer batch and is credited as 0
  for a full one. The queue wait then no longer depends on the batch's content, and the bound's
  latency is the buffer wait, plus that queue wait, plus S_k.

For Poisson arrivals the dispatch gaps are i.i.d. and the stationary Lindley recursion is solved
on a lattice rounded against the bound (gaps down, service up), so the bound is rigorous up to
the lattice step (:mod:`raysrv.analytics._finite`). For MMPP/MAP arrivals the gaps are
correlated and the same computation uses their stationary law: an approximation, not a bound.
Loads where even the bound's queue is unstable raise ValueError ("too few replicas").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from numbers import Real
from typing import Literal, Protocol

import numpy as np
from scipy.linalg import expm, solve

from raysrv.analytics._cycle import Cycle, cycle_for, phase_rates, stationary
from raysrv.analytics._finite import (
    LATTICE_POINTS,
    MAX_ITER,
    QueueInputs,
    lattice_step,
    queue_waits,
)
from raysrv.analytics._mapfit import stationary as null_vector

__all__ = ["ArrivalLike", "BatchBufferModel", "LatencyBounds", "Pricing"]

Method = Literal["exact", "paper"]


class ArrivalLike(Protocol):
    """Any Markovian arrival process: ``D0`` hidden transitions, ``D1`` arrivals (batch eq. 16)."""

    @property
    def D0(self) -> np.ndarray: ...

    @property
    def D1(self) -> np.ndarray: ...


@dataclass(frozen=True)
class Pricing:
    """The prices of batch eq. 1: C = S * M * I * K1 + I * K2 per invocation.

    ``per_unit_second`` is K1 ($ per GB-second on Lambda; per thread- or replica-second for
    raysrv's knobs), ``per_call`` is K2 ($ per invocation). Defaults are the paper's Lambda
    prices.
    """

    per_unit_second: float = 1.66667e-5
    per_call: float = 2e-7

    def __post_init__(self) -> None:
        for name in ("per_unit_second", "per_call"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"Pricing.{name} must be finite and >= 0, got {value!r}")


@dataclass(frozen=True)
class LatencyBounds:
    """Latency percentiles of the finite-server buffer: ``lower <= true <= upper``."""

    q: float
    lower: float
    upper: float


class BatchBufferModel:
    """Latency of queries through the batch buffer of batch §III-B (see the module docstring).

    ``service_times[k-1]`` is the service time S_k (seconds) of a batch of k; ``timeout`` in
    seconds; ``replicas=None`` is the paper's infinite-server setting, an int bounds the
    finite-server one (:meth:`latency_bounds`). ``grid`` is the number of cells over [0, T].
    """

    def __init__(
        self,
        arrival: ArrivalLike,
        service_times: Sequence[float] | np.ndarray,
        max_batch: int,
        timeout: float,
        *,
        replicas: int | None = None,
        method: Method = "exact",
        grid: int = 256,
    ) -> None:
        self.D0 = np.asarray(arrival.D0, dtype=float)
        self.D1 = np.asarray(arrival.D1, dtype=float)
        self.arrival = arrival
        self.service = _check_service(service_times, max_batch)
        self.max_batch = int(max_batch)
        self.timeout = _check_nonneg("timeout", timeout)
        if replicas is not None and (int(replicas) != replicas or replicas < 1):
            raise ValueError(f"replicas must be None or an int >= 1, got {replicas!r}")
        if method not in ("exact", "paper"):
            raise ValueError(f"method must be 'exact' or 'paper', got {method!r}")
        if int(grid) != grid or grid < 8:
            raise ValueError(f"grid must be an int >= 8, got {grid!r}")
        self.replicas = replicas
        self.method: Method = method
        self.grid = int(grid)
        self.rate = _fundamental_rate(self.D0, self.D1)

    # -- batch sizes ---------------------------------------------------------------------------

    @cached_property
    def _cycle(self) -> Cycle | None:
        """The CTMC tables, or None when every batch is a single query (B = 1 or T = 0)."""
        if self.max_batch == 1 or self.timeout == 0:
            return None
        return cycle_for(self.D0, self.D1, self.max_batch, self.timeout, self.grid)

    def batch_size_pmf(self, per: Literal["batch", "query"] = "batch") -> np.ndarray:
        """``pmf[k-1]``: P(a batch holds k queries) (eq. 7), or with ``per="query"`` the chance a
        query rides in a batch of k (eq. 8)."""
        pmf = self._batch_pmf()
        if per == "query":
            sizes = np.arange(1, self.max_batch + 1)
            return sizes * pmf / float(sizes @ pmf)
        if per != "batch":
            raise ValueError(f"per must be 'batch' or 'query', got {per!r}")
        return pmf

    def _batch_pmf(self) -> np.ndarray:
        if self._cycle is None:
            pmf = np.zeros(self.max_batch)
            pmf[0] = 1.0
            return pmf
        return self._cycle.pmf.copy()

    def mean_batch_size(self) -> float:
        return float(np.arange(1, self.max_batch + 1) @ self._batch_pmf())

    # -- latency -------------------------------------------------------------------------------

    def latency_cdf(self, t: float | np.ndarray) -> float | np.ndarray:
        """P(latency <= t) for a query (infinite servers)."""
        ts = np.asarray(t, dtype=float)
        out = self._paper_cdf(ts) if self.method == "paper" else self._exact_cdf(ts)
        return float(out) if np.ndim(t) == 0 else out

    def latency_percentile(self, q: float) -> float:
        """The q-quantile (0 < q < 1) of query latency: the least t with P(latency <= t) >= q."""
        if not 0 < q < 1:
            raise ValueError(f"q must be in (0, 1), got {q!r}")
        if self.method == "exact" and self._cycle is not None:
            return self._exact_percentile(q)
        return _invert(self.latency_cdf, q, 0.0, float(self.service[-1]) + self.timeout)

    def _exact_percentile(self, q: float) -> float:
        """Invert the exact CDF at once: it is linear between the points S_k + grid, with
        jumps (the openers of timer batches) at S_k + T."""
        cyc = self._cycle
        assert cyc is not None
        grid = np.linspace(0.0, self.timeout, cyc.N + 1)
        points = np.unique((self.service[:, None] + grid[None, :]).ravel())
        cdf = self._exact_cdf(points)
        j = int(np.searchsorted(cdf, q - 1e-12))
        if j == 0:
            return float(points[0])
        j = min(j, points.size - 1)
        a, b = float(points[j - 1]), float(points[j])
        at_b = float(self._exact_cdf(np.array(b - 1e-9 * (b - a))))  # left limit at b
        if at_b < q:
            return b  # q falls in the jump at b
        return a + (q - float(cdf[j - 1])) / (at_b - float(cdf[j - 1])) * (b - a)

    def mean_latency(self) -> float:
        """Mean query latency: mean buffer wait plus the query-weighted mean service time."""
        rho = self.batch_size_pmf("query")
        if self.method == "paper":
            return float(rho @ self.service) + self._paper_mean_wait()
        return float(rho @ self.service) + self._exact_mean_wait()

    def cost_per_query(self, pricing: Pricing | None = None, units: float = 1.0) -> float:
        """Batch eq. 1 per query: (S_K * units * K1 + K2) per batch over the mean batch size.

        ``units`` is Lambda's memory in GB, or the threads or replicas a batch holds.
        """
        pricing = pricing or Pricing()
        pmf = self._batch_pmf()
        per_batch = float(pmf @ self.service) * units * pricing.per_unit_second
        return (per_batch + pricing.per_call) / self.mean_batch_size()

    # -- exact ---------------------------------------------------------------------------------

    def _exact_cdf(self, t: np.ndarray) -> np.ndarray:
        return np.clip(self._cdf_by_size(t).sum(axis=0), 0.0, 1.0)

    def _cdf_by_size(self, t: np.ndarray) -> np.ndarray:
        """``out[k-1]``: P(wait + S_k <= t and the query rides in a batch of k), on the grid."""
        cyc = self._cycle
        out = np.zeros((self.max_batch, *t.shape))
        if cyc is None:
            out[0] = t >= self.service[0]
            return out
        grid = np.linspace(0.0, self.timeout, cyc.N + 1)
        totals = np.arange(1, self.max_batch + 1) * cyc.pmf
        for k, s_k in enumerate(self.service):
            w = t - s_k
            below = np.interp(w, grid, cyc.waits[k], left=0.0)
            out[k] = np.where(w >= self.timeout, totals[k], np.where(w >= 0, below, 0.0))
        return out / self.mean_batch_size()

    def _exact_mean_wait(self) -> float:
        cyc = self._cycle
        if cyc is None:
            return 0.0
        step = self.timeout / cyc.N
        totals = np.arange(1, self.max_batch + 1) * cyc.pmf
        below = (cyc.waits[:, 1:] + cyc.waits[:, :-1]).sum(axis=1) * step / 2
        return float((totals * self.timeout - below).sum() / self.mean_batch_size())

    # -- the paper's approximation ---------------------------------------------------------------

    def _paper_pmf(self) -> np.ndarray:
        """Eq. 5 with eq. 13-14's initial phase (eq. 4, 11 and 16 share one generator)."""
        B, T = self.max_batch, self.timeout
        pmf = np.zeros(B)
        if B == 1 or T == 0:
            pmf[0] = 1.0
            return pmf
        m = self.D0.shape[0]
        Q = np.kron(np.eye(B), self.D0) + np.kron(np.eye(B, k=1), self.D1)
        Q[-m:, -m:] = 0.0  # eq. 4/11: the B-th state is absorbing
        start = np.zeros(B * m)
        start[:m] = self._paper_initial_phase()
        pmf[:] = (start @ expm(Q * T)).reshape(B, m).sum(axis=1)  # eq. 5-7
        return pmf

    def _paper_initial_phase(self) -> np.ndarray:
        """Eq. 13-14: alpha_m = (lambda_m / omega_m) / min(B, lambda_m T + 1), normalised."""
        lam, omega = phase_rates(self.D0, self.D1)
        if lam.size == 1 or np.any(omega <= 0):
            return stationary(solve(-self.D0, self.D1))
        alpha = (lam / omega) / np.minimum(self.max_batch, lam * self.timeout + 1)
        return alpha / alpha.sum()

    def _paper_tau(self) -> float:
        """Eq. 10 / 15: time to collect B-1 more queries at the mean rate, capped at T."""
        return min((self.max_batch - 1) / self.rate, self.timeout)

    def _paper_cdf(self, t: np.ndarray) -> np.ndarray:
        """Eq. 9: uniform waits over (0, T) in timer batches and (0, tau) in full ones."""
        pmf = self._paper_pmf()
        sizes = np.arange(1, self.max_batch + 1)
        rho = sizes * pmf / float(sizes @ pmf)  # eq. 8
        spans = np.full(self.max_batch, self.timeout)
        spans[-1] = self._paper_tau()
        out = np.zeros(t.shape)
        for k, s_k in enumerate(self.service):
            if spans[k] <= 0:
                out += rho[k] * (t >= s_k)
            else:
                out += rho[k] * np.clip((t - s_k) / spans[k], 0.0, 1.0)
        return out

    def _paper_mean_wait(self) -> float:
        pmf = self._paper_pmf()
        sizes = np.arange(1, self.max_batch + 1)
        rho = sizes * pmf / float(sizes @ pmf)
        spans = np.full(self.max_batch, self.timeout)
        spans[-1] = self._paper_tau()
        return float(rho @ spans) / 2

    # -- finite servers --------------------------------------------------------------------------

    def latency_bounds(
        self,
        q: float,
        replicas: int | None = None,
        points: int = LATTICE_POINTS,
        max_iter: int = MAX_ITER,
    ) -> LatencyBounds:
        """Bounds on the q-quantile with ``replicas`` servers (see the module docstring), on a
        lattice of ``points`` steps over the longest batch, the timeout and the mean gap: fewer
        are faster and give a looser upper bound, never a lower one. A queue whose wait has not
        settled after ``max_iter`` Lindley steps raises ValueError, as one too near saturation.

        Upper bound: every batch served in S_B, so FCFS is cyclic and batch n+c waits
        W = max(0, V - D) with V = W' + S_B - (gaps before its buffer opened), independent of
        it, and D its own buffer time: exactly T for a timer batch, >= 0 for a full one.
        """
        c = replicas if replicas is not None else self.replicas
        if c is None or int(c) != c or c < 1:
            raise ValueError(f"latency_bounds needs replicas, an int >= 1, got {c!r}")
        if self.method != "exact":
            raise ValueError("latency_bounds needs method='exact'")
        lower = self.latency_percentile(q)
        step = lattice_step(float(self.service[-1]), self.timeout, self.rate, points)
        timer_wait, fill_wait = self._queue_waits(int(c), step, max_iter)
        ys = np.arange(max(timer_wait.size, fill_wait.size)) * step
        timer_wait = np.pad(timer_wait, (0, ys.size - timer_wait.size))
        fill_wait = np.pad(fill_wait, (0, ys.size - fill_wait.size))

        def upper_cdf(t: float) -> float:
            by_size = self._cdf_by_size(t - ys)  # (B, len(ys))
            return float(by_size[:-1].sum(axis=0) @ timer_wait + by_size[-1] @ fill_wait)

        hi = lower + float(ys[-1]) + step
        return LatencyBounds(q, lower, _invert(upper_cdf, q, lower, hi))

    def _queue_waits(
        self, c: int, step: float, max_iter: int = MAX_ITER
    ) -> tuple[np.ndarray, np.ndarray]:
        """Lattice laws of the bound's queue wait for timer batches and for full batches."""
        opened = self._cycle.fill_cdf if self._cycle is not None else None
        return queue_waits(
            QueueInputs(self.D0, self.D1, self.service, self._batch_pmf(), self.timeout, opened),
            c,
            step,
            max_iter,
        )


def _invert(cdf, q: float, lo: float, hi: float) -> float:  # type: ignore[no-untyped-def]
    """Least t in [lo, hi] with cdf(t) >= q (bisection to 1e-9 relative)."""
    if not 0 < q < 1:
        raise ValueError(f"q must be in (0, 1), got {q!r}")
    while cdf(hi) < q:
        hi = hi * 2 + 1e-9
    for _ in range(100):
        mid = (lo + hi) / 2
        if cdf(mid) >= q:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-9 * max(hi, 1e-9):
            break
    return hi


def _fundamental_rate(D0: np.ndarray, D1: np.ndarray) -> float:
    theta = null_vector(D0 + D1)
    return float(theta @ D1.sum(axis=1))


def _check_service(values: Sequence[float] | np.ndarray, max_batch: int) -> np.ndarray:
    if int(max_batch) != max_batch or max_batch < 1:
        raise ValueError(f"max_batch must be an int >= 1, got {max_batch!r}")
    s = np.asarray(values, dtype=float)
    if s.ndim != 1 or s.size < max_batch:
        raise ValueError(
            f"service_times needs one time per batch size 1..{max_batch}, got {s.size} values"
        )
    if not np.all(np.isfinite(s[:max_batch])) or np.any(s[:max_batch] < 0):
        raise ValueError(f"service_times must be finite and >= 0, got {s[:max_batch]!r}")
    out = s[: int(max_batch)].copy()
    out.flags.writeable = False
    return out


def _check_nonneg(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValueError(f"{name} must be a number of seconds, got {value!r}")
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number >= 0 (seconds), got {value!r}")
    return float(value)
