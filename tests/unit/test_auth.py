"""API keys (``ingress.api_keys``): with any configured, predictions, infer requests and
feedback need one of them, sent as a bearer token or in ``x-api-key``; the rest of the API stays
readable; the OpenAPI schema says which operations need a key; a key too short to be hard to
guess is refused when the config is read, without the key in the message."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from pydantic import ValidationError

from raysrv._http import KEYED, create_http_app
from raysrv._server import Server
from raysrv.config import IngressSpec, RaysrvSpec
from raysrv.testing import EchoModel, fake_workers, model_spec, spec

KEY, OTHER = "k" * 24, "second-key-of-the-ingress"
SPEC = RaysrvSpec.model_validate(
    spec([model_spec("a")], [{"name": "one", "models": ["a"]}], ingress={"api_keys": [KEY, OTHER]})
)
INPUT = [1.0, 2.0, 3.0, 4.0]
INFER = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": INPUT}]}


def _calls(headers: dict[str, str]) -> tuple[list[int], httpx.Response]:
    """The statuses of a prediction (the app's route and the model's), an infer request and a
    feedback sent with ``headers``, and the first answer."""

    async def scenario() -> tuple[list[int], httpx.Response]:
        server = Server(SPEC, {"a": fake_workers(EchoModel())})
        transport = httpx.ASGITransport(app=create_http_app(server, 4096))
        async with httpx.AsyncClient(
            transport=transport, base_url="http://raysrv", headers=headers
        ) as c:
            first = await c.post("/v1/one/predict", json={"input": INPUT})
            answers = [
                first,
                await c.post("/v1/models/a/predict", json={"input": INPUT}),
                await c.post("/v2/models/a/infer", json=INFER),
                await c.post("/v1/one/feedback", json={"query_id": "q", "label": 1}),
            ]
        return [a.status_code for a in answers], first

    return asyncio.run(scenario())


@pytest.mark.parametrize(
    "headers",
    [{}, {"authorization": "Bearer wrong-key-wrong-key-wrong"}, {"x-api-key": KEY[:-1]},
     {"authorization": f"Basic {KEY}"}, {"x-api-key": KEY + "k"}],
)  # fmt: skip
def test_without_a_right_key_every_keyed_route_is_a_401_that_asks_for_one(
    headers: dict[str, str],
) -> None:
    statuses, first = _calls(headers)
    assert statuses == [401] * 4
    assert first.headers["www-authenticate"] == "Bearer"
    assert first.json()["error"] == "unauthorized"
    assert KEY not in first.text


@pytest.mark.parametrize(
    "headers",
    [{"authorization": f"Bearer {KEY}"}, {"authorization": f"bearer {OTHER}"}, {"x-api-key": KEY}],
)
def test_any_configured_key_as_a_bearer_token_or_x_api_key_opens_them(
    headers: dict[str, str],
) -> None:
    statuses, _ = _calls(headers)
    assert statuses == [200, 200, 200, 404]  # the feedback's query is unknown: past the key


def test_the_rest_of_the_api_is_read_without_a_key_and_the_schema_says_what_needs_one() -> None:
    async def scenario() -> tuple[list[int], dict]:
        server = Server(SPEC, {"a": fake_workers(EchoModel())})
        transport = httpx.ASGITransport(app=create_http_app(server, 4096))
        async with httpx.AsyncClient(transport=transport, base_url="http://raysrv") as c:
            reads = [await c.get(path) for path in ("/healthz", "/v1/apps", "/v1/models/a")]
            schema = (await c.get("/openapi.json")).json()
        return [r.status_code for r in reads], schema

    statuses, schema = asyncio.run(scenario())
    assert statuses == [200, 200, 200]
    assert set(schema["components"]["securitySchemes"]) == {"bearer", "apiKey"}
    for path, method in KEYED:
        assert schema["paths"][path][method]["security"] == [{"bearer": []}, {"apiKey": []}]
    assert "security" not in schema["paths"]["/healthz"]["get"]


def test_without_keys_the_schema_declares_none() -> None:
    open_spec = RaysrvSpec.model_validate(spec([model_spec("a")], []))

    async def scenario() -> dict:
        server = Server(open_spec, {"a": fake_workers(EchoModel())})
        transport = httpx.ASGITransport(app=create_http_app(server, 4096))
        async with httpx.AsyncClient(transport=transport, base_url="http://raysrv") as c:
            return (await c.get("/openapi.json")).json()

    schema = asyncio.run(scenario())
    assert "securitySchemes" not in schema["components"]
    assert "security" not in schema["paths"]["/v1/{app}/predict"]["post"]


@pytest.mark.parametrize("key", ["short-key", "has a space in it!!", "non-ascii-key-é-é-é-é"])
def test_a_key_easy_to_guess_or_to_mangle_is_refused_by_index_never_repeated(key: str) -> None:
    with pytest.raises(ValidationError) as caught:
        IngressSpec.model_validate({"api_keys": [KEY, key]})
    message = "; ".join(e["msg"] for e in caught.value.errors())
    assert "api_keys[1]" in message
    assert key not in message
    assert json.dumps(key)[1:-1] not in message


FEEDBACK_KEY = "feedback-key-of-app-one"


def test_an_apps_feedback_keys_guard_its_feedback_alone() -> None:
    """``feedback_keys`` of app ``one``: its feedback needs one in ``x-feedback-key`` (401
    without, with a wrong one, or with it as a bearer token); its predictions and the other
    app's feedback need none."""
    keyed = RaysrvSpec.model_validate(
        spec(
            [model_spec("a")],
            [
                {"name": "one", "models": ["a"], "feedback_keys": [FEEDBACK_KEY]},
                {"name": "two", "models": ["a"]},
            ],
        )
    )

    async def scenario() -> list[httpx.Response]:
        server = Server(keyed, {"a": fake_workers(EchoModel())})
        transport = httpx.ASGITransport(app=create_http_app(server, 4096))
        async with httpx.AsyncClient(transport=transport, base_url="http://raysrv") as c:
            one = (await c.post("/v1/one/predict", json={"input": INPUT})).json()["query_id"]
            two = (await c.post("/v1/two/predict", json={"input": INPUT})).json()["query_id"]
            sends = [
                ("one", one, {}),
                ("one", one, {"x-feedback-key": FEEDBACK_KEY[:-1]}),
                ("one", one, {"authorization": f"Bearer {FEEDBACK_KEY}"}),
                ("one", one, {"x-feedback-key": FEEDBACK_KEY}),
                ("two", two, {}),
            ]
            return [
                await c.post(f"/v1/{app}/feedback", json={"query_id": q, "label": 1}, headers=h)
                for app, q, h in sends
            ]

    answers = asyncio.run(scenario())
    assert [a.status_code for a in answers] == [401, 401, 401, 200, 200]
    assert "x-feedback-key: KEY" in answers[0].json()["message"]
    assert FEEDBACK_KEY not in answers[1].text


def test_a_feedback_key_too_short_is_refused_by_index_never_repeated() -> None:
    short = spec([model_spec("a")], [{"name": "one", "models": ["a"], "feedback_keys": ["short"]}])
    with pytest.raises(ValidationError) as info:
        RaysrvSpec.model_validate(short)
    message = "; ".join(e["msg"] for e in info.value.errors())
    assert "feedback_keys[0] must be at least 16" in message
    assert "short" not in message
