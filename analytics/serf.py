"""SERF's interference-aware latency model (M/D_interf/c) and its configuration reference table.

Source: SERF §IV-C (eq. 2-13) and §IV-D; parallelism configurations from
§II/§III (service parallelism ``C_service = c``, inter-node degree ``C_inter``, intra-op threads
``C_intra``).

Model. Requests arrive as a Poisson stream of ``lambda`` per second (§IV-C1). ``service_rates[i-1]``
is the profiled per-request rate mu_i when ``i`` requests run at once; at most ``c`` run (service
parallelism), the rest wait FCFS. The M/M_interf/c birth-death chain with death rate ``n mu_n``
(eq. 2-4) gives the state probabilities; Little's law gives its waiting time (eq. 5-7);
Cosmetatos' factor turns it into the deterministic-service waiting time (eq. 8-11); PASTA gives
the mean service time (eq. 12); their sum is the mean latency (eq. 13).

Erratum. The paper prints eq. 12's last term without ``p0``; the term is ``P(N >= c) / mu_c`` =
``p0 prod(rho_i) / (mu_c c! (1 - rho))`` and is implemented with ``p0``. With it, ``c = 1`` gives
exactly the Pollaczek-Khinchine mean of M/D/1 (Cosmetatos' ``f`` vanishes at ``c = 1``).

Accuracy. ``analytics/interference.py`` simulates the queue this model approximates, and
``serf_validation_grid()`` reruns the model against it over c, load and interference profiles;
``python -m bench.validate_analytics`` reports the figures. The paper's formula is kept as the
default: on that grid it is within a few percent of the simulated mean latency (the unit tests
hold four cases to 5 %), while ``"exponential"`` (no Cosmetatos correction) is off by tens of
percent at high load, where the wait dominates. Where the formula loses accuracy:

* Strong interference at mid-to-high load (mu_c well below mu_1, rho 0.5-0.9): it tends to
  overestimate. Exponential work spreads the number of running requests too widely, so the chain
  puts more time at the cap ``c``, where interference is worst, than deterministic work does.
  Below the cap the chain is nearly exact: with no queue the slots behave as processor sharing,
  whose state distribution does not depend on the work distribution.
* Light load, ``c >= 2``: Cosmetatos' waiting time is off by a large *relative* amount against
  the exact M/D/c, but the wait is then a tiny share of the latency, which stays accurate.
* If service time were fixed when a request starts (the PASTA reading, ``mode="fixed"`` in the
  simulator), the model overestimates the wait more than under shared progress.

Caveats: Poisson arrivals, homogeneous work, FCFS, mu_i measured per concurrency level and
independent of load. ``method="exponential"`` drops Cosmetatos' correction and returns the exact
M/M_interf/c mean (a baseline, as in the paper's Fig. 9). Cost ``O(c)`` per prediction. Seconds
and requests per second throughout.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import NDArray
from scipy.special import gammaln, logsumexp

__all__ = [
    "ConfigChoice",
    "ConfigRow",
    "ParallelConfig",
    "SerfPrediction",
    "cosmetatos_factor",
    "lanes_differ",
    "lookup_config",
    "serf_config_table",
    "serf_latency",
    "serf_predict",
    "state_probabilities",
]

Method = Literal["paper", "exponential"]
LookupRule = Literal["next_higher", "nearest"]


@dataclass(frozen=True)
class SerfPrediction:
    """The pieces of one prediction, in seconds (rates per second); ``inf`` when unstable."""

    arrival_rate: float  # lambda
    servers: int  # c, the service parallelism
    utilisation: float  # rho = lambda / (c mu_c); stable iff < 1
    p0: float  # P(idle), eq. 4
    prob_wait: float  # P(N >= c), the chance an arrival queues (PASTA)
    mm_waiting_time: float  # W_q of M/M_interf/c, eq. 7
    waiting_time: float  # W_q of the chosen method (eq. 11 for "paper")
    service_time: float  # S, eq. 12
    latency: float  # W = W_q + S, eq. 13
    method: Method

    @property
    def stable(self) -> bool:
        return self.utilisation < 1.0


def serf_latency(
    arrival_rate: float, service_rates: Sequence[float], *, method: Method = "paper"
) -> float:
    """Mean latency (seconds) of the M/D_interf/c queue, eq. 13; ``math.inf`` when rho >= 1."""
    return serf_predict(arrival_rate, service_rates, method=method).latency


def serf_predict(
    arrival_rate: float, service_rates: Sequence[float], *, method: Method = "paper"
) -> SerfPrediction:
    """Waiting time, service time and latency with the intermediate quantities (module docs)."""
    lam = _check_rate("arrival_rate", arrival_rate)
    mu = _check_service_rates(service_rates)
    if method not in ("paper", "exponential"):
        raise ValueError(f"method must be 'paper' or 'exponential', got {method!r}")
    c = mu.size
    rho = float(lam / (c * mu[-1]))
    if rho >= 1.0:  # the limits as rho -> 1: all c slots busy, the queue grows without bound
        return SerfPrediction(
            lam, c, rho, 0.0, 1.0, math.inf, math.inf, float(1 / mu[-1]), math.inf, method
        )
    p = _probabilities_up_to_c(lam, mu)
    prob_wait = float(p[c] / (1.0 - rho))  # sum_{n >= c} p_n, geometric tail of eq. 2
    wq_mm = float(p[c]) * rho / (1.0 - rho) ** 2 / lam  # eq. 6 and Little's law, eq. 7
    # eq. 12 (with the p0 the paper drops): an arrival seeing i-1 running is served at mu_i.
    # It equals E[min(N, c)] / lambda (Little) since lambda p_{i-1} = i mu_i p_i (eq. 2).
    service = float(np.sum(p[:c] / mu) + prob_wait / mu[-1])
    wq = wq_mm * cosmetatos_factor(c, rho) if method == "paper" else wq_mm  # eq. 11
    return SerfPrediction(
        lam, c, rho, float(p[0]), prob_wait, wq_mm, wq, service, wq + service, method
    )


def cosmetatos_factor(servers: int, utilisation: float) -> float:
    """``W_q(M/D/c) / W_q(M/M/c)`` by Cosmetatos: ``(1 + f(c) g(rho)) / 2``, eq. 8-10."""
    if servers < 1:
        raise ValueError(f"servers must be >= 1, got {servers!r}")
    if not 0.0 < utilisation < 1.0:
        raise ValueError(f"utilisation must lie in (0, 1), got {utilisation!r}")
    f = (servers - 1) * (math.sqrt(4 + 5 * servers) - 2) / (16 * servers)  # eq. 9
    g = (1 - utilisation) / utilisation  # eq. 10
    return 0.5 * (1 + f * g)  # eq. 8


def state_probabilities(
    arrival_rate: float, service_rates: Sequence[float], n_max: int
) -> NDArray[np.float64]:
    """``p_0 .. p_{n_max}`` of the M/M_interf/c chain (eq. 2-4); requires rho < 1."""
    lam = _check_rate("arrival_rate", arrival_rate)
    mu = _check_service_rates(service_rates)
    if isinstance(n_max, bool) or not isinstance(n_max, int | np.integer) or n_max < 0:
        raise ValueError(f"n_max must be an integer >= 0, got {n_max!r}")
    c = mu.size
    rho = lam / (c * mu[-1])
    if rho >= 1.0:
        raise ValueError(f"no steady state: rho = lambda / (c mu_c) = {rho:.4g} >= 1")
    p = _probabilities_up_to_c(lam, mu)
    if n_max <= c:
        return p[: n_max + 1]
    tail = p[c] * rho ** np.arange(1, n_max - c + 1)  # eq. 2, n >= c
    return np.concatenate([p, tail])


def _probabilities_up_to_c(lam: float, mu: NDArray[np.float64]) -> NDArray[np.float64]:
    """``p_0 .. p_c`` (eq. 2-4), in log space so large ``c`` neither overflows nor underflows."""
    c = mu.size
    k = np.arange(c + 1)
    log_terms = np.concatenate([[0.0], np.cumsum(np.log(lam / mu))]) - gammaln(k + 1)  # eq. 2
    rho = lam / (c * mu[-1])
    log_h = logsumexp(np.append(log_terms[:c], log_terms[c] - math.log1p(-rho)))  # eq. 3
    return np.exp(log_terms - log_h)  # p0 = 1/H, eq. 4


def _check_rate(name: str, value: float) -> float:
    try:
        rate = float(value)
    except (TypeError, ValueError):
        rate = math.nan
    if not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"{name} must be positive and finite (per second), got {value!r}")
    return rate


def _check_service_rates(service_rates: Sequence[float]) -> NDArray[np.float64]:
    mu = np.asarray(service_rates, dtype=np.float64)
    if mu.ndim != 1 or mu.size == 0:
        raise ValueError(f"service_rates must be a non-empty sequence mu_1..mu_c, got {mu!r}")
    for i, r in enumerate(mu.tolist()):
        _check_rate(f"service_rates[{i}] (mu_{i + 1})", r)
    return mu


# --- Configuration reference table (§IV-A, last paragraph of §IV-C, §IV-D) -----------------------


@dataclass(frozen=True)
class ParallelConfig:
    """A parallelism configuration, ordered as the paper's Table I."""

    service: int  # C_service = c: the most requests a serving unit runs at once
    inter_node: int  # C_inter: machines that serve each request together (one serving unit)
    intra_threads: int  # C_intra: cores each request uses on each of its machines
    # of the c, how many run in one process on one copy of the model (not the paper's: how a
    # host packs its service parallelism, which changes mu_i and the memory the c take)
    lanes: int = 1

    @property
    def processes(self) -> int:
        """The processes the c requests run in: ceil(c / lanes)."""
        return -(-self.service // self.lanes)


@dataclass(frozen=True)
class ConfigChoice:
    """One configuration evaluated at one cluster load."""

    config: ParallelConfig
    latency: float  # predicted mean latency, seconds (eq. 13 at the unit's arrival rate)
    units: int  # serving units the cluster splits into: floor(machines / C_inter)
    unit_arrival_rate: float  # lambda = lambda_all / units, requests per second


@dataclass(frozen=True)
class ConfigRow:
    """A row of the reference table: the best and second-best stable configurations at a load.

    ``best`` is ``None`` when no configuration is stable at ``load`` (requests per second).
    """

    load: float
    best: ConfigChoice | None
    runner_up: ConfigChoice | None


Profile = Mapping[tuple[int, int] | tuple[int, int, int], Sequence[float]]


def serf_config_table(
    profile: Profile,
    loads: Sequence[float],
    *,
    machines: int,
    cores_per_machine: int,
    method: Method = "paper",
) -> tuple[ConfigRow, ...]:
    """Best configuration per cluster load, rows sorted by load (serf §IV-A, §IV-C).

    ``profile[(inter_node, intra_threads)]`` is ``mu_1 .. mu_cmax`` profiled with that inter-node
    degree and thread count. A configuration ``(c, inter, intra)`` is feasible when ``inter <=
    machines`` and ``c * intra <= cores_per_machine`` (the threads of ``c`` concurrent requests
    share one machine's cores, so ``C_intra <= F / c``) and ``c <= cmax``. The cluster then splits
    into ``machines // inter`` serving units (left-over machines idle), each seeing an equal share
    of the load, and the configuration's latency is ``serf_latency`` of one unit.

    A key ``(inter_node, intra_threads, lanes)`` gives mu_i with the i requests run ``lanes`` to
    a process (:class:`ParallelConfig`; a two-part key: one to a process). Of configurations
    predicted alike, the one of fewer processes wins.
    """
    if machines < 1 or cores_per_machine < 1:
        raise ValueError(
            f"need machines, cores_per_machine >= 1, got {machines}, {cores_per_machine}"
        )
    candidates = _candidates(profile, machines, cores_per_machine)
    rows = []
    for load in sorted(_check_rate("loads", x) for x in loads):
        choices = [_evaluate(cfg, mu, machines, load, method) for cfg, mu in candidates]
        ranked = sorted((ch for ch in choices if math.isfinite(ch.latency)), key=_rank)
        best = ranked[0] if ranked else None
        rows.append(ConfigRow(load, best, ranked[1] if len(ranked) > 1 else None))
    return tuple(rows)


def lookup_config(
    table: Sequence[ConfigRow], load: float, *, rule: LookupRule = "next_higher"
) -> ConfigRow:
    """The table row the scheduler (§IV-D) uses at the observed ``load`` (requests per second).

    ``"next_higher"`` takes the smallest level at or above ``load`` (conservative: the config was
    chosen for at least this much traffic), or the top level beyond the table; ``"nearest"`` the
    closest level, the higher one on ties.
    """
    if not table:
        raise ValueError("table is empty")
    if not (math.isfinite(load) and load >= 0):
        raise ValueError(f"load must be a finite rate >= 0, got {load!r}")
    rows = sorted(table, key=lambda row: row.load)
    if rule == "next_higher":
        return next((row for row in rows if row.load >= load), rows[-1])
    if rule == "nearest":
        return min(reversed(rows), key=lambda row: abs(row.load - load))
    raise ValueError(f"rule must be 'next_higher' or 'nearest', got {rule!r}")


def _candidates(
    profile: Profile, machines: int, cores: int
) -> list[tuple[ParallelConfig, tuple[float, ...]]]:
    out = []
    profiled: dict[tuple[int, int], list[int]] = {}
    for key in profile:
        inter, intra, lanes = (*key, 1)[:3]
        profiled.setdefault((inter, intra), []).append(lanes)
    for key, rates in profile.items():
        inter, intra, lanes = (*key, 1)[:3]
        if min(inter, intra, lanes) < 1:
            raise ValueError(
                f"profile key (inter_node, intra_threads[, lanes]) must be >= 1, got {key}"
            )
        mu = tuple(_check_service_rates(rates).tolist())
        if inter > machines:
            continue
        for c in range(1, min(len(mu), cores // intra) + 1):
            if lanes_differ(c, lanes, profiled[inter, intra]):
                out.append((ParallelConfig(c, inter, intra, lanes), mu[:c]))
    if not out:
        raise ValueError(f"no profiled configuration fits {machines} machines x {cores} cores")
    return out


def lanes_differ(c: int, lanes: int, profiled: Sequence[int]) -> bool:
    """Whether ``c`` requests ``lanes`` to a process are laid out unlike with any smaller lanes
    value of ``profiled``: not when such a value also holds the ``c`` in one process (the same
    process running the same requests, kept once, at the fewest lanes)."""
    return not any(c <= other < lanes for other in profiled)


def _evaluate(
    cfg: ParallelConfig, mu: tuple[float, ...], machines: int, load: float, method: Method
) -> ConfigChoice:
    units = machines // cfg.inter_node
    unit_rate = load / units  # lambda = lambda_all / (N / C_inter), §IV-C last paragraph
    return ConfigChoice(cfg, serf_latency(unit_rate, mu, method=method), units, unit_rate)


def _rank(choice: ConfigChoice) -> tuple[float, int, int, int, int]:
    """Lowest latency first; ties go to the configuration that uses fewer resources."""
    cfg = choice.config
    return (
        choice.latency,
        cfg.inter_node,
        cfg.service * cfg.intra_threads,
        cfg.service,
        cfg.processes,
    )
