"""The Open Inference Protocol's REST API (KServe's v2, which Triton speaks too), for clients
that speak it: ``POST /v2/models/{model}/infer`` and the health and metadata routes.

A request carries one input tensor, as a raysrv model takes one input: ``shape`` [N, *the
model's shape] and ``data`` row-major (flat or nested); each of its N rows is one query to the
model, as ``inputs`` in raysrv's own API. ``BYTES`` carries a string or bytes model's inputs,
one string each (shape [N]). The options of raysrv's API (``slo_ms``, ``best_effort``,
``priority``, ``sent_at``) go in the request's ``parameters``. The answer has one output
tensor per output of the model (``output`` for a model with one), the rows stacked. The
protocol has no answer per row: if any row fails, the request fails with that row's status
and ``{"error": message}``.

Tensors may also travel as bytes, in the binary tensor data extension that Triton's clients
use by default: the body is the JSON header (``Inference-Header-Content-Length`` bytes long)
and then the input's bytes, which the input declares in ``parameters.binary_data_size``:
little-endian row-major values, or for ``BYTES`` each element's length (4 bytes, little-endian)
then its bytes. An answer's outputs come as bytes the same way where the request asks
(``binary_data_output`` in its parameters, or ``binary_data`` in an output's), with that
header on the answer. ``outputs`` may name the outputs to return.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response

from raysrv._model_spec import InputSpec
from raysrv._server import Server, counted_bodies, json_object
from raysrv.errors import BadRequest, ModelFailed, RaysrvError
from raysrv.metrics import Metrics

__all__ = [
    "add_oip_routes",
    "answer_infer",
    "encode_infer",
    "oip_error",
    "read_infer",
    "split_body",
    "wanted_outputs",
    "write_infer",
]

DATATYPES = {  # the protocol's tensor types, and raysrv's dtypes they carry
    "BOOL": "bool",
    "UINT8": "uint8",
    "INT8": "int8",
    "INT32": "int32",
    "INT64": "int64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
}
OPTIONS = ("slo_ms", "best_effort", "priority", "sent_at")
BINARY_ALL = "binary_data_output"  # a request parameter: every output as bytes
HEADER = "inference-header-content-length"
WHERE = "/v2/models"  # the metrics' app tag of these requests


def split_body(body: bytes, header_length: str | None) -> tuple[dict[str, Any], memoryview]:
    """An infer request's JSON header and the tensor bytes after it: with no
    ``Inference-Header-Content-Length`` (``header_length``), the whole body is the header."""
    if header_length is None:
        return json_object(body, exact=False), memoryview(b"")
    digits = header_length.isascii() and header_length.isdigit() and len(header_length) < 16
    if not digits or int(header_length) > len(body):
        raise BadRequest(
            f"Inference-Header-Content-Length must be a byte count within the body's "
            f"{len(body)}, got {header_length!r}"
        )
    length = int(header_length)
    return json_object(body[:length], exact=False), memoryview(body)[length:]


def read_infer(
    body: dict[str, Any], spec: InputSpec, data: memoryview | None = None
) -> tuple[Any, dict[str, Any]]:
    """The rows of an infer request's one input tensor (a list, or an array one input a row),
    from its JSON or from ``data``, the bytes after its header, and raysrv's options from its
    ``parameters``; :class:`BadRequest` says what is wrong."""
    unknown = sorted(set(body) - {"id", "inputs", "outputs", "parameters"})
    if unknown:
        raise BadRequest(f"unknown fields {unknown} in an infer request")
    inputs = body.get("inputs")
    if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], dict):
        raise BadRequest("inputs must hold exactly one tensor: a raysrv model takes one input")
    parameters = body.get("parameters") or {}
    if not isinstance(parameters, dict) or set(parameters) - {*OPTIONS, BINARY_ALL}:
        raise BadRequest(f"parameters may be {[*OPTIONS, BINARY_ALL]}, got {parameters!r}")
    options = {k: v for k, v in parameters.items() if k != BINARY_ALL}  # see wanted_outputs
    tensor, data = inputs[0], data if data is not None else memoryview(b"")
    size = _binary_size(tensor)
    if size is None:
        if data:
            raise BadRequest(f"{len(data)} bytes follow the header, but no input declares them")
        return _rows(tensor, spec), {**options, "http": True}
    if "data" in tensor or size != len(data):
        raise BadRequest(
            f"the input declares {size} bytes (binary_data_size) and must have no data; "
            f"{len(data)} bytes follow the header"
        )
    return _binary_rows(tensor, spec, data), {**options, "http": True}


def _binary_size(tensor: dict[str, Any]) -> int | None:
    parameters = tensor.get("parameters") or {}
    if not isinstance(parameters, dict) or set(parameters) - {"binary_data_size"}:
        raise BadRequest(f"an input's parameters may be ['binary_data_size'], got {parameters!r}")
    size = parameters.get("binary_data_size")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 0):
        raise BadRequest(f"binary_data_size must be a byte count, got {size!r}")
    return size


def _shape(tensor: dict[str, Any], spec: InputSpec) -> list[int]:
    """The input's shape, checked against the model's input and the tensor's type."""
    shape, datatype = tensor.get("shape"), tensor.get("datatype")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise BadRequest(f"the input's shape must be a list of sizes, got {shape!r}")
    if spec.text:
        if datatype != "BYTES" or len(shape) != 1:
            raise BadRequest(f"this model takes {spec.dtype} inputs: BYTES of shape [N]")
        return shape
    if DATATYPES.get(datatype) != spec.dtype:
        raise BadRequest(f"this model takes {_datatype_of(spec)} inputs, got {datatype!r}")
    if not shape or shape[1:] != list(spec.shape):
        raise BadRequest(f"the input's shape must be [N, {', '.join(map(str, spec.shape))}]")
    return shape


def _rows(tensor: dict[str, Any], spec: InputSpec) -> Any:
    shape, data = _shape(tensor, spec), tensor.get("data")
    if spec.text:
        if not isinstance(data, list) or len(data) != shape[0]:
            raise BadRequest(f"BYTES data must be a list of {shape[0]} strings")
        return data if spec.dtype == "string" else [_utf8(x) for x in data]
    try:
        return np.asarray(data, dtype=spec.dtype).reshape(shape)
    except (ValueError, TypeError) as exc:
        raise BadRequest(f"the input's data do not fill its shape {shape}: {exc}") from None


def _binary_rows(tensor: dict[str, Any], spec: InputSpec, data: memoryview) -> Any:
    shape = _shape(tensor, spec)
    if spec.text:
        elements = _unpacked(data, shape[0])
        if spec.dtype == "bytes":
            return elements
        try:
            return [e.decode() for e in elements]
        except UnicodeDecodeError as exc:
            raise BadRequest(f"a BYTES element of a string model is not UTF-8: {exc}") from None
    dtype = np.dtype(spec.dtype).newbyteorder("<")
    if len(data) != math.prod(shape) * dtype.itemsize:
        raise BadRequest(
            f"{len(data)} bytes do not fill the input's shape {shape} of {dtype.itemsize}-byte "
            "values"
        )
    return np.frombuffer(data, dtype=dtype).reshape(shape).astype(spec.dtype)


def _unpacked(data: memoryview, count: int) -> list[bytes]:
    """``count`` BYTES elements, each its length (4 bytes, little-endian) then its bytes,
    filling ``data`` exactly."""
    elements, at = [], 0
    while at < len(data) and len(elements) < count:
        if at + 4 > len(data):
            break
        length = int.from_bytes(data[at : at + 4], "little")
        if at + 4 + length > len(data):
            break
        elements.append(bytes(data[at + 4 : at + 4 + length]))
        at += 4 + length
    if len(elements) != count or at != len(data):
        raise BadRequest(
            f"the input's bytes must be {count} BYTES elements, each its 4-byte length "
            "then its bytes, and nothing after"
        )
    return elements


def _utf8(value: Any) -> bytes:
    if not isinstance(value, str):
        raise BadRequest(f"BYTES data must be strings, got {type(value).__name__}")
    return value.encode()


def wanted_outputs(body: dict[str, Any]) -> dict[str, bool] | bool:
    """Which outputs an infer request asks for: by name, each with whether it wants it as
    bytes, or, when it names none, whether it wants every output as bytes."""
    outputs = body.get("outputs")
    every = (body.get("parameters") or {}).get(BINARY_ALL, False)
    if not isinstance(every, bool):
        raise BadRequest(f"{BINARY_ALL} must be true or false, got {every!r}")
    if outputs is None:
        return every
    if not isinstance(outputs, list) or not outputs:
        raise BadRequest(f"outputs must be a list of outputs by name, got {outputs!r}")
    return dict(_wanted(output, every) for output in outputs)


def _wanted(output: Any, every: bool) -> tuple[str, bool]:
    """One entry of ``outputs``: its name, and whether it is wanted as bytes."""
    parameters = output.get("parameters") or {} if isinstance(output, dict) else None
    binary = parameters.get("binary_data", every) if isinstance(parameters, dict) else None
    fits = (
        isinstance(binary, bool)  # so ``output`` and its parameters are objects
        and isinstance(output.get("name"), str)
        and set(output) <= {"name", "parameters"}
        and set(parameters) <= {"binary_data"}
    )
    if not fits:
        raise BadRequest(
            f'an output is {{"name": ..., "parameters": {{"binary_data": true or false}}}}, '
            f"got {output!r}"
        )
    return output["name"], binary


def write_infer(
    model: str,
    request_id: Any,
    entries: list[dict[str, Any] | RaysrvError],
    wanted: dict[str, bool] | bool = False,
) -> tuple[dict[str, Any], list[bytes]]:
    """The infer response of a model's answers, one per row: one output tensor per output
    ``wanted`` (:func:`wanted_outputs`), and the bytes of those it wants as bytes, in order;
    the first error among the answers raised."""
    for entry in entries:
        if isinstance(entry, RaysrvError):
            raise entry
    outputs = [e["output"] for e in entries]  # type: ignore[index]
    named = outputs[0] if isinstance(outputs[0], dict) else None
    columns = {k: [o[k] for o in outputs] for k in named} if named else {"output": outputs}
    if isinstance(wanted, dict):
        unknown = sorted(set(wanted) - set(columns))
        if unknown:
            raise BadRequest(f"model {model!r} has no outputs {unknown}: it has {list(columns)}")
        columns = {name: columns[name] for name in wanted}
    response: dict[str, Any] = {"model_name": model, "outputs": []}
    if request_id is not None:
        response["id"] = request_id
    blobs = []
    for name, rows in columns.items():
        array = np.asarray(rows)
        tensor = {"name": name, "shape": list(array.shape), "datatype": _datatype(array)}
        if wanted.get(name, False) if isinstance(wanted, dict) else wanted:
            blobs.append(_packed(array, tensor["datatype"]))
            tensor["parameters"] = {"binary_data_size": len(blobs[-1])}
        else:
            tensor["data"] = array.reshape(-1).tolist()
        response["outputs"].append(tensor)
    return response, blobs


def _packed(array: np.ndarray, datatype: str) -> bytes:
    """An output's bytes: little-endian row-major values, or BYTES elements length-first."""
    if datatype == "BYTES":
        elements = [x if isinstance(x, bytes) else str(x).encode() for x in array.reshape(-1)]
        return b"".join(len(e).to_bytes(4, "little") + e for e in elements)
    dtype = {"BOOL": "u1", "INT64": "<i8", "FP64": "<f8"}[datatype]
    return np.ascontiguousarray(array, dtype=dtype).tobytes()


def encode_infer(response: dict[str, Any], blobs: list[bytes]) -> Response:
    """The infer response as JSON, or, with bytes to send, as its JSON header and then them;
    :class:`ModelFailed` if the JSON would hold NaN or an infinity, which it has no numbers
    for."""
    try:
        header = JSONResponse(response).body
    except ValueError:
        raise ModelFailed(
            "the answer holds NaN or an infinity, which JSON cannot carry: ask for the outputs "
            "as bytes (binary_data_output)"
        ) from None
    if not blobs:
        return Response(header, media_type="application/json")
    return Response(
        header + b"".join(blobs),
        media_type="application/octet-stream",
        headers={"Inference-Header-Content-Length": str(len(header))},
    )


def _datatype_of(spec: InputSpec) -> str:
    """The protocol's tensor type of a model's input."""
    return "BYTES" if spec.text else next(k for k, v in DATATYPES.items() if v == spec.dtype)


def _datatype(array: np.ndarray) -> str:
    kind = array.dtype.kind
    return {"b": "BOOL", "i": "INT64", "u": "INT64", "f": "FP64"}.get(kind, "BYTES")


_TENSOR = {
    "type": "object",
    "required": ["name", "shape", "datatype"],
    "properties": {
        "name": {"type": "string"},
        "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        "datatype": {"type": "string", "enum": [*DATATYPES, "BYTES"]},
        "parameters": {"type": "object"},
        "data": {"type": "array", "description": "Row-major values, flat or nested."},
    },
}
INFER_BODY = {  # the infer request, for the OpenAPI schema
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["inputs"],
                    "properties": {
                        "id": {"type": "string"},
                        "parameters": {
                            "type": "object",
                            "description": f"raysrv's options: {', '.join(OPTIONS)}; "
                            f"{BINARY_ALL} for outputs as bytes.",
                        },
                        "inputs": {"type": "array", "items": _TENSOR, "minItems": 1},
                        "outputs": {"type": "array", "items": {"type": "object"}},
                    },
                }
            },
            "application/octet-stream": {
                "schema": {"type": "string", "format": "binary"},
                "description": "The binary tensor data extension: the JSON request "
                "(Inference-Header-Content-Length bytes), then the tensors' bytes.",
            },
        },
    }
}


def add_oip_routes(api: FastAPI, server: Server) -> None:
    """The protocol's health and metadata routes on ``api``; its infer requests are answered by
    :func:`answer_infer`, before FastAPI (``raysrv._http.PredictRoutes``)."""

    @api.get("/v2/health/live")
    @api.get("/v2/health/ready")
    async def health() -> JSONResponse:
        return JSONResponse({"live": True, "ready": True})

    @api.get("/v2/models/{model}/ready")
    async def ready(model: str) -> JSONResponse:
        server.pool_of(model)  # 404 if unknown
        return JSONResponse({"name": model, "ready": True})

    @api.get("/v2/models/{model}")
    async def metadata(model: str) -> JSONResponse:
        spec = server.input_spec("model", model)
        shape = [-1] if spec.text else [-1, *spec.shape]
        tensor = {"name": "input", "datatype": _datatype_of(spec), "shape": shape}
        return JSONResponse({"name": model, "platform": "raysrv", "inputs": [tensor]})


async def answer_infer(
    server: Server,
    metrics: Metrics,
    model: str,
    body: bytes,
    header_length: str | None,
    start: float,
) -> Response:
    """The answer to the infer request ``body`` for ``model`` that arrived at ``start``
    (``time.monotonic()``); ``header_length``: its ``Inference-Header-Content-Length``."""
    try:
        header, data = split_body(body, header_length)
        rows, options = read_infer(header, server.input_spec("model", model), data)
        wanted = wanted_outputs(header)
        entries = await server.predict_model_many(model, rows, **options)
    except RaysrvError as exc:
        metrics.error(WHERE, exc)
        return oip_error(exc)
    counted_bodies(entries, metrics, WHERE, time.monotonic() - start)  # each row a query
    try:
        return encode_infer(*write_infer(model, header.get("id"), entries, wanted))
    except RaysrvError as exc:  # a row's, counted with it; or an output it does not have
        return oip_error(exc)


def oip_error(exc: RaysrvError) -> JSONResponse:
    """``exc`` as the protocol answers an error: ``{"error": message}``, with its status."""
    return JSONResponse({"error": exc.message}, status_code=exc.status, headers=exc.headers())
