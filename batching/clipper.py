"""Clipper's two other batching rules (Clipper, NSDI'17, §4.3.1-4.3.2): ``quantile``, ``delayed``.

``quantile`` (§4.3.1, the alternative to AIMD): "quantile regression to estimate the
99th-percentile (P99) latency as a function of batch size and set the maximum batch size
accordingly". Every ``refit_every`` batches a linear quantile regression duration = a + b * size
at ``quantile`` is solved as a linear program (pinball loss) over the last ``window`` run times
of each batch size (the model's ``runs``) and the batch just finished, and the cap becomes the
largest size whose predicted quantile meets the objective. Until two sizes have been measured
the cap grows by ``step`` after each full batch within the objective, as AIMD does, to collect
them.

``delayed`` (§4.3.2): AIMD's cap, and when fewer queries wait than the cap, hold the batch up to
``delay_ms`` past the oldest arrival for more to arrive, "similar to the motivation for Nagle's
algorithm" — but never so long that the batch, at its measured p99 run time, would finish after
the oldest query's deadline. While fewer wait than the ingress lately held requests at once,
the hold is ``busy_timeout_ms`` if that is longer (as ``fixed`` holds), within the same bound.

Batches are cut FIFO for a free replica, as ``fixed`` and ``aimd`` do, and queries already past
their deadline are refused first. Cost: O(1) per step; a refit is one small LP (window <= 1000).
"""

from __future__ import annotations

import math

import numpy as np
from pydantic import Field, model_validator
from scipy.optimize import linprog

from raysrv.batching.aimd import AIMDParams, AIMDPolicy, CapParams, CappedFifoPolicy
from raysrv.batching.base import (
    BatcherView,
    BatchOutcome,
    Decision,
)
from raysrv.batching.fixed import expects_more, fifo_step

__all__ = [
    "DelayedParams",
    "DelayedPolicy",
    "QuantileParams",
    "QuantilePolicy",
    "fit_quantile_line",
]


class QuantileParams(CapParams):
    quantile: float = Field(0.99, gt=0.0, lt=1.0, description="Latency quantile regressed.")
    window: int = Field(
        500, ge=8, le=1000, description="Run times per batch size the regression reads."
    )
    refit_every: int = Field(16, ge=1, description="Batches between two regressions.")
    step: int = Field(1, ge=1, description="Growth of the cap while probing for sizes.")


def fit_quantile_line(sizes: np.ndarray, durations: np.ndarray, q: float) -> tuple[float, float]:
    """(a, b) minimizing the pinball loss of duration - (a + b * size) at quantile ``q``.

    The LP: minimize q * sum(u) + (1 - q) * sum(v) s.t. a + b * x_i + u_i - v_i = y_i, u, v >= 0.
    """
    n = sizes.size
    cost = np.concatenate([[0.0, 0.0], np.full(n, q), np.full(n, 1.0 - q)])
    equality = np.hstack([np.ones((n, 1)), sizes[:, None], np.eye(n), -np.eye(n)])
    bounds = [(None, None), (None, None)] + [(0.0, None)] * (2 * n)
    result = linprog(cost, A_eq=equality, b_eq=durations, bounds=bounds, method="highs")
    if not result.success:
        raise ValueError(f"quantile regression failed: {result.message}")
    return float(result.x[0]), float(result.x[1])


class QuantilePolicy(CappedFifoPolicy):
    name = "quantile"
    Params = QuantileParams
    params: QuantileParams

    def __init__(self, params: QuantileParams, slo_s: float) -> None:
        super().__init__(params, slo_s, 1)
        self._since_fit = 0
        self.line: tuple[float, float] | None = None  # (a, b) of the last regression

    def run_window(self) -> int:
        return self.params.window

    def observe(self, outcome: BatchOutcome) -> None:
        if not outcome.ok:
            return
        self._since_fit += 1
        pairs = [(outcome.size, outcome.duration)]
        for size, seconds in self.runs.samples(self.params.window).items():
            pairs += [(size, s) for s in seconds]
        if len({size for size, _ in pairs}) < 2:  # probe: grow after a full batch in time
            cap = self.max_batch_size
            if outcome.size >= cap and outcome.duration <= self._objective_s:
                self._cap = min(self.params.max_batch_size, cap + self.params.step)
            return
        if self.line is None or self._since_fit >= self.params.refit_every:
            self._refit(np.asarray(pairs, dtype=float))

    def _refit(self, data: np.ndarray) -> None:
        a, b = fit_quantile_line(data[:, 0], data[:, 1], self.params.quantile)
        self.line, self._since_fit = (a, b), 0
        largest = self.params.max_batch_size
        if b > 0:
            largest = min(largest, math.floor((self._objective_s - a) / b))
        self._cap = max(1, largest)

    def describe(self) -> dict[str, object]:
        return {**super().describe(), "p_latency_line_s": self.line}


class DelayedParams(AIMDParams):
    delay_ms: float = Field(
        2.0, ge=0.0, le=60_000.0, description="Longest hold for more queries (Clipper: 2 ms)."
    )

    @model_validator(mode="after")
    def _no_timeout(self) -> DelayedParams:
        if self.timeout_ms:
            raise ValueError(
                f"delayed holds batches with delay_ms, not timeout_ms ({self.timeout_ms})"
            )
        return self


class DelayedPolicy(AIMDPolicy):
    name = "delayed"
    Params = DelayedParams
    params: DelayedParams

    def run_window(self) -> int:
        return 10

    def decide(self, view: BatcherView) -> Decision:
        hold = self.params.delay_ms / 1000.0
        busy = self.params.busy_timeout_ms / 1000.0
        if busy > hold and expects_more(view, self.max_batch_size):
            hold = busy
        if view.queue and math.isfinite(view.queue[0].deadline):
            oldest = view.queue[0]
            run = self.runs.estimate(self.max_batch_size, 0.99, 10) or 0.0
            hold = max(0.0, min(hold, oldest.deadline - run - oldest.arrival))
        return fifo_step(view, self.max_batch_size, hold)
