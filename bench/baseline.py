"""The baseline: what a Ray user would write instead of raysrv, a plain Serve deployment.

One replica (``num_cpus=1``; more with ``num_replicas``), each holding an onnxruntime session
with one intra-op thread over the same ONNX file, and ``@serve.batch`` on an ``async`` method
that runs the session inline (the pattern of Serve's batching guide). ``POST /baseline`` takes
the body raysrv takes, ``{"input": <nested list>}``, and answers ``{"output": [...]}``; Python
callers use ``await handle.predict.remote(input)``.

Each replica collects its young objects at the threshold ``RAYSRV_GC_YOUNG_OBJECTS`` sets, as
raysrv's processes do (``raysrv._heap``), a setting any Serve user could make: the baseline
gains from it about as much as raysrv does (bench/RESULTS.md, "The fast path").

``max_ongoing_requests`` must be well above ``max_batch_size``, or Serve never lets enough
requests into the replica for ``@serve.batch`` to form full batches.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from ray import serve
from ray.serve import Application
from starlette.requests import Request
from starlette.responses import JSONResponse

from raysrv._heap import set_young_threshold  # raysrv's collector setting, so both get it
from raysrv.runtimes import rows  # the same row split raysrv answers with, so both pay it

__all__ = ["Baseline", "admitted", "build_baseline"]


@serve.deployment
class Baseline:
    """ONNX model behind ``@serve.batch``; HTTP via ``__call__``, handles via ``predict``."""

    def __init__(
        self,
        path: str,
        input_shape: tuple[int, ...],
        max_batch_size: int = 16,
        batch_wait_timeout_s: float = 0.001,
    ) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self._session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self._input_name = self._session.get_inputs()[0].name
        self._output_names = [o.name for o in self._session.get_outputs()]
        self._shape = tuple(input_shape)
        self._batch.set_max_batch_size(max_batch_size)
        self._batch.set_batch_wait_timeout_s(batch_wait_timeout_s)
        self._batches = 0
        self._items = 0
        set_young_threshold()

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.001)
    async def _batch(self, inputs: list[np.ndarray]) -> list[Any]:
        outputs = self._session.run(None, {self._input_name: np.stack(inputs)})
        self._batches += 1
        self._items += len(inputs)
        return rows(self._output_names, outputs)

    async def predict(self, input: Any) -> dict[str, Any]:
        """The model's output for one input (nested list or array of the model's input shape)."""
        x = np.asarray(input, dtype=np.float32)
        if x.shape != self._shape:
            raise ValueError(f"input has shape {list(x.shape)}, expected {list(self._shape)}")
        return {"output": await self._batch(x)}

    async def __call__(self, request: Request) -> JSONResponse:
        try:
            body = await request.json()
            return JSONResponse(await self.predict(body["input"]))
        except (ValueError, KeyError, TypeError) as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)

    async def stats(self) -> dict[str, int]:
        """Batches run and items served since start (for the mean batch size)."""
        return {"batches": self._batches, "items": self._items}


def build_baseline(
    path: str,
    input_shape: tuple[int, ...],
    max_batch_size: int = 16,
    batch_wait_timeout_s: float = 0.001,
    max_ongoing_requests: int = 128,
    max_queued_requests: int = -1,
    num_replicas: int = 1,
) -> Application:
    """The baseline application over the ONNX file at ``path``, in ``num_replicas`` replicas.
    ``max_queued_requests`` (-1: no limit) bounds the callers' queue in front of the replicas:
    beyond it Serve refuses at once (``BackPressureError``)."""
    return Baseline.options(
        name="baseline",
        num_replicas=num_replicas,
        max_ongoing_requests=max_ongoing_requests,
        max_queued_requests=max_queued_requests,
        ray_actor_options={"num_cpus": 1},
    ).bind(path, tuple(input_shape), max_batch_size, batch_wait_timeout_s)


def admitted(capacity: float, slo_s: float, max_batch: int) -> int:
    """How many queries the hand-tuned baseline lets into its replica at once: as many full
    batches as can run one after another within the SLO behind the one running, at the
    measured capacity (a full batch every ``max_batch / capacity`` seconds); at least one."""
    behind = math.floor(slo_s * capacity / max_batch) - 1
    return max_batch * max(1, behind)
