"""The Open Inference Protocol's REST API (KServe's v2, which Triton speaks too), in JSON, for
clients that speak it: ``POST /v2/models/{model}/infer`` and the health and metadata routes.

A request carries one input tensor, as a raysrv model takes one input: ``shape`` [N, *the
model's shape] and ``data`` row-major (flat or nested); each of its N rows is one query to the
model, as ``inputs`` in raysrv's own API. ``BYTES`` carries a string or bytes model's inputs,
one string each (shape [N]). The options of raysrv's API (``slo_ms``, ``best_effort``,
``priority``, ``sent_at``) go in the request's ``parameters``. The answer has one output
tensor per output of the model (``output`` for a model with one), the rows stacked. The
protocol has no answer per row: if any row fails, the request fails with that row's status
and ``{"error": message}``.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from raysrv._model_spec import InputSpec
from raysrv._server import Server, counted_bodies
from raysrv.errors import BadRequest, RaysrvError
from raysrv.metrics import Metrics

__all__ = ["add_oip_routes", "read_infer", "write_infer"]

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
WHERE = "/v2/models"  # the metrics' app tag of these requests


def read_infer(body: dict[str, Any], spec: InputSpec) -> tuple[Any, dict[str, Any]]:
    """The rows of an infer request's one input tensor (a list, or an array one input a row)
    and raysrv's options from its ``parameters``; :class:`BadRequest` says what is wrong."""
    unknown = sorted(set(body) - {"id", "inputs", "outputs", "parameters"})
    if unknown:
        raise BadRequest(f"unknown fields {unknown} in an infer request")
    inputs = body.get("inputs")
    if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], dict):
        raise BadRequest("inputs must hold exactly one tensor: a raysrv model takes one input")
    parameters = body.get("parameters") or {}
    if not isinstance(parameters, dict) or set(parameters) - set(OPTIONS):
        raise BadRequest(f"parameters may be {list(OPTIONS)}, got {parameters!r}")
    return _rows(inputs[0], spec), {**parameters, "http": True}


def _rows(tensor: dict[str, Any], spec: InputSpec) -> Any:
    shape, datatype, data = tensor.get("shape"), tensor.get("datatype"), tensor.get("data")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise BadRequest(f"the input's shape must be a list of sizes, got {shape!r}")
    if spec.text:
        if datatype != "BYTES" or len(shape) != 1:
            raise BadRequest(f"this model takes {spec.dtype} inputs: BYTES of shape [N]")
        if not isinstance(data, list) or len(data) != shape[0]:
            raise BadRequest(f"BYTES data must be a list of {shape[0]} strings")
        return data if spec.dtype == "string" else [_utf8(x) for x in data]
    if DATATYPES.get(datatype) != spec.dtype:
        raise BadRequest(f"this model takes {_datatype_of(spec)} inputs, got {datatype!r}")
    if not shape or shape[1:] != list(spec.shape):
        raise BadRequest(f"the input's shape must be [N, {', '.join(map(str, spec.shape))}]")
    try:
        return np.asarray(data, dtype=spec.dtype).reshape(shape)
    except (ValueError, TypeError) as exc:
        raise BadRequest(f"the input's data do not fill its shape {shape}: {exc}") from None


def _utf8(value: Any) -> bytes:
    if not isinstance(value, str):
        raise BadRequest(f"BYTES data must be strings, got {type(value).__name__}")
    return value.encode()


def write_infer(
    model: str, request_id: Any, entries: list[dict[str, Any] | RaysrvError]
) -> dict[str, Any]:
    """The infer response of a model's answers, one per row: one output tensor per output;
    the first error among them raised."""
    for entry in entries:
        if isinstance(entry, RaysrvError):
            raise entry
    outputs = [e["output"] for e in entries]  # type: ignore[index]
    named = outputs[0] if isinstance(outputs[0], dict) else None
    columns = {k: [o[k] for o in outputs] for k in named} if named else {"output": outputs}
    response: dict[str, Any] = {"model_name": model, "outputs": []}
    if request_id is not None:
        response["id"] = request_id
    for name, rows in columns.items():
        array = np.asarray(rows)
        response["outputs"].append(
            {
                "name": name,
                "shape": list(array.shape),
                "datatype": _datatype(array),
                "data": array.reshape(-1).tolist(),
            }
        )
    return response


def _datatype_of(spec: InputSpec) -> str:
    """The protocol's tensor type of a model's input."""
    return "BYTES" if spec.text else next(k for k, v in DATATYPES.items() if v == spec.dtype)


def _datatype(array: np.ndarray) -> str:
    kind = array.dtype.kind
    return {"b": "BOOL", "i": "INT64", "u": "INT64", "f": "FP64"}.get(kind, "BYTES")


def add_oip_routes(api: FastAPI, server: Server, read_json: Any, metrics: Metrics) -> None:
    """The protocol's routes on ``api``; ``read_json(request)`` reads a body within the limit."""

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

    @api.post("/v2/models/{model}/infer")
    async def infer(model: str, request: Request) -> JSONResponse:
        start = time.monotonic()
        try:
            body = await read_json(request)
            rows, options = read_infer(body, server.input_spec("model", model))
            entries = await server.predict_model_many(model, rows, **options)
        except RaysrvError as exc:
            metrics.error(WHERE, exc)
            return _error(exc)
        counted_bodies(entries, metrics, WHERE, time.monotonic() - start)  # each row a query
        try:
            return JSONResponse(write_infer(model, body.get("id"), entries))
        except RaysrvError as exc:  # a row's, counted with it
            return _error(exc)


def _error(exc: RaysrvError) -> JSONResponse:
    return JSONResponse({"error": exc.message}, status_code=exc.status)
