"""The ingress ASGI app over a Server whose replica groups are in-process fakes."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import httpx
import numpy as np
import pytest

import raysrv._http
from raysrv._http import create_http_app
from raysrv._server import (
    DESCRIBE_CHUNK,
    DOT_FROM,
    TRIP_WINDOW,
    TRIPS_KNOWN,
    Server,
    TripBack,
    coerce_input,
    coerce_inputs,
)
from raysrv.config import InputSpec, LiveConfig, RaysrvSpec
from raysrv.errors import BadRequest, RaysrvError
from raysrv.metrics import Metrics
from raysrv.testing import EchoModel, LocalWorkers, fake_workers, model_spec, spec

JSON = {"content-type": "application/json"}
SPEC = RaysrvSpec.model_validate(
    spec(
        [model_spec("a"), model_spec("b", max_queue=2)],
        [
            {"name": "one", "models": ["a"], "cache_size": 16},
            {
                "name": "ab",
                "models": ["a", "b"],
                "selection": {"policy": "split", "params": {"weights": {"b": 1}}},
                "context_field": "user",
            },
        ],
    )
)


def _server(delay_s: float = 0.0, logs: dict[str, list[int]] | None = None) -> Server:
    logs = logs if logs is not None else {"a": [], "b": []}
    return Server(SPEC, {m: fake_workers(EchoModel(), delay_s, logs[m]) for m in ("a", "b")})


async def _client(server: Server, limit: int = 4096) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=create_http_app(server, limit))
    return httpx.AsyncClient(transport=transport, base_url="http://raysrv")


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with await _client(_server()) as c:
        yield c


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _with_turns(call: Awaitable[Any]) -> tuple[Any, int]:
    """``call``'s result, and how many turns a task beside it had while it ran: how often
    ``call`` handed the event loop back."""
    turns = 0

    async def other_work() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    ticking = asyncio.create_task(other_work())
    await asyncio.sleep(0)
    before = turns
    result = await call
    ticking.cancel()
    return result, turns - before


def test_predict_answers_and_repeats_hit_the_cache() -> None:
    async def scenario() -> None:
        logs: dict[str, list[int]] = {"a": [], "b": []}
        async with await _client(_server(logs=logs)) as c:
            first = (await c.post("/v1/one/predict", json={"input": [1, 2, 3, 4]})).json()
            again = (await c.post("/v1/one/predict", json={"input": [1, 2, 3, 4]})).json()
        assert first["output"]["sum"] == 10.0
        assert first["models"] == ["a"]
        assert (first["cache_hit"], again["cache_hit"]) == (False, True)
        assert again["output"] == first["output"]
        assert first["query_id"] != again["query_id"]
        assert first["latency_ms"] >= 0
        assert logs["a"] == [1]  # the second answer came from the cache

    run(scenario())


def test_selection_picks_the_weighted_model_and_reads_the_context_field() -> None:
    async def scenario() -> None:
        async with await _client(_server()) as c:
            r = await c.post("/v1/ab/predict", json={"input": [0, 0, 0, 1], "user": "u1"})
            bad = await c.post("/v1/ab/predict", json={"input": [0, 0, 0, 1], "context": "u1"})
        assert r.status_code == 200
        assert r.json()["models"] == ["b"]
        assert bad.status_code == 400
        assert "unknown fields ['context']" in bad.json()["message"]

    run(scenario())


def test_feedback_joins_an_answered_query() -> None:
    async def scenario() -> None:
        async with await _client(_server()) as c:
            answer = (await c.post("/v1/one/predict", json={"input": [1, 1, 1, 1]})).json()
            ok = await c.post("/v1/one/feedback", json={"query_id": answer["query_id"], "label": 4})
            unknown = await c.post("/v1/one/feedback", json={"query_id": "nope", "label": 4})
            wrong_app = await c.post(
                "/v1/ab/feedback", json={"query_id": answer["query_id"], "label": 4}
            )
            malformed = await c.post("/v1/one/feedback", json={"label": 4})
        assert ok.status_code == 200
        assert ok.json()["accepted"] is True
        assert unknown.status_code == 404
        assert wrong_app.status_code == 404
        assert malformed.status_code == 400
        assert "query_id" in malformed.json()["message"]

    run(scenario())


@pytest.mark.parametrize(
    ("path", "body", "status", "fragment"),
    [
        ("/v1/one/predict", b"{not json", 400, "not valid JSON"),
        ("/v1/one/predict", b"[1, 2]", 400, "JSON object"),
        ("/v1/one/predict", b'{"inputs": [[1, 2, 3, 4]], "input": [1, 2, 3, 4]}', 400, "one of"),
        ("/v1/one/predict", b'{"user": "x"}', 400, "unknown fields ['user']"),
        ("/v1/ab/predict", b'{"user": "x"}', 400, "give one of the fields 'input'"),
        ("/v1/one/predict", b'{"inputs": []}', 400, "non-empty list"),
        ("/v1/one/predict", b'{"inputs": {"x": [1, 2, 3, 4]}}', 400, "non-empty list"),
        ("/v1/one/predict", b'{"inputs": [' + b"0, " * 1024 + b"0]}", 413, "limit of 1024"),
        ("/v1/one/predict", b'{"input": [1, 2, 3]}', 400, "shape [3], expected [4]"),
        ("/v1/one/predict", b'{"input": [[1, 2], [3]]}', 400, "rectangular"),
        ("/v1/one/predict", b'{"input": ["a", "b", "c", "d"]}', 400, "must hold numbers"),
        ("/v1/one/predict", b'{"input": [1, 2, 3, NaN]}', 400, "NaN"),
        ("/v1/one/predict", b'{"input": [1, 2, 3, 1e39]}', 400, "beyond the range of float32"),
        ("/v1/one/predict", b'{"input": [1, 2, 3, 4], "slo_ms": -1}', 400, "slo_ms"),
        ("/v1/one/predict", b'{"input": [1, 2, 3, 4], "slo_ms": "fast"}', 400, "slo_ms"),
        ("/v1/one/predict", b'{"input": [1, 2, 3, 4], "best_effort": 1}', 400, "best_effort"),
        ("/v1/one/predict", b'{"input": [1, 2, 3, 4], "priority": 2}', 400, "priority"),
        ("/v1/one/predict", b'{"input": [1, 2, 3, 4], "sent_at": "now"}', 400, "sent_at"),
        ("/v1/nope/predict", b'{"input": [1, 2, 3, 4]}', 404, "unknown app 'nope'"),
        ("/v1/one/predict", b'{"input": [' + b"1, " * 3000 + b"1]}", 413, "exceeds the limit"),
    ],
)
def test_bad_requests_get_a_4xx_with_a_message_and_serving_goes_on(
    path: str, body: bytes, status: int, fragment: str
) -> None:
    async def scenario() -> None:
        async with await _client(_server()) as c:
            bad = await c.post(path, content=body, headers={"content-type": "application/json"})
            good = await c.post("/v1/one/predict", json={"input": [1, 2, 3, 4]})
        assert bad.status_code == status
        assert fragment in bad.json()["message"]
        assert good.status_code == 200

    run(scenario())


def test_many_inputs_are_answered_together_in_order_each_with_its_answer_or_error() -> None:
    """One request of four inputs: the second is malformed and gets its own 400 while the
    others are answered; the fourth repeats the first and joins it."""

    async def scenario() -> tuple[httpx.Response, httpx.Response, int, int]:
        logs: dict[str, list[int]] = {"a": [], "b": []}
        async with await _client(_server(logs=logs)) as c:
            inputs = [[1, 2, 3, 4], [1, 2, 3], [5, 6, 7, 8], [1, 2, 3, 4]]
            app = await c.post("/v1/one/predict", json={"inputs": inputs})
            ran = sum(logs["a"])
            model = await c.post("/v1/models/a/predict", json={"inputs": inputs[2:]})
        return app, model, ran, sum(logs["a"])

    app, model, ran, ran_in_all = run(scenario())
    assert app.status_code == 200
    first, bad, third, again = app.json()["results"]
    assert (first["output"]["sum"], third["output"]["sum"]) == (10.0, 26.0)
    assert (bad["status"], bad["error"]) == (400, "bad_request")
    assert "shape [3], expected [4]" in bad["message"]
    assert again["output"] == first["output"]
    assert again["cache_hit"] is True
    assert first["query_id"] != again["query_id"]
    assert ran == 2  # the two distinct inputs
    assert model.status_code == 200
    third, repeat = model.json()["results"]
    assert (third["output"]["sum"], third["model"]) == (26.0, "a")
    assert repeat["output"]["sum"] == 10.0
    assert ran_in_all == 4  # no cache on the model route


@pytest.mark.parametrize(
    "inputs",
    [
        [[1, 2, 3, 4], [5, 6, 7, 8.5], [0, 0, 0, 0]],  # one conversion of them all
        [[1, 2, 3, 4], [1, 2, 3], ["a", "b", "c", "d"], [1, 2, 3, float("nan")], [9, 9, 9, 9]],
        [[1, 2, 3, 4], [[1, 2], [3, 4]], {"x": 1}, [1, 2, 3, 4]],
    ],
)
def test_many_inputs_are_read_exactly_as_each_would_be_alone(inputs: list[Any]) -> None:
    shape = SPEC.models[0].input
    together = coerce_inputs(inputs, shape)
    assert len(together) == len(inputs)
    for value, got in zip(inputs, together, strict=True):
        if isinstance(got, BadRequest):
            with pytest.raises(BadRequest) as alone_error:
                coerce_input(value, shape)
            assert str(got) == str(alone_error.value)
            continue
        alone = coerce_input(value, shape)
        assert (got.dtype, got.shape, got.tolist()) == (alone.dtype, alone.shape, alone.tolist())


@pytest.mark.parametrize(
    ("dtype", "finite", "refused"),
    [
        ("float64", [1e308, 1e308, -1e308, 1e308], [1.0, 2.0, float("nan"), 4.0]),
        ("float64", [1e308, 1e308, 1e308, 1e308], [1e308, 1e308, float("inf"), 1.0]),
        ("float32", [3e38, 3e38, 3e38, 3e38], [1.0, 2.0, 3.0, 1e39]),  # past float32's range
        ("float32", [0.0, -0.0, 1e-45, 3.4e38], [float("-inf"), 0.0, 0.0, 0.0]),
        ("float16", [65000.0, 65000.0, 65000.0, 65000.0], [70000.0, 1.0, 1.0, 1.0]),
    ],
)
def test_an_input_is_refused_only_where_it_holds_nan_or_an_infinity(
    dtype: str, finite: list[float], refused: list[float]
) -> None:
    """Finite values whose sum overflows are still finite, as are float32's and float16's
    largest; a value past the dtype's range becomes an infinity and is refused."""
    spec = InputSpec(shape=(4,), dtype=dtype)
    read = coerce_input(finite, spec)
    assert read.dtype == np.dtype(dtype)
    assert read.tolist() == np.asarray(finite, dtype=dtype).tolist()
    with pytest.raises(BadRequest, match="NaN or infinite"):
        coerce_input(refused, spec)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_large_input_is_checked_for_nan_and_infinities_too(dtype: str) -> None:
    """From DOT_FROM values on, the check is a dot product's: the same answers."""
    size = DOT_FROM + 3
    spec = InputSpec(shape=(size,), dtype=dtype)
    big = np.full(size, np.finfo(dtype).max / 2, dtype=dtype)
    assert coerce_input(big, spec).tolist() == big.tolist()
    for bad in (np.nan, np.inf, -np.inf):
        values = big.copy()
        values[-1] = bad
        with pytest.raises(BadRequest, match="NaN or infinite"):
            coerce_input(values, spec)


def _raw(array: np.ndarray, shape: str | None = None) -> dict[str, Any]:
    """A raw tensor request's body and headers."""
    headers = {
        "content-type": "application/octet-stream",
        "x-raysrv-shape": shape or ",".join(map(str, array.shape)),
        "x-raysrv-dtype": str(array.dtype),
    }
    return {"content": array.tobytes(), "headers": headers}


def test_raw_tensor_bodies_are_answered_as_their_json_twins() -> None:
    rows = np.array([[1, 2, 3, 4], [5, 6, 7, 8], [0, 0, 1, 0]], dtype=np.float64)

    async def scenario() -> dict[str, httpx.Response]:
        async with await _client(_server()) as c:
            return {
                "one": await c.post("/v1/one/predict?slo_ms=5000", **_raw(rows[0])),
                # model b queues at most 2
                "many": await c.post("/v1/ab/predict?user=u1&priority=1", **_raw(rows[:2])),
                "model": await c.post("/v1/models/a/predict", **_raw(rows[1:].astype("int32"))),
            }

    r = run(scenario())
    assert r["one"].json()["output"]["sum"] == 10.0
    assert r["one"].json()["models"] == ["a"]
    many = r["many"].json()["results"]
    assert [a["output"]["sum"] for a in many] == [10.0, 26.0]
    assert {a["models"][0] for a in many} == {"b"}  # the split app read its context field
    assert [a["output"]["sum"] for a in r["model"].json()["results"]] == [26.0, 1.0]


def test_an_output_json_cannot_carry_is_a_500_body_for_its_input_alone() -> None:
    overflow = [3e38, 3e38, 0, 0]  # float32's sum of it is an infinity

    async def scenario() -> tuple[httpx.Response, httpx.Response]:
        async with await _client(_server()) as c:
            one = await c.post("/v1/models/a/predict", json={"input": overflow})
            many = await c.post("/v1/one/predict", json={"inputs": [[1, 2, 3, 4], overflow]})
            return one, many

    one, many = run(scenario())
    assert one.status_code == 500
    assert one.json()["error"] == "model_failed"
    assert "NaN or an infinity" in one.json()["message"]
    assert many.status_code == 200
    good, bad = many.json()["results"]
    assert good["output"]["sum"] == 10.0
    assert (bad["status"], bad["error"]) == (500, "model_failed")


@pytest.mark.parametrize(
    "payload",
    [
        {"output": [0.5, 1, True, None], "query_id": "é", "nested": {"a": [[1.5], []]}},
        {"output": [1e308, 1e308]},  # finite values whose sum is not
        {"output": 2**70},  # past orjson's 64 bits: the standard encoder
        {"output": [np.float64(0.25)], 3: "key"},  # a float subclass, a key not a string
        {"output": "null", "transit_ms": None, "nested": {"none": None}},  # nulls not NaN
    ],
)
def test_an_answer_of_finite_values_is_encoded_as_the_standard_encoder_reads_it(
    payload: dict[Any, Any],
) -> None:
    status, body = raysrv._http._encoded(200, payload)
    assert status == 200
    assert json.loads(body) == json.loads(json.dumps(payload))


@pytest.mark.parametrize(
    "payload",
    [
        {"output": [1.0, float("nan")]},
        {"output": {"scores": [[0.5], [float("inf")]]}},
        {"output": [2, -float("inf")]},
        {"output": [np.float64("nan")]},
        {"output": 1.0, "confidence": float("nan")},
        {"output": [float("nan")], "transit_ms": None},  # one null a None, one a NaN
        {"transit_ms": None, "confidence": float("inf")},
        {"output": [{"label": 1, "p": [0.5]}, {"label": 2, "p": float("inf")}]},
    ],
)
def test_an_answer_holding_a_non_finite_float_is_the_documented_500(
    payload: dict[str, Any],
) -> None:
    status, body = raysrv._http._encoded(200, payload)
    assert status == 500
    assert json.loads(body)["error"] == "model_failed"


@pytest.mark.parametrize(
    ("kwargs", "query", "fragment"),
    [
        (_raw(np.zeros(4, np.float32), shape="4,2"), "", "holds 32 bytes, got 16"),
        (_raw(np.zeros(4, np.float32), shape="four"), "", "x-raysrv-shape must be"),
        (_raw(np.zeros((1, 1, 4), np.float32)), "", "neither one input [4] nor inputs"),
        (_raw(np.zeros(4, np.complex64)), "", "x-raysrv-dtype must be one of"),
        (_raw(np.zeros(4, np.float32)), "?slo_ms=soon", "slo_ms must be a positive number"),
        (_raw(np.zeros(4, np.float32)), "?colour=red", "unknown fields ['colour']"),
        (_raw(np.zeros(4, np.float32)), "?input=1", "input is its body"),
        (_raw(np.array([1, 2, 3, np.nan], np.float32)), "", "NaN"),
    ],
)
def test_a_malformed_raw_tensor_request_gets_a_400_that_says_why(
    kwargs: dict[str, Any], query: str, fragment: str
) -> None:
    async def scenario() -> httpx.Response:
        async with await _client(_server()) as c:
            return await c.post(f"/v1/one/predict{query}", **kwargs)

    bad = run(scenario())
    assert bad.status_code == 400
    assert fragment in bad.json()["message"]


def test_overload_is_refused_quickly_with_503_and_retry_after() -> None:
    async def scenario() -> None:
        async with await _client(_server(delay_s=0.05)) as c:
            posts = [
                c.post("/v1/ab/predict", json={"input": [i, 0, 0, 0], "user": "u"})
                for i in range(8)
            ]
            responses = await asyncio.gather(*posts)
        statuses = sorted(r.status_code for r in responses)
        refused = [r for r in responses if r.status_code == 503]
        assert statuses.count(200) >= 2  # at least what the queue holds
        assert refused
        assert refused[0].headers["retry-after"] == "1"
        assert refused[0].json()["error"] == "overloaded"
        assert all(r.status_code in (200, 503) for r in responses)

    run(scenario())


def test_the_docs_page_is_whole_without_the_internet() -> None:
    """``/docs`` lists every operation of the schema, and loads nothing from elsewhere (no
    script, stylesheet or image: FastAPI's own page took them from a CDN)."""

    async def scenario() -> tuple[httpx.Response, dict[str, Any]]:
        async with await _client(_server()) as c:
            return await c.get("/docs"), (await c.get("/openapi.json")).json()

    page, schema = run(scenario())
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    html = page.text
    for path, operations in schema["paths"].items():
        for method in operations:
            assert f"<code>{method.upper()} {path}</code>" in html
    assert "x-feedback-key" in html
    assert "408" in html
    assert not any(tag in html for tag in ("<script", "<link", "<img", "src=", "//cdn"))
    assert "<a href='openapi.json'>" in html


def test_listing_health_and_openapi() -> None:
    async def scenario() -> None:
        async with await _client(_server()) as c:
            apps = (await c.get("/v1/apps")).json()["apps"]
            models = (await c.get("/v1/models")).json()["models"]
            health = (await c.get("/healthz")).json()
            schema = (await c.get("/openapi.json")).json()
        assert [a["name"] for a in apps] == ["one", "ab"]
        assert apps[1]["selection"]["policy"] == "split"
        assert [m["name"] for m in models] == ["a", "b"]
        assert models[0]["batching"]["policy"] == "fixed"
        assert health["status"] == "ok"
        predict = schema["paths"]["/v1/{app}/predict"]["post"]
        body = predict["requestBody"]["content"]["application/json"]["schema"]
        assert "input" in body["properties"]
        for path in ("/v1/{app}/predict", "/v1/models/{model}/predict"):  # Serve's timeout
            timed_out = schema["paths"][path]["post"]["responses"]["408"]
            assert "x-request-timeout-seconds" in timed_out["description"]
            assert "text/plain" in timed_out["content"]
        assert "/v1/{app}/feedback" in schema["paths"]
        feedback = schema["paths"]["/v1/{app}/feedback"]["post"]["parameters"]
        assert {"app", "x-feedback-key"} == {p["name"] for p in feedback}
        for path, operations in schema["paths"].items():  # raysrv's errors, never FastAPI's
            for method, operation in operations.items():
                assert "422" not in operation["responses"], (method, path)
                error = operation["responses"]["default"]["content"]["application/json"]
                assert ("ErrorBody" in str(error)) != path.startswith("/v2/"), (method, path)

    run(scenario())


def test_the_predict_routes_answer_below_a_route_prefix_post_only_and_are_documented() -> None:
    async def scenario() -> dict[str, httpx.Response]:
        app = create_http_app(_server(), 4096)
        transport = httpx.ASGITransport(app=app, root_path="/raysrv")
        async with httpx.AsyncClient(transport=transport, base_url="http://raysrv") as c:
            return {
                "app": await c.post("/raysrv/v1/one/predict", json={"input": [1, 2, 3, 4]}),
                "model": await c.post("/raysrv/v1/models/a/predict", json={"input": [1, 1, 1, 1]}),
                "get": await c.get("/raysrv/v1/one/predict"),
                "unknown model": await c.post("/raysrv/v1/models/z/predict", content=b"{oops"),
                "schema": await c.get("/raysrv/openapi.json"),
            }

    r = run(scenario())
    assert r["app"].json()["output"]["sum"] == 10.0
    assert (r["model"].json()["output"]["sum"], r["model"].json()["model"]) == (4.0, "a")
    assert (r["get"].status_code, r["get"].json()["error"]) == (405, "method_not_allowed")
    assert r["unknown model"].status_code == 404  # before its body is read
    paths = r["schema"].json()["paths"]
    model_body = paths["/v1/models/{model}/predict"]["post"]["requestBody"]["content"]
    assert "inputs" in model_body["application/json"]["schema"]["properties"]
    app_answer = paths["/v1/{app}/predict"]["post"]["responses"]["200"]["content"]
    one, many = app_answer["application/json"]["schema"]["anyOf"]  # one input's, or inputs'
    assert "models" in one["properties"]
    assert many["properties"]["results"]["items"]["anyOf"][0] == one
    assert r["get"].headers["allow"] == "POST"


def _answered(app: Any, pieces: list[bytes], whole: bool = True) -> list[dict[str, Any]]:
    """What ``app`` sends for a predict request of app ``one`` whose body arrives in
    ``pieces``, one message each; then the client leaves (without ``whole``, before the last
    piece said it was the last)."""
    last = pieces[-1] if whole else None
    messages = iter(
        [{"type": "http.request", "body": p, "more_body": p is not last} for p in pieces]
    )
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return next(messages, {"type": "http.disconnect"})

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/one/predict",
        "headers": [(b"content-type", b"application/json")],
    }
    run(app(scope, receive, send))
    return sent


def test_a_client_that_leaves_before_its_body_arrives_gets_no_answer_and_costs_no_work() -> None:
    logs: dict[str, list[int]] = {"a": [], "b": []}
    app = create_http_app(_server(logs=logs), 4096)
    assert _answered(app, [b'{"input": [1,'], whole=False) == []
    assert logs["a"] == []


@pytest.mark.parametrize(("limit", "status"), [(4096, 200), (20, 413)])
def test_a_body_sent_in_pieces_is_read_whole_and_held_to_the_limit_over_all_of_them(
    limit: int, status: int
) -> None:
    """Three messages, 38 bytes in all, none of them over a limit of 20 alone."""
    pieces = [b'{"input": ', b"[1, 2, 3, 4]", b', "slo_ms": 1e4}']
    sent = _answered(create_http_app(_server(), limit), pieces)
    assert sent[0]["status"] == status, sent[1]["body"]
    if status == 200:
        assert json.loads(sent[1]["body"])["output"]["sum"] == 10


def test_one_model_is_described_on_its_own_and_an_unknown_one_is_a_404() -> None:
    async def scenario() -> None:
        async with await _client(_server()) as c:
            listed = (await c.get("/v1/models")).json()["models"]
            one = await c.get("/v1/models/b")
            unknown = await c.get("/v1/models/zz")
        assert one.status_code == 200
        assert one.json() == listed[1]
        assert unknown.status_code == 404
        assert "unknown model 'zz'" in unknown.json()["message"]

    run(scenario())


def test_listing_many_models_hands_the_event_loop_back_between_chunks() -> None:
    """A thousand models take tens of milliseconds to describe and render: queries in flight
    must not wait for the whole list."""
    count = 3 * DESCRIBE_CHUNK + 1
    models = [
        model_spec(f"m{i:03d}", pool="shared", batching={"policy": "deadline"})
        for i in range(count)
    ]
    raw = spec(models, [], pools=[{"name": "shared", "workers": 2, "memory_mb": 64}])
    server = Server(RaysrvSpec.model_validate(raw), {"shared": LocalWorkers(2)})

    async def listing() -> list[dict[str, Any]]:
        async with await _client(server) as c:
            return (await c.get("/v1/models")).json()["models"]

    async def scenario() -> tuple[list[dict[str, Any]], int]:
        return await _with_turns(listing())

    listed, turns = run(scenario())
    assert [m["name"] for m in listed] == [f"m{i:03d}" for i in range(count)]
    assert listed[0]["batching"]["policy"] == "deadline"
    # the other task ran between chunks, while describing and while rendering
    assert turns >= 2 * (count // DESCRIBE_CHUNK), turns


def test_live_configuration_changes_batching_cache_and_selection() -> None:
    async def scenario() -> None:
        server = _server()
        live = {
            "models": {"a": {"batching": {"policy": "aimd", "params": {"max_batch_size": 4}}}},
            "apps": {"one": {"cache_size": 0}, "ab": {"selection": {"policy": "single"}}},
        }
        server.configure(LiveConfig.model_validate(live))
        async with await _client(server) as c:
            models = (await c.get("/v1/models")).json()["models"]
            r1 = (await c.post("/v1/one/predict", json={"input": [1, 2, 3, 4]})).json()
            r2 = (await c.post("/v1/one/predict", json={"input": [1, 2, 3, 4]})).json()
            ab = (await c.post("/v1/ab/predict", json={"input": [1, 2, 3, 4]})).json()
        assert models[0]["batching"]["policy"] == "aimd"
        assert (r1["cache_hit"], r2["cache_hit"]) == (False, False)
        assert ab["models"] == ["a"]
        with pytest.raises(ValueError, match="unknown entries"):
            server.configure(LiveConfig.model_validate({"apps": {"zz": {}}}))

    run(scenario())


def test_json_body_sizes_just_under_the_limit_pass() -> None:
    async def scenario() -> None:
        body = json.dumps({"input": [1.0, 2.0, 3.0, 4.0]}).encode()
        async with await _client(_server(), limit=len(body)) as c:
            r = await c.post("/v1/one/predict", content=body, headers=JSON)
        assert r.status_code == 200

    run(scenario())


def test_queries_past_their_deadline_get_429_with_the_reason_before_any_work() -> None:
    async def scenario() -> None:
        logs: dict[str, list[int]] = {"a": [], "b": []}
        async with await _client(_server(delay_s=0.05, logs=logs)) as c:
            first = asyncio.create_task(c.post("/v1/one/predict", json={"input": [0, 0, 0, 0]}))
            await asyncio.sleep(0.01)  # the first query now occupies the only replica for 50 ms
            late = [
                c.post("/v1/one/predict", json={"input": [i, 0, 0, 0], "slo_ms": 5})
                for i in range(1, 4)
            ]
            patient = c.post("/v1/one/predict", json={"input": [9, 0, 0, 0], "slo_ms": 10_000})
            responses = await asyncio.gather(first, *late, patient)
        assert [r.status_code for r in responses] == [200, 429, 429, 429, 200]
        assert responses[1].json() == {
            "error": "rejected",
            "message": "model 'a': deadline passed while queued",
            "status": 429,
        }
        assert logs["a"] == [1, 1]  # the refused queries never reached the model

    run(scenario())


def test_until_replies_are_measured_the_trip_back_is_kept_as_long_as_the_trips_here_take() -> None:
    """Callers whose queries take 50 ms to arrive, on workers that do not say when their
    batches ended: the answer is expected to take as long to go back, so a query with 45 ms of
    its SLO left on arrival cannot be answered in time."""

    async def scenario() -> tuple[list[httpx.Response], float]:
        server = _server()
        async with await _client(server) as c:
            before = [
                await c.post(
                    "/v1/one/predict",
                    json={"input": [i, 0, 0, 0], "slo_ms": 1000, "sent_at": time.time() - 0.05},
                )
                for i in range(25)
            ]
            tight = {"input": [99, 0, 0, 0], "slo_ms": 95, "sent_at": time.time() - 0.05}
            return [*before, await c.post("/v1/one/predict", json=tight)], server.trip_back()

    responses, trip_back = run(scenario())
    assert all(r.status_code == 200 for r in responses[:-1])
    assert trip_back == pytest.approx(0.05, abs=0.02)
    assert responses[-1].status_code == 429, responses[-1].text
    assert "deadline passed" in responses[-1].json()["message"]
    assert 50 <= responses[-1].json()["transit_ms"] < 70  # the refusal says where time went


def test_the_trip_back_is_the_shortest_trip_here_plus_the_replies_not_the_wait_in_front() -> None:
    """Four queries in five wait 60 ms in front of the ingress, the fifth arrives in 4 ms, and
    answers come back from the workers in 5 ms: the way back is kept at the shortest trip here
    plus the replies' p99, about 10 ms, not the trips' 60. A query sent 60 ms before it arrives
    with 110 ms to go is then answered; kept at the trips' p99 it would have been refused."""

    async def scenario() -> tuple[list[httpx.Response], float]:
        workers = {m: LocalWorkers(1, dedicated=EchoModel(), reply_s=0.005) for m in ("a", "b")}
        server = Server(SPEC, workers)
        async with await _client(server) as c:
            before = []
            for i in range(40):
                transit = 0.004 if i % 5 == 0 else 0.06
                body = {"input": [i, 0, 0, 0], "slo_ms": 1000, "sent_at": time.time() - transit}
                before.append(await c.post("/v1/one/predict", json=body))
            kept = server.trip_back()
            tight = {"input": [99, 0, 0, 0], "slo_ms": 110, "sent_at": time.time() - 0.06}
            return [*before, await c.post("/v1/one/predict", json=tight)], kept

    responses, kept = run(scenario())
    assert all(r.status_code == 200 for r in responses[:-1])
    assert 0.009 <= kept < 0.03
    assert responses[-1].status_code == 200, responses[-1].text


def test_the_time_kept_back_follows_the_replies_in_a_burst_and_the_trips_in_a_stall() -> None:
    """Nothing is kept back before 20 trips are known, and only the trips count until 20
    replies are. Then the smaller of the trips' quantile and the shortest trip plus the
    replies' quantile: a burst of 250 trips of 60 ms, waiting in front of the ingress, leaves
    it at the calm trips' 2 ms plus the replies' 5 ms; replies slowed to 200 ms by a stall
    leave it at the trips' 60 ms, which every query renews."""
    rule = TripBack()
    for _ in range(TRIPS_KNOWN - 1):
        rule.add(0.002)
    assert rule.kept(0.99) == 0.0
    for _ in range(300):
        rule.add(0.002)
    rule.add(0.05)
    assert rule.kept(1.0) == pytest.approx(0.05)
    for _ in range(TRIPS_KNOWN):
        rule.reply(0.005)
    assert rule.kept(1.0) == pytest.approx(0.007)
    for _ in range(TRIP_WINDOW + 50):
        rule.add(0.06)
    assert rule.kept(0.5) == pytest.approx(0.007)
    for _ in range(TRIP_WINDOW):
        rule.reply(0.2)
    assert rule.kept(0.5) == pytest.approx(0.06)


def test_answers_and_the_pool_say_how_long_queries_took_to_arrive_and_what_was_kept_back() -> None:
    """30 queries sent 40 ms before they arrive and 10 sent 80 ms before: each answer says its
    own trip, and the pool's quantiles show both kinds, and what was kept back. A query
    without ``sent_at`` has no trip to report."""

    async def scenario() -> tuple[list[dict[str, object]], dict[str, object], dict[str, object]]:
        server = _server()
        answers = []
        async with await _client(server) as c:
            for i in range(40):
                transit = 0.08 if i % 4 == 3 else 0.04
                body = {"input": [i, 0, 0, 0], "slo_ms": 1000, "sent_at": time.time() - transit}
                answers.append((await c.post("/v1/models/a/predict", json=body)).json())
            unsent = (await c.post("/v1/models/a/predict", json={"input": [9, 9, 9, 9]})).json()
            pools = (await c.get("/v1/pools")).json()["pools"]
        (pool,) = [p for p in pools if p["name"] == server.pool_of("a").name]
        return answers, unsent, pool

    answers, unsent, pool = run(scenario())
    transits = [a["transit_ms"] for a in answers]
    assert all(40 <= t < 60 for t in transits[:3])
    assert 80 <= transits[3] < 100
    assert unsent["transit_ms"] is None
    trip_in, kept = pool["trip_in_ms"], pool["kept_back_ms"]
    assert 40 <= trip_in["p50"] < 60
    assert 80 <= trip_in["p90"] < 100
    # nothing is kept back before 20 trips are known; then the p99 of those seen, an 80 ms one
    assert kept["p10"] == 0.0
    assert 80 <= kept["p90"] < 100


def test_over_http_the_way_back_is_kept_at_the_shortest_trip_plus_the_loops_lag() -> None:
    """An answer over HTTP goes back without the wait in front of the ingress and without
    crossing Ray: with trips of 60 ms and replies of 200 ms, it is kept back at the shortest
    trip plus the loop's lag (2 + 3 ms) once 20 lags are known, where an answer through a
    handle keeps the trips' 60; never more than the other two estimates."""
    rule = TripBack()
    for _ in range(TRIPS_KNOWN):
        rule.add(0.002)
    for _ in range(TRIP_WINDOW):
        rule.add(0.06)
        rule.reply(0.2)
    for _ in range(TRIPS_KNOWN - 1):
        rule.lag(0.003)
    assert rule.kept(0.5, http=True) == pytest.approx(0.06)  # too few lags yet
    rule.lag(0.003)
    assert rule.kept(0.5, http=True) == pytest.approx(0.005)
    assert rule.kept(0.5) == pytest.approx(0.06)
    for _ in range(TRIP_WINDOW):
        rule.lag(0.5)  # a loop slower than the other estimates: they bound it
    assert rule.kept(0.5, http=True) == pytest.approx(0.06)


@pytest.mark.parametrize("rule", ["replies", "loop"])
def test_with_the_loops_rule_a_query_over_http_keeps_back_less_than_one_through_a_handle(
    rule: str,
) -> None:
    """Four queries in five take 60 ms to arrive, the fifth 4 ms, and the workers' answers 30
    ms to come back: through a handle the way back is kept at the shortest trip plus the
    replies (34 ms); over HTTP too by default, at the shortest trip plus the loop's lag with
    ``http_trip_back: loop``. A query sent 60 ms before it arrives, with an SLO of 115 ms and
    30 ms of work, is then answered over HTTP, and refused through a handle either way."""
    raw = spec(
        [model_spec("a")], [{"name": "one", "models": ["a"]}], ingress={"http_trip_back": rule}
    )

    async def scenario() -> tuple[httpx.Response, dict[str, Any], float, float]:
        workers = {"a": LocalWorkers(1, dedicated=EchoModel(), reply_s=0.03)}
        server = Server(RaysrvSpec.model_validate(raw), workers)
        async with await _client(server) as c:
            for i in range(40):
                transit = 0.004 if i % 5 == 0 else 0.06
                body = {"input": [i, 0, 0, 0], "slo_ms": 1000, "sent_at": time.time() - transit}
                assert (await c.post("/v1/models/a/predict", json=body)).status_code == 200
            kept_http, kept_handle = server.trip_back(http=True), server.trip_back()
            tight = {"input": [99, 0, 0, 0], "slo_ms": 115, "sent_at": time.time() - 0.06}
            over_http = await c.post("/v1/models/a/predict", json=tight)
            by_handle: dict[str, Any] = {}
            try:
                await server.predict_model("a", [98, 0, 0, 0], 115, sent_at=time.time() - 0.06)
            except RaysrvError as exc:
                by_handle = exc.to_json()
        return over_http, by_handle, kept_http, kept_handle

    over_http, by_handle, kept_http, kept_handle = run(scenario())
    assert 0.03 <= kept_handle < 0.05
    assert by_handle.get("status") == 429, by_handle
    if rule == "loop":
        assert 0.004 <= kept_http < 0.015
        assert over_http.status_code == 200, over_http.text
    else:
        assert kept_http == kept_handle
        assert over_http.status_code == 429, over_http.text


def test_a_trip_back_quantile_of_1_keeps_back_the_longest_recent_trip() -> None:
    """One trip in a hundred takes 150 ms: the default p99 looks past it, 1 keeps it back."""

    async def trip_back_after(quantile: float) -> float:
        raw = spec(
            [model_spec("a")],
            [{"name": "one", "models": ["a"]}],
            ingress={"trip_back_quantile": quantile},
        )
        server = Server(RaysrvSpec.model_validate(raw), {"a": fake_workers(EchoModel())})
        async with await _client(server) as c:
            for i in range(100):
                transit = 0.15 if i == 50 else 0.01
                body = {"input": [i, 0, 0, 0], "slo_ms": 1000, "sent_at": time.time() - transit}
                response = await c.post("/v1/one/predict", json=body)
                assert response.status_code == 200, response.text
        return server.trip_back()

    assert run(trip_back_after(0.99)) == pytest.approx(0.01, abs=0.02)
    assert 0.15 <= run(trip_back_after(1.0)) < 0.2


def test_a_query_whose_batch_outruns_its_deadline_gets_504_at_the_deadline() -> None:
    async def scenario() -> None:
        logs: dict[str, list[int]] = {"a": [], "b": []}
        async with await _client(_server(delay_s=0.05, logs=logs)) as c:
            # fixed sends it at once to the free replica, which then takes 50 ms: too long
            body = {"input": [1, 0, 0, 0], "slo_ms": 20}
            expired, waited = await asyncio.gather(
                c.post("/v1/one/predict", json=body),
                c.post(
                    "/v1/one/predict", json={**body, "input": [3, 0, 0, 0], "best_effort": True}
                ),
            )
            after = await c.post("/v1/one/predict", json={"input": [2, 0, 0, 0]})
        assert expired.status_code == 504, expired.text
        assert expired.json()["error"] == "deadline_expired"
        assert waited.status_code == 200  # a caller who asked to wait gets the late answer
        assert waited.json()["latency_ms"] > 20
        assert after.status_code == 200  # and the server keeps serving
        assert sum(logs["a"]) == 3  # the work was spent: the expired query did run

    run(scenario())


def test_a_caller_that_leaves_takes_its_queued_query_out_of_the_queue() -> None:
    """Without a cache a query is its caller's alone: once the caller stops waiting, the query
    leaves the queue and never runs, and the query ahead of it is answered as usual."""
    uncached = RaysrvSpec.model_validate(
        spec([model_spec("a")], [{"name": "one", "models": ["a"], "cache_size": 0}])
    )

    async def scenario() -> None:
        log: list[int] = []
        server = Server(uncached, {"a": fake_workers(EchoModel(), 0.05, log)})
        pool = server.pool_of("a")
        running = asyncio.create_task(server.predict("one", [1, 0, 0, 0], slo_ms=5000))
        await asyncio.sleep(0.01)  # in a batch now, which takes 50 ms
        queued = asyncio.create_task(server.predict("one", [2, 0, 0, 0], slo_ms=5000))
        await asyncio.sleep(0.01)
        assert pool.queue_length("a") == 1
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        assert pool.queue_length("a") == 0
        assert (await running)["output"]["sum"] == 1
        await asyncio.sleep(0.1)
        assert log == [1]  # the batch that ran; the query that left was in none
        await server.close()

    run(scenario())


def test_an_answer_taken_up_after_the_deadline_gets_504_not_a_late_200() -> None:
    """The model's answer comes back while the ingress's loop is held up past the deadline
    (here: the batch blocks the loop for 80 ms of a 50 ms SLO), so the answer and the timeout
    are due together: the ingress drops it instead of sending it on late."""
    echo = EchoModel()

    class Stalling:
        def predict_batch(self, inputs: Any) -> list[Any]:
            time.sleep(0.08)  # holds the loop: no timer can fire meanwhile
            return echo.predict_batch(inputs)

    async def scenario() -> tuple[httpx.Response, httpx.Response]:
        server = Server(SPEC, {"a": fake_workers(Stalling()), "b": fake_workers(echo)})
        async with await _client(server) as c:
            stalled = await c.post("/v1/one/predict", json={"input": [1, 0, 0, 0], "slo_ms": 50})
            roomy = await c.post("/v1/one/predict", json={"input": [2, 0, 0, 0], "slo_ms": 500})
        return stalled, roomy

    stalled, roomy = run(scenario())
    assert stalled.status_code == 504, stalled.text
    assert stalled.json()["error"] == "deadline_expired"
    assert roomy.status_code == 200  # the same stall within a roomier SLO is answered
    assert roomy.json()["output"]["sum"] == 2.0


def test_best_effort_queries_are_answered_late_instead_of_refused() -> None:
    async def scenario() -> None:
        async with await _client(_server(delay_s=0.05)) as c:
            first = asyncio.create_task(c.post("/v1/one/predict", json={"input": [0, 0, 0, 0]}))
            await asyncio.sleep(0.01)  # the only replica is busy for 50 ms
            body = {"input": [1, 0, 0, 0], "slo_ms": 5}
            refused = c.post("/v1/one/predict", json=body)
            late = c.post(
                "/v1/one/predict", json={**body, "input": [2, 0, 0, 0], "best_effort": True}
            )
            responses = await asyncio.gather(first, refused, late)
        assert [r.status_code for r in responses] == [200, 429, 200]
        assert responses[2].json()["latency_ms"] > 5

    run(scenario())


def test_reapplying_the_same_live_config_keeps_what_the_policy_learned() -> None:
    server = _server()
    aimd = {"policy": "aimd", "params": {"max_batch_size": 4}}
    server.configure(LiveConfig.model_validate({"models": {"a": {"batching": aimd}}}))
    learned = server.pool_of("a").policy("a")
    selection = server.apps["ab"].selection
    declared = SPEC.apps[1].selection.model_dump()  # named, as the declared one
    again = {"models": {"a": {"batching": aimd}}, "apps": {"ab": {"selection": declared}}}
    server.configure(LiveConfig.model_validate(again))
    assert server.pool_of("a").policy("a") is learned
    assert server.apps["ab"].selection is selection  # what it learned from feedback too
    server.configure(LiveConfig.model_validate({"models": {"a": {"batching": aimd, "slo_ms": 5}}}))
    assert server.pool_of("a").policy("a") is not learned
    assert server.pool_of("a").policy("a").name == "aimd"
    assert server.pool_of("a").policy("a").slo_s == 0.005


def test_a_knob_the_live_config_leaves_out_goes_back_to_its_declared_value() -> None:
    """Serve hands over the whole ``user_config``: one that no longer overrides a knob means
    the model or app as the ``args`` declare it."""
    server = _server()
    declared = server.pool_of("a").policy("a")
    live = {
        "models": {"a": {"batching": {"policy": "aimd"}, "slo_ms": 5}},
        "apps": {"one": {"cache_size": 0, "slo_ms": 7}, "ab": {"selection": {"policy": "single"}}},
    }
    server.configure(LiveConfig.model_validate(live))
    assert (server.pool_of("a").policy("a").name, server.apps["one"].cache.capacity) == ("aimd", 0)
    server.configure(LiveConfig.model_validate({"models": {"a": {"slo_ms": 5}}}))
    assert server.pool_of("a").policy("a").name == declared.name
    assert server.pool_of("a").policy("a").slo_s == 0.005
    server.configure(LiveConfig())
    assert server.pool_of("a").policy("a").slo_s == declared.slo_s
    assert server.apps["one"].cache.capacity == 16
    assert server.apps["one"].slo_ms is None
    assert server.apps["ab"].selection.name == "split"


def test_the_plan_view_shows_the_prediction_and_its_inputs() -> None:
    async def scenario() -> None:
        async with await _client(_server(delay_s=0.002)) as c:
            empty = (await c.get("/v1/models/a/plan")).json()
            for i in range(80):
                await c.post("/v1/one/predict", json={"input": [i, 0, 0, 0]})
                await asyncio.sleep(0.001)
            plan = (await c.get("/v1/models/a/plan")).json()
            unknown = await c.get("/v1/models/nope/plan")
        assert empty["predicted"] is None
        assert "needs 50 arrivals" in empty["why_no_prediction"]
        assert plan["policy"] == "fixed"
        assert plan["settings"] == {"max_batch_size": 8, "timeout_ms": 0.0}
        assert plan["inputs"]["arrivals"] == 80
        assert plan["inputs"]["run_p99_ms"]["1"] >= 2.0  # the fake replica sleeps 2 ms
        predicted = plan["predicted"]  # timeout 0: every batch is one query, run in S_1
        assert predicted["mean_batch_size"] == 1.0
        assert predicted["p99_ms"] == pytest.approx(plan["inputs"]["run_p99_ms"]["1"])
        assert unknown.status_code == 404

    run(scenario())


class _Plans(Metrics):
    """The models whose predicted p99 was exported, in order."""

    def __init__(self) -> None:
        self.exported: list[str] = []

    def plan(self, model: str, p99_ms: float) -> None:
        self.exported.append(model)


def test_the_plans_of_queried_models_are_exported_without_anyone_asking() -> None:
    """Each round exports the models queried since their last export, at most ``limit``, the
    one exported longest ago first; an idle model is not planned again, and one queried too
    little for a prediction sets no gauge."""

    async def queries(server: Server, model: str, n: int) -> None:
        for i in range(n):
            assert "output" in await server.predict_model(model, [i, 0, 0, 0])
            await asyncio.sleep(0.001)

    async def scenario() -> None:
        metrics = _Plans()
        server = Server(SPEC, {m: fake_workers(EchoModel()) for m in ("a", "b")}, metrics=metrics)
        assert await server.export_plans() == []  # nothing queried yet
        await queries(server, "a", 60)
        await queries(server, "b", 60)
        assert await server.export_plans(limit=1) == ["a"]
        assert await server.export_plans(limit=1) == ["b"]  # a's turn came; then b's
        assert await server.export_plans() == []  # neither queried since
        await queries(server, "a", 1)
        assert await server.export_plans() == ["a"]
        assert metrics.exported == ["a", "b", "a"]
        few = Server(SPEC, {m: fake_workers(EchoModel()) for m in ("a", "b")}, metrics=metrics)
        await queries(few, "a", 3)
        assert await few.export_plans() == ["a"]  # planned, but with too few arrivals to predict
        assert metrics.exported == ["a", "b", "a"]

    run(scenario())


_FIRST_PLAN = """
import sys
import numpy as np
from raysrv._planner import PlanSnapshot, predict, prepare
if sys.argv[1] == "prepared":
    prepare()
before = set(sys.modules)
arrivals = np.cumsum(np.random.default_rng(0).exponential(0.01, 200))
view = predict(PlanSnapshot("m", {"policy": "fixed"}, arrivals, {1: 0.002}, 1, 0.05))
assert view["predicted"] is not None
print(len(set(sys.modules) - before))
"""


@pytest.mark.parametrize(("how", "imports"), [("prepared", False), ("cold", True)])
def test_a_prepared_ingress_imports_nothing_for_its_first_plan(how: str, imports: bool) -> None:
    """The ingress prepares the plan view as it starts: a worker thread importing scipy under
    traffic held its loop for about half a second. Unprepared, the first plan imports it."""
    found = subprocess.run(
        [sys.executable, "-c", _FIRST_PLAN, how], capture_output=True, text=True, check=True
    )
    assert (int(found.stdout) > 0) is imports, found.stdout


def test_the_slo_starts_when_the_caller_sent_the_query() -> None:
    """A query that spent its whole SLO in front of raysrv is refused, not run."""

    async def scenario() -> list[httpx.Response]:
        async with await _client(_server()) as c:
            body = {"input": [1, 2, 3, 4], "slo_ms": 500}
            fresh = await c.post("/v1/one/predict", json={**body, "sent_at": time.time()})
            late = {**body, "input": [4, 3, 2, 1], "sent_at": time.time() - 1}
            stale = await c.post("/v1/one/predict", json=late)
            return [fresh, stale]

    fresh, stale = run(scenario())
    assert fresh.status_code == 200
    assert stale.status_code == 429, stale.text
    assert "deadline passed" in stale.json()["message"]


def test_a_pools_timeline_is_served_as_json_columns_with_null_for_what_did_not_happen() -> None:
    """The fake workers here report no start or end (a live one does): those come as null,
    never as a NaN that is not JSON; ``since`` keeps the later actions, ``after`` those
    numbered past it; a bad one of either is a 400 and an unknown pool a 404."""

    async def scenario() -> list[httpx.Response]:
        server = _server()
        async with await _client(server) as c:
            await c.post("/v1/models/a/predict", json={"input": [1, 0, 0, 0]})
            middle = time.time()
            await c.post("/v1/models/a/predict", json={"input": [2, 0, 0, 0]})
            pool = server.pool_of("a").name
            return [
                await c.get(f"/v1/pools/{pool}/timeline"),
                await c.get(f"/v1/pools/{pool}/timeline", params={"since": middle}),
                await c.get(f"/v1/pools/{pool}/timeline", params={"since": "soon"}),
                await c.get(f"/v1/pools/{pool}/timeline", params={"since": "nan"}),
                await c.get("/v1/pools/nope/timeline"),
                await c.get(f"/v1/pools/{pool}/timeline", params={"after": "0"}),
                await c.get(f"/v1/pools/{pool}/timeline", params={"after": "-2"}),
                await c.get(f"/v1/pools/{pool}/timeline", params={"after": "9" * 400}),
            ]

    every, later, bad, nan, unknown, past, negative, huge = run(scenario())
    assert every.status_code == 200
    columns = every.json()
    assert columns["kind"] == ["infer", "infer"]
    assert columns["model"] == ["a", "a"]
    assert columns["started"] == [None, None]
    assert all(isinstance(t, float) for t in columns["sent"] + columns["back"])
    assert later.json()["sent"] == columns["sent"][1:]
    assert columns["seq"] == [0, 1]
    assert past.json()["sent"] == columns["sent"][1:]
    assert (bad.status_code, nan.status_code, unknown.status_code) == (400, 400, 404)
    assert (negative.status_code, huge.status_code) == (400, 400)
    assert "since must be wall-clock seconds" in bad.json()["message"]
    assert "after must be an action number" in negative.json()["message"]


def test_a_long_timeline_is_rendered_in_chunks_between_other_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(raysrv._http, "TIMELINE_CHUNK", 3)

    async def scenario() -> tuple[dict[str, list[Any]], dict[str, list[Any]], int]:
        server = _server()
        async with await _client(server) as c:
            for i in range(10):  # one at a time: a batch each
                await c.post("/v1/models/a/predict", json={"input": [i, 0, 0, 0]})
            pool = server.pool_of("a").name
            shown, turns = await _with_turns(c.get(f"/v1/pools/{pool}/timeline"))
            return shown.json(), server.timeline(pool), turns

    shown, kept, turns = run(scenario())
    assert len(shown["kind"]) == 10
    for name, values in kept.items():  # the same values, null for NaN
        assert shown[name] == [None if v != v else v for v in values], name
    assert turns >= 10 * 4  # 10 columns of 10 values, 4 chunks of 3 each


def test_an_input_answered_in_time_keeps_its_answer_when_another_of_its_request_is_late() -> None:
    """Batches of one and an SLO of 0.5 s: of one request's two inputs the first is answered
    at 0.1 s, the second's batch runs 0.8 s from there. The request's wait ends at the
    deadline; the first answer, taken up in time, is kept, and the second is dropped (504)."""
    echo = EchoModel()

    async def slow_second(inputs: np.ndarray) -> tuple[list[Any], float]:
        seconds = 0.1 if float(inputs.sum()) == 10.0 else 0.8
        await asyncio.sleep(seconds)
        return echo.predict_batch(inputs), seconds

    raw = spec(
        [model_spec("one", batching={"policy": "fixed", "params": {"max_batch_size": 1}})],
        [{"name": "app", "models": ["one"]}],
    )
    server = Server(RaysrvSpec.model_validate(raw), {"one": LocalWorkers(1, run=slow_second)})
    first, second = run(server.predict_model_many("one", [[1, 2, 3, 4], [5, 6, 7, 8]], 500))
    assert first["output"]["sum"] == 10.0
    assert first["latency_ms"] < 500
    assert isinstance(second, RaysrvError)
    assert second.status == 504


def test_query_ids_are_distinct_hex_across_reads_of_the_random_source() -> None:
    from raysrv._server import IDS_A_READ, _QueryIds

    ids = _QueryIds()
    drawn = [ids.next() for _ in range(3 * IDS_A_READ + 5)]
    assert len(set(drawn)) == len(drawn)
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in drawn)


def test_the_wait_for_one_answer_ends_at_its_answer_or_its_timeout_and_leaves_it_be() -> None:
    from raysrv._server import Alarms

    alarms = Alarms()

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        slow = loop.create_future()
        started = loop.time()
        await alarms.until_done(slow, 0.05)
        assert loop.time() - started >= 0.04
        assert not slow.done()
        loop.call_later(0.01, slow.set_result, 3)
        await alarms.until_done(slow, 5.0)
        assert slow.result() == 3
        never = loop.create_future()
        waiting = asyncio.create_task(alarms.until_done(never, None))
        await asyncio.sleep(0.01)
        waiting.cancel()  # the caller left: its wait ends, the answer is still its owner's
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert not never.done()
        assert not never._callbacks  # nothing of the finished wait stays on the answer

    run(scenario())
    run(scenario())  # on a new loop, as on the first


def test_a_query_waits_on_its_answer_itself_until_its_time_and_then_the_answer_is_over() -> None:
    from raysrv._server import Alarms, TimedOut

    alarms = Alarms()

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        answer = loop.create_future()
        loop.call_later(0.01, answer.set_result, 3)
        assert await alarms.result(answer, 5.0) == 3
        assert [entry[2] for entry in alarms._heap] == [None]  # the answer is not held
        failing = loop.create_future()
        loop.call_later(0.01, failing.set_exception, ValueError("the model's error"))
        with pytest.raises(ValueError, match="the model's error"):
            await alarms.result(failing, 5.0)
        slow = loop.create_future()
        started = loop.time()
        with pytest.raises(TimedOut):
            await alarms.result(slow, 0.05)
        assert loop.time() - started >= 0.04
        # whoever owed the answer finds it over, and a late result is not taken
        assert isinstance(slow.exception(), TimedOut)
        never = loop.create_future()
        waiting = asyncio.ensure_future(alarms.result(never, 60.0))
        await asyncio.sleep(0.01)
        waiting.cancel()  # the caller left: the answer is cancelled with its wait
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert never.cancelled()

    run(scenario())


def test_the_timer_rings_for_waits_still_waiting_not_for_each_one_answered() -> None:
    """Forty waits answered at once and one left waiting: the timer rings at the first one's
    time, drops the answered ones and rings next at the waiting one's, which then ends."""
    from raysrv._server import Alarms, TimedOut

    alarms = Alarms()
    rings = []

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        ring = alarms._ring

        def counted() -> None:
            rings.append(loop.time())
            ring()

        alarms._ring = counted  # type: ignore[method-assign]
        answers = [loop.create_future() for _ in range(40)]
        waits = [
            asyncio.ensure_future(alarms.result(a, 0.01 + 0.001 * k)) for k, a in enumerate(answers)
        ]
        left = asyncio.ensure_future(alarms.result(loop.create_future(), 0.08))
        await asyncio.sleep(0)
        for k, answer in enumerate(answers):
            answer.set_result(k)
        assert await asyncio.gather(*waits) == list(range(40))
        started = loop.time()
        with pytest.raises(TimedOut):
            await left
        assert loop.time() - started >= 0.05
        # at the first one's time and at the waiting one's (again if rung a hair before it);
        # set for each answered wait in turn, as before, it rang 38 times
        assert len(rings) <= 3

    run(scenario())


def test_waits_end_each_at_its_own_time_and_answered_ones_do_not_pile_up() -> None:
    from raysrv._server import ALARMS_COMPACTED, Alarms

    alarms = Alarms()

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        ended: list[float] = []

        async def wait(timeout: float) -> None:
            await alarms.until_done(loop.create_future(), timeout)
            ended.append(timeout)

        # set out of order: each rings at its own time, the earliest first
        await asyncio.gather(*(wait(t) for t in (0.06, 0.02, 0.04)))
        assert ended == [0.02, 0.04, 0.06]
        for _ in range(3 * ALARMS_COMPACTED):  # each left long before its time
            waiting = asyncio.ensure_future(alarms.until_done(loop.create_future(), 60.0))
            await asyncio.sleep(0)
            waiting.cancel()
        await asyncio.sleep(0)
        assert len(alarms._heap) < 2 * ALARMS_COMPACTED

    run(scenario())


def test_an_app_that_always_asks_one_model_answers_as_any_app_and_follows_a_live_switch() -> None:
    """With ``single`` selection and no cache, the app's query goes straight to its model
    (``fixed_model``): an answer with every field an app's answer has, a refusal under the
    app's SLO that tells its transit, and a live switch to a policy that chooses takes effect,
    and back."""
    raw = spec(
        [model_spec("a"), model_spec("b")],
        [
            {
                "name": "ab",
                "models": ["a", "b"],
                "selection": {"policy": "single", "params": {"model": "b"}},
                "cache_size": 0,
                "slo_ms": 80,
            }
        ],
    )
    logs: dict[str, list[int]] = {"a": [], "b": []}
    server = Server(
        RaysrvSpec.model_validate(raw),
        {m: fake_workers(EchoModel(), 0.0, logs[m]) for m in ("a", "b")},
    )
    split = {"apps": {"ab": {"selection": {"policy": "split", "params": {"weights": {"a": 1}}}}}}

    async def scenario() -> list[httpx.Response]:
        async with await _client(server) as c:
            fixed = await c.post("/v1/ab/predict", json={"input": [1, 2, 3, 4]})
            # sent 100 ms ago: past the app's 80 ms SLO, whatever the model's 1,000
            old = {"input": [1, 2, 3, 4], "sent_at": time.time() - 0.1}
            refused = await c.post("/v1/ab/predict", json=old)
            server.configure(LiveConfig.model_validate(split))
            chosen = await c.post("/v1/ab/predict", json={"input": [1, 2, 3, 4]})
            server.configure(LiveConfig.model_validate({}))
            back = await c.post("/v1/ab/predict", json={"input": [1, 2, 3, 4]})
        return [fixed, refused, chosen, back]

    fixed, refused, chosen, back = run(scenario())
    answer = fixed.json()
    assert answer["output"]["sum"] == 10.0
    assert (answer["models"], answer["confidence"], answer["missing"]) == (["b"], 1.0, [])
    assert (answer["cache_hit"], answer["default"]) == (False, False)
    assert len(answer["query_id"]) == 32
    assert refused.status_code == 429, refused.text
    assert refused.json()["transit_ms"] >= 100  # the refusal says where time went
    assert chosen.json()["models"] == ["a"]
    assert back.json()["models"] == ["b"]
    assert (len(logs["a"]), len(logs["b"])) == (1, 2)  # the refused query reached no model
