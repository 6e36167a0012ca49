"""String and bytes inputs for python-runtime models: the config, the reading of each input,
the cache key, and the HTTP API over a Server whose workers are in-process."""

from __future__ import annotations

import asyncio
import base64
import sys
from typing import Any

import httpx
import pytest

from raysrv._http import create_http_app
from raysrv._server import Server, coerce_input, coerce_inputs
from raysrv.cache import cache_key
from raysrv.config import InputSpec, RaysrvSpec
from raysrv.errors import BadRequest, PayloadTooLarge
from raysrv.runtimes import PythonRuntime
from raysrv.testing import fake_workers, model_spec, spec

STRING = InputSpec(dtype="string", max_length=16, example="a typical input")
BYTES = InputSpec(dtype="bytes", max_length=4)


def _spec(**overrides: Any) -> dict[str, Any]:
    return model_spec("t", **{"source": "raysrv.testing:TextModel", **overrides})


@pytest.mark.parametrize(
    ("model", "fragment"),
    [
        (_spec(input={"dtype": "string", "shape": [3]}), "a string input has no shape, got [3]"),
        (_spec(input={"dtype": "float32"}), "an input of dtype float32 needs its shape"),
        (
            _spec(input={"shape": [4], "max_length": 9}),
            "['max_length'] belong to string and bytes inputs, not float32",
        ),
        (
            _spec(input={"dtype": "bytes", "max_length": 2, "example": "abc"}),
            "example's length 3 is more than max_length 2",
        ),
        (
            _spec(input={"dtype": "string"}, runtime="onnx", source="m.onnx"),
            "input.dtype 'string' needs runtime 'python' (got 'onnx'",
        ),
        (_spec(input={"dtype": "text"}), "input.dtype"),
    ],
)
def test_a_string_or_bytes_input_that_does_not_fit_is_refused_naming_the_field(
    model: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(ValueError, match="input") as error:
        RaysrvSpec.model_validate(spec([model], [{"name": "app", "models": ["t"]}]))
    assert fragment in str(error.value)


def test_an_app_takes_models_of_one_input_kind_only() -> None:
    text = _spec(input={"dtype": "string", "max_length": 10})
    other = {**text, "name": "u", "input": {"dtype": "string", "max_length": 20}}
    alike = {**text, "name": "v", "input": {"dtype": "string", "max_length": 10, "example": "x"}}
    with pytest.raises(ValueError, match="mixes models with different inputs"):
        RaysrvSpec.model_validate(spec([text, other], [{"name": "app", "models": ["t", "u"]}]))
    # the profiling example is the model's own
    RaysrvSpec.model_validate(spec([text, alike], [{"name": "app", "models": ["t", "v"]}]))


def test_a_numeric_input_spec_survives_its_own_dump() -> None:
    numeric = InputSpec(shape=(64,), dtype="uint8")
    assert InputSpec.model_validate(numeric.model_dump()) == numeric
    assert InputSpec.model_validate(STRING.model_dump()) == STRING


def test_strings_and_bytes_are_read_as_such_and_checked_against_max_length() -> None:
    assert coerce_input("héllo", STRING) == "héllo"
    assert coerce_input("x" * 16, STRING) == "x" * 16  # characters, not bytes
    assert coerce_input(b"\x00\xff", BYTES) == b"\x00\xff"  # from a handle or a raw body
    assert coerce_input({"b64": base64.b64encode(b"\x00ab").decode()}, BYTES) == b"\x00ab"
    with pytest.raises(
        PayloadTooLarge, match="17 characters exceeds the model's input.max_length 16"
    ):
        coerce_input("y" * 17, STRING)
    with pytest.raises(PayloadTooLarge, match="5 bytes exceeds"):
        coerce_input({"b64": base64.b64encode(b"12345").decode()}, BYTES)


@pytest.mark.parametrize(
    ("value", "spec_", "fragment"),
    [
        (["a"], STRING, "input must be a string, got list"),
        (3, STRING, "input must be a string, got int"),
        (b"abc", STRING, "input must be a string, got bytes"),
        ("abc", BYTES, 'a bytes input is {"b64": "<base64>"} in JSON'),
        ({"b64": "not base64!"}, BYTES, "input.b64 is not base64"),
        ({"b64": "é"}, BYTES, "input.b64 is not base64"),
        ({"b64": "YQ==", "more": 1}, BYTES, 'a bytes input is {"b64"'),
        ({"b64": 12}, BYTES, 'a bytes input is {"b64"'),
    ],
)
def test_a_value_of_the_wrong_kind_gets_a_400_that_says_what_was_expected(
    value: Any, spec_: InputSpec, fragment: str
) -> None:
    with pytest.raises(BadRequest) as error:
        coerce_input(value, spec_)
    assert error.value.status == 400
    assert fragment in error.value.message


def test_many_strings_each_get_their_input_or_their_own_error() -> None:
    read = coerce_inputs(["ok", 7, "z" * 17, ""], STRING)
    assert read[0] == "ok"
    assert read[3] == ""
    assert isinstance(read[1], BadRequest)
    assert read[1].status == 400
    assert isinstance(read[2], PayloadTooLarge)
    assert read[2].status == 413


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")
def test_numbers_past_the_model_dtype_range_are_refused_each_alone() -> None:
    spec_ = InputSpec(shape=[2], dtype="float32")
    with pytest.raises(BadRequest, match="beyond the range of float32"):
        coerce_input([1.0, 1e39], spec_)
    read = coerce_inputs([[1.0, 2.0], [1e39, 0.0], [float("nan"), 0.0]], spec_)
    assert read[0].tolist() == [1.0, 2.0]  # type: ignore[union-attr]
    assert [type(r) for r in read[1:]] == [BadRequest, BadRequest]
    half = InputSpec(shape=[1], dtype="float16")
    with pytest.raises(BadRequest, match="float16"):
        coerce_input([70_000], half)  # an integer past float16's largest


def test_a_string_or_bytes_cache_key_is_a_digest_of_its_bytes_of_one_size() -> None:
    short, long = cache_key("m", "1", "abc"), cache_key("m", "1", "abc" * 10_000)
    assert short == cache_key("m", "1", "abc")
    assert short != long
    assert short != cache_key("m", "1", "abd")
    assert sys.getsizeof(short[-1]) == sys.getsizeof(long[-1])
    # a string and its UTF-8 bytes are different inputs; a new version a different model
    assert cache_key("m", "1", "abc") != cache_key("m", "1", b"abc")
    assert cache_key("m", "1", "abc") != cache_key("m", "2", "abc")


def test_a_python_models_numpy_outputs_become_json_and_other_types_fail_the_batch() -> None:
    runtime = PythonRuntime("raysrv.testing:TextModel")
    (answer,) = runtime.predict_batch(["two words"])
    assert answer == {"length": 9, "words": 2, "first": "t", "batch_size": 1, "batch": 1}
    assert all(type(v) in (int, str) for v in answer.values())
    runtime.model.predict_batch = lambda inputs: [{"set": {1}}]
    with pytest.raises(TypeError, match="must be what JSON holds, got set"):
        runtime.predict_batch(["x"])
    runtime.model.predict_batch = lambda inputs: [{1: 2}]
    with pytest.raises(TypeError, match="keys must be strings, got int"):
        runtime.predict_batch(["x"])


TEXT_SPEC = RaysrvSpec.model_validate(
    spec(
        [
            _spec(input={"dtype": "string", "max_length": 32}),
            {**_spec(input={"dtype": "bytes", "max_length": 8}), "name": "b"},
        ],
        [{"name": "words", "models": ["t"], "cache_size": 16}],
    )
)


def _client(logs: dict[str, list[int]]) -> httpx.AsyncClient:
    workers = {
        m: fake_workers(PythonRuntime("raysrv.testing:TextModel"), 0.0, logs.setdefault(m, []))
        for m in ("t", "b")
    }
    app = create_http_app(Server(TEXT_SPEC, workers), 4096)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://raysrv")


def test_strings_and_bytes_are_served_over_http_batched_cached_and_fed_back() -> None:
    async def scenario() -> dict[str, Any]:
        logs: dict[str, list[int]] = {}
        async with _client(logs) as c:
            many = await c.post("/v1/words/predict", json={"inputs": ["one", "two words", ""]})
            again = await c.post("/v1/words/predict", json={"input": "two words"})
            label = {"query_id": again.json()["query_id"], "label": 2}
            fed = await c.post("/v1/words/feedback", json=label)
            b64 = {"input": {"b64": base64.b64encode(b"\x00\x01 a").decode()}}
            json_bytes = await c.post("/v1/models/b/predict", json=b64)
            raw = await c.post(
                "/v1/models/b/predict?slo_ms=5000",
                content=b"\x00\x01 a",
                headers={"content-type": "application/octet-stream"},
            )
            return {
                "many": many,
                "again": again,
                "fed": fed,
                "json": json_bytes,
                "raw": raw,
                "logs": logs,
            }

    r = asyncio.run(scenario())
    results = r["many"].json()["results"]
    assert [a["output"]["words"] for a in results] == [1, 2, 0]
    assert [a["output"]["length"] for a in results] == [3, 9, 0]
    assert {a["output"]["batch_size"] for a in results} == {3}  # one batch of three
    assert r["again"].json()["cache_hit"] is True  # the same string, answered from the cache
    assert r["fed"].status_code == 200
    sent_as_json, sent_raw = r["json"].json()["output"], r["raw"].json()["output"]
    assert sent_as_json["batch"] != sent_raw["batch"]  # the model route has no cache
    assert {**sent_as_json, "batch": 0} == {**sent_raw, "batch": 0}
    assert (sent_raw["first"], sent_raw["length"], sent_raw["words"]) == ([0], 4, 2)
    assert r["logs"]["t"] == [3]


@pytest.mark.parametrize(
    ("path", "kwargs", "status", "fragment"),
    [
        ("/v1/words/predict", {"json": {"input": [1, 2]}}, 400, "input must be a string"),
        ("/v1/words/predict", {"json": {"input": "w" * 33}}, 413, "exceeds the model's"),
        (
            "/v1/words/predict",
            {"content": b"words", "headers": {"content-type": "application/octet-stream"}},
            400,
            "takes string inputs: send them as JSON",
        ),
        (
            "/v1/models/b/predict",
            {"content": b"123456789", "headers": {"content-type": "application/octet-stream"}},
            413,
            "input of 9 bytes exceeds",
        ),
        ("/v1/models/b/predict", {"json": {"input": "plain"}}, 400, '{"b64": "<base64>"}'),
    ],
)
def test_a_text_request_that_does_not_fit_gets_a_4xx_that_says_why(
    path: str, kwargs: dict[str, Any], status: int, fragment: str
) -> None:
    async def scenario() -> httpx.Response:
        async with _client({}) as c:
            return await c.post(path, **kwargs)

    bad = asyncio.run(scenario())
    assert bad.status_code == status
    assert fragment in bad.json()["message"]
