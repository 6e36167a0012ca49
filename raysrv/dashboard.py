"""raysrv's Grafana dashboard: a panel per question an operator asks of a running server, each a
PromQL query over the ``ray_raysrv_*`` series that Prometheus scrapes from Ray's metrics ports.

``raysrv dashboard`` prints it as Grafana's JSON model (``clusters/monitoring/`` keeps the
copy a test holds equal to it); ``raysrv dashboard push --url URL --token TOKEN`` puts it on a
Grafana server through its HTTP API (grafana-client, ``pip install raysrv[grafana]``). The
queries read a Prometheus data source chosen on the dashboard (``$datasource``) and
Grafana's ``$__rate_interval``; every query is checked against a real Prometheus scraping a
served app (``tests/integration/test_monitoring.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["PANELS", "Panel", "dashboard", "push", "queries"]

UID = "raysrv"
RATE = "$__rate_interval"  # Grafana's: at least four scrape intervals


@dataclass(frozen=True)
class Panel:
    """One time series panel: its title, the unit of its values (Grafana's unit ids) and its
    queries, each (PromQL, legend)."""

    title: str
    unit: str
    targets: tuple[tuple[str, str], ...]
    description: str = ""


def _rate(series: str, by: str) -> str:
    return f"sum by ({by}) (rate({series}[{RATE}]))"


def _quantile(q: float, histogram: str, by: str) -> str:
    return f"histogram_quantile({q}, sum by ({by}, le) (rate({histogram}_bucket[{RATE}])))"


PANELS: tuple[Panel, ...] = (
    Panel(
        "Requests by app and status",
        "reqps",
        ((_rate("ray_raysrv_requests_total", "app, status"), "{{app}} {{status}}"),),
        "Answers per second; a request of many inputs counts once.",
    ),
    Panel(
        "Request latency by app",
        "ms",
        (
            (_quantile(0.5, "ray_raysrv_request_latency_ms", "app"), "{{app}} p50"),
            (_quantile(0.99, "ray_raysrv_request_latency_ms", "app"), "{{app}} p99"),
        ),
        "Inside raysrv, from a request's arrival at the ingress to its answer.",
    ),
    Panel(
        "Refusals by where and why",
        "reqps",
        ((_rate("ray_raysrv_rejections_total", "where, reason"), "{{where}} {{reason}}"),),
        "Queries refused before work was spent on them (429, 503) or dropped at their "
        "deadline (504).",
    ),
    Panel(
        "Cache hit ratio by app",
        "percentunit",
        (
            (
                f"{_rate('ray_raysrv_cache_hits_total', 'app')} / ("
                f"{_rate('ray_raysrv_cache_hits_total', 'app')} + "
                f"{_rate('ray_raysrv_cache_misses_total', 'app')})",
                "{{app}}",
            ),
        ),
    ),
    Panel(
        "Models selected by app",
        "reqps",
        ((_rate("ray_raysrv_selections_total", "app, model"), "{{app}} {{model}}"),),
        "Which model each query's selection policy chose.",
    ),
    Panel(
        "Feedback and ensemble predictions left out",
        "reqps",
        (
            (_rate("ray_raysrv_feedback_total", "app"), "{{app}} feedback"),
            (_rate("ray_raysrv_missing_predictions_total", "app, model"), "{{app}} {{model}}"),
        ),
        "Feedback taught to the selection policies; ensemble answers given without a "
        "model's prediction (late at the deadline, refused or failed).",
    ),
    Panel(
        "Queue length by model",
        "short",
        (("max by (model) (ray_raysrv_queue_length)", "{{model}}"),),
    ),
    Panel(
        "Mean batch size by model",
        "short",
        (
            (
                f"{_rate('ray_raysrv_batch_size_sum', 'model')} / "
                f"{_rate('ray_raysrv_batch_size_count', 'model')}",
                "{{model}}",
            ),
        ),
    ),
    Panel(
        "Batch latency and worker run time by model (p99)",
        "ms",
        (
            (_quantile(0.99, "ray_raysrv_batch_latency_ms", "model"), "{{model}} batch"),
            (_quantile(0.99, "ray_raysrv_execution_ms", "model"), "{{model}} run"),
        ),
        "A batch from its dispatch to its answer in the ingress, against its run on the "
        "worker: the difference is the hops and the waits.",
    ),
    Panel(
        "Predicted p99 latency by model",
        "ms",
        (("max by (model) (ray_raysrv_plan_predicted_p99_ms)", "{{model}}"),),
        "What the latency model predicts for the model's batching now (GET "
        "/v1/models/{model}/plan), exported every ingress.plan_export_s.",
    ),
    Panel(
        "LOADs and UNLOADs by pool",
        "ops",
        (
            (_rate("ray_raysrv_loads_total", "pool, status"), "{{pool}} load {{status}}"),
            (_rate("ray_raysrv_unloads_total", "pool, evicted"), "{{pool}} unload {{evicted}}"),
        ),
    ),
    Panel(
        "LOAD time and cold-start latency by pool (p99)",
        "ms",
        (
            (_quantile(0.99, "ray_raysrv_load_ms", "pool"), "{{pool}} load"),
            (_quantile(0.99, "ray_raysrv_cold_start_latency_ms", "pool"), "{{pool}} cold start"),
        ),
        "Cold start: the latency of queries whose model was loaded nowhere as they arrived.",
    ),
    Panel(
        "Weights held by pool worker",
        "bytes",
        (("max by (pool, worker) (ray_raysrv_worker_weights_bytes)", "{{pool}} {{worker}}"),),
    ),
    Panel(
        "State store fallbacks",
        "ops",
        ((_rate("ray_raysrv_state_store_fallbacks_total", "operation"), "{{operation}}"),),
        "Store operations answered from memory while Redis was unreachable.",
    ),
)


def queries(panels: tuple[Panel, ...] = PANELS, rate_interval: str = RATE) -> list[str]:
    """Every panel's PromQL, with ``$__rate_interval`` as ``rate_interval`` (for a
    Prometheus asked directly, as Grafana would ask it)."""
    return [expr.replace(RATE, rate_interval) for p in panels for expr, _ in p.targets]


def dashboard() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model: two panels a row, a data source picked on it."""
    source = {"type": "prometheus", "uid": "${datasource}"}
    panels = []
    for i, panel in enumerate(PANELS):
        panels.append(
            {
                "id": i + 1,
                "type": "timeseries",
                "title": panel.title,
                "description": panel.description,
                "datasource": source,
                "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
                "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
                "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
                "targets": [
                    {"refId": chr(ord("A") + j), "datasource": source, "expr": e, "legendFormat": f}
                    for j, (e, f) in enumerate(panel.targets)
                ],
            }
        )
    return {
        "uid": UID,
        "title": "raysrv",
        "tags": ["raysrv", "ray"],
        "timezone": "browser",
        "schemaVersion": 39,
        "refresh": "10s",
        "time": {"from": "now-30m", "to": "now"},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                }
            ]
        },
        "panels": panels,
    }


def push(url: str, token: str, folder_uid: str | None = None) -> dict[str, Any]:
    """Create or replace the dashboard on the Grafana at ``url``, with a service account
    ``token``; Grafana's answer (its ``url`` says where the dashboard is)."""
    from grafana_client import GrafanaApi, TokenAuth

    api = GrafanaApi.from_url(url, credential=TokenAuth(token))
    body: dict[str, Any] = {"dashboard": dashboard(), "overwrite": True, "message": "raysrv"}
    if folder_uid is not None:
        body["folderUid"] = folder_uid
    return api.dashboard.update_dashboard(body)
