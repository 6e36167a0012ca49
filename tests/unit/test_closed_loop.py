"""A closed loop of clients through the pool simulator: callers that send their next query as
soon as the last one is answered or refused, and the ``deadline`` policy's hold that keeps them
in whole batches."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from raysrv.analytics import PoolSimResult, SimModel, simulate_closed_loop
from raysrv.analytics.poolsim import Legs
from raysrv.batching import make_policy

SLO_S = 0.2
CLIENTS = 16


def _service(seed: int) -> Callable[[int], float]:
    """A batch of k in 34 ms + 4.9 ms a query (16 in about 112 ms, over half the SLO), each run
    jittered by a lognormal of log-spread 10%."""
    rng = np.random.default_rng(seed)
    return lambda k: (0.034 + 0.0049 * k) * float(rng.lognormal(0.0, 0.1))


def _loop(seed: int, **params: object) -> PoolSimResult:
    policy = make_policy("deadline", {"max_batch_size": CLIENTS, **params}, SLO_S)
    return simulate_closed_loop(
        CLIENTS,
        20.0,
        SimModel(policy, _service(seed), pinned=True),
        slo=SLO_S,
        depth=2,
        hop_s=lambda: Legs(0.005, 0.005),
        stagger_s=0.01,
        profile_runs=10,
    )


def test_each_client_has_one_query_out_at_a_time_and_every_query_ends_once() -> None:
    policy = make_policy("fixed", {"max_batch_size": 4, "timeout_ms": 0}, SLO_S)
    result = simulate_closed_loop(
        3, 1.0, SimModel(policy, lambda k: 0.01 * k, pinned=True), slo=SLO_S, stagger_s=0.003
    )
    ended = result.arrivals + np.where(result.rejected, result.refused_after, result.latencies)
    assert np.isfinite(ended).all()  # each answered or refused
    for t in result.arrivals:
        out = (result.arrivals <= t) & ~(ended <= t)
        assert out.sum() <= 3
    assert result.arrivals[:3].tolist() == pytest.approx([0.0, 0.001, 0.002])
    assert result.arrivals.size > 3 * 10  # each client went on sending until the end
    assert result.arrivals.max() < 1.0


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_clients_that_start_apart_are_held_into_whole_batches_by_default(seed: int) -> None:
    """Cut as the worker frees, the staggered clients fall into groups that the deadlines keep
    apart: each group's queries wait behind the other's batch, and those that could not finish
    are refused and sent again. The default hold waits for the clients on their way."""
    held, unheld = _loop(seed), _loop(seed, busy_timeout_ms=0)
    assert held.batch_sizes.min() == CLIENTS
    assert not held.rejected.any()
    assert not held.late.any()
    assert unheld.batch_sizes.mean() < 0.75 * CLIENTS
    assert unheld.rejected.any()
    assert held.within(SLO_S).sum() > 1.15 * unheld.within(SLO_S).sum()
