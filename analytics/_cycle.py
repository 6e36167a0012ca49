"""The batch buffer's CTMC over one cycle (BATCH §IV eq. 4-16), tabulated on a grid.

Private to :mod:`raysrv.analytics.buffer`; see its docstring for the method and its accuracy.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from scipy.linalg import expm, solve

from raysrv.analytics._mapfit import stationary as null_vector

__all__ = ["Cycle", "cycle_for", "phase_rates", "stationary"]


def phase_rates(D0: np.ndarray, D1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per phase: arrival rate (row sums of D1) and hidden switching rate (off-diagonal D0)."""
    lam = D1.sum(axis=1)
    omega = D0.sum(axis=1) - np.diag(D0)
    return lam, omega


def stationary(P: np.ndarray) -> np.ndarray:
    """Stationary row vector of a stochastic matrix P."""
    return null_vector(P - np.eye(P.shape[0]))


class Cycle:
    """One buffer cycle (first arrival to dispatch) on an N-cell grid over [0, T].

    ``waits[k-1, i]`` is the expected number of queries per cycle that end in a batch of k and
    wait at most ``i * T / N`` in the buffer (for timer batches the opener's wait T is left out;
    it is the atom ``pmf[k-1]`` at T). ``fill_cdf[i]``: P(batch full by ``i * T / N``).
    """

    def __init__(self, D0: np.ndarray, D1: np.ndarray, B: int, T: float, N: int) -> None:
        m = D0.shape[0]
        self.B, self.T, self.N, self.m = B, T, N, m
        nt = (B - 1) * m
        Q = np.kron(np.eye(B - 1), D0) + np.kron(np.eye(B - 1, k=1), D1)
        shift = np.kron(np.eye(B - 1, k=1), D1)  # arrivals that keep the buffer open
        to_full = np.zeros((nt, m))
        to_full[-m:] = D1  # the B-th arrival (eq. 11's last block row)
        E, I_shift, J = self._cell_operators(Q, shift, T / N)
        alpha = self._opening_phase(E, J, to_full, solve(-D0, D1))
        start = np.zeros(nt)
        start[:m] = alpha  # the opener: one query, phase alpha
        self._tabulate(start, E, I_shift, J, shift, to_full)

    @staticmethod
    def _cell_operators(Q: np.ndarray, A: np.ndarray, d: float) -> tuple[np.ndarray, ...]:
        """e^{Qd}, int_0^d e^{Qs} A e^{Q(d-s)} ds (Van Loan), int_0^d e^{Qs} ds = Q^-1 (E - I)."""
        n = Q.shape[0]
        big = np.zeros((2 * n, 2 * n))
        big[:n, :n] = Q
        big[:n, n:] = A
        big[n:, n:] = Q
        X = expm(big * d)
        E = X[:n, :n]
        return E, X[:n, n:], solve(Q, E - np.eye(n))

    def _opening_phase(
        self, E: np.ndarray, J: np.ndarray, to_full: np.ndarray, next_arrival: np.ndarray
    ) -> np.ndarray:
        """Stationary phase of a buffer's first query: phase at dispatch, then the next arrival."""
        m, nt = self.m, E.shape[0]
        if m == 1:
            return np.ones(1)
        p = np.zeros((m, nt))
        p[:, :m] = np.eye(m)  # one row per opening phase
        opened = np.zeros((m, nt))
        for _ in range(self.N):
            opened += p @ J
            p = p @ E
        at_timer = p.reshape(m, self.B - 1, m).sum(axis=1)  # phase when the timer fires
        at_fill = opened @ to_full  # phase right after the B-th arrival
        return stationary((at_timer + at_fill) @ next_arrival)

    def _tabulate(
        self,
        start: np.ndarray,
        E: np.ndarray,
        I_shift: np.ndarray,
        J: np.ndarray,
        shift: np.ndarray,
        to_full: np.ndarray,
    ) -> None:
        B, N, m = self.B, self.N, self.m
        nt = start.size
        counts = np.kron(np.eye(B - 1), np.ones((m, 1)))  # state -> queries in buffer
        # Forward: p_j = start e^{Q u_j}; backward: e^{Q r_i} [counts | 1] for r_i = i T / N.
        p = np.empty((N + 1, nt))
        back = np.empty((N + 1, nt, B))
        p[0], back[0] = start, np.hstack([counts, np.ones((nt, 1))])
        for j in range(N):
            p[j + 1] = p[j] @ E
            back[j + 1] = E @ back[j]
        surv = back[:, :, -1]  # P(not yet full after r | state)
        cum_p = np.vstack([np.zeros(nt), np.cumsum(p[:-1] @ J, axis=0)])  # int_0^{u_j} p(u) du
        # Cell j (u in [u_j, u_{j+1}]) arrival flow into the open buffer, exact (Van Loan).
        flow = p[:-1] @ I_shift  # (N, nt)
        ends = back[N - 1 :: -1]  # e^{Q (T - u_{j+1})}[...] for j = 0..N-1
        timer_cells = np.einsum("js,jsk->jk", flow, ends[:, :, :-1])  # (N, B-1)
        # Fill-batch arrivals: int p A (1 - e^{Q(T-u)} 1) = int p du A 1 - flow . survival.
        opened = p[:-1] @ J @ shift.sum(axis=1)
        fill_cells = opened - np.einsum("js,js->j", flow, ends[:, :, -1])
        # Waits <= w_i = i T / N come from arrivals after u_{N-i}: suffix sums over cells.
        suffix_timer = np.vstack([np.zeros(B - 1), np.cumsum(timer_cells[::-1], axis=0)])
        suffix_fill = np.concatenate([[0.0], np.cumsum(fill_cells[::-1])])
        filled_by = 1.0 - surv  # P(full within r | state)
        earlier = cum_p[::-1] @ shift  # int_0^{T - w_i} p(u) du A, for i = 0..N
        full_arrivals = float(cum_p[N] @ to_full.sum(axis=1))  # B-th queries: wait 0
        fill_waits = (
            np.einsum("is,is->i", earlier, filled_by)
            + suffix_fill
            + full_arrivals
            + filled_by @ start  # the opener fills within w_i
        )
        pmf = np.empty(B)
        pmf[:-1] = p[N] @ counts
        pmf[-1] = max(0.0, 1.0 - pmf[:-1].sum())
        self.pmf = pmf
        self.waits = np.vstack([suffix_timer.T, fill_waits])
        self.fill_cdf = cum_p @ to_full.sum(axis=1)
        for table in (self.pmf, self.waits, self.fill_cdf):
            table.flags.writeable = False  # shared through the cache


@lru_cache(maxsize=256)
def _cached(d0: bytes, d1: bytes, m: int, B: int, T: float, N: int) -> Cycle:
    D0 = np.frombuffer(d0).reshape(m, m)
    D1 = np.frombuffer(d1).reshape(m, m)
    return Cycle(D0, D1, B, T, N)


def cycle_for(D0: np.ndarray, D1: np.ndarray, B: int, T: float, N: int) -> Cycle:
    """The tables for (arrival, B, T, N), shared by every model that asks (the optimizer varies
    only the service times over them)."""
    m = D0.shape[0]
    return _cached(
        np.ascontiguousarray(D0, dtype=float).tobytes(),
        np.ascontiguousarray(D1, dtype=float).tobytes(),
        m,
        B,
        T,
        N,
    )
