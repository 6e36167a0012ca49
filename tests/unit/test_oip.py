"""The Open Inference Protocol's JSON routes over a Server whose workers are in-process."""

from __future__ import annotations

import asyncio
import json
import struct
from typing import Any

import httpx
import numpy as np
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
            model_spec("w", input={"shape": [64], "dtype": "float32"}),
        ],
        [{"name": "one", "models": ["a"]}],
    )
)


def _post(path: str, body: Any, raw: bytes | None = None, **headers: str | bytes) -> httpx.Response:
    """GET ``path`` (no ``body``), or POST ``body`` as JSON, or ``raw`` with ``headers``."""

    async def scenario() -> httpx.Response:
        workers = {
            "a": fake_workers(EchoModel()),
            "t": fake_workers(PythonRuntime("raysrv.testing:TextModel")),
            "w": fake_workers(EchoModel()),
        }
        app = create_http_app(Server(SPEC, workers), 4096)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://raysrv") as c:
            if raw is not None:
                return await c.post(path, content=raw, headers=headers)
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
        (
            "/v2/models/a/infer",
            {**_tensor([1, 4], "FP32", [0] * 4), "outputs": [{"name": "sum", "parameters": [[1]]}]},
            400,
            "an output is",
        ),
        (
            "/v2/models/a/infer",
            {**_tensor([1, 4], "FP32", [0] * 4), "outputs": [7]},
            400,
            "an output is",
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


def _binary(header: dict[str, Any], data: bytes) -> tuple[bytes, dict[str, str]]:
    """A request of the binary tensor data extension: the JSON header, then ``data``."""
    text = json.dumps(header).encode()
    return text + data, {"Inference-Header-Content-Length": str(len(text))}


def _binary_tensor(shape: list[int], datatype: str, size: int, **extra: Any) -> dict[str, Any]:
    tensor = {"name": "input", "shape": shape, "datatype": datatype}
    return {"inputs": [{**tensor, "parameters": {"binary_data_size": size}}], **extra}


def _split(answer: httpx.Response) -> tuple[dict[str, Any], bytes]:
    length = int(answer.headers["Inference-Header-Content-Length"])
    return json.loads(answer.content[:length]), answer.content[length:]


def test_a_binary_input_reads_as_little_endian_rows_and_outputs_come_as_asked() -> None:
    rows = np.arange(8, dtype="<f4").reshape(2, 4)
    raw, headers = _binary(_binary_tensor([2, 4], "FP32", rows.nbytes), rows.tobytes())
    answer = _post("/v2/models/a/infer", None, raw, **headers)
    assert answer.status_code == 200
    assert "inference-header-content-length" not in answer.headers
    outputs = {o["name"]: o for o in answer.json()["outputs"]}
    assert outputs["sum"]["data"] == [6.0, 22.0]

    asked = _binary_tensor([2, 4], "FP32", rows.nbytes, parameters={"binary_data_output": True})
    raw, headers = _binary(asked, rows.tobytes())
    answer = _post("/v2/models/a/infer", None, raw, **headers)
    assert answer.headers["content-type"] == "application/octet-stream"
    header, data = _split(answer)
    sizes = [o["parameters"]["binary_data_size"] for o in header["outputs"]]
    assert sum(sizes) == len(data)
    assert all("data" not in o for o in header["outputs"])
    at, decoded = 0, {}
    for output, size in zip(header["outputs"], sizes, strict=True):
        dtype = {"FP64": "<f8", "INT64": "<i8"}[output["datatype"]]
        decoded[output["name"]] = np.frombuffer(data[at : at + size], dtype).tolist()
        at += size
    assert decoded["sum"] == [6.0, 22.0]
    assert decoded["batch_size"] == [2, 2]


def test_outputs_are_chosen_by_name_each_as_json_or_bytes() -> None:
    body = {
        **_tensor([1, 4], "FP32", [1, 2, 3, 4]),
        "outputs": [{"name": "sum", "parameters": {"binary_data": True}}, {"name": "batch"}],
    }
    header, data = _split(_post("/v2/models/a/infer", body))
    assert [o["name"] for o in header["outputs"]] == ["sum", "batch"]
    assert np.frombuffer(data, "<f8").tolist() == [10.0]
    assert isinstance(header["outputs"][1]["data"][0], int)
    body["outputs"] = [{"name": "colour"}]
    answer = _post("/v2/models/a/infer", body)
    assert answer.status_code == 400
    assert "no outputs ['colour']" in answer.json()["error"]


def test_binary_bytes_elements_reach_a_string_model_and_come_back_length_first() -> None:
    words = ["two words", "é"]
    data = b"".join(struct.pack("<I", len(w.encode())) + w.encode() for w in words)
    raw, headers = _binary(
        _binary_tensor([2], "BYTES", len(data), parameters={"binary_data_output": True}), data
    )
    header, answer = _split(_post("/v2/models/t/infer", None, raw, **headers))
    first = next(o for o in header["outputs"] if o["name"] == "first")
    at = sum(
        o["parameters"]["binary_data_size"]
        for o in header["outputs"][: header["outputs"].index(first)]
    )
    blob = answer[at : at + first["parameters"]["binary_data_size"]]
    assert blob == struct.pack("<I", 1) + b"t" + struct.pack("<I", 2) + "é".encode()


@pytest.mark.filterwarnings("ignore:overflow encountered")
def test_an_answer_json_cannot_carry_fails_as_json_and_comes_whole_as_bytes() -> None:
    body = _tensor([1, 4], "FP32", [3e38, 3e38, 0, 0])  # float32's sum of it is an infinity
    answer = _post("/v2/models/a/infer", body)
    assert answer.status_code == 500
    assert "binary_data_output" in answer.json()["error"]
    body["parameters"] = {"binary_data_output": True}
    header, data = _split(_post("/v2/models/a/infer", body))
    assert header["outputs"][0]["name"] == "sum"
    assert np.isinf(np.frombuffer(data[:8], "<f8")[0])


FOUR = np.zeros(4, "<f4").tobytes()


@pytest.mark.parametrize(
    ("header", "data", "length", "fragment"),
    [
        (_binary_tensor([1, 4], "FP32", 16), FOUR, "x", "must be a byte count"),
        (_binary_tensor([1, 4], "FP32", 16), FOUR, "99999", "must be a byte count"),
        (_binary_tensor([1, 4], "FP32", 16), FOUR, "9" * 5000, "must be a byte count"),
        (_binary_tensor([1, 4], "FP32", 16), FOUR, "²".encode(), "must be a byte count"),
        (_binary_tensor([1, 4], "FP32", 12), FOUR, None, "declares 12 bytes"),
        (_binary_tensor([2, 4], "FP32", 16), FOUR, None, "do not fill the input's shape"),
        (_tensor([1, 4], "FP32", [0] * 4), FOUR, None, "no input declares them"),
        (_binary_tensor([1, 4], "FP32", -1), FOUR, None, "must be a byte count"),
        (
            _binary_tensor([2], "BYTES", 16),
            struct.pack("<I", 99) + b"x" * 12,
            None,
            "BYTES elements",
        ),
        (
            _binary_tensor([1], "BYTES", 8),
            struct.pack("<I", 2) + b"\xff\xfe" + b"ab",
            None,
            "BYTES elements",
        ),
    ],
)
def test_a_binary_request_that_does_not_fit_gets_a_400_that_says_why(
    header: dict[str, Any], data: bytes, length: str | bytes | None, fragment: str
) -> None:
    raw, headers = _binary(header, data)
    if length is not None:
        headers["Inference-Header-Content-Length"] = length
    model = "t" if header["inputs"][0]["datatype"] == "BYTES" else "a"
    answer = _post(f"/v2/models/{model}/infer", None, raw, **headers)
    assert answer.status_code == 400
    assert fragment in answer.json()["error"]


def test_a_compressed_body_is_refused_with_a_400() -> None:
    raw = json.dumps(_tensor([1, 4], "FP32", [0] * 4)).encode()
    answer = _post("/v2/models/a/infer", None, raw, **{"Content-Encoding": "gzip"})
    assert answer.status_code == 400
    assert "compressed" in answer.json()["error"]


def test_an_identity_encoding_is_read_and_another_method_than_post_is_a_405() -> None:
    raw = json.dumps(_tensor([1, 4], "FP32", [1, 2, 3, 4])).encode()
    answer = _post("/v2/models/a/infer", None, raw, **{"Content-Encoding": "identity"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"][0] == {
        "name": "sum",
        "shape": [1],
        "datatype": "FP64",
        "data": [10.0],
    }
    refused = _post("/v2/models/a/infer", None)  # a GET
    assert (refused.status_code, refused.headers["allow"]) == (405, "POST")
    assert refused.json()["error"] == "method_not_allowed"


def test_the_infer_route_answered_before_fastapi_is_in_the_openapi_schema() -> None:
    operation = _post("/openapi.json", None).json()["paths"]["/v2/models/{model}/infer"]["post"]
    assert operation["requestBody"]["content"].keys() == {
        "application/json",
        "application/octet-stream",
    }
    assert operation["responses"]["default"]["content"]["application/json"]["schema"][
        "required"
    ] == ["error"]  # the protocol's error body


def test_the_fast_path_benchmarks_binary_infer_bodies_read_back_as_their_inputs() -> None:
    from bench.fast_path import oip_bodies

    inputs = [np.arange(64, dtype=np.float32) + i for i in range(6)]
    bodies, headers = oip_bodies(inputs, 3)
    assert len(bodies) == 2
    for k, raw in enumerate(bodies):
        answer = _post("/v2/models/w/infer", None, raw, **headers)
        assert answer.status_code == 200, answer.text
        header, data = _split(answer)
        first = header["outputs"][0]
        assert (first["name"], first["shape"]) == ("sum", [3])
        sums = np.frombuffer(data[: first["parameters"]["binary_data_size"]], "<f8")
        assert sums.tolist() == [float(x.sum()) for x in inputs[3 * k : 3 * k + 3]]
