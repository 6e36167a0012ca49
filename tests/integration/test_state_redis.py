"""The Redis state store and the query path over it, against a real redis-server."""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from raysrv._server import Server
from raysrv.config import RaysrvSpec
from raysrv.errors import Overloaded
from raysrv.state import FallbackStore, RedisStore, StateStore, make_store
from raysrv.testing import EchoModel, FakeClock, fake_workers, model_spec, spec
from tests.conftest import _wait_for_port, free_port
from tests.unit.test_state import FallbackCounter, count_up, round_trip, zero


def test_redis_store_round_trip_is_shared_between_clients(redis_url: str) -> None:
    async def scenario() -> None:
        store = make_store(redis_url)
        assert isinstance(store, FallbackStore)
        try:
            await round_trip(store)
        finally:
            await store.close()
        reopened = make_store(redis_url)
        try:
            assert (await reopened.get_prediction("q1"))["predictions"] == {"m": 3}
        finally:
            await reopened.close()

    asyncio.run(scenario())


def test_a_selection_state_in_redis_expires_a_while_after_its_last_write(redis_url: str) -> None:
    """Each write of a state, set or updated, gives it ``state_ttl_s`` more: a context nobody
    teaches any more leaves Redis."""

    async def scenario() -> list[int]:
        store = RedisStore(redis_url, prefix="ttl", state_ttl_s=100)
        try:
            await store.set_state("a", "set", {"n": 1})
            await store.update_state("a", "updated", zero, count_up)
            raw = store._redis
            return [await raw.ttl("ttl:state:a:set"), await raw.ttl("ttl:state:a:updated")]
        finally:
            await store.close()

    for ttl in asyncio.run(scenario()):
        assert 90 <= ttl <= 100


def test_feedback_reaches_a_second_ingress_through_redis(redis_url: str) -> None:
    """Two servers (as two ingress replicas would be) share answered queries through Redis."""
    parsed = RaysrvSpec.model_validate(
        spec([model_spec("a")], [{"name": "one", "models": ["a"]}], state=redis_url)
    )

    async def scenario() -> None:
        first, second = (
            Server(parsed, {"a": fake_workers(EchoModel())}, store=make_store(redis_url))
            for _ in range(2)
        )
        try:
            answer = await first.predict("one", [1, 2, 3, 4], context="user-7")
            ack = await second.feedback("one", answer["query_id"], {"sum": 10})
            assert ack["accepted"] is True
        finally:
            await first.close()
            await second.close()

    asyncio.run(scenario())


async def racy_count_up(store: StateStore, context: str) -> None:
    """The read-then-write that ``update_state`` replaces."""
    state = await store.get_state("race", context) or zero()
    await store.set_state("race", context, count_up(state))


def test_concurrent_updates_from_two_clients_lose_nothing(redis_url: str) -> None:
    """200 increments racing on one context from two clients (two ingress replicas) all count.

    More than 200 calls of the change show that the clients' transactions did conflict and
    were redone. The same race through get_state then set_state loses most increments, which
    shows the race is real: reads are sent before the writes land.
    """
    changes: list[dict[str, Any]] = []

    def counted(state: dict[str, Any]) -> dict[str, Any]:
        changes.append(state)
        return count_up(state)

    async def scenario() -> None:
        clients = [RedisStore(redis_url), RedisStore(redis_url)]
        try:
            await asyncio.gather(
                *(
                    c.update_state("race", "atomic", zero, counted)
                    for c in clients
                    for _ in range(100)
                )
            )
            assert await clients[0].get_state("race", "atomic") == {"n": 200}
            assert len(changes) > 200
            await asyncio.gather(*(racy_count_up(c, "racy") for c in clients for _ in range(100)))
            assert (await clients[0].get_state("race", "racy"))["n"] < 200
        finally:
            for client in clients:
                await client.close()

    asyncio.run(scenario())


def test_closing_does_not_fail_when_the_sockets_are_slow_to_finish_closing(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a busy machine the wait for a socket to finish closing can outlast the store's timeout
    (seen in the full suite); every socket has been told to close by then, so close() returns."""

    async def slow_to_finish(self: asyncio.StreamWriter) -> None:
        await asyncio.sleep(1.0)

    async def scenario() -> list[bool]:
        clients = [RedisStore(redis_url, timeout_s=0.05) for _ in range(2)]
        for client in clients:
            await client.set_state("slow-close", "s", {"n": 1})
        writers = [c._redis.connection_pool._available_connections[0]._writer for c in clients]
        monkeypatch.setattr(asyncio.StreamWriter, "wait_closed", slow_to_finish)
        for client in clients:
            await client.close()
        return [writer.is_closing() for writer in writers]

    assert asyncio.run(scenario()) == [True, True]


def test_update_state_gives_up_under_endless_contention(redis_url: str) -> None:
    import redis

    other = redis.Redis.from_url(redis_url)
    tries: list[dict[str, Any]] = []

    def change_while_another_writes(state: dict[str, Any]) -> dict[str, Any]:
        tries.append(state)
        other.incr("contended:state:a:u")
        return state

    async def scenario() -> None:
        store = RedisStore(redis_url, prefix="contended", max_tries=3)
        try:
            await store.update_state("a", "u", dict, change_while_another_writes)
        finally:
            await store.close()

    try:
        with pytest.raises(Overloaded, match="on each of 3 tries"):
            asyncio.run(scenario())
        assert tries == [{}, 1, 2]
    finally:
        other.close()


@contextmanager
def private_redis(workdir: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A redis-server of this test's own, which the test may stop or kill; killed at the end."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    port = free_port()
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen([*args, "--dir", str(workdir)], stdout=subprocess.DEVNULL)
    try:
        _wait_for_port(port, proc)
        yield f"redis://127.0.0.1:{port}/0", proc
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_queries_keep_their_state_when_redis_is_killed(tmp_path: Path) -> None:
    metrics = FallbackCounter()

    async def scenario(url: str, proc: subprocess.Popen[bytes]) -> None:
        store = make_store(url, metrics)
        await store.update_state("a", "u", zero, count_up)
        proc.kill()
        proc.wait(timeout=10)
        await store.put_prediction("q1", {"app": "a"})
        assert await store.get_prediction("q1") == {"app": "a"}
        assert await store.update_state("a", "u", zero, count_up) == {"n": 1}
        assert await store.update_state("a", "u", zero, count_up) == {"n": 2}
        await store.close()

    with private_redis(tmp_path) as (url, proc):
        asyncio.run(scenario(url, proc))
    assert metrics.fallbacks == Counter(put_prediction=1, get_prediction=1, update_state=2)


def test_a_frozen_redis_costs_one_timeout_then_its_copy_wins_again(tmp_path: Path) -> None:
    """SIGSTOP leaves connections open but unanswered: the read timeout is what detects it."""
    metrics, clock = FallbackCounter(), FakeClock()

    class CountingRedis(RedisStore):
        puts = 0

        async def put_prediction(self, query_id: str, record: dict[str, Any]) -> None:
            CountingRedis.puts += 1
            await super().put_prediction(query_id, record)

    async def scenario(url: str, proc: subprocess.Popen[bytes]) -> None:
        redis = CountingRedis(url, timeout_s=0.2)
        store = FallbackStore(redis, redis.down_errors, metrics, retry_after_s=1.0, clock=clock)
        try:
            await store.set_state("a", "u", {"n": 5})
            proc.send_signal(signal.SIGSTOP)
            assert await store.update_state("a", "u", zero, count_up) == {"n": 1}  # timed out
            await store.put_prediction("during", {"app": "a"})
            assert CountingRedis.puts == 0  # within retry_after_s: straight to memory
            proc.send_signal(signal.SIGCONT)
            clock.advance(1.0)
            assert await store.update_state("a", "u", zero, count_up) == {"n": 6}
            assert await store.get_prediction("during") == {"app": "a"}
        finally:
            proc.send_signal(signal.SIGCONT)
            await store.close()

    with private_redis(tmp_path) as (url, proc):
        asyncio.run(scenario(url, proc))
    assert metrics.fallbacks == Counter(update_state=1, put_prediction=1)


def test_redis_keeps_predictions_and_feedbacks_within_their_byte_budget(redis_url: str) -> None:
    """100 records of about 1 KB against a budget of 20,000 bytes, then 100 such feedbacks: each
    kind holds at most its budget of JSON, the newest, and its ledger's total is what it holds."""
    import redis

    client = redis.Redis.from_url(redis_url)
    budget, prefix = 20_000, "budgeted"

    def held(kind: str) -> dict[str, int]:
        keys = client.keys(f"{prefix}:{kind}:*")
        return {k.decode().rsplit(":", 1)[1]: client.strlen(k) for k in keys}

    async def scenario() -> None:
        store = RedisStore(redis_url, prefix=prefix, budget_bytes=budget)
        try:
            for i in range(100):
                record = {"app": "a", "context": "", "input": "x" * 1000, "predictions": {}}
                await store.put_prediction(f"q{i}", record)
                assert await store.put_feedback(f"q{i}", "y" * 1000)
            assert await store.swap_feedback("q99", "z" * 1500) == (True, "y" * 1000)
            await store.drop_feedback("q98")
        finally:
            await store.close()

    asyncio.run(scenario())
    for kind in ("pred", "feedback"):
        kept = held(kind)
        assert budget - 2_000 < sum(kept.values()) <= budget
        assert int(client.get(f"{prefix}:bytes:{kind}")) == sum(kept.values())
        assert client.zcard(f"{prefix}:ledger:{kind}") == len(kept)
        newest = sorted(kept, key=lambda q: int(q[1:]))
        assert newest == [
            f"q{i}"
            for i in range(100 - len(kept) - (kind == "feedback"), 100)
            if not (kind == "feedback" and i == 98)
        ]


def test_what_expired_leaves_the_redis_budget_ledger(redis_url: str) -> None:
    import redis

    client, prefix = redis.Redis.from_url(redis_url), "expiring"

    async def scenario() -> None:
        store = RedisStore(redis_url, prefix=prefix, ttl_s=1, budget_bytes=10_000)
        try:
            await store.put_prediction("old", {"input": "x" * 5000})
            await asyncio.sleep(2.1)
            await store.put_prediction("new", {"input": "x" * 100})
        finally:
            await store.close()

    asyncio.run(scenario())
    assert int(client.get(f"{prefix}:bytes:pred")) == client.strlen(f"{prefix}:pred:new")
    assert client.zrange(f"{prefix}:ledger:pred", 0, -1) == [f"{prefix}:pred:new".encode()]
