"""``aimd``: Clipper's dynamic batch size (NSDI'17, §4.3.1).

"We additively increase the batch size by a fixed amount until the latency to process a batch
exceeds the latency objective. At this point, we perform a small multiplicative back-off,
reducing the batch size by 10%."

Steps, per finished batch (:meth:`AIMDPolicy.observe`):
  (1) the batch took longer than the objective  -> size = max(1, floor(size * backoff));
  (2) else, if the batch was full (size == cap)  -> size = min(max, size + step).
A batch smaller than the cap says nothing about whether a larger one would fit, so (2) waits
for a full one; without that rule a quiet period would grow the cap blindly and the next burst
would pay for it. The objective is ``slo_ms`` if given, else the model's SLO; batches are cut
FIFO, as in ``fixed``, when a replica is free. O(1) per decision step.
"""

from __future__ import annotations

import math

from pydantic import Field, model_validator

from raysrv.batching.base import (
    BatcherView,
    BatchingPolicy,
    BatchOutcome,
    Decision,
    PolicyParams,
)
from raysrv.batching.fixed import fifo_step

__all__ = ["AIMDParams", "AIMDPolicy", "CapParams", "CappedFifoPolicy"]


class CapParams(PolicyParams):
    """What every policy with a moving batch-size cap shares."""

    max_batch_size: int = Field(256, ge=1, le=4096, description="Upper bound of the cap.")
    timeout_ms: float = Field(0.0, ge=0.0, le=60_000.0, description="Wait for a fuller batch.")
    busy_timeout_ms: float = Field(
        0.0, ge=0.0, le=60_000.0, description="Wait for the ingress's concurrency (as ``fixed``)."
    )
    slo_ms: float | None = Field(
        None, gt=0.0, description="Batch latency objective; default: the model's SLO."
    )


class CappedFifoPolicy(BatchingPolicy):
    """FIFO batches (:func:`fifo_step`) up to a cap that a subclass moves from what it observes,
    against a batch-latency objective: ``slo_ms`` if given, else the model's SLO."""

    params: CapParams

    def __init__(self, params: CapParams, slo_s: float, initial_cap: int) -> None:
        super().__init__(params, slo_s)
        self._cap = initial_cap
        self._objective_s = params.slo_ms / 1000.0 if params.slo_ms is not None else slo_s

    @property
    def max_batch_size(self) -> int:
        return self._cap

    def decide(self, view: BatcherView) -> Decision:
        params = self.params
        return fifo_step(
            view, self._cap, params.timeout_ms / 1000.0, params.busy_timeout_ms / 1000.0
        )


class AIMDParams(CapParams):
    initial_batch_size: int = Field(1, ge=1, description="Batch size cap at start.")
    step: int = Field(
        1, ge=1, description="Additive increase after a full batch within the objective."
    )
    backoff: float = Field(
        0.9, gt=0.0, lt=1.0, description="Multiplicative decrease (Clipper: 10%)."
    )

    @model_validator(mode="after")
    def _initial_within_max(self) -> AIMDParams:
        if self.initial_batch_size > self.max_batch_size:
            raise ValueError(
                f"initial_batch_size ({self.initial_batch_size}) exceeds "
                f"max_batch_size ({self.max_batch_size})"
            )
        return self


class AIMDPolicy(CappedFifoPolicy):
    name = "aimd"
    Params = AIMDParams
    params: AIMDParams

    def __init__(self, params: AIMDParams, slo_s: float) -> None:
        super().__init__(params, slo_s, params.initial_batch_size)

    def observe(self, outcome: BatchOutcome) -> None:
        if not outcome.ok:
            return
        if outcome.duration > self._objective_s:  # step (1)
            self._cap = max(1, math.floor(self._cap * self.params.backoff))
        elif outcome.size >= self._cap:  # step (2)
            self._cap = min(self.params.max_batch_size, self._cap + self.params.step)
