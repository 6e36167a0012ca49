"""The prediction cache of Clipper (NSDI'17, §4.2): CLOCK eviction, request / fetch.

Keys are ``(model, version, input bytes)`` (:func:`cache_key`), so a new model version never
serves an old answer; a string or bytes input, of variable length, is keyed by a digest of its
bytes, so that a key's size does not grow with the input's. :class:`ClockCache` is the pure
store; :class:`PredictionCache` adds Clipper's non-blocking API on top for asyncio callers:

* ``request(key, compute)`` returns whether the entry is present and, if it is neither present
  nor being computed, starts ``compute()`` and remembers it as pending, so that concurrent
  identical queries cost one model evaluation;
* ``fetch(key)`` returns the value if present, else :data:`MISS`.

A query that joins an identical one in flight keeps its own deadline
(:meth:`PredictionCache.get_or_compute`): it is never answered after it, and a refusal or a
drop at the first query's earlier deadline does not become its answer.

CLOCK (second chance): entries sit on a ring with a reference bit set on every hit; the hand
sweeps, clearing bits, and evicts the first entry whose bit is clear. O(1) amortised per
operation, an approximation of LRU.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

__all__ = ["MISS", "ClockCache", "JoinExpired", "PredictionCache", "cache_key"]

MISS: Final = object()


class JoinExpired(TimeoutError):
    """A query's deadline passed while it waited on an identical query's computation, which
    goes on for the queries it was started for."""


@dataclass(frozen=True)
class _Flight:
    """A computation in flight and the deadline of the query it was started for."""

    result: asyncio.Future[Any]
    deadline: float


def cache_key(
    model: str, version: str, x: np.ndarray | str | bytes
) -> tuple[str, str, str, tuple[int, ...], bytes]:
    """The cache key of input ``x`` for one model version (dtype and shape are part of it; a
    string or bytes input's key holds the BLAKE2b digest of its bytes, UTF-8 for a string)."""
    if isinstance(x, str):
        return model, version, "string", (), hashlib.blake2b(x.encode()).digest()
    if isinstance(x, bytes):
        return model, version, "bytes", (), hashlib.blake2b(x).digest()
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
    """Clipper's request / fetch API over a :class:`ClockCache`, with in-flight coalescing.
    Deadlines are read on ``clock``."""

    def __init__(self, capacity: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._store = ClockCache(capacity)
        self._clock = clock
        self._pending: dict[Hashable, _Flight] = {}

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

    def request(
        self, key: Hashable, compute: Callable[[], Awaitable[Any]], deadline: float = math.inf
    ) -> bool:
        """True if ``key`` is cached; otherwise make sure ``compute`` runs once for it (for a
        query with ``deadline``, if this starts it)."""
        if key in self._store:
            return True
        if key not in self._pending and self._store.capacity:
            result = asyncio.ensure_future(compute())
            self._pending[key] = _Flight(result, deadline)
            result.add_done_callback(lambda fut: self._settle(key, fut))
        return False

    def _settle(self, key: Hashable, fut: asyncio.Future[Any]) -> None:
        if key in self._pending and self._pending[key].result is fut:
            del self._pending[key]
        if not fut.cancelled() and fut.exception() is None:
            self._store.put(key, fut.result())

    async def get_or_compute(
        self, key: Hashable, compute: Callable[[], Awaitable[Any]], deadline: float = math.inf
    ) -> tuple[Any, bool]:
        """``(value, hit)``: the cached value, a coalesced in-flight one, or a fresh computation
        (``compute``, which keeps to ``deadline`` itself). ``hit`` is True when no new model
        evaluation was started for this call.

        A query that finds its key in flight waits for it until its own ``deadline`` only, then
        raises :class:`JoinExpired`. If the computation fails and this query's deadline is
        later than the one it was started for (``inf``: best effort), it runs ``compute``: the
        failure may be that earlier deadline's refusal or drop, which says nothing of its own.
        """
        value = self.fetch(key)
        if value is not MISS:
            return value, True
        if not self._store.capacity:
            return await compute(), False
        flight = self._pending.get(key)
        if flight is None:
            self.request(key, compute, deadline)
            return await asyncio.shield(self._pending[key].result), False
        timeout = max(0.0, deadline - self._clock()) if math.isfinite(deadline) else None
        done, _ = await asyncio.wait((flight.result,), timeout=timeout)
        if not done:
            raise JoinExpired("the deadline passed while joined to an identical query")
        if flight.result.cancelled() or (
            flight.result.exception() is not None and deadline > flight.deadline
        ):
            return await self.get_or_compute(key, compute, deadline)
        return flight.result.result(), True
