"""Discrete-event simulation of the M/D_interf/c queue of serf §IV-C: the referee for the model.

Source: SERF §III-B/C (homogeneous requests, interference among concurrent
requests) and §IV-C1 (the M/D_interf/c formulation). ``service_rates[i-1]`` is the profiled rate
mu_i: running ``i`` requests at once, each one finishes in ``1/mu_i`` seconds.

Semantics (``mode="shared"``, the default and the physical one). There are ``c`` service slots and
one FCFS queue. Every request carries one unit of work. While ``n`` requests run (``n <= c``), each
progresses at ``mu_n`` units per second, so a request's service time changes as others start and
finish. With ``mu_n = mu_1`` for all ``n`` this is exactly the M/D/c queue with service ``1/mu_1``.
One virtual clock ``V(t) = integral of mu_{n(t)} dt`` carries the whole state of the running
requests: a request started at ``V = v`` with work ``w`` leaves when ``V = v + w``; with equal work
they leave in the order they started. ``work`` may give each request its own amount: exponential
work with mean 1 turns the queue into serf's M/M_interf/c chain (eq. 2), which checks eq. 2-7.

``mode="fixed"`` is the reading that serf's PASTA step (eq. 12) takes: a request's service time is
fixed when it starts, at ``1/mu_k`` with ``k`` the number running including itself, and does not
change afterwards.

Cost: ``2R`` events for ``R`` requests, ``O(log c)`` each (a heap of the running requests), in a
pure-Python loop: long runs belong in ``bench/validate_analytics.py``. Caveats: no warm-up is
discarded here (callers drop a prefix), and arrivals must be sorted. Poisson arrival times come
from :meth:`raysrv.analytics.arrivals.Poisson.arrival_times`. All times are seconds.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from raysrv.analytics.arrivals import Poisson
from raysrv.analytics.serf import Method, _check_service_rates, serf_latency

__all__ = [
    "SimulationResult",
    "ValidationCase",
    "interference_profile",
    "serf_validation_grid",
    "simulate_interference",
]

Mode = Literal["shared", "fixed"]
Shape = Literal["linear", "knee"]


@dataclass(frozen=True)
class SimulationResult:
    """Per-request times of one run, in seconds, indexed like the arrivals.

    ``latency = wait + service``; ``wait`` is the time in the FCFS queue, ``service`` the time from
    start to finish.
    """

    arrival: NDArray[np.float64]
    start: NDArray[np.float64]
    finish: NDArray[np.float64]

    @property
    def wait(self) -> NDArray[np.float64]:
        return self.start - self.arrival

    @property
    def service(self) -> NDArray[np.float64]:
        return self.finish - self.start

    @property
    def latency(self) -> NDArray[np.float64]:
        return self.finish - self.arrival

    def mean_latency(self, warmup: float = 0.1) -> float:
        """Mean latency after dropping the first ``warmup`` fraction of requests (transient)."""
        return float(np.mean(self.latency[int(len(self.arrival) * warmup) :]))

    def stderr_latency(self, warmup: float = 0.1, batches: int = 20) -> float:
        """Standard error of ``mean_latency`` by batch means (consecutive latencies correlate)."""
        means = [
            b.mean()
            for b in np.array_split(self.latency[int(len(self.arrival) * warmup) :], batches)
        ]
        return float(np.std(means, ddof=1) / math.sqrt(batches))


def simulate_interference(
    arrival_times: ArrayLike,
    service_rates: Sequence[float],
    *,
    mode: Mode = "shared",
    work: ArrayLike | None = None,
) -> SimulationResult:
    """Simulate a ``c = len(service_rates)``-slot FCFS queue with interference (module docstring).

    ``arrival_times`` are sorted seconds; ``service_rates[i-1]`` is mu_i in requests per second.
    ``work`` gives each request's work in units of one request (default 1 each: deterministic
    service, the M/D_interf/c queue); exponential work with mean 1 gives the M/M_interf/c queue of
    serf eq. 2, whose state probabilities the shared mode then reproduces exactly.
    """
    arrivals = np.asarray(arrival_times, dtype=np.float64)
    rates = _check_service_rates(service_rates).tolist()
    if arrivals.ndim != 1 or not np.all(np.isfinite(arrivals)):
        raise ValueError("arrival_times must be a 1-d array of finite seconds")
    if arrivals.size > 1 and np.any(np.diff(arrivals) < 0):
        raise ValueError("arrival_times must be sorted")
    units = _check_work(work, arrivals.size)
    if mode == "shared":
        start, finish = _run_shared(arrivals.tolist(), rates, units)
    elif mode == "fixed":
        start, finish = _run_fixed(arrivals.tolist(), rates, units)
    else:
        raise ValueError(f"mode must be 'shared' or 'fixed', got {mode!r}")
    return SimulationResult(arrivals, np.asarray(start), np.asarray(finish))


def _check_work(work: ArrayLike | None, total: int) -> list[float]:
    if work is None:
        return [1.0] * total
    units = np.asarray(work, dtype=np.float64)
    if units.shape != (total,) or not np.all(np.isfinite(units)) or np.any(units <= 0):
        raise ValueError(f"work must hold {total} positive finite amounts, one per arrival")
    return units.tolist()


def _run_shared(
    arrivals: list[float], rates: list[float], work: list[float]
) -> tuple[list[float], list[float]]:
    """Shared progress: one virtual clock ``V``; a request leaves when ``V`` has grown by its work.

    With equal work the heap pops in start order, so it costs ``O(log c)`` per event at most.
    """
    total, c = len(arrivals), len(rates)
    start = [0.0] * total
    finish = [0.0] * total
    running: list[tuple[float, int]] = []  # heap of (virtual finish time, request index)
    t = v = 0.0
    nxt_arrival = nxt_start = done = 0
    while done < total:
        n = len(running)
        t_done = t + (running[0][0] - v) / rates[n - 1] if n else math.inf
        if nxt_arrival < total and arrivals[nxt_arrival] <= t_done:
            a = arrivals[nxt_arrival]
            if n:
                v += (a - t) * rates[n - 1]  # every running request gained mu_n * dt of work
            t = a
            nxt_arrival += 1
        else:
            v, idx = heapq.heappop(running)
            t = t_done
            finish[idx] = t
            done += 1
        # FCFS: one event frees or fills at most one slot; the queue is nxt_start..nxt_arrival-1
        if nxt_start < nxt_arrival and len(running) < c:
            start[nxt_start] = t
            heapq.heappush(running, (v + work[nxt_start], nxt_start))
            nxt_start += 1
    return start, finish


def _run_fixed(
    arrivals: list[float], rates: list[float], work: list[float]
) -> tuple[list[float], list[float]]:
    """Service fixed at start to ``work/mu_k``, ``k`` the number running once it has started."""
    total, c = len(arrivals), len(rates)
    start = [0.0] * total
    finish = [0.0] * total
    running: list[tuple[float, int]] = []  # heap of (finish time, request index)
    nxt_arrival = nxt_start = done = 0
    t = 0.0
    while done < total:
        t_done = running[0][0] if running else math.inf
        if nxt_arrival < total and arrivals[nxt_arrival] <= t_done:
            t = arrivals[nxt_arrival]
            nxt_arrival += 1
        else:
            t, idx = heapq.heappop(running)
            finish[idx] = t
            done += 1
        if nxt_start < nxt_arrival and len(running) < c:
            start[nxt_start] = t
            k = len(running) + 1  # eq. 12 reads mu_k with k running, itself included
            heapq.heappush(running, (t + work[nxt_start] / rates[k - 1], nxt_start))
            nxt_start += 1
    return start, finish


def interference_profile(
    servers: int, slowdown: float, shape: Shape = "linear"
) -> tuple[float, ...]:
    """Test profile ``mu_1 .. mu_c`` with ``mu_1 = 1`` per second and ``mu_c = 1 - slowdown``.

    ``"linear"`` falls evenly from ``mu_1``; ``"knee"`` stays at 1 up to two running requests and
    then falls evenly, like the cache effect of serf Fig. 6 (needs ``c >= 3`` to differ).
    """
    if servers < 1:
        raise ValueError(f"servers must be >= 1, got {servers!r}")
    if not 0.0 <= slowdown < 1.0:
        raise ValueError(f"slowdown must lie in [0, 1), got {slowdown!r}")
    if shape not in ("linear", "knee"):
        raise ValueError(f"shape must be 'linear' or 'knee', got {shape!r}")
    flat = 2 if shape == "knee" and servers >= 3 else 1  # levels before the fall starts
    if servers == flat:
        return (1.0,) * servers
    return tuple(
        1.0 - slowdown * max(0, i - flat) / (servers - flat) for i in range(1, servers + 1)
    )


@dataclass(frozen=True)
class ValidationCase:
    """One grid case: model prediction against simulation, mean latencies in seconds."""

    servers: int
    shape: Shape
    slowdown: float
    utilisation: float  # rho = lambda / (c mu_c)
    service_rates: tuple[float, ...]
    arrival_rate: float
    predicted: float
    simulated: float
    simulated_stderr: float

    @property
    def relative_error(self) -> float:
        return (self.predicted - self.simulated) / self.simulated


def serf_validation_grid(
    *,
    servers: Sequence[int] = (1, 2, 3, 4, 6, 8),
    slowdowns: Sequence[float] = (0.0, 0.1, 0.25, 0.5),
    utilisations: Sequence[float] = (0.1, 0.3, 0.5, 0.7, 0.9),
    shapes: Sequence[Shape] = ("linear", "knee"),
    n_requests: int = 1_000_000,
    seed: int = 0,
    method: Method = "paper",
    mode: Mode = "shared",
) -> list[ValidationCase]:
    """Rerun the model-vs-simulation grid that ``analytics/serf.py`` reports its accuracy on.

    Each case holds the model's and the simulation's mean latency (``predicted``, ``simulated``);
    another method on the same runs is ``serf_latency(case.arrival_rate, case.service_rates,
    method=...)``. Duplicate profiles (no slowdown, or ``"knee"`` with ``c <= 2``) are run once;
    the first 10 % of each run is dropped as warm-up. The default grid is 165 cases of 10^6
    requests each: minutes of CPU, a benchmark rather than a unit test.
    """
    rng = np.random.default_rng(seed)
    cases: list[ValidationCase] = []
    seen: set[tuple[float, ...]] = set()
    for c, s, shape in itertools.product(servers, slowdowns, shapes):
        mu = interference_profile(c, s, shape)
        if mu in seen:
            continue
        seen.add(mu)
        for rho in utilisations:
            lam = rho * c * mu[-1]
            arrivals = Poisson(lam).arrival_times(n_requests, rng)
            run = simulate_interference(arrivals, mu, mode=mode)
            predicted = serf_latency(lam, mu, method=method)
            simulated = (run.mean_latency(), run.stderr_latency())
            cases.append(ValidationCase(c, shape, s, rho, mu, lam, predicted, *simulated))
    return cases
