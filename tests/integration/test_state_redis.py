"""The Redis state store and the query path over it, against a real redis-server."""

from __future__ import annotations

import asyncio

from raysrv._server import Server
from raysrv.config import RaysrvSpec
from raysrv.state import RedisStore, make_store
from raysrv.testing import EchoModel, fake_execute, model_spec, spec
from tests.unit.test_state import round_trip


def test_redis_store_round_trip_is_shared_between_clients(redis_url: str) -> None:
    async def scenario() -> None:
        store = make_store(redis_url)
        assert isinstance(store, RedisStore)
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


def test_feedback_reaches_a_second_ingress_through_redis(redis_url: str) -> None:
    """Two servers (as two ingress replicas would be) share answered queries through Redis."""
    parsed = RaysrvSpec.model_validate(
        spec([model_spec("a")], [{"name": "one", "models": ["a"]}], state=redis_url)
    )

    async def scenario() -> None:
        first, second = (
            Server(parsed, {"a": fake_execute(EchoModel())}, store=make_store(redis_url))
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
