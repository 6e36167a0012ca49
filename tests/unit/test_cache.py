"""The CLOCK prediction cache and its request / fetch API."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from raysrv.cache import MISS, ClockCache, PredictionCache, cache_key


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
