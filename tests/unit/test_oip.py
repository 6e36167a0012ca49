"""The Open Inference Protocol's JSON routes over a Server whose workers are in-process."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from raysrv._http import create_http_app
from raysrv._server import Server
from raysrv.config import RaysrvSpec
from raysrv.runtimes import PythonRuntime
from raysrv.testing import EchoModel, fake_workers, model_spec, spec

SPEC = RaysrvSpec.model_validate(
    spec(
        [
            model_spec("a"),
            model_spec("t", source="raysrv.testing:TextModel", input={"dtype": "string"}),
        ],
        [{"name": "one", "models": ["a"]}],
    )
)


def _post(path: str, body: Any) -> httpx.Response:
    async def scenario() -> httpx.Response:
        workers = {
            "a": fake_workers(EchoModel()),
            "t": fake_workers(PythonRuntime("raysrv.testing:TextModel")),
        }
        app = create_http_app(Server(SPEC, workers), 4096)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://raysrv") as c:
            if body is None:
                return await c.get(path)
            return await c.post(path, json=body)

    return asyncio.run(scenario())


def _tensor(shape: list[int], datatype: str, data: Any) -> dict[str, Any]:
    return {"inputs": [{"name": "input", "shape": shape, "datatype": datatype, "data": data}]}


def test_an_infer_request_is_answered_row_by_row_as_one_tensor_per_output() -> None:
    body = {"id": "r1", **_tensor([2, 4], "FP32", [1, 2, 3, 4, 5, 6, 7, 8])}
    body["parameters"] = {"slo_ms": 5000}
    answer = _post("/v2/models/a/infer", body)
    assert answer.status_code == 200
    reply = answer.json()
    assert (reply["model_name"], reply["id"]) == ("a", "r1")
    outputs = {o["name"]: o for o in reply["outputs"]}
    assert outputs["sum"]["data"] == [10.0, 26.0]
    assert (outputs["sum"]["shape"], outputs["sum"]["datatype"]) == ([2], "FP64")
    assert outputs["batch_size"]["data"] == [2, 2]  # the two rows ran as one batch
    assert outputs["batch_size"]["datatype"] == "INT64"


def test_bytes_tensors_reach_a_string_model_one_string_a_row() -> None:
    answer = _post("/v2/models/t/infer", _tensor([2], "BYTES", ["two words", "é"]))
    outputs = {o["name"]: o for o in answer.json()["outputs"]}
    assert outputs["words"]["data"] == [2, 1]
    assert outputs["first"] == {
        "name": "first",
        "shape": [2],
        "datatype": "BYTES",
        "data": ["t", "é"],
    }


def test_health_and_metadata_describe_the_model() -> None:
    assert _post("/v2/health/ready", None).json()["ready"] is True
    assert _post("/v2/models/a/ready", None).json() == {"name": "a", "ready": True}
    (tensor,) = _post("/v2/models/a", None).json()["inputs"]
    assert tensor == {"name": "input", "datatype": "FP32", "shape": [-1, 4]}
    assert _post("/v2/models/t", None).json()["inputs"][0]["datatype"] == "BYTES"
    assert _post("/v2/models/nope/ready", None).status_code == 404


@pytest.mark.parametrize(
    ("path", "body", "status", "fragment"),
    [
        ("/v2/models/a/infer", _tensor([1, 4], "INT64", [1, 2, 3, 4]), 400, "takes FP32"),
        ("/v2/models/a/infer", _tensor([1, 3], "FP32", [1, 2, 3]), 400, "must be [N, 4]"),
        ("/v2/models/a/infer", _tensor([2, 4], "FP32", [1, 2, 3]), 400, "do not fill"),
        ("/v2/models/a/infer", {"inputs": []}, 400, "exactly one tensor"),
        ("/v2/models/a/infer", {**_tensor([1, 4], "FP32", [0] * 4), "x": 1}, 400, "unknown"),
        (
            "/v2/models/a/infer",
            {**_tensor([1, 4], "FP32", [0] * 4), "parameters": {"colour": 1}},
            400,
            "parameters may be",
        ),
        (
            "/v2/models/a/infer",
            {**_tensor([1, 4], "FP32", [0] * 4), "parameters": {"best_effort": "yes"}},
            400,
            "best_effort must be true or false",
        ),
        (
            "/v2/models/a/infer",
            {**_tensor([1, 4], "FP32", [0] * 4), "parameters": {"slo_ms": True}},
            400,
            "slo_ms must be a positive number",
        ),
        ("/v2/models/t/infer", _tensor([1], "BYTES", [3]), 400, "input must be a string"),
        ("/v2/models/t/infer", _tensor([2], "BYTES", ["x"]), 400, "a list of 2 strings"),
        ("/v2/models/nope/infer", _tensor([1, 4], "FP32", [0] * 4), 404, "unknown model"),
    ],
)
def test_an_infer_request_that_does_not_fit_gets_a_4xx_that_says_why(
    path: str, body: Any, status: int, fragment: str
) -> None:
    answer = _post(path, body)
    assert answer.status_code == status
    assert fragment in answer.json()["error"]
