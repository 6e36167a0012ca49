"""State stores: the bounded memory store (Redis is tested in the integration tier)."""

from __future__ import annotations

import asyncio

import pytest

from raysrv.state import MemoryStore, RedisStore, StateStore, make_store

__all__ = ["round_trip"]


async def round_trip(store: StateStore) -> None:
    record = {"app": "a", "context": "u", "input": [1.0, 2.0], "predictions": {"m": 3}}
    await store.put_prediction("q1", record)
    assert await store.get_prediction("q1") == record
    assert await store.get_prediction("q2") is None
    await store.put_feedback("q1", {"label": 3})
    assert await store.get_feedback("q1") == {"label": 3}
    assert await store.get_state("a", "u") is None
    await store.set_state("a", "u", {"weights": [0.5, 0.5]})
    assert await store.get_state("a", "u") == {"weights": [0.5, 0.5]}
    assert await store.get_state("a", "other") is None


def test_memory_storeround_trip_and_window() -> None:
    async def scenario() -> None:
        await round_trip(MemoryStore())
        small = MemoryStore(window=2)
        for i in range(3):
            await small.put_prediction(f"q{i}", {"i": i})
        assert await small.get_prediction("q0") is None
        assert await small.get_prediction("q2") == {"i": 2}

    asyncio.run(scenario())


def test_make_store_kinds() -> None:
    assert isinstance(make_store("memory"), MemoryStore)
    pytest.importorskip("redis")
    assert isinstance(make_store("redis://127.0.0.1:1/0"), RedisStore)
