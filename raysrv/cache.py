"""The prediction cache of Clipper (NSDI'17, §4.2): CLOCK eviction, request / fetch.

Keys are ``(model, version, input bytes)`` (:func:`cache_key`), so a new model version never
serves an old answer. :class:`ClockCache` is the pure store; :class:`PredictionCache` adds
Clipper's non-blocking API on top for asyncio callers:

* ``request(key, compute)`` returns whether the entry is present and, if it is neither present
  nor being computed, starts ``compute()`` and remembers it as pending, so that concurrent
  identical queries cost one model evaluation;
* ``fetch(key)`` returns the value if present, else :data:`MISS`.

CLOCK (second chance): entries sit on a ring with a reference bit set on every hit; the hand
sweeps, clearing bits, and evicts the first entry whose bit is clear. O(1) amortised per
operation, an approximation of LRU.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Final

import numpy as np

__all__ = ["MISS", "ClockCache", "PredictionCache", "cache_key"]

MISS: Final = object()


def cache_key(
    model: str, version: str, x: np.ndarray
) -> tuple[str, str, str, tuple[int, ...], bytes]:
    """The cache key of input ``x`` for one model version (dtype and shape are part of it)."""
    return model, version, x.dtype.str, x.shape, x.tobytes()


class ClockCache:
    """A fixed-capacity map with CLOCK eviction; capacity 0 stores nothing."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self._capacity = capacity
        self._keys: list[Hashable] = []
        self._slots: dict[Hashable, int] = {}
        self._values: list[Any] = []
        self._referenced: list[bool] = []
        self._hand = 0

    @property
    def capacity(self) -> int:
        return self._capacity

    def __len__(self) -> int:
        return len(self._slots)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._slots

    def get(self, key: Hashable) -> Any:
        """The value under ``key`` (marking it referenced), or :data:`MISS`."""
        slot = self._slots.get(key)
        if slot is None:
            return MISS
        self._referenced[slot] = True
        return self._values[slot]

    def put(self, key: Hashable, value: Any) -> None:
        """Store ``value``, evicting by CLOCK when full."""
        if self._capacity == 0:
            return
        slot = self._slots.get(key)
        if slot is None:
            slot = self._free_slot()
            self._keys[slot] = key
            self._slots[key] = slot
        self._values[slot] = value
        self._referenced[slot] = False

    def _free_slot(self) -> int:
        if len(self._keys) < self._capacity:
            self._keys.append(None)
            self._values.append(None)
            self._referenced.append(False)
            return len(self._keys) - 1
        while self._referenced[self._hand]:  # second chance: clear and move on
            self._referenced[self._hand] = False
            self._hand = (self._hand + 1) % self._capacity
        victim = self._hand
        del self._slots[self._keys[victim]]
        self._hand = (self._hand + 1) % self._capacity
        return victim

    def resize(self, capacity: int) -> ClockCache:
        """A cache of the new capacity holding the latest-inserted entries that fit."""
        fresh = ClockCache(capacity)
        if capacity:
            for key, slot in list(self._slots.items())[-capacity:]:
                fresh.put(key, self._values[slot])
        return fresh


class PredictionCache:
    """Clipper's request / fetch API over a :class:`ClockCache`, with in-flight coalescing."""

    def __init__(self, capacity: int) -> None:
        self._store = ClockCache(capacity)
        self._pending: dict[Hashable, asyncio.Future[Any]] = {}

    @property
    def capacity(self) -> int:
        return self._store.capacity

    def __len__(self) -> int:
        return len(self._store)

    def resize(self, capacity: int) -> None:
        self._store = self._store.resize(capacity)

    def fetch(self, key: Hashable) -> Any:
        """The cached value, or :data:`MISS` (pending computations are not values yet)."""
        return self._store.get(key)

    def request(self, key: Hashable, compute: Callable[[], Awaitable[Any]]) -> bool:
        """True if ``key`` is cached; otherwise make sure ``compute`` runs once for it."""
        if key in self._store:
            return True
        if key not in self._pending and self._store.capacity:
            self._pending[key] = asyncio.ensure_future(compute())
            self._pending[key].add_done_callback(lambda fut: self._settle(key, fut))
        return False

    def _settle(self, key: Hashable, fut: asyncio.Future[Any]) -> None:
        self._pending.pop(key, None)
        if not fut.cancelled() and fut.exception() is None:
            self._store.put(key, fut.result())

    async def get_or_compute(
        self, key: Hashable, compute: Callable[[], Awaitable[Any]]
    ) -> tuple[Any, bool]:
        """``(value, hit)``: the cached value, a coalesced in-flight one, or a fresh computation.

        ``hit`` is True when no new model evaluation was started for this call.
        """
        value = self.fetch(key)
        if value is not MISS:
            return value, True
        if not self._store.capacity:
            return await compute(), False
        pending = self._pending.get(key)
        if pending is not None:
            return await asyncio.shield(pending), True
        self.request(key, compute)
        return await asyncio.shield(self._pending[key]), False
