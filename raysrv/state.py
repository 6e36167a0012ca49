"""Where served predictions, feedback and selection-policy states live: memory or Redis.

Feedback arrives after the answer (clipper §4.2: "feedback is likely to return soon after
predictions are rendered"), so each answered query is kept for a while under its ``query_id``
with its input and the predictions of the models that answered it; ``POST .../feedback`` joins
the label with that record and hands both to the selection policy's ``observe``. Selection
states are kept per (app, context key), as Clipper's contextualized selection does (§5.3).

``memory`` keeps the last ``window`` records per process (lost on restart, not shared between
ingress replicas); a Redis URL shares them between replicas and keeps them for ``ttl_s``.
Records and states are JSON; a record's input may be a numpy array, kept as is in memory and
written as nested lists to Redis.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any, Protocol

import numpy as np

__all__ = ["MemoryStore", "RedisStore", "StateStore", "make_store"]

DEFAULT_WINDOW = 10_000
DEFAULT_TTL_S = 3600


class StateStore(Protocol):
    async def put_prediction(self, query_id: str, record: dict[str, Any]) -> None: ...
    async def get_prediction(self, query_id: str) -> dict[str, Any] | None: ...
    async def put_feedback(self, query_id: str, label: Any) -> None: ...
    async def get_feedback(self, query_id: str) -> Any: ...
    async def get_state(self, app: str, context: str) -> dict[str, Any] | None: ...
    async def set_state(self, app: str, context: str, state: dict[str, Any]) -> None: ...
    async def close(self) -> None: ...


class MemoryStore:
    """In-process store keeping the newest ``window`` predictions and feedbacks."""

    def __init__(self, window: int = DEFAULT_WINDOW) -> None:
        self._window = window
        self._predictions: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._feedback: OrderedDict[str, Any] = OrderedDict()
        self._states: dict[tuple[str, str], dict[str, Any]] = {}

    def _bounded_put(self, table: OrderedDict[str, Any], key: str, value: Any) -> None:
        table[key] = value
        if len(table) > self._window:
            table.popitem(last=False)

    async def put_prediction(self, query_id: str, record: dict[str, Any]) -> None:
        self._bounded_put(self._predictions, query_id, record)

    async def get_prediction(self, query_id: str) -> dict[str, Any] | None:
        return self._predictions.get(query_id)

    async def put_feedback(self, query_id: str, label: Any) -> None:
        self._bounded_put(self._feedback, query_id, label)

    async def get_feedback(self, query_id: str) -> Any:
        return self._feedback.get(query_id)

    async def get_state(self, app: str, context: str) -> dict[str, Any] | None:
        return self._states.get((app, context))

    async def set_state(self, app: str, context: str, state: dict[str, Any]) -> None:
        self._states[(app, context)] = state

    async def close(self) -> None:
        return None


class RedisStore:
    """Redis-backed store shared by every ingress replica; records expire after ``ttl_s``."""

    def __init__(self, url: str, prefix: str = "raysrv", ttl_s: int = DEFAULT_TTL_S) -> None:
        import redis.asyncio as aioredis

        self._redis = aioredis.Redis.from_url(url)
        self._prefix = prefix
        self._ttl_s = ttl_s

    def _key(self, *parts: str) -> str:
        return ":".join((self._prefix, *parts))

    async def put_prediction(self, query_id: str, record: dict[str, Any]) -> None:
        raw = json.dumps(record, default=_jsonable)
        await self._redis.set(self._key("pred", query_id), raw, ex=self._ttl_s)

    async def get_prediction(self, query_id: str) -> dict[str, Any] | None:
        raw = await self._redis.get(self._key("pred", query_id))
        return None if raw is None else json.loads(raw)

    async def put_feedback(self, query_id: str, label: Any) -> None:
        await self._redis.set(self._key("feedback", query_id), json.dumps(label), ex=self._ttl_s)

    async def get_feedback(self, query_id: str) -> Any:
        raw = await self._redis.get(self._key("feedback", query_id))
        return None if raw is None else json.loads(raw)

    async def get_state(self, app: str, context: str) -> dict[str, Any] | None:
        raw = await self._redis.get(self._key("state", app, context))
        return None if raw is None else json.loads(raw)

    async def set_state(self, app: str, context: str, state: dict[str, Any]) -> None:
        await self._redis.set(self._key("state", app, context), json.dumps(state))

    async def close(self) -> None:
        await self._redis.aclose()


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    raise TypeError(f"cannot store a {type(value).__name__} as JSON")


def make_store(state: str) -> StateStore:
    """The store a spec's ``state`` names: ``memory`` or a Redis URL."""
    if state == "memory":
        return MemoryStore()
    return RedisStore(state)
