"""The CLOCK prediction cache and its request / fetch API."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import numpy as np
import pytest

from raysrv._server import Server
from raysrv.cache import MISS, ClockCache, JoinExpired, PredictionCache, cache_key
from raysrv.config import RaysrvSpec
from raysrv.errors import DeadlineExpired, Rejected
from raysrv.testing import LabelModel, fake_workers, model_spec, spec


def test_clock_gives_referenced_entries_a_second_chance() -> None:
    cache = ClockCache(3)
    for key in "abc":
        cache.put(key, key.upper())
    assert cache.get("a") == "A"  # a is referenced, b and c are not
    cache.put("d", "D")  # the hand passes a (clearing its bit) and evicts b
    assert "b" not in cache
    assert [k in cache for k in "acd"] == [True, True, True]
    cache.put("e", "E")  # a's bit is clear now: c is next after the hand, evicted
    assert "c" not in cache
    assert cache.get("a") == "A"
    assert len(cache) == 3


def test_clock_evicts_in_insertion_order_without_hits() -> None:
    cache = ClockCache(2)
    for i in range(5):
        cache.put(i, i)
    assert cache.get(0) is MISS
    assert cache.get(2) is MISS
    assert (cache.get(3), cache.get(4)) == (3, 4)


def test_capacity_zero_stores_nothing_and_resize_keeps_what_fits() -> None:
    empty = ClockCache(0)
    empty.put("a", 1)
    assert empty.get("a") is MISS
    cache = ClockCache(4)
    for i in range(4):
        cache.put(i, i)
    smaller = cache.resize(2)
    assert len(smaller) == 2
    assert smaller.capacity == 2
    with pytest.raises(ValueError, match="capacity"):
        ClockCache(-1)


def test_key_depends_on_model_version_dtype_and_bytes() -> None:
    x = np.arange(4, dtype=np.float32)
    keys = {
        cache_key("m", "1", x),
        cache_key("m", "2", x),
        cache_key("n", "1", x),
        cache_key("m", "1", x.astype(np.float64)),
        cache_key("m", "1", x.reshape(2, 2)),
        cache_key("m", "1", x + 1),
    }
    assert len(keys) == 6
    assert cache_key("m", "1", x) == cache_key("m", "1", np.arange(4, dtype=np.float32))


def test_request_then_fetch_and_concurrent_queries_coalesce() -> None:
    async def scenario() -> None:
        cache = PredictionCache(8)
        calls = 0
        release = asyncio.Event()

        async def compute() -> str:
            nonlocal calls
            calls += 1
            await release.wait()
            return "y"

        assert cache.request("k", compute) is False
        assert cache.fetch("k") is MISS  # pending is not a value yet
        waiters = [asyncio.create_task(cache.get_or_compute("k", compute)) for _ in range(3)]
        await asyncio.sleep(0)
        release.set()
        results = await asyncio.gather(*waiters)
        assert results == [("y", True)] * 3
        assert calls == 1
        assert cache.request("k", compute) is True
        assert cache.fetch("k") == "y"

    asyncio.run(scenario())


def test_failures_are_not_cached() -> None:
    async def scenario() -> None:
        cache = PredictionCache(8)
        attempts = 0

        async def flaky() -> str:
            nonlocal attempts
            attempts += 1
            if attempts == 1:
                raise RuntimeError("boom")
            return "ok"

        with pytest.raises(RuntimeError, match="boom"):
            await cache.get_or_compute("k", flaky)
        await asyncio.sleep(0)
        assert await cache.get_or_compute("k", flaky) == ("ok", False)
        assert await cache.get_or_compute("k", flaky) == ("ok", True)
        assert attempts == 2

    asyncio.run(scenario())


def test_a_joined_query_fails_with_the_first_unless_its_deadline_is_later() -> None:
    """A computation's failure is every joined query's answer when it was started for a
    deadline at least as late as theirs; one joined with a later deadline (or best effort)
    computes its own, as the failure may be the first deadline's refusal."""

    async def scenario(deadlines: list[float]) -> tuple[list[Any], int]:
        cache = PredictionCache(8)
        calls = 0
        release = asyncio.Event()

        async def compute() -> str:
            nonlocal calls
            calls += 1
            if calls == 1:
                await release.wait()
                raise RuntimeError("refused for the first deadline")
            return "own"

        now = time.monotonic()
        waiters = [
            asyncio.create_task(cache.get_or_compute("k", compute, now + d)) for d in deadlines
        ]
        await asyncio.sleep(0)
        release.set()
        return await asyncio.gather(*waiters, return_exceptions=True), calls

    answers, calls = asyncio.run(scenario([30.0, 30.0, 20.0]))
    assert calls == 1
    assert [str(a) for a in answers] == ["refused for the first deadline"] * 3
    answers, calls = asyncio.run(scenario([30.0, 60.0, math.inf]))
    assert calls == 2  # the two later ones: one computes, the other joins it
    assert str(answers[0]) == "refused for the first deadline"
    assert answers[1] == ("own", False)
    assert answers[2] == ("own", True)


def test_a_joined_query_leaves_at_its_own_deadline_and_the_computation_goes_on() -> None:
    async def scenario() -> tuple[Any, Any, bool]:
        cache = PredictionCache(8)
        release = asyncio.Event()

        async def compute() -> str:
            await release.wait()
            return "y"

        first = asyncio.create_task(cache.get_or_compute("k", compute))  # best effort
        await asyncio.sleep(0)
        joined = cache.get_or_compute("k", compute, time.monotonic() + 0.01)
        left = await asyncio.gather(joined, return_exceptions=True)
        still_running = not first.done()
        release.set()
        return left[0], await first, still_running

    left, first, still_running = asyncio.run(scenario())
    assert isinstance(left, JoinExpired)
    assert still_running
    assert first == ("y", False)


def _cached_app(delay_s: float) -> tuple[Server, list[int]]:
    """One app over a model that takes ``delay_s`` per batch, with a cache; INFERs' batch
    sizes in the list."""
    models = [model_spec("m", source="raysrv.testing:LabelModel")]
    app = {"name": "a", "models": ["m"], "cache_size": 16}
    log: list[int] = []
    server = Server(
        RaysrvSpec.model_validate(spec(models, [app])),
        {"m": fake_workers(LabelModel(), delay_s, log)},
    )
    return server, log


def test_two_identical_queries_each_wait_under_their_own_slo() -> None:
    """The issue's case: the second of two identical queries joins the first's computation.
    With a tighter SLO it is dropped at its own deadline (504) while the first is answered
    from the one run; a best-effort one that joined a query dropped at its deadline is
    answered from a run of its own."""

    async def joined(first: dict[str, Any], second: dict[str, Any]) -> tuple[list[Any], list[int]]:
        server, log = _cached_app(0.5)
        try:
            one = asyncio.create_task(server.predict("a", [0, 0, 0, 1], **first))
            await asyncio.sleep(0.01)  # in flight
            two = asyncio.create_task(server.predict("a", [0, 0, 0, 1], **second))
            answers = await asyncio.gather(one, two, return_exceptions=True)
        finally:
            await server.close()
        return answers, log

    (loose, tight), log = asyncio.run(joined({"slo_ms": 5_000}, {"slo_ms": 50}))
    assert isinstance(tight, DeadlineExpired)
    assert loose["output"] == {"label": 0}
    assert log == [1]
    (tight, patient), log = asyncio.run(joined({"slo_ms": 50}, {"best_effort": True}))
    assert isinstance(tight, (DeadlineExpired, Rejected))
    assert patient["output"] == {"label": 0}
    assert patient["cache_hit"] is False
    assert len(log) == 2
