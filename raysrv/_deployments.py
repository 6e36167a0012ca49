"""The Serve deployments: the ingress (HTTP + handle methods) and one replica group per model.

Thin shells (STYLE §4): the ingress wraps a :class:`~raysrv._server.Server` whose per-model
``execute`` is a handle call to that model's replica group; each replica wraps a runtime. A
replica accepts one batch at a time (``max_ongoing_requests=1``) and the batcher never sends a
replica group more batches than it has replicas, so no batch queues inside Serve.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from ray import serve
from ray.serve.handle import DeploymentHandle

from raysrv._batcher import Execute
from raysrv._http import create_http_app
from raysrv._server import Server
from raysrv.config import LiveConfig, ModelSpec, RaysrvSpec
from raysrv.metrics import ServeMetrics
from raysrv.runtimes import load_runtime
from raysrv.state import make_store

__all__ = ["Ingress", "ModelReplica"]


def _replica_executor(handle: DeploymentHandle) -> Execute:
    run_batch = handle.options(method_name="run_batch")

    async def execute(inputs: np.ndarray) -> tuple[list[Any], float]:
        return await run_batch.remote(inputs)

    return execute


@serve.deployment
@serve.ingress()
class Ingress:
    """Ingress, selection, cache and batchers of every app in one spec (see ``_server``).

    HTTP routes come from :func:`create_http_app`; Python callers use the same methods through a
    ``DeploymentHandle``: ``await handle.predict.remote(app, input, context=..., slo_ms=...)``.
    """

    def __init__(self, spec: dict[str, Any], replicas: dict[str, DeploymentHandle]) -> None:
        self._spec = RaysrvSpec.model_validate(spec)
        self._metrics = ServeMetrics()
        self._server = Server(
            self._spec,
            {name: _replica_executor(handle) for name, handle in replicas.items()},
            store=make_store(self._spec.state),
            metrics=self._metrics,
        )

    def __serve_build_asgi_app__(self) -> Any:
        return create_http_app(self._server, self._spec.ingress.max_body_bytes, self._metrics)

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        """Apply the live knobs of ``user_config`` (a :class:`LiveConfig`) without a restart."""
        self._server.configure(LiveConfig.model_validate(user_config))

    async def predict(
        self, app: str, input: Any, context: str | None = None, slo_ms: float | None = None
    ) -> dict[str, Any]:
        """The handle twin of ``POST /v1/{app}/predict``; returns the same result object."""
        start = time.monotonic()
        result = await self._server.predict(app, input, context, slo_ms)
        self._metrics.request(app, 200, time.monotonic() - start)
        return result

    async def feedback(self, app: str, query_id: str, label: Any) -> dict[str, Any]:
        """The handle twin of ``POST /v1/{app}/feedback``."""
        return await self._server.feedback(app, query_id, label)

    async def apps(self) -> list[dict[str, Any]]:
        return self._server.describe_apps()

    async def models(self) -> list[dict[str, Any]]:
        return self._server.describe_models()


@serve.deployment(max_ongoing_requests=1)
class ModelReplica:
    """One replica of one model: runs exactly the batches it is handed, one at a time."""

    def __init__(self, model: dict[str, Any]) -> None:
        self._spec = ModelSpec.model_validate(model)
        self._runtime = load_runtime(self._spec)
        self._metrics = ServeMetrics()

    def run_batch(self, inputs: np.ndarray) -> tuple[list[Any], float]:
        """Outputs for a stacked batch and the measured run time in seconds."""
        start = time.perf_counter()
        outputs = self._runtime.predict_batch(inputs)
        duration = time.perf_counter() - start
        self._metrics.execution(self._spec.name, len(inputs), duration)
        return outputs, duration
