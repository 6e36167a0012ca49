"""The HTTP face of the ingress: a FastAPI app over a :class:`~raysrv._server.Server`.

Built by :func:`create_http_app` so that it runs the same under Serve's proxy and in tests with
an in-process ASGI client. Bodies are read with a size limit (413 past it) and parsed here, so a
malformed request gets a 4xx with a message and never reaches a model.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from raysrv._server import DESCRIBE_CHUNK, Server, counted_bodies
from raysrv.errors import BadRequest, Overloaded, PayloadTooLarge, RaysrvError
from raysrv.metrics import Metrics

__all__ = [
    "FeedbackRequest",
    "ModelPredictRequest",
    "ModelPredictResponse",
    "PredictRequest",
    "PredictResponse",
    "create_http_app",
]


class ModelPredictRequest(BaseModel):
    """Body of ``POST /v1/models/{model}/predict``: one model, no selection, cache or feedback."""

    model_config = ConfigDict(extra="forbid")
    input: Any = Field(
        None, description="One input of the model's shape and dtype, as nested lists."
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

    input: Any = Field(None, description="One input of the app's shape and dtype, as nested lists.")
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


async def _read_json(request: Request, limit: int) -> dict[str, Any]:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"body of {declared} bytes exceeds the limit of {limit} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise PayloadTooLarge(f"body exceeds the limit of {limit} bytes")
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadRequest(f"body must be a JSON object, got {type(data).__name__}")
    return data


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
    allowed = {"input", "inputs", "slo_ms", "best_effort", "priority", "sent_at"}
    if context_field is not None:
        allowed.add(context_field)
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise BadRequest(f"unknown fields {unknown}; expected {sorted(allowed)}")
    if ("input" in data) == ("inputs" in data):
        raise BadRequest("give one of the fields 'input' (one input) or 'inputs' (a list)")
    context = data.get(context_field) if context_field is not None else None
    if context is not None and not isinstance(context, (str, int)):
        raise BadRequest(f"{context_field} must be a string, got {type(context).__name__}")
    slo_ms = data.get("slo_ms")
    if slo_ms is not None and (
        isinstance(slo_ms, bool)
        or not isinstance(slo_ms, (int, float))
        or not 0 < slo_ms < math.inf
    ):
        raise BadRequest(f"slo_ms must be a positive number, got {slo_ms!r}")
    best_effort = data.get("best_effort", False)
    if not isinstance(best_effort, bool):
        raise BadRequest(f"best_effort must be true or false, got {best_effort!r}")
    options = {
        "slo_ms": slo_ms,
        "best_effort": best_effort,
        "priority": data.get("priority", 0),
        "sent_at": data.get("sent_at"),
        "http": True,
    }
    if context_field is not None:
        options["context"] = None if context is None else str(context)
    many = "inputs" in data
    return data["inputs" if many else "input"], many, options


def _json(value: Any) -> str:
    """``value`` as JSONResponse renders it."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _results(
    entries: list[dict[str, Any] | RaysrvError], metrics: Metrics, where: str, seconds: float
) -> JSONResponse:
    """The answer to a request of many inputs (:func:`~raysrv._server.counted_bodies`)."""
    return JSONResponse({"results": counted_bodies(entries, metrics, where, seconds)})


def _error_response(exc: RaysrvError) -> JSONResponse:
    headers = {"Retry-After": str(exc.retry_after_s)} if isinstance(exc, Overloaded) else None
    return JSONResponse(exc.to_json(), status_code=exc.status, headers=headers)


def create_http_app(server: Server, max_body_bytes: int, metrics: Metrics | None = None) -> FastAPI:
    """The REST API of ``server``; see the OpenAPI schema at ``/openapi.json``."""
    metrics = metrics or Metrics()
    api = FastAPI(title="raysrv", version="1", description="Model serving with adaptive batching.")

    @api.exception_handler(RaysrvError)
    async def _raysrv_error(request: Request, exc: RaysrvError) -> JSONResponse:
        where = request.path_params.get("app", MODELS if "model" in request.path_params else "")
        metrics.error(where, exc)
        return _error_response(exc)

    @api.post(
        "/v1/{app}/predict",
        response_model=PredictResponse,
        openapi_extra=_body_schema(PredictRequest),
    )
    async def predict(app: str, request: Request) -> JSONResponse:
        start = time.monotonic()
        context_field = server.context_field(app)
        data = await _read_json(request, max_body_bytes)
        value, many, options = _parse_predict(data, context_field)
        if many:
            entries = await server.predict_many(app, value, **options)
            return _results(entries, metrics, app, time.monotonic() - start)
        result = await server.predict(app, value, **options)
        metrics.request(app, 200, time.monotonic() - start)
        return JSONResponse(result)

    @api.post("/v1/{app}/feedback", openapi_extra=_body_schema(FeedbackRequest))
    async def feedback(app: str, request: Request) -> JSONResponse:
        data = await _read_json(request, max_body_bytes)
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

    @api.get("/healthz")
    async def healthz() -> JSONResponse:
        return JSONResponse({"status": "ok", "apps": sorted(server.apps)})

    return api


def _model_routes(api: FastAPI, server: Server, max_body_bytes: int, metrics: Metrics) -> None:
    """``POST /v1/models/{model}/predict``, ``GET /v1/models[/{model}]`` and ``GET /v1/pools``
    (with ``GET /v1/pools/{pool}/timeline``)."""

    @api.post(
        "/v1/models/{model}/predict",
        response_model=ModelPredictResponse,
        openapi_extra=_body_schema(ModelPredictRequest),
    )
    async def predict_model(model: str, request: Request) -> JSONResponse:
        start = time.monotonic()
        server.pool_of(model)  # 404 before the body is read
        data = await _read_json(request, max_body_bytes)
        value, many, options = _parse_predict(data, None)
        if many:
            entries = await server.predict_model_many(model, value, **options)
            return _results(entries, metrics, MODELS, time.monotonic() - start)
        result = await server.predict_model(model, value, **options)
        metrics.request(MODELS, 200, time.monotonic() - start)
        return JSONResponse(result)

    @api.get("/v1/models")
    async def models() -> Response:
        # rendered DESCRIBE_CHUNK models at a time, handing the event loop back between
        # chunks: a thousand models make about a megabyte of JSON
        shown = await server.describe_models()
        parts = []
        for start in range(0, len(shown), DESCRIBE_CHUNK):
            parts.extend(_json(m) for m in shown[start : start + DESCRIBE_CHUNK])
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
