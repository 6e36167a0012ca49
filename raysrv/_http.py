"""The HTTP face of the ingress: an ASGI app over a :class:`~raysrv._server.Server`, the predict
routes answered by :class:`PredictRoutes` and the others by a FastAPI app, which documents all.

Built by :func:`create_http_app` so that it runs the same under Serve's proxy and in tests with
an in-process ASGI client. Bodies are read only of a JSON content type, or a raw one where a
route takes raw tensors (415 otherwise: a web page may send a form or plain text to any address
without asking; infer requests of no type are read, as Triton's own client sends them so), with
a size limit (413 past it) and a depth limit, and parsed here, so a malformed request gets a 4xx
with a message and never reaches a model. Anything unexpected is answered as the documented
JSON error, a 500, and logged.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import math
import time
from functools import cache
from typing import Any
from urllib.parse import parse_qsl

import numpy as np
import orjson
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from raysrv._docs import docs_page
from raysrv._model_spec import NUMERIC
from raysrv._oip import HEADER as INFER_HEADER
from raysrv._oip import INFER_BODY, add_oip_routes, answer_infer, oip_error
from raysrv._oip import WHERE as INFER_WHERE
from raysrv._server import (
    DESCRIBE_CHUNK,
    Server,
    counted_bodies,
    json_object,
    shown,
    unexpected,
    unexpected_error,
)
from raysrv.errors import (
    BadRequest,
    MethodNotAllowed,
    ModelFailed,
    NotFound,
    PayloadTooLarge,
    RaysrvError,
    Unauthorized,
    UnsupportedMediaType,
)
from raysrv.metrics import Metrics

__all__ = [
    "ErrorBody",
    "FeedbackRequest",
    "ModelPredictRequest",
    "ModelPredictResponse",
    "PredictRequest",
    "PredictResponse",
    "PredictRoutes",
    "create_http_app",
]


class ModelPredictRequest(BaseModel):
    """Body of ``POST /v1/models/{model}/predict``: one model, no selection, cache or feedback."""

    model_config = ConfigDict(extra="forbid")
    input: Any = Field(
        None,
        description="One input: of the model's shape and dtype, as nested lists; a string; "
        'or bytes as {"b64": "<base64>"}.',
    )
    inputs: list[Any] | None = Field(
        None,
        description="Instead of input: many inputs, answered together as {results: [...]}, "
        "each an answer or an error body, in order (at most ingress.max_inputs).",
    )
    slo_ms: float | None = Field(None, gt=0, description="Latency objective of this query.")
    best_effort: bool = Field(
        False, description="Answer late rather than refuse when the objective cannot be met."
    )
    priority: int = Field(
        0, ge=0, le=1, description="0: latency-sensitive; 1: batch client, fills idle time."
    )
    sent_at: float | None = Field(
        None, description="Wall-clock seconds when the caller sent it: the SLO starts there."
    )


class PredictRequest(ModelPredictRequest):
    """Body of ``POST /v1/{app}/predict`` (the context field is named by the app's config)."""

    input: Any = Field(
        None,
        description="One input: of the app's shape and dtype, as nested lists; a string; or "
        'bytes as {"b64": "<base64>"}.',
    )
    context: str | None = Field(None, description="Context key for per-user model selection.")


class PredictResponse(BaseModel):
    output: Any = Field(description="The (combined) prediction.")
    models: list[str] = Field(
        description="Models asked (see missing for those that did not answer)."
    )
    cache_hit: bool = Field(description="True when no model evaluation was started for it.")
    query_id: str = Field(description="Quote it in feedback.")
    latency_ms: float = Field(description="Time spent inside raysrv.")
    transit_ms: float | None = Field(
        description="Time from the request's sent_at to its reaching raysrv (null without it)."
    )
    confidence: float = Field(description="The selection policy's confidence in the output.")
    missing: list[str] = Field(
        description="Models asked whose prediction did not arrive by the deadline (or failed)."
    )
    default: bool = Field(description="True when the output is the app's default answer.")


class ModelPredictResponse(BaseModel):
    output: Any = Field(description="The model's prediction.")
    model: str = Field(description="The model that answered.")
    latency_ms: float = Field(description="Time spent inside raysrv.")
    transit_ms: float | None = Field(
        description="Time from the request's sent_at to its reaching raysrv (null without it)."
    )


class ErrorBody(BaseModel):
    error: str = Field(description="A short machine-readable reason, e.g. rejected.")
    message: str = Field(description="What was wrong, with the offending value.")
    status: int = Field(description="The HTTP status.")
    transit_ms: float | None = Field(
        None, description="With sent_at: the time from sending to reaching raysrv."
    )


class FeedbackRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    query_id: str = Field(description="The query_id of an answered query.")
    label: Any = Field(description="The right answer for that query.")


MODELS = "/v1/models"  # the app tag of direct model queries: one series for every model


def _body_schema(model: type[BaseModel]) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": model.model_json_schema()}},
        }
    }


STRING = {"type": "string"}


ERROR = {  # every raysrv error's answer (RaysrvError.to_json)
    "description": "An error: 400, 401, 404, 405, 409, 413, 415, 429, 503, 504 or 500",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
}
OIP_ERROR = {  # the Open Inference Protocol's error answer
    "description": "An error, as the Open Inference Protocol answers one",
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "properties": {"error": {"type": "string"}},
                "required": ["error"],
            }
        }
    },
}


SERVE_TIMED_OUT = {  # Ray Serve's own answer: raysrv never reads the header
    "description": "Ray Serve gave up on the request when its x-request-timeout-seconds header "
    "(or http_options.request_timeout_s) ran out, wherever it waited: also in Serve's proxy "
    "while no ingress replica is up. A line of text, not raysrv's error body",
    "content": {"text/plain": {"schema": STRING}},
}


def _predict_operation(
    summary: str, name: str, request: type[BaseModel], response: type[BaseModel]
) -> dict[str, Any]:
    one = response.model_json_schema()
    each = {"anyOf": [one, {"$ref": "#/components/schemas/ErrorBody"}]}  # in order, as sent
    many = {
        "type": "object",
        "required": ["results"],
        "properties": {"results": {"type": "array", "items": each}},
    }
    json_of = {"application/json": {"schema": {"anyOf": [one, many]}}}
    body = _body_schema(request)
    body["requestBody"]["content"]["application/octet-stream"] = {
        "schema": {"type": "string", "format": "binary"},
        "description": "One raw tensor in C order: its shape in x-raysrv-shape, its dtype in "
        "x-raysrv-dtype; or, for a model of bytes inputs, the one input. The options as query "
        "parameters.",
    }
    return {
        "summary": summary,
        "parameters": [{"name": name, "in": "path", "required": True, "schema": STRING}],
        **body,
        "responses": {
            "200": {"description": "The answer; with inputs: {results: [...]}", "content": json_of},
            "408": SERVE_TIMED_OUT,
            "default": ERROR,
        },
    }


def _infer_operation() -> dict[str, Any]:
    """The Open Inference Protocol's infer request, as :class:`PredictRoutes` answers it: a
    new dict each time, as a schema's operations are added to."""
    return {
        "summary": "Infer",
        "operationId": "infer_v2_models__model__infer_post",
        "parameters": [{"name": "model", "in": "path", "required": True, "schema": STRING}],
        **INFER_BODY,
        "responses": {
            "200": {
                "description": "The output tensors; with outputs asked as bytes, the JSON header "
                "(Inference-Header-Content-Length bytes long) and then their bytes",
                "content": {
                    "application/json": {"schema": {"type": "object"}},
                    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
                },
            },
            "408": SERVE_TIMED_OUT,
        },
    }


KEYED = (  # the operations that need an API key where the ingress has any
    ("/v1/{app}/predict", "post"),
    ("/v1/models/{model}/predict", "post"),
    ("/v1/{app}/feedback", "post"),
    ("/v2/models/{model}/infer", "post"),
)
SECURITY = {
    "bearer": {"type": "http", "scheme": "bearer"},
    "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
}


def _document_predict_routes(api: FastAPI, keyed: bool) -> None:
    """Put the routes :class:`PredictRoutes` answers into ``api``'s OpenAPI schema, and every
    operation's error answer (:data:`ERROR`, the protocol's :data:`OIP_ERROR` under ``/v2``)
    in place of FastAPI's 422; with ``keyed``, the API keys that :data:`KEYED` operations
    need."""
    build = api.openapi

    def openapi() -> dict[str, Any]:
        if api.openapi_schema is None:
            schema = build()  # cached by FastAPI as api.openapi_schema
            schema["paths"]["/v1/{app}/predict"] = {
                "post": _predict_operation("Predict", "app", PredictRequest, PredictResponse)
            }
            schema["paths"]["/v1/models/{model}/predict"] = {
                "post": _predict_operation(
                    "Predict Model", "model", ModelPredictRequest, ModelPredictResponse
                )
            }
            schema["paths"]["/v2/models/{model}/infer"] = {"post": _infer_operation()}
            components = schema.setdefault("components", {})
            components.setdefault("schemas", {})["ErrorBody"] = ErrorBody.model_json_schema()
            for path, operations in schema["paths"].items():
                for operation in operations.values():
                    responses = operation.setdefault("responses", {})
                    responses.pop("422", None)  # no route has a parameter FastAPI checks
                    responses.setdefault("default", OIP_ERROR if path.startswith("/v2/") else ERROR)
            if keyed:
                components["securitySchemes"] = SECURITY
                for path, method in KEYED:
                    schema["paths"][path][method]["security"] = [{name: []} for name in SECURITY]
        return api.openapi_schema

    api.openapi = openapi  # type: ignore[method-assign]


async def _read_body(scope: dict[str, Any], receive: Any, limit: int, infer: bool = False) -> bytes:
    """The body, at most ``limit`` bytes, of a JSON content type; with ``infer`` (an Open
    Inference Protocol infer request) also :data:`BINARY`, none (Triton's own client sends its
    JSON requests without one) or any with ``Inference-Header-Content-Length``, a header no
    page sends without asking."""
    untyped = not _header(scope, b"content-type")
    if not (infer and (untyped or _header(scope, INFER_HEADER.encode()))):
        _body_type(scope, infer)
    body = await _receive_body(scope, receive, limit)
    if body is None:
        raise BadRequest("the client left before its body arrived")
    return body


TIMELINE_CHUNK = 2000  # values of a timeline column rendered between turns of the event loop
MAX_AFTER_DIGITS = 18  # a timeline's ``after``: an action number, well within an int64


def _since(value: str | None) -> float:
    """The ``since`` of a timeline request: wall-clock seconds, 0 if absent."""
    if value is None:
        return 0.0
    try:
        since = float(value)
    except ValueError:
        since = math.nan
    if not math.isfinite(since):
        raise BadRequest(f"since must be wall-clock seconds, got {value!r}")
    return since


def _after(value: str | None) -> int:
    """The ``after`` of a timeline request: the last action number the caller has, -1 if
    absent."""
    if value is None:
        return -1
    if not value.isascii() or not value.isdigit() or len(value) > MAX_AFTER_DIGITS:
        raise BadRequest(f"after must be an action number (seq), got {value[:40]!r}")
    return int(value)


def _finite(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _parse_predict(
    data: dict[str, Any], context_field: str | None
) -> tuple[Any, bool, dict[str, Any]]:
    """The input (``input``) or inputs (``inputs``, with True) and the keyword arguments of
    :meth:`Server.predict` from a request body (of :meth:`Server.predict_model` without a
    ``context_field``)."""
    allowed = _predict_fields(context_field)
    if not allowed.issuperset(data):
        unknown = sorted(set(data) - allowed)
        raise BadRequest(f"unknown fields {unknown}; expected {sorted(allowed)}")
    if ("input" in data) == ("inputs" in data):
        raise BadRequest("give one of the fields 'input' (one input) or 'inputs' (a list)")
    context = data.get(context_field) if context_field is not None else None
    if context is not None and not isinstance(context, (str, int)):
        raise BadRequest(f"{context_field} must be a string, got {type(context).__name__}")
    options = {  # checked by the server, as a handle call's are
        "slo_ms": data.get("slo_ms"),
        "best_effort": data.get("best_effort", False),
        "priority": data.get("priority", 0),
        "sent_at": data.get("sent_at"),
        "http": True,
    }
    if context_field is not None:
        options["context"] = None if context is None else str(context)
    many = "inputs" in data
    return data["inputs" if many else "input"], many, options


@cache
def _predict_fields(context_field: str | None) -> frozenset[str]:
    """The fields of a predict request's body, with the app's ``context_field``."""
    fields = {"input", "inputs", "slo_ms", "best_effort", "priority", "sent_at", context_field}
    return frozenset(fields - {None})


def _json(value: Any) -> str:
    """``value`` as JSONResponse renders it."""
    return _ENCODER.encode(value)


# one encoder for every answer: json.dumps makes one a call where any option is given
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


NOT_JSON = ModelFailed("the answer holds NaN or an infinity, which JSON cannot carry")


def _encoded(status: int, payload: Any) -> tuple[int, bytes]:
    """``payload`` as JSON, with its ``status``. An answer whose output holds NaN or an
    infinity, which JSON has no numbers for, becomes a 500 error body; in ``{"results"}``
    that answer's entry alone, so that the other inputs keep theirs.

    A payload of finite numbers is written by orjson, in a tenth of the standard encoder's
    time. orjson writes NaN and the infinities as ``null``, so its text is kept only where
    every ``null`` in it is a ``None`` of the payload's top level (an answer's
    ``transit_ms``), else where :func:`_all_finite` finds no such float; any other payload
    goes to the standard encoder, which refuses them, as does what orjson cannot write (an
    integer past 64 bits). The count is a scan of the text in C, cheaper than a walk of the
    payload in Python (bench/RESULTS.md, "The fast path")."""
    try:
        body = orjson.dumps(payload, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:
        body = None
    if body is not None and (body.count(b"null") == _nones(payload) or _all_finite(payload)):
        return status, body
    try:
        return status, _json(payload).encode()
    except ValueError:
        pass
    if isinstance(payload, dict) and isinstance(payload.get("results"), list):
        entries = [_json_or_error(entry) for entry in payload["results"]]
        return status, ('{"results":[' + ",".join(entries) + "]}").encode()
    return NOT_JSON.status, _json(NOT_JSON.to_json()).encode()


def _nones(payload: Any) -> int:
    """How many of a dict payload's top-level values are None: each one ``null`` in its JSON."""
    return sum(1 for value in payload.values() if value is None) if type(payload) is dict else 0


def _all_finite(value: Any) -> bool:
    """False if ``value`` holds a float that is NaN or infinite (or, rarely, floats whose sum
    overflows: a list of floats is summed in C, and a sum is finite only where each term is).
    A container's scalars are checked in its own loop, not one call each."""
    kind = type(value)
    if kind is float:
        return math.isfinite(value)
    if kind is dict:
        items: Any = value.values()
    elif kind is list or kind is tuple:
        if value and type(value[0]) is float:
            try:
                return math.isfinite(sum(value))
            except TypeError:  # not numbers alone
                pass
        items = value
    else:
        return True
    for item in items:
        kind = type(item)
        if kind is float:
            if not math.isfinite(item):
                return False
        elif (kind is dict or kind is list or kind is tuple) and not _all_finite(item):
            return False
    return True


def _json_or_error(entry: Any) -> str:
    try:
        return _json(entry)
    except ValueError:
        return _json(NOT_JSON.to_json())


async def _routing_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """No route, or not this method, for a request of the FastAPI app: the documented error
    body, not Starlette's ``{"detail"}``."""
    asked = f"{request.method} {shown(request.url.path)}"
    if exc.status_code == 405:
        allow = (exc.headers or {}).get("Allow", "")
        return _error_response(MethodNotAllowed(f"{asked}: use {allow}", allow))
    if exc.status_code == 404:
        return _error_response(NotFound(f"no route for {asked}"))
    body = {"error": "http_error", "message": str(exc.detail), "status": exc.status_code}
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


def _error_response(exc: RaysrvError) -> JSONResponse:
    return JSONResponse(exc.to_json(), status_code=exc.status, headers=exc.headers())


class PredictRoutes:
    """The REST API of a :class:`Server` as an ASGI app: the two predict routes and the Open
    Inference Protocol's infer route answered here, every other request passed to the FastAPI
    app ``api`` (which documents all of them).

    A prediction is the one request a client sends at rate, and FastAPI's routing, dependency
    resolution and middleware, with Starlette's, took 16% of the busy ingress's time under
    load, near raysrv's own work on the predictions (``bench/RESULTS_ARCHIVE.md``, "where the
    fast path's time went, fp1 to fp4"), and 11% of it under binary infer requests (its day:
    "fp12 and fp13"); here a prediction costs one path split, the body read with its size limit
    and one JSON parse, or none for a raw tensor body (``application/octet-stream``).
    """

    def __init__(
        self, api: FastAPI, server: Server, max_body_bytes: int, metrics: Metrics, keys: Keys
    ):
        self.api = api
        self._keys = keys
        self._server = server
        self._limit = max_body_bytes
        self._metrics = metrics

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        route = _predict_route(scope) if scope["type"] == "http" else None
        if route is None:
            await self._other(scope, receive, send)
            return
        start = time.monotonic()
        kind, name = route
        if kind == "infer":
            await self._infer(scope, receive, send, name, start)
            return
        where = self._server.metric_tag(name) if kind == "app" else MODELS
        try:
            if scope["method"] != "POST":
                raise MethodNotAllowed(f"{scope['method']} on a predict route; use POST")
            self._keys.check(scope)
            if kind == "model":
                self._server.pool_of(name)  # 404 before the body is read
            binary = _body_type(scope, raw=True) == BINARY
            body = await _receive_body(scope, receive, self._limit)
            if body is None:
                return  # the client left before its body arrived: nobody to answer
            data = (
                self._binary(scope, body, kind, name) if binary else json_object(body, exact=False)
            )
            status, payload = await self._answer(kind, name, data, start)
        except RaysrvError as exc:
            self._metrics.error(where, exc)
            status, payload = exc.status, exc
        except Exception as exc:  # a defect: the documented error all the same
            payload = unexpected(exc, f"{scope['method']} {kind} predict")
            self._metrics.error(where, payload)
            status = payload.status
        await _send_json(send, status, payload)

    async def _other(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """A request for the FastAPI app; an exception it lets out is answered as the
        documented error if no answer was begun, and logged."""
        begun = False

        async def tracked(message: dict[str, Any]) -> None:
            nonlocal begun
            begun = begun or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.api(scope, receive, tracked)
        except Exception as exc:
            if scope["type"] != "http":
                raise
            error = unexpected(exc, f"{scope.get('method')} {scope.get('path', '')[:100]}")
            if not begun:
                await _send_json(send, error.status, error)

    async def _infer(
        self, scope: dict[str, Any], receive: Any, send: Any, model: str, start: float
    ) -> None:
        """An Open Inference Protocol infer request, answered as the protocol answers, errors
        included (``raysrv._oip``)."""
        if scope["method"] != "POST":
            error = MethodNotAllowed(f"{scope['method']} {shown(scope['path'])}: use POST")
            await _error_response(error)(scope, receive, send)
            return
        try:
            self._keys.check(scope)
            if _sent_header(scope, b"content-encoding") not in (None, b"identity"):
                raise BadRequest("a compressed body (Content-Encoding) is not accepted")
            body = await _read_body(scope, receive, self._limit, infer=True)
            length = _sent_header(scope, INFER_HEADER.encode())
            response = await answer_infer(
                self._server,
                self._metrics,
                model,
                body,
                None if length is None else length.decode(errors="replace"),
                start,
            )
        except RaysrvError as exc:
            self._metrics.error(INFER_WHERE, exc)
            response = oip_error(exc)
        except Exception as exc:  # a defect: the documented error all the same
            error = unexpected(exc, "POST infer")
            self._metrics.error(INFER_WHERE, error)
            response = oip_error(error)
        await response(scope, receive, send)

    def _binary(self, scope: dict[str, Any], body: bytes, kind: str, name: str) -> dict[str, Any]:
        """A raw body (:data:`BINARY`) as the fields of a JSON one: for a model of bytes inputs
        the one input; else a tensor, its shape in ``x-raysrv-shape``, its dtype in
        ``x-raysrv-dtype`` (the model's if absent), one input if the shape is the model's,
        else ``inputs``, one per row. Options in the query."""
        spec = self._server.input_spec(kind, name)
        if spec.dtype == "bytes":  # the body is the one input
            return {"input": body, **_query_options(scope)}
        if spec.text:
            raise BadRequest(f"{name!r} takes {spec.dtype} inputs: send them as JSON")
        dtype = _header(scope, b"x-raysrv-dtype").decode(errors="replace") or spec.dtype
        if dtype not in NUMERIC:
            raise BadRequest(f"x-raysrv-dtype must be one of {list(NUMERIC)}, got {dtype[:40]!r}")
        shape = _shape(_header(scope, b"x-raysrv-shape"))
        if len(shape) not in (len(spec.shape), len(spec.shape) + 1):
            raise BadRequest(
                f"x-raysrv-shape {list(shape)} is neither one input {list(spec.shape)} nor "
                f"inputs of it"
            )
        size = math.prod(shape) * np.dtype(dtype).itemsize
        if len(body) != size:
            raise BadRequest(
                f"a body of shape {list(shape)} and {dtype} holds {size} bytes, got {len(body)}"
            )
        array = np.frombuffer(body, dtype=dtype).reshape(shape)
        many = len(shape) > len(spec.shape)  # then one input a row
        return {("inputs" if many else "input"): array, **_query_options(scope)}

    async def _answer(self, kind: str, name: str, data: dict[str, Any], start: float) -> Any:
        server, where = self._server, name if kind == "app" else MODELS
        context_field = server.context_field(name) if kind == "app" else None
        value, many, options = _parse_predict(data, context_field)
        if many:
            call = server.predict_many if kind == "app" else server.predict_model_many
            entries = await call(name, value, **options)
            elapsed = time.monotonic() - start
            return 200, {"results": counted_bodies(entries, self._metrics, where, elapsed)}
        call = server.predict if kind == "app" else server.predict_model
        result = await call(name, value, **options)
        self._metrics.request(where, 200, time.monotonic() - start)
        return 200, result


BINARY = b"application/octet-stream"  # a raw tensor or bytes body (PredictRoutes._binary)
JSON = b"application/json"


def _body_type(scope: dict[str, Any], raw: bool = False) -> bytes:
    """The request's media type if it is JSON's (``application/json`` or ``...+json``), or,
    with ``raw``, :data:`BINARY`; else :class:`UnsupportedMediaType`."""
    given = _header(scope, b"content-type")
    media = given.split(b";", 1)[0].strip().lower()
    if media == JSON or (media.startswith(b"application/") and media.endswith(b"+json")):
        return JSON
    if raw and media == BINARY:
        return BINARY
    wanted = "application/json" + (" or application/octet-stream" if raw else "")
    sent = given.decode("latin-1")[:60] if given else "none"
    raise UnsupportedMediaType(f"content-type must be {wanted}, got {sent!r}")


MAX_DIMS = 8  # of an x-raysrv-shape


FEEDBACK_KEY = b"x-feedback-key"  # the header of an app's feedback key


class Keys:
    """Keys of which a caller must send one: the ingress's API keys (``ingress.api_keys``), for
    the predict, infer and feedback routes, as ``Authorization: Bearer KEY`` or ``x-api-key:
    KEY``; or an app's feedback keys (``feedback_keys``), as ``x-feedback-key: KEY``
    (``header``, without ``bearer``). The key sent is compared with every key, each in constant
    time, so that neither which key nor how much of one matched shows in the time of the
    answer."""

    def __init__(
        self,
        keys: tuple[str, ...],
        header: bytes = b"x-api-key",
        bearer: bool = True,
        whose: str = "the ingress's API keys",
    ) -> None:
        self._keys = tuple(key.encode() for key in keys)
        self._header, self._bearer, self._whose = header, bearer, whose
        self._how = "Authorization: Bearer KEY" if bearer else f"{header.decode()}: KEY"

    def __bool__(self) -> bool:
        return bool(self._keys)

    def check(self, scope: dict[str, Any]) -> None:
        """Nothing with no keys or a right one sent; else :class:`Unauthorized`."""
        if not self._keys:
            return
        sent = _header(scope, self._header)
        scheme, _, token = _header(scope, b"authorization").partition(b" ")
        if self._bearer and scheme.lower() == b"bearer":
            sent = token.strip()
        matched = False
        for key in self._keys:
            matched |= hmac.compare_digest(sent, key)
        if not matched:
            raise Unauthorized(f"send one of {self._whose}: {self._how}")


def _header(scope: dict[str, Any], name: bytes) -> bytes:
    """The value of the request's header ``name`` (lower case), empty if absent."""
    return _sent_header(scope, name) or b""


def _sent_header(scope: dict[str, Any], name: bytes) -> bytes | None:
    """The value of the request's header ``name`` (lower case), None if absent."""
    return next((value for key, value in scope["headers"] if key == name), None)


def _shape(value: bytes) -> tuple[int, ...]:
    """An ``x-raysrv-shape`` header (``32,64``) as a shape, else a 400 that says why."""
    parts = value.decode(errors="replace").split(",")
    if not value or len(parts) > MAX_DIMS or not all(p.strip().isdigit() for p in parts):
        raise BadRequest(
            f"x-raysrv-shape must be up to {MAX_DIMS} whole numbers, e.g. 32,64; got {value[:40]!r}"
        )
    return tuple(int(p) for p in parts)


def _query_options(scope: dict[str, Any]) -> dict[str, Any]:
    """A raw tensor request's options, from its query string: numbers as numbers, ``true`` and
    ``false`` as booleans, the rest (a context key) as strings; checked as a JSON body's."""
    options: dict[str, Any] = {}
    for key, value in parse_qsl(scope.get("query_string", b"").decode(errors="replace")):
        if key in ("input", "inputs"):
            raise BadRequest(f"a raw tensor request's {key} is its body, not a query parameter")
        if key in ("slo_ms", "sent_at"):
            options[key] = _number(value)
        elif key == "priority":
            options[key] = int(value) if value.isdigit() else value
        elif key == "best_effort":
            options[key] = {"true": True, "false": False}.get(value, value)
        else:
            options[key] = value
    return options


def _number(value: str) -> float | str:
    try:
        return float(value)
    except ValueError:
        return value  # refused with its field's message


def _predict_route(scope: dict[str, Any]) -> tuple[str, str] | None:
    """``("app", name)`` for ``/v1/{app}/predict``, ``("model", name)`` for
    ``/v1/models/{model}/predict``, ``("infer", model)`` for ``/v2/models/{model}/infer``
    (below the app's route prefix), else None."""
    path, root = scope["path"], scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]
    parts = path.split("/")
    if len(parts) == 4 and parts[:2] == ["", "v1"] and parts[3] == "predict" and parts[2]:
        return "app", parts[2]
    if len(parts) == 5 and parts[2] == "models" and parts[3]:
        if parts[:2] == ["", "v1"] and parts[4] == "predict":
            return "model", parts[3]
        if parts[:2] == ["", "v2"] and parts[4] == "infer":
            return "infer", parts[3]
    return None


async def _receive_body(scope: dict[str, Any], receive: Any, limit: int) -> bytes | None:
    """The request's body, at most ``limit`` bytes (413 past it, before reading it where the
    client declared its length); None if the client disconnected first."""
    for key, value in scope["headers"]:
        if key == b"content-length" and value.isdigit() and int(value) > limit:
            declared = value.decode()
            raise PayloadTooLarge(f"body of {declared} bytes exceeds the limit of {limit} bytes")
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        if len(body) + len(chunk) > limit:
            raise PayloadTooLarge(f"body exceeds the limit of {limit} bytes")
        if not message.get("more_body", False):  # a body in one message is kept as it came
            return bytes(body + chunk) if body else bytes(chunk)
        body += chunk


async def _send_json(send: Any, status: int, payload: Any) -> None:
    """``payload`` (an error: its body, with the headers it asks for) as JSON."""
    headers = [(b"content-type", b"application/json")]
    if isinstance(payload, RaysrvError):
        headers += [(k.lower().encode(), v.encode()) for k, v in payload.headers().items()]
        payload = payload.to_json()
    status, body = _encoded(status, payload)
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _add_docs(api: FastAPI) -> None:
    @api.get("/docs", include_in_schema=False)
    async def _docs() -> HTMLResponse:
        return HTMLResponse(docs_page(api.openapi()))


def create_http_app(
    server: Server, max_body_bytes: int, metrics: Metrics | None = None
) -> PredictRoutes:
    """The REST API of ``server``; see the OpenAPI schema at ``/openapi.json``."""
    metrics = metrics or Metrics()
    keys = Keys(server.spec.ingress.api_keys)
    api = FastAPI(
        title="raysrv",
        version="1",
        description="Model serving with adaptive batching.",
        docs_url=None,  # FastAPI's page loads from a CDN: /docs is raysrv's own (_docs)
        redoc_url=None,
    )
    _add_docs(api)

    @api.exception_handler(RaysrvError)
    async def _raysrv_error(request: Request, exc: RaysrvError) -> JSONResponse:
        app = request.path_params.get("app")
        where = MODELS if "model" in request.path_params else ""
        where = server.metric_tag(app) if app is not None else where
        metrics.error(where, exc)
        return _error_response(exc)

    api.add_exception_handler(StarletteHTTPException, _routing_error)  # type: ignore[arg-type]

    @api.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Starlette answers with this, then lets the exception on: PredictRoutes logs it
        return _error_response(unexpected_error(exc))

    _document_predict_routes(api, bool(keys))

    feedback_keys = {  # by app: only those that have any
        a.name: Keys(a.feedback_keys, FEEDBACK_KEY, False, f"app {a.name!r}'s feedback keys")
        for a in server.spec.apps
        if a.feedback_keys
    }

    feedback_key = {  # in the schema: the header of an app's feedback_keys, where it has any
        "name": FEEDBACK_KEY.decode(),
        "in": "header",
        "required": False,
        "schema": STRING,
        "description": "One of the app's feedback_keys, for an app that has any.",
    }

    @api.post(
        "/v1/{app}/feedback",
        openapi_extra={**_body_schema(FeedbackRequest), "parameters": [feedback_key]},
    )
    async def feedback(app: str, request: Request) -> JSONResponse:
        keys.check(request.scope)
        if app in feedback_keys:
            feedback_keys[app].check(request.scope)
        data = json_object(await _read_body(request.scope, request.receive, max_body_bytes))
        try:
            parsed = FeedbackRequest.model_validate(data)
        except ValueError as exc:
            raise BadRequest(f"invalid feedback: {exc}") from None
        return JSONResponse(await server.feedback(app, parsed.query_id, parsed.label))

    @api.get("/v1/apps")
    async def apps() -> JSONResponse:
        return JSONResponse({"apps": server.describe_apps()})

    @api.get("/v1/models/{model}/plan")
    async def plan(model: str) -> JSONResponse:
        return JSONResponse(await server.plan(model))

    _model_routes(api, server, max_body_bytes, metrics)

    add_oip_routes(api, server)

    @api.get("/healthz")
    async def healthz() -> JSONResponse:
        return JSONResponse({"status": "ok", "apps": sorted(server.apps)})

    return PredictRoutes(api, server, max_body_bytes, metrics, keys)


def _model_routes(api: FastAPI, server: Server, max_body_bytes: int, metrics: Metrics) -> None:
    """``GET /v1/models[/{model}]`` and ``GET /v1/pools`` (with ``GET
    /v1/pools/{pool}/timeline``)."""

    @api.get("/v1/models")
    async def models() -> Response:
        # rendered DESCRIBE_CHUNK models at a time, handing the event loop back between
        # chunks: a thousand models make about a megabyte of JSON
        described = await server.describe_models()
        parts = []
        for start in range(0, len(described), DESCRIBE_CHUNK):
            parts.extend(_json(m) for m in described[start : start + DESCRIBE_CHUNK])
            await asyncio.sleep(0)
        body = '{"models":[' + ",".join(parts) + "]}"
        return Response(body, media_type="application/json")

    @api.get("/v1/models/{model}")
    async def model(model: str) -> JSONResponse:
        return JSONResponse(server.describe_model(model))

    @api.get("/v1/pools")
    async def pools() -> JSONResponse:
        return JSONResponse({"pools": await server.describe_pools()})

    @api.get("/v1/pools/{pool}/timeline")
    async def timeline(pool: str, request: Request) -> Response:
        # 20,000 actions make 2 MB of JSON, some 80 ms of CPU in one piece: rendered
        # TIMELINE_CHUNK values at a time, handing the event loop back between chunks. An
        # action that did not run has no start or end, and only calls of batches have an
        # overhead: JSON's null for the NaN that stands for them.
        query = request.query_params
        columns = server.timeline(pool, _since(query.get("since")), _after(query.get("after")))
        parts = []
        for name, values in columns.items():
            chunks = []
            for first in range(0, len(values), TIMELINE_CHUNK):
                chunk = values[first : first + TIMELINE_CHUNK]
                chunks.append(_json([_finite(v) for v in chunk])[1:-1])
                await asyncio.sleep(0)
            parts.append(f"{_json(name)}:[{','.join(chunks)}]")
        return Response("{" + ",".join(parts) + "}", media_type="application/json")
