"""The ingress Serve deployment: HTTP and handle methods over one :class:`Server`.

A thin shell over the Ray-free server: it starts every pool's workers (plain Ray actors, see
``_workers``), waits until each dedicated model is loaded, hands the server the workers, and
profiles the models whose batching policy asks before it takes traffic.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import ray
from ray import serve

from raysrv._heap import settle
from raysrv._http import MODELS, create_http_app
from raysrv._planner import prepare as prepare_plans
from raysrv._server import Server, counted_bodies, unexpected
from raysrv._workers import (
    AUTO_COLOCATE_MS,
    ColocatedWorkers,
    Owner,
    RayWorkers,
    Workers,
    choose_placement,
)
from raysrv.config import LiveConfig, RaysrvSpec, ResolvedPool
from raysrv.errors import RaysrvError
from raysrv.metrics import ServeMetrics
from raysrv.state import make_store

logger = logging.getLogger(__name__)

SERVE_NAMESPACE = "serve"  # where Serve names its replicas' actors

__all__ = ["STARTING", "Ingress", "StartFailed", "cause_line"]

STARTING = "raysrv could not start app"  # how a failed start's one line begins


class StartFailed(RuntimeError):
    """An ingress replica could not start its app's workers: one line says which and why."""


def cause_line(exc: BaseException) -> str:
    """``exc`` in one line: its type and message, those of the error a remote call raised
    where Ray wrapped one."""
    cause = getattr(exc, "cause", None)
    exc = cause if isinstance(cause, BaseException) else exc
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


@serve.deployment
@serve.ingress()
class Ingress:
    """Ingress, selection, cache and pool schedulers of every app in one spec (see ``_server``).

    HTTP routes come from :func:`create_http_app`; Python callers use the same methods through a
    ``DeploymentHandle``: ``await handle.predict.remote(app, input, context=..., slo_ms=...)``.
    """

    async def __init__(self, spec: dict[str, Any], root: str | None = None) -> None:
        """``spec``: a raysrv spec with its model sets expanded; ``root``: the directory
        relative sources of models added live are read from."""
        self._spec = RaysrvSpec.model_validate(spec)
        self._metrics = ServeMetrics()
        # Each ingress replica owns its workers, and takes over those of a replica that died
        # (``RayWorkers.start``).
        owner = (ray.get_runtime_context().get_actor_name() or "", SERVE_NAMESPACE)
        app = serve.get_replica_context().app_name
        orphan_s = self._spec.ingress.orphan_timeout_s
        self._workers: dict[str, Workers] = {}
        try:
            for pool_spec in self._spec.resolved_pools():
                self._workers[pool_spec.name] = await _workers(pool_spec, app, owner, orphan_s)
            for pool in self._workers.values():
                await pool.ready()
        except Exception as exc:  # e.g. a model that cannot load: no workers left behind
            for pool in self._workers.values():
                pool.close()
            self._workers = {}
            raise StartFailed(f"{STARTING} {app!r}: {cause_line(exc)}") from None
        self._server = Server(
            self._spec,
            self._workers,
            store=make_store(
                self._spec.state,
                self._metrics,
                self._spec.ingress.store_budget_bytes(),
            ),
            metrics=self._metrics,
            root=None if root is None else Path(root),
        )
        await self._server.profile()
        period_s = self._spec.ingress.plan_export_s
        self._exports = asyncio.create_task(self._export_plans(period_s)) if period_s else None
        prepare_plans()  # imported now, not by the first plan under traffic
        settle()  # start-up's objects out of the collector's full passes

    async def _export_plans(self, period_s: float) -> None:
        while True:
            await asyncio.sleep(period_s)
            try:
                await self._server.export_plans()
            except Exception:  # a plan that fails must not end the exports
                logger.exception("exporting the models' plans failed")

    async def __del__(self) -> None:
        """Serve stops the replica in order: its workers end now, not ``orphan_timeout_s``
        later."""
        if getattr(self, "_exports", None) is not None:
            self._exports.cancel()
        for pool in getattr(self, "_workers", {}).values():
            pool.close()

    def __serve_build_asgi_app__(self) -> Any:
        return create_http_app(self._server, self._spec.ingress.max_body_bytes, self._metrics)

    async def reconfigure(self, user_config: dict[str, Any]) -> None:
        """Apply the live knobs of ``user_config`` (a :class:`LiveConfig`) without a restart, on
        the loop that serves the queries (the pools' schedulers are not thread-safe)."""
        self._server.configure(LiveConfig.model_validate(user_config))
        settle()  # the models added, out of the collector's full passes; those removed freed

    async def predict(
        self,
        app: str,
        input: Any,
        context: str | None = None,
        slo_ms: float | None = None,
        best_effort: bool = False,
        priority: int = 0,
        sent_at: float | None = None,
    ) -> dict[str, Any]:
        """The handle twin of ``POST /v1/{app}/predict``: the same result object, errors included.

        An error comes back as ``{"error", "message", "status"}``, not raised (``raysrv.errors``
        says why); ``raysrv.errors.raise_for_error(result)`` raises it.
        """
        options = {"best_effort": best_effort, "priority": priority, "sent_at": sent_at}
        query = self._server.predict(app, input, context, slo_ms, **options)
        return await self._answer(self._server.metric_tag(app), query)

    async def predict_model(
        self,
        model: str,
        input: Any,
        slo_ms: float | None = None,
        best_effort: bool = False,
        priority: int = 0,
        sent_at: float | None = None,
    ) -> dict[str, Any]:
        """The handle twin of ``POST /v1/models/{model}/predict`` (errors as result objects)."""
        options = {"best_effort": best_effort, "priority": priority, "sent_at": sent_at}
        return await self._answer(
            MODELS, self._server.predict_model(model, input, slo_ms, **options)
        )

    async def predict_many(
        self,
        app: str,
        inputs: list[Any],
        context: str | None = None,
        slo_ms: float | None = None,
        best_effort: bool = False,
        priority: int = 0,
        sent_at: float | None = None,
    ) -> dict[str, Any]:
        """The handle twin of ``POST /v1/{app}/predict`` with ``inputs``: ``{"results"}``, each
        an answer or an error object, in order; or the request's error object."""
        options = {"best_effort": best_effort, "priority": priority, "sent_at": sent_at}
        many = self._server.predict_many(app, inputs, context, slo_ms, **options)
        return await self._answers(self._server.metric_tag(app), many)

    async def predict_model_many(
        self,
        model: str,
        inputs: list[Any],
        slo_ms: float | None = None,
        best_effort: bool = False,
        priority: int = 0,
        sent_at: float | None = None,
    ) -> dict[str, Any]:
        """The handle twin of ``POST /v1/models/{model}/predict`` with ``inputs``."""
        options = {"best_effort": best_effort, "priority": priority, "sent_at": sent_at}
        many = self._server.predict_model_many(model, inputs, slo_ms, **options)
        return await self._answers(MODELS, many)

    async def _answers(
        self, tag: str, query: Awaitable[list[dict[str, Any] | RaysrvError]]
    ) -> dict[str, Any]:
        """``{"results"}`` of a query of many inputs, each counted under ``tag``; or its
        error as a result object."""
        start = time.monotonic()
        try:
            entries = await query
        except RaysrvError as exc:
            self._metrics.error(tag, exc)
            return exc.to_json()
        except Exception as exc:  # a defect: the documented error all the same
            error = unexpected(exc, f"a handle's query of many inputs ({tag})")
            self._metrics.error(tag, error)
            return error.to_json()
        return {"results": counted_bodies(entries, self._metrics, tag, time.monotonic() - start)}

    async def _answer(self, tag: str, query: Awaitable[dict[str, Any]]) -> dict[str, Any]:
        """The answer of ``query``, or its error as a result object; counted under ``tag``."""
        start = time.monotonic()
        try:
            result = await query
        except RaysrvError as exc:
            self._metrics.error(tag, exc)
            return exc.to_json()
        except Exception as exc:  # a defect: the documented error all the same
            error = unexpected(exc, f"a handle's query ({tag})")
            self._metrics.error(tag, error)
            return error.to_json()
        self._metrics.request(tag, 200, time.monotonic() - start)
        return result

    async def feedback(self, app: str, query_id: str, label: Any) -> dict[str, Any]:
        """The handle twin of ``POST /v1/{app}/feedback``; errors come back as objects too."""
        try:
            return await self._server.feedback(app, query_id, label)
        except RaysrvError as exc:
            return exc.to_json()
        except Exception as exc:  # a defect: the documented error all the same
            return unexpected(exc, "a handle's feedback").to_json()

    async def apps(self) -> list[dict[str, Any]]:
        return self._server.describe_apps()

    async def models(self) -> list[dict[str, Any]]:
        return await self._server.describe_models()

    async def model(self, name: str) -> dict[str, Any]:
        """The handle twin of ``GET /v1/models/{model}`` (errors as result objects)."""
        try:
            return self._server.describe_model(name)
        except RaysrvError as exc:
            return exc.to_json()

    async def pools(self) -> list[dict[str, Any]]:
        return await self._server.describe_pools()

    async def timeline(self, pool: str, since: float = 0.0, after: int = -1) -> dict[str, Any]:
        """The pool's last actions as they ran, sent at or after the wall time ``since`` and
        numbered past ``after`` (``raysrv._pool.TIMELINE_COLUMNS``; errors as result
        objects)."""
        try:
            return self._server.timeline(pool, since, after)
        except RaysrvError as exc:
            return exc.to_json()

    async def plan(self, model: str) -> dict[str, Any]:
        """The handle twin of ``GET /v1/models/{model}/plan`` (errors as result objects)."""
        try:
            return await self._server.plan(model)
        except RaysrvError as exc:
            return exc.to_json()


async def _workers(pool: ResolvedPool, app: str, owner: Owner, orphan_s: float) -> Workers:
    """The pool's workers: threads of this process where it is colocated, or ``auto`` chose
    that (its dedicated models loaded and timed off the event loop), else Ray actors."""
    placement, medians = pool.placement, None
    if placement == "auto":
        placement, medians = await asyncio.to_thread(choose_placement, pool)
        logger.info("pool %s placed on %s (batch of one, ms: %s)", pool.name, placement, medians)
    started = time.monotonic()
    if placement == "colocated":
        workers: Workers = await asyncio.to_thread(ColocatedWorkers, pool)
    else:  # returns once each has claimed, so its models are loaded
        workers = await RayWorkers.start(pool, app, owner, orphan_s)
    workers.start_s = time.monotonic() - started
    if medians is not None:
        workers.auto = {"batch_of_one_ms": medians, "colocate_within_ms": AUTO_COLOCATE_MS}
    return workers
