"""Where served predictions, feedback and selection-policy states live: memory or Redis.

Feedback arrives after the answer (clipper §4.2: "feedback is likely to return soon after
predictions are rendered"), so each answered query is kept for a while under its ``query_id``
with its input and the predictions of the models that answered it; ``POST .../feedback`` joins
the label with that record and hands both to the selection policy's ``observe``. Selection
states are kept per (app, context key) in an external store, as Clipper's contextualized
selection does with Redis (clipper §5.3), so every ingress replica learns into the same state.
Two feedbacks for one context may race on two replicas: :meth:`StateStore.update_state` applies
each one atomically, so neither overwrites the other.

``memory`` keeps the last ``window`` records per process (lost on restart, not shared between
ingress replicas); a Redis URL shares them between replicas and keeps them for ``ttl_s``, and
falls back to memory while Redis is unreachable (:class:`FallbackStore`). Records and states
are JSON; a record's input may be a numpy array, kept as is in memory and written as nested
lists to Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import pickle
import time
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import numpy as np

from raysrv.errors import Overloaded
from raysrv.metrics import Metrics

__all__ = ["FallbackStore", "MemoryStore", "RedisStore", "StateStore", "make_store"]

logger = logging.getLogger(__name__)

DEFAULT_WINDOW = 10_000
DEFAULT_BUDGET = 64 << 20  # bytes each kind of entry may take in a memory store
STATE_WINDOW = 1_000_000  # selection states a memory store keeps, within its budget
DEFAULT_TTL_S = 3600
STATE_TTL_S = 30 * 86_400  # a context's selection state in Redis, from its last feedback
DEFAULT_TIMEOUT_S = 0.25
DEFAULT_MAX_TRIES = 50
DEFAULT_RETRY_AFTER_S = 1.0
BACKOFF_S = 0.001
BACKOFF_CAP_S = 0.05

State = dict[str, Any]
T = TypeVar("T")


class StateStore(Protocol):
    async def put_prediction(self, query_id: str, record: dict[str, Any]) -> None: ...
    async def get_prediction(self, query_id: str) -> dict[str, Any] | None: ...
    async def put_feedback(self, query_id: str, label: Any) -> bool:
        """Keep ``label`` as the query's feedback unless it has one: whether it had none. Two
        racing feedbacks of one query: exactly one is kept."""
        ...

    async def swap_feedback(self, query_id: str, label: Any) -> tuple[bool, Any]:
        """Keep ``label`` as the query's feedback, in place of any: whether it had one, and
        that one. Two racing swaps of one query: each gets what the other replaced, or none."""
        ...

    async def drop_feedback(self, query_id: str) -> None:
        """Forget the query's feedback (one that could not be used), so it may be given again."""
        ...

    async def get_feedback(self, query_id: str) -> Any: ...
    async def get_state(self, app: str, context: str) -> State | None: ...
    async def set_state(self, app: str, context: str, state: State) -> None: ...

    async def update_state(
        self, app: str, context: str, init: Callable[[], State], change: Callable[[State], State]
    ) -> State:
        """Atomically replace the state (``init()`` when there is none) by ``change(state)``.

        A read then a write would lose one of two updates that race between them; this one
        does not. ``change`` may run more than once (a store retries when another writer got
        in first), each time on a freshly read state, so it must be pure: no side effects, and
        its answer depends on its argument only. Returns the state written.
        """
        ...

    async def close(self) -> None: ...


class _Table:
    """Packed entries, the newest last, at most ``window`` of them and ``budget`` bytes of
    their values: the oldest go first."""

    def __init__(self, window: int, budget: int) -> None:
        self.entries: OrderedDict[Any, bytes] = OrderedDict()
        self.bytes = 0
        self._window, self._budget = window, budget

    def get(self, key: Any) -> bytes | None:
        return self.entries.get(key)

    def __contains__(self, key: Any) -> bool:
        return key in self.entries

    def put(self, key: Any, value: bytes) -> None:
        self.pop(key)
        self.entries[key] = value
        self.bytes += len(value)
        while len(self.entries) > self._window or self.bytes > self._budget:
            _, gone = self.entries.popitem(last=False)
            self.bytes -= len(gone)

    def pop(self, key: Any) -> None:
        gone = self.entries.pop(key, None)
        if gone is not None:
            self.bytes -= len(gone)


class MemoryStore:
    """In-process store keeping the newest ``window`` predictions and feedbacks and the last
    written ``STATE_WINDOW`` selection states (by app and context), each kind within
    ``budget_bytes`` as stored: a caller's large inputs, labels or many contexts push the oldest
    out rather than grow the ingress. A context whose state is pushed out starts again from the
    policy's initial state.

    Entries are kept pickled, each one bytes object the garbage collector does not track: as
    dicts of arrays, 10,000 records made one full collection take 37 ms (a stall of every query
    in the process; see :mod:`raysrv._heap`), pickled they add nothing to it, for about 12 µs
    to write a record and 8 µs to read one. A caller also cannot change a stored state in place,
    as with Redis.
    """

    def __init__(self, window: int = DEFAULT_WINDOW, budget_bytes: int = DEFAULT_BUDGET) -> None:
        self._predictions = _Table(window, budget_bytes)
        self._feedback = _Table(window, budget_bytes)
        self._states = _Table(STATE_WINDOW, budget_bytes)

    async def put_prediction(self, query_id: str, record: dict[str, Any]) -> None:
        self._predictions.put(query_id, _pack_record(record))

    async def get_prediction(self, query_id: str) -> dict[str, Any] | None:
        return _unpack_record(self._predictions.get(query_id))

    async def put_feedback(self, query_id: str, label: Any) -> bool:
        if query_id in self._feedback:  # no await between the check and the put: one step
            return False
        self._feedback.put(query_id, _pack(label))
        return True

    async def swap_feedback(self, query_id: str, label: Any) -> tuple[bool, Any]:
        old = self._feedback.get(query_id)  # no await between the get and the put: one step
        self._feedback.put(query_id, _pack(label))
        return old is not None, _unpack(old)

    async def drop_feedback(self, query_id: str) -> None:
        self._feedback.pop(query_id)

    async def get_feedback(self, query_id: str) -> Any:
        return _unpack(self._feedback.get(query_id))

    async def get_state(self, app: str, context: str) -> State | None:
        return _unpack(self._states.get((app, context)))

    async def set_state(self, app: str, context: str, state: State) -> None:
        self._states.put((app, context), _pack(state))

    async def update_state(
        self, app: str, context: str, init: Callable[[], State], change: Callable[[State], State]
    ) -> State:
        """Atomic without a lock: nothing between the read and the write yields to the loop."""
        current = _unpack(self._states.get((app, context)))
        state = change(init() if current is None else current)
        self._states.put((app, context), _pack(state))
        return state

    async def close(self) -> None:
        return None


# A write of a record within its kind's byte budget, in one round trip. The kind's ledger keeps
# each entry's expiry (a sorted set) and size (a hash) and their total: what expired on its own
# leaves the ledger first, then the entries due to expire soonest, the oldest of one TTL, go
# until the total is within the budget (the entry just written stays). ARGV[4]: ``set``; ``nx``,
# nothing written over an entry; ``get``, the entry replaced is returned.
_PUT_WITHIN_BUDGET = """
local key, ledger, sizes, total = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local value, ttl, budget, mode = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local old = redis.call('GET', key)
if old and mode == 'nx' then
  return {0, false}
end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1e6
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', ledger, '-inf', now)) do
  redis.call('DECRBY', total, tonumber(redis.call('HGET', sizes, gone) or '0'))
  redis.call('HDEL', sizes, gone)
end
redis.call('ZREMRANGEBYSCORE', ledger, '-inf', now)
local before = tonumber(redis.call('HGET', sizes, key) or '0')
redis.call('SET', key, value, 'EX', ttl)
redis.call('ZADD', ledger, now + ttl, key)
redis.call('HSET', sizes, key, #value)
local held = redis.call('INCRBY', total, #value - before)
while held > budget do
  local oldest = redis.call('ZRANGE', ledger, 0, 0)[1]
  if not oldest or oldest == key then
    break
  end
  held = redis.call('DECRBY', total, tonumber(redis.call('HGET', sizes, oldest) or '0'))
  redis.call('HDEL', sizes, oldest)
  redis.call('ZREM', ledger, oldest)
  redis.call('DEL', oldest)
end
return {1, old}
"""
_FORGET = """
redis.call('DECRBY', KEYS[4], tonumber(redis.call('HGET', KEYS[3], KEYS[1]) or '0'))
redis.call('HDEL', KEYS[3], KEYS[1])
redis.call('ZREM', KEYS[2], KEYS[1])
return redis.call('DEL', KEYS[1])
"""


class RedisStore:
    """Redis-backed store shared by every ingress replica; records expire after ``ttl_s``, a
    selection state ``state_ttl_s`` after it was last written (a context nobody teaches any more
    does not stay for good).

    Predictions and feedbacks each stay within ``budget_bytes`` of their JSON, all replicas
    together: every write runs one script that keeps a ledger of the kind's entries and drops
    the oldest past the budget (``_PUT_WITHIN_BUDGET``). Redis's own cost per key, and the
    ledger's (about 100 bytes an entry), come on top.

    Connecting and each reply wait at most ``timeout_s`` (Redis answers in about a
    millisecond, so a longer wait means it is gone), with one immediate reconnect for a pooled
    connection Redis has closed, rather than redis-py's default of ten tries with backoff that
    would hold a query for seconds. Query arguments of the URL win over these
    (``redis://host:6379/0?socket_timeout=1``). ``down_errors`` are the errors that mean Redis
    cannot be reached, for :class:`FallbackStore`.
    """

    def __init__(
        self,
        url: str,
        prefix: str = "raysrv",
        ttl_s: int = DEFAULT_TTL_S,
        state_ttl_s: int = STATE_TTL_S,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_tries: int = DEFAULT_MAX_TRIES,
        rng: np.random.Generator | None = None,
        budget_bytes: int = DEFAULT_BUDGET,
    ) -> None:
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff
        from redis.exceptions import ConnectionError, TimeoutError, WatchError

        self._redis = aioredis.Redis.from_url(
            url,
            socket_connect_timeout=timeout_s,
            socket_timeout=timeout_s,
            retry=Retry(NoBackoff(), 1),
        )
        self._prefix = prefix
        self._ttl_s, self._state_ttl_s = ttl_s, state_ttl_s
        self._budget = budget_bytes
        self._put = self._redis.register_script(_PUT_WITHIN_BUDGET)
        self._forget = self._redis.register_script(_FORGET)
        self._max_tries = max_tries
        self._rng = rng or np.random.default_rng()
        self._watch_error = WatchError
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self.down_errors: tuple[type[BaseException], ...] = (
            ConnectionError,
            TimeoutError,
            OSError,
            asyncio.TimeoutError,
        )

    def _key(self, *parts: str) -> str:
        return ":".join((self._prefix, *parts))

    def _ledger(self, kind: str) -> list[str]:
        """The keys of ``kind``'s ledger: entries' expiries, their sizes, their total."""
        return [self._key("ledger", kind), self._key("sizes", kind), self._key("bytes", kind)]

    async def _put_entry(self, kind: str, query_id: str, raw: str, mode: str) -> list[Any]:
        keys = [self._key(kind, query_id), *self._ledger(kind)]
        return await self._put(keys=keys, args=[raw, self._ttl_s, self._budget, mode])

    async def put_prediction(self, query_id: str, record: dict[str, Any]) -> None:
        await self._put_entry("pred", query_id, json.dumps(record, default=_jsonable), "set")

    async def get_prediction(self, query_id: str) -> dict[str, Any] | None:
        raw = await self._redis.get(self._key("pred", query_id))
        return None if raw is None else json.loads(raw)

    async def put_feedback(self, query_id: str, label: Any) -> bool:
        written, _ = await self._put_entry("feedback", query_id, json.dumps(label), "nx")
        return bool(written)

    async def swap_feedback(self, query_id: str, label: Any) -> tuple[bool, Any]:
        _, old = await self._put_entry("feedback", query_id, json.dumps(label), "get")
        return old is not None, None if old is None else json.loads(old)

    async def drop_feedback(self, query_id: str) -> None:
        keys = [self._key("feedback", query_id), *self._ledger("feedback")]
        await self._forget(keys=keys)

    async def get_feedback(self, query_id: str) -> Any:
        raw = await self._redis.get(self._key("feedback", query_id))
        return None if raw is None else json.loads(raw)

    async def get_state(self, app: str, context: str) -> State | None:
        raw = await self._redis.get(self._key("state", app, context))
        return None if raw is None else json.loads(raw)

    async def set_state(self, app: str, context: str, state: State) -> None:
        key = self._key("state", app, context)
        await self._redis.set(key, json.dumps(state), ex=self._state_ttl_s)

    async def update_state(
        self, app: str, context: str, init: Callable[[], State], change: Callable[[State], State]
    ) -> State:
        """Optimistic transaction: WATCH the key, read, MULTI/EXEC the write, retry on conflict.

        EXEC fails with ``WatchError`` when another client wrote the key after WATCH (or the
        connection dropped while watching); the read and ``change`` are then redone, at most
        ``max_tries`` times in all, after which the contention is reported as
        :class:`~raysrv.errors.Overloaded` (retry later) rather than spinning on. Coroutines of
        this process take turns on a key (one lock per key, dropped when unused), so a
        transaction only races those of other processes: without the lock, n feedbacks in
        flight for one context (every query without a context shares one) would each retry up
        to n times. Between tries a random wait, up to 1 ms doubling to at most 50 ms, breaks
        the lockstep in which the same client would lose every round.
        """
        key = self._key("state", app, context)
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        async with lock:
            for tries in range(self._max_tries):
                state = await self._try_update(key, init, change)
                if state is not None:
                    return state
                await asyncio.sleep(self._rng.uniform(0, min(BACKOFF_CAP_S, BACKOFF_S * 2**tries)))
        raise Overloaded(
            f"state of app {app!r} context {context!r} was changed by other writers on each of "
            f"{self._max_tries} tries; retry later"
        )

    async def _try_update(
        self, key: str, init: Callable[[], State], change: Callable[[State], State]
    ) -> State | None:
        """One WATCH/GET/MULTI/SET/EXEC round: the state written, or None if another won."""
        async with self._redis.pipeline(transaction=True) as pipe:
            try:
                await pipe.watch(key)
                raw = await pipe.get(key)
                state = change(init() if raw is None else json.loads(raw))
                pipe.multi()
                pipe.set(key, json.dumps(state), ex=self._state_ttl_s)
                await pipe.execute()
            except self._watch_error:
                return None
            return state

    async def close(self) -> None:
        """Close every pooled connection. A socket slower than ``timeout_s`` to finish closing
        (a busy event loop) is closed all the same, so that wait's timeout is not an error."""
        from redis.exceptions import TimeoutError as SlowToClose

        with contextlib.suppress(SlowToClose):
            await self._redis.aclose()


class FallbackStore:
    """``primary`` (Redis) while it answers, an in-process :class:`MemoryStore` while it does not.

    A lost Redis must not fail queries: an operation that raises one of ``down_errors`` is served
    from memory instead, counted by ``metrics.store_fallback`` and logged once per outage. Then
    for ``retry_after_s`` every operation goes straight to memory, so a dead Redis adds its
    timeout to one operation per interval instead of to every query; the first operation after
    the interval probes Redis again (the others keep using memory meanwhile) and Redis serves
    everything again once it answers.

    What is written during an outage stays in memory as the fallback copy and is not copied to
    Redis: once Redis is back its copy of a selection state wins, and what was learned from
    feedback in the outage is lost to it (the next outage starts from the memory copy). A query
    answered during the outage can still take its feedback afterwards: a prediction Redis does
    not have is looked up in memory.

    A wrapper rather than a resilient :class:`RedisStore` so that the Redis code stays a plain
    client and the fallback rules can be tested over any store.
    """

    def __init__(
        self,
        primary: StateStore,
        down_errors: tuple[type[BaseException], ...],
        metrics: Metrics | None = None,
        retry_after_s: float = DEFAULT_RETRY_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
        memory: MemoryStore | None = None,
    ) -> None:
        self._primary = primary
        self._memory = memory or MemoryStore()
        self._down_errors = down_errors
        self._metrics = metrics or Metrics()
        self._retry_after_s = retry_after_s
        self._clock = clock
        self._down = False
        self._retry_at = -float("inf")

    async def _call(self, operation: str, run: Callable[[StateStore], Awaitable[T]]) -> T:
        now = self._clock()
        if now < self._retry_at:
            return await self._fall_back(operation, run)
        probe = self._down
        if probe:
            self._retry_at = now + self._retry_after_s
        try:
            result = await run(self._primary)
        except self._down_errors as exc:
            self._went_down(exc)
            return await self._fall_back(operation, run)
        if probe:
            self._down, self._retry_at = False, -float("inf")
            logger.warning("state store answers again; back from memory to it")
        return result

    async def _fall_back(self, operation: str, run: Callable[[StateStore], Awaitable[T]]) -> T:
        self._metrics.store_fallback(operation)
        return await run(self._memory)

    def _went_down(self, exc: BaseException) -> None:
        self._retry_at = self._clock() + self._retry_after_s
        if not self._down:
            self._down = True
            logger.warning(
                "state store unreachable (%s: %s); serving from memory, retrying every %.1f s",
                type(exc).__name__,
                exc,
                self._retry_after_s,
            )

    async def put_prediction(self, query_id: str, record: dict[str, Any]) -> None:
        await self._call("put_prediction", lambda s: s.put_prediction(query_id, record))

    async def get_prediction(self, query_id: str) -> dict[str, Any] | None:
        record = await self._call("get_prediction", lambda s: s.get_prediction(query_id))
        return record if record is not None else await self._memory.get_prediction(query_id)

    async def put_feedback(self, query_id: str, label: Any) -> bool:
        return await self._call("put_feedback", lambda s: s.put_feedback(query_id, label))

    async def swap_feedback(self, query_id: str, label: Any) -> tuple[bool, Any]:
        return await self._call("swap_feedback", lambda s: s.swap_feedback(query_id, label))

    async def drop_feedback(self, query_id: str) -> None:
        await self._call("drop_feedback", lambda s: s.drop_feedback(query_id))

    async def get_feedback(self, query_id: str) -> Any:
        return await self._call("get_feedback", lambda s: s.get_feedback(query_id))

    async def get_state(self, app: str, context: str) -> State | None:
        return await self._call("get_state", lambda s: s.get_state(app, context))

    async def set_state(self, app: str, context: str, state: State) -> None:
        await self._call("set_state", lambda s: s.set_state(app, context, state))

    async def update_state(
        self, app: str, context: str, init: Callable[[], State], change: Callable[[State], State]
    ) -> State:
        return await self._call(
            "update_state", lambda s: s.update_state(app, context, init, change)
        )

    async def close(self) -> None:
        await self._primary.close()


def _pack(value: Any) -> bytes:
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def _unpack(raw: bytes | None) -> Any:
    return None if raw is None else pickle.loads(raw)


def _pack_record(record: dict[str, Any]) -> bytes:
    """A prediction record packed, its input array as its dtype, shape and raw bytes under
    ``RAW_INPUT``: a sixth of pickling the array, which every answered query pays."""
    x = record.get("input")
    if isinstance(x, np.ndarray):
        record = {**record, "input": None, RAW_INPUT: (x.dtype.str, x.shape, x.tobytes())}
    return _pack(record)


def _unpack_record(raw: bytes | None) -> dict[str, Any] | None:
    record = _unpack(raw)
    if record is not None and RAW_INPUT in record:
        dtype, shape, data = record.pop(RAW_INPUT)
        record["input"] = np.frombuffer(bytearray(data), dtype=dtype).reshape(shape)
    return record


RAW_INPUT = "input_array"  # a packed record's input array, as plain values


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    raise TypeError(f"cannot store a {type(value).__name__} as JSON")


def make_store(
    state: str, metrics: Metrics | None = None, budget_bytes: int = DEFAULT_BUDGET
) -> StateStore:
    """The store a spec's ``state`` names: ``memory``, or a Redis URL with a memory fallback;
    ``budget_bytes`` bounds each kind of entry in memory, and predictions and feedbacks in
    Redis."""
    if state == "memory":
        return MemoryStore(budget_bytes=budget_bytes)
    redis = RedisStore(state, budget_bytes=budget_bytes)
    memory = MemoryStore(budget_bytes=budget_bytes)
    return FallbackStore(redis, redis.down_errors, metrics, memory=memory)
