"""Holding a batch for the ingress's concurrency (``busy_timeout_ms``): what the ingress counts,
and what the policies make of it, with in-process workers."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import pytest

from raysrv._server import Inside, Server
from raysrv.config import RaysrvSpec
from raysrv.testing import EchoModel, FakeClock, fake_workers, model_spec, spec

HOLD_MS = 10_000  # far longer than any test here runs: a batch held for it would show
SHORT_HOLD_MS = 300  # long beside the model's 20 ms batches, short beside the SLO


def test_inside_counts_requests_and_keeps_the_most_at_once_of_the_last_windows() -> None:
    clock = FakeClock()
    inside = Inside(clock, window_s=0.1)
    for _ in range(3):
        inside.enter()
    inside.leave()
    assert (inside.now, inside.peak()) == (2, 3)
    clock.advance(0.1)  # a new window: the last one's three are still recent
    inside.leave()
    assert (inside.now, inside.peak()) == (1, 3)
    clock.advance(0.1)  # and now they are not
    assert inside.peak() == 1
    inside.enter()
    assert inside.peak() == 2
    clock.advance(0.5)  # windows passed unread: only what is inside now is known
    inside.leave()
    inside.leave()
    assert (inside.now, inside.peak()) == (0, 0)


def _server(busy_timeout_ms: float, log: list[int], policy: str = "fixed") -> Server:
    params = {"max_batch_size": 8, "busy_timeout_ms": busy_timeout_ms}
    if policy == "fixed":
        params["timeout_ms"] = 0
    model = model_spec("echo", batching={"policy": policy, "params": params})
    parsed = RaysrvSpec.model_validate(spec([model], [{"name": "a", "models": ["echo"]}]))
    return Server(parsed, {"echo": fake_workers(EchoModel(), delay_s=0.02, log=log)})


async def _closed_loop(server: Server, clients: int, rounds: int) -> None:
    """``clients`` callers, each sending its next query a millisecond after its answer comes
    (its trip back and forth), the first of each a millisecond after the one before."""

    async def client(k: int) -> None:
        await asyncio.sleep(0.001 * k)
        for _ in range(rounds):
            await server.predict_model("echo", np.full(4, k, dtype=np.float32))
            await asyncio.sleep(0.001)

    await asyncio.gather(*(client(k) for k in range(clients)))


@pytest.mark.parametrize("policy", ["fixed", "deadline"])
@pytest.mark.parametrize("hold_ms", [0, SHORT_HOLD_MS])
def test_clients_that_came_together_batch_together_when_held(hold_ms: float, policy: str) -> None:
    log: list[int] = []

    async def scenario() -> None:
        server = _server(hold_ms, log, policy)
        await _closed_loop(server, clients=4, rounds=6)
        await server.close()

    asyncio.run(scenario())
    # the first comes alone, and the other three queue behind its batch. Held, they wait for
    # the first client's next query, and the four stay one batch: the last three wait out
    # the hold, the first client being done. Not held, the first client's query is cut alone
    # each time the other three are
    if hold_ms:
        assert log == [1] + [4] * 5 + [3], log
    else:
        assert log == [1, 3] * 6, log


def test_a_lone_client_never_waits_for_the_hold() -> None:
    log: list[int] = []

    async def scenario() -> float:
        server = _server(HOLD_MS, log)
        began = time.monotonic()
        await _closed_loop(server, clients=1, rounds=5)
        took = time.monotonic() - began
        await server.close()
        return took

    assert asyncio.run(scenario()) < HOLD_MS / 1000.0
    assert log == [1] * 5


def test_a_request_of_many_inputs_counts_once() -> None:
    log: list[int] = []

    async def scenario() -> list[Any]:
        server = _server(HOLD_MS, log)
        rows = np.ones((3, 4), dtype=np.float32)
        answers = await server.predict_model_many("echo", rows)
        await server.close()
        return answers

    answers = asyncio.run(scenario())
    assert [a["output"]["batch_size"] for a in answers] == [3, 3, 3]
    assert log == [3]
