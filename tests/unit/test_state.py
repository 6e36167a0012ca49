"""State stores: the bounded memory store and the memory fallback (Redis: integration tier)."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from raysrv.metrics import Metrics
from raysrv.state import FallbackStore, MemoryStore, StateStore, make_store
from raysrv.testing import FakeClock

__all__ = ["FallbackCounter", "count_up", "round_trip"]


class FallbackCounter(Metrics):
    """Counts the operations a store served from memory, by operation."""

    def __init__(self) -> None:
        self.fallbacks: Counter[str] = Counter()

    def store_fallback(self, operation: str) -> None:
        self.fallbacks[operation] += 1


def count_up(state: dict[str, Any]) -> dict[str, Any]:
    return {**state, "n": state["n"] + 1}


def zero() -> dict[str, Any]:
    return {"n": 0}


async def round_trip(store: StateStore) -> None:
    record = {"app": "a", "context": "u", "input": [1.0, 2.0], "predictions": {"m": 3}}
    await store.put_prediction("q1", record)
    assert await store.get_prediction("q1") == record
    assert await store.get_prediction("q2") is None
    assert await store.put_feedback("q1", {"label": 3})
    assert not await store.put_feedback("q1", {"label": 4})  # one feedback a query
    assert await store.get_feedback("q1") == {"label": 3}
    await store.drop_feedback("q1")
    assert await store.get_feedback("q1") is None
    assert await store.put_feedback("q1", {"label": 3})
    assert await store.swap_feedback("q1", {"label": 5}) == (True, {"label": 3})  # relabel
    assert await store.get_feedback("q1") == {"label": 5}
    assert await store.swap_feedback("q3", 7) == (False, None)
    assert await store.get_feedback("q3") == 7
    assert await store.get_state("a", "u") is None
    await store.set_state("a", "u", {"weights": [0.5, 0.5]})
    assert await store.get_state("a", "u") == {"weights": [0.5, 0.5]}
    assert await store.get_state("a", "other") is None
    assert await store.update_state("a", "counted", zero, count_up) == {"n": 1}
    assert await store.update_state("a", "counted", zero, count_up) == {"n": 2}
    assert await store.get_state("a", "counted") == {"n": 2}


def test_memory_storeround_trip_and_window() -> None:
    async def scenario() -> None:
        await round_trip(MemoryStore())
        small = MemoryStore(window=2)
        for i in range(3):
            await small.put_prediction(f"q{i}", {"i": i})
        assert await small.get_prediction("q0") is None
        assert await small.get_prediction("q2") == {"i": 2}

    asyncio.run(scenario())


def test_a_memory_store_gives_back_a_records_input_array_as_it_was_put() -> None:
    """An array input is kept as its raw bytes: it comes back equal, of its dtype and shape,
    and the caller's own to change."""
    import numpy as np

    async def scenario() -> None:
        store = MemoryStore()
        for x in (np.arange(6, dtype=np.float32).reshape(2, 3), np.array([1, -2], np.int64)):
            await store.put_prediction("q", {"app": "a", "input": x, "predictions": {"m": [1]}})
            back = await store.get_prediction("q")
            assert back is not None
            assert back["predictions"] == {"m": [1]}
            assert back["input"].dtype == x.dtype
            assert back["input"].shape == x.shape
            np.testing.assert_array_equal(back["input"], x)
            back["input"][0] = 7  # writable, and not the stored copy
            again = await store.get_prediction("q")
            np.testing.assert_array_equal(again["input"], x)

    asyncio.run(scenario())


def test_a_memory_store_keeps_each_kind_within_its_byte_budget_the_newest_first() -> None:
    """Hostile traffic (large inputs, labels, endless contexts) pushes the oldest entries out:
    what each kind holds, as stored, stays within the budget, and the newest are kept."""
    budget = 200_000

    async def scenario() -> MemoryStore:
        store = MemoryStore(budget_bytes=budget)
        for i in range(100):
            await store.put_prediction(f"q{i}", {"input": "x" * 10_000, "i": i})
            await store.put_feedback(f"q{i}", "y" * 10_000)
            await store.set_state("app", f"context {i}", {"w": "z" * 10_000})
        assert await store.get_prediction("q0") is None
        assert (await store.get_prediction("q99"))["i"] == 99
        assert await store.get_feedback("q99") == "y" * 10_000
        assert await store.get_state("app", "context 0") is None
        assert await store.get_state("app", "context 99") == {"w": "z" * 10_000}
        return store

    store = asyncio.run(scenario())
    for table in (store._predictions, store._feedback, store._states):
        held = sum(len(v) for v in table.entries.values())
        assert table.bytes == held
        assert budget - 11_000 < held <= budget  # full, to within one entry


def test_memory_update_state_inits_only_when_absent() -> None:
    inits: list[int] = []

    def init() -> dict[str, Any]:
        inits.append(1)
        return {"n": 10}

    async def scenario() -> None:
        store = MemoryStore()
        await store.set_state("a", "known", {"n": 3})
        assert await store.update_state("a", "known", init, count_up) == {"n": 4}
        assert inits == []
        assert await store.update_state("a", "new", init, count_up) == {"n": 11}
        assert inits == [1]
        assert await store.get_state("a", "new") == {"n": 11}
        assert await store.get_state("a", "known") == {"n": 4}

    asyncio.run(scenario())


class Flaky:
    """A memory store that refuses connections while ``down``; ``calls`` counts what it got."""

    def __init__(self) -> None:
        self.inner = MemoryStore()
        self.down = False
        self.calls = 0

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        method = getattr(self.inner, name)

        async def call(*args: Any) -> Any:
            self.calls += 1
            if self.down:
                raise ConnectionRefusedError("nothing listens")
            return await method(*args)

        return call


def fallback_over(primary: Flaky) -> tuple[FallbackStore, FallbackCounter, FakeClock]:
    metrics, clock = FallbackCounter(), FakeClock()
    store = FallbackStore(primary, (OSError,), metrics, retry_after_s=1.0, clock=clock)
    return store, metrics, clock


def test_fallback_serves_from_memory_and_tries_primary_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    primary = Flaky()
    store, metrics, clock = fallback_over(primary)

    async def scenario() -> None:
        await store.update_state("a", "u", zero, count_up)
        assert metrics.fallbacks == Counter()
        primary.down = True
        calls = primary.calls
        await store.put_prediction("q1", {"app": "a"})
        assert await store.get_prediction("q1") == {"app": "a"}
        assert await store.update_state("a", "u", zero, count_up) == {"n": 1}
        assert await store.get_state("a", "u") == {"n": 1}
        assert primary.calls == calls + 1
        clock.advance(1.0)
        await store.put_feedback("q1", 1)
        assert primary.calls == calls + 2
        assert await store.get_feedback("q1") == 1

    with caplog.at_level(logging.WARNING, logger="raysrv.state"):
        asyncio.run(scenario())
    assert metrics.fallbacks == Counter(
        put_prediction=1,
        get_prediction=1,
        update_state=1,
        get_state=1,
        put_feedback=1,
        get_feedback=1,
    )
    assert [r.message for r in caplog.records if "unreachable" in r.message] == [
        "state store unreachable (ConnectionRefusedError: nothing listens); "
        "serving from memory, retrying every 1.0 s"
    ]


def test_fallback_returns_to_primary_whose_copy_wins() -> None:
    primary = Flaky()
    store, metrics, clock = fallback_over(primary)

    async def scenario() -> None:
        await store.set_state("a", "u", {"n": 5})
        primary.down = True
        await store.put_prediction("during", {"app": "a"})
        assert await store.update_state("a", "u", zero, count_up) == {"n": 1}
        primary.down = False
        assert await store.get_state("a", "u") == {"n": 1}
        clock.advance(1.0)
        assert await store.update_state("a", "u", zero, count_up) == {"n": 6}
        fallbacks = sum(metrics.fallbacks.values())
        assert await store.get_prediction("during") == {"app": "a"}
        assert await primary.inner.get_prediction("during") is None
        assert sum(metrics.fallbacks.values()) == fallbacks

    asyncio.run(scenario())


def test_fallback_does_not_hide_other_errors() -> None:
    primary = Flaky()
    store, metrics, _ = fallback_over(primary)

    def broken(state: dict[str, Any]) -> dict[str, Any]:
        raise ValueError("bad state")

    with pytest.raises(ValueError, match="bad state"):
        asyncio.run(store.update_state("a", "u", zero, broken))
    assert metrics.fallbacks == Counter()


def test_make_store_kinds() -> None:
    assert isinstance(make_store("memory"), MemoryStore)
    pytest.importorskip("redis")
    assert isinstance(make_store("redis://127.0.0.1:1/0"), FallbackStore)


def test_the_memory_store_keeps_entries_out_of_the_collectors_sight_and_apart() -> None:
    """Records are kept pickled: 1,000 of them add no objects for a full collection to walk
    (as dicts of arrays they made one take 37 ms), and a caller's copy is its own."""
    import gc

    import numpy as np

    async def scenario() -> None:
        store = MemoryStore()
        gc.collect()
        before = len(gc.get_objects())
        for i in range(1000):
            record = {"input": np.zeros(64), "predictions": {"m": {"label": i}}}
            await store.put_prediction(f"q{i}", record)
        gc.collect()
        assert len(gc.get_objects()) - before < 50
        await store.set_state("a", "u", {"weights": [1.0]})
        mine = await store.get_state("a", "u")
        mine["weights"].append(2.0)
        assert await store.get_state("a", "u") == {"weights": [1.0]}

    asyncio.run(scenario())
