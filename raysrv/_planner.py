"""What the analytic model predicts for a model's batching now: ``GET /v1/models/{model}/plan``.

The batcher keeps the inputs (the last arrival times, the replicas' run times per batch size,
the policy's settings); :func:`predict` fits a MAP(2) to the arrivals (batch §III-A), runs the
batch-buffer model (batch §IV) at the policy's current batch size and hold, and reports the
predicted latency quantiles beside the inputs they came from. A policy that plans for itself
(``ctmc``) adds its own plan. The fit and the model take about a millisecond a model where the
arrivals are near Poisson or a MAP2 matches them in closed form; arrivals no MAP2 reaches (an
overloaded ingress's) take the fit's bounded search, up to about 150 ms of one core
(``raysrv.analytics._mapfit``). The ingress runs :func:`predict` in a worker thread.
Importing what they need (scipy among it) takes most of a second of one core, and a worker
thread that imports holds the ingress's loop for most of that time: the ingress imports it as
it starts (:func:`prepare`), before traffic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["MIN_ARRIVALS", "PlanSnapshot", "predict", "prepare"]

MIN_ARRIVALS = 50  # arrivals needed before the arrival process is fitted


@dataclass(frozen=True)
class PlanSnapshot:
    """Copies of the batcher's state, safe to use off the event loop."""

    model: str
    policy: dict[str, Any]
    arrivals: np.ndarray  # the last arrival times, seconds
    run_p99: dict[int, float]  # replica run time per batch size, seconds
    replicas: int
    slo_s: float


def prepare() -> None:
    """Import the modules :func:`predict` needs, so that no plan imports them mid-traffic."""
    import raysrv.analytics  # noqa: F401
    import raysrv.analytics.profiles  # noqa: F401


def predict(snap: PlanSnapshot) -> dict[str, Any]:
    """The plan view: settings, inputs and, when there are enough of them, the prediction."""
    batch, hold_s = _settings(snap.policy)
    view: dict[str, Any] = {
        "model": snap.model,
        "policy": snap.policy.get("policy"),
        "settings": {"max_batch_size": batch, "timeout_ms": hold_s * 1000.0},
        "inputs": {
            "arrivals": int(snap.arrivals.size),
            "replicas": snap.replicas,
            "run_p99_ms": {str(k): v * 1000.0 for k, v in sorted(snap.run_p99.items())},
        },
        "predicted": None,
        "policy_plan": snap.policy.get("plan"),
    }
    gaps = np.diff(snap.arrivals)
    gaps = gaps[gaps > 0]
    if gaps.size < MIN_ARRIVALS or not snap.run_p99:
        view["why_no_prediction"] = (
            f"needs {MIN_ARRIVALS} arrivals and a measured batch; has {gaps.size} gaps and "
            f"{len(snap.run_p99)} batch sizes measured"
        )
        return view
    from raysrv.analytics import BatchBufferModel, fit_map2
    from raysrv.analytics.profiles import TableProfile

    arrival = fit_map2(gaps)
    view["inputs"].update(
        rate_per_s=arrival.rate, scv=arrival.scv, lag1=arrival.lag1_autocorrelation
    )
    service = TableProfile.from_mapping(snap.run_p99).service_times(batch)
    model = BatchBufferModel(arrival, service, batch, hold_s)
    view["predicted"] = {
        "p50_ms": model.latency_percentile(0.5) * 1000.0,
        "p99_ms": model.latency_percentile(0.99) * 1000.0,
        "mean_ms": model.mean_latency() * 1000.0,
        "mean_batch_size": model.mean_batch_size(),
        "meets_slo_at_p99": model.latency_percentile(0.99) <= snap.slo_s,
        "assumes": "a free replica for every batch (batch §IV); the replica wait is extra",
    }
    return view


def _settings(policy: dict[str, Any]) -> tuple[int, float]:
    """The policy's batch size and hold (seconds) as the buffer model sees them: the buffer's B
    where the policy has one (``ctmc``), else its largest batch."""
    params = policy.get("params", {})
    hold_ms = policy.get("timeout_ms", params.get("timeout_ms", params.get("delay_ms", 0.0)))
    batch = policy.get("batch_size", policy.get("max_batch_size", 1))
    return max(1, int(batch)), float(hold_ms or 0.0) / 1000.0
