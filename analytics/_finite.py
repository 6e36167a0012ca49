"""Finite-server bound of the batch buffer on a lattice (see :mod:`raysrv.analytics.buffer`).

Private: :meth:`BatchBufferModel.latency_bounds` is the entry. Every quantity is a pmf on a
lattice of ``step`` seconds, rounded against the bound (gaps down, service up), so rounding
can only raise the upper bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.linalg import expm, solve
from scipy.signal import fftconvolve

from raysrv.analytics._cycle import stationary

__all__ = ["LATTICE_POINTS", "MAX_ITER", "QueueInputs", "lattice_step", "queue_waits"]


@dataclass(frozen=True)
class QueueInputs:
    """What the bound needs of a model: arrivals, S_k, the batch-size pmf, T and the buffer's
    fill-time CDF on its grid over [0, T] (None when every batch is a single query)."""

    D0: np.ndarray
    D1: np.ndarray
    service: np.ndarray
    batch_pmf: np.ndarray
    timeout: float
    fill_cdf: np.ndarray | None


LATTICE_POINTS = 400  # the lattice's default resolution
MAX_ITER = 5000  # Lindley steps before a queue counts as too near saturation to bound


def lattice_step(
    longest_service: float, timeout: float, rate: float, points: int = LATTICE_POINTS
) -> float:
    """The lattice: 1/``points`` of the longest batch, the timeout and the mean gap together."""
    return (longest_service + timeout + 1.0 / rate) / points


def queue_waits(
    m: QueueInputs, c: int, step: float, max_iter: int = MAX_ITER
) -> tuple[np.ndarray, np.ndarray]:
    """Laws of the bound's queue wait for timer batches and for full batches.

    Batch n+c waits W = max(0, V - D): V = W' + S - (gaps before its buffer opened), with W' the
    stationary Lindley wait of the replica's previous batch, and D its own buffer time (T for a
    timer batch; a full batch is credited 0).
    """
    gap = _exp_gap(m.D0, m.D1, step)  # dispatch -> next buffer opens
    open_time = _open_time_pmf(m, step)
    cycle = np.convolve(gap, open_time)  # dispatch -> next dispatch
    before = gap
    for _ in range(c - 1):
        before = np.convolve(before, cycle)  # the gaps up to batch n+c's buffer opening
    window = np.convolve(before, open_time)
    service = _service_pmf(m, c, step)
    wait = _lindley_wait(window, service, max_iter=max_iter)
    v = np.convolve(np.convolve(wait, service), before[::-1])  # from -(len(before) - 1) up
    v_offset = -(before.size - 1)
    t_steps = int(math.floor(m.timeout / step))
    return _positive_part(v, v_offset - t_steps), _positive_part(v, v_offset)


def _positive_part(pmf: np.ndarray, offset: int) -> np.ndarray:
    """Law of max(0, X) where ``pmf[i]`` = P(X = i + offset), on the same lattice."""
    zero = -offset
    if zero <= 0:
        return np.concatenate([np.zeros(-zero), pmf])
    if zero >= pmf.size:
        return np.array([pmf.sum()])
    out = pmf[zero:].copy()
    out[0] += pmf[:zero].sum()
    return out


def _exp_gap(D0: np.ndarray, D1: np.ndarray, step: float) -> np.ndarray:
    """Time from a dispatch to the next arrival (stationary phase), lattice pmf rounded down."""
    phase = stationary(solve(-D0, D1))
    horizon = 40.0 / float(np.min(-np.diag(D0)) + 1e-300)
    n = int(min(horizon / step, 20000)) + 1
    E = expm(D0 * step)
    surv = np.empty(n + 1)
    v = phase.copy()
    for i in range(n + 1):
        surv[i] = v.sum()
        v = v @ E
    pmf = -np.diff(surv)  # mass in [i step, (i+1) step) rounds down to i step
    pmf[-1] += surv[-1]
    tail = np.nonzero(surv > 1e-13)[0]
    cut = int(tail[-1]) + 1 if tail.size else pmf.size
    pmf = pmf[:cut].copy()
    pmf[-1] += max(0.0, 1.0 - pmf.sum())  # beyond the cut: rounded down to the cut
    return pmf / pmf.sum()


def _lindley_wait(
    window: np.ndarray, service: np.ndarray, tol: float = 1e-10, max_iter: int = MAX_ITER
) -> np.ndarray:
    """Stationary W = max(0, W + S - G) on a lattice: ``service[s]`` = P(S = s steps),
    ``window[g]`` = P(G = g steps), S and G independent."""
    mean_s = float(np.arange(service.size) @ service)
    mean_g = float(np.arange(window.size) @ window)
    if mean_s >= mean_g:
        raise ValueError(
            f"the finite-server bound needs the mean batch service ({mean_s:.1f} lattice steps) "
            f"below the mean gap between one replica's batches ({mean_g:.1f} steps): too few "
            "replicas for this load"
        )
    inc = np.convolve(service, window[::-1])  # increments S - G from -(len(window) - 1) up
    offset = -(window.size - 1)
    w = np.array([1.0])
    for _ in range(max_iter):
        nxt = _lindley_step(w, inc, offset)
        if nxt.size == w.size and float(np.abs(nxt - w).sum()) < tol:
            return nxt
        w = nxt
    raise ValueError("the finite-server bound did not converge: the replicas are nearly saturated")


def _lindley_step(w: np.ndarray, inc: np.ndarray, offset: int) -> np.ndarray:
    """One Lindley step W <- max(0, W + U); ``inc[i]`` = P(U = i + offset), offset <= 0."""
    conv = np.clip(fftconvolve(w, inc), 0.0, None)  # value of conv[i] = i + offset
    zero = -offset
    out = conv[zero:].copy()
    out[0] += conv[:zero].sum()
    keep = np.nonzero(np.cumsum(out[::-1]) > 1e-13)[0]
    return out[: out.size - int(keep[0])] if keep.size else out[:1]


def _service_pmf(m: QueueInputs, c: int, step: float) -> np.ndarray:
    """Lattice law (rounded up) of the service the bound charges a batch: its own S_K for one
    replica (FCFS on one server is Lindley's recursion), S_B for more (FCFS is then cyclic)."""
    steps = np.ceil(m.service / step - 1e-9).astype(int)
    pmf = np.zeros(int(steps[-1]) + 1)
    if c == 1:
        np.add.at(pmf, steps, m.batch_pmf)
    else:
        pmf[-1] = 1.0
    return pmf


def _open_time_pmf(m: QueueInputs, step: float) -> np.ndarray:
    """How long a buffer stays open (to the B-th query or T), on the lattice, rounded down."""
    if m.fill_cdf is None:
        return np.array([1.0])
    grid = np.linspace(0.0, m.timeout, m.fill_cdf.size)
    cells = np.floor(grid / step + 1e-9).astype(int)
    pmf = np.zeros(cells[-1] + 1)
    np.add.at(pmf, cells[1:], np.diff(m.fill_cdf))
    pmf[cells[-1]] += max(0.0, 1.0 - m.fill_cdf[-1])  # the timer fired
    return pmf / pmf.sum()
