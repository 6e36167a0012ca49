"""Hostile traffic against a live ingress on Ray Serve: its memory stays within the store's
budget and the metric series stay as many as the apps.

The ingress's own resident memory is read from ``GET /v1/pools``: its pool is colocated, so
the process a worker reports is the ingress's.
"""

from __future__ import annotations

import time
import urllib.request
from typing import Any

import httpx
from ray import serve

from raysrv.app import build_app
from raysrv.testing import model_spec, spec
from tests.integration.conftest import RayCluster

APP = "hostile"
BUDGET_MB = 8.0  # each of predictions, feedbacks and selection states
LABEL_PAD = 60_000  # bytes a label carries beside the answer it gives
FEEDBACKS = 1_000  # 60 MB of labels: seven times the budget
UNKNOWN = 300  # names nobody serves


def _rss(base: str) -> int:
    (pool,) = httpx.get(f"{base}/v1/pools", timeout=60).json()["pools"]
    return pool["workers"][0]["process"]["rss_bytes"]


def _requests_series(port: int) -> set[str]:
    """The app tags of the requests counter the metrics endpoint shows."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    lines = [line for line in body.splitlines() if line.startswith("ray_raysrv_requests_total{")]
    return {line.split('app="', 1)[1].split('"', 1)[0] for line in lines if 'app="' in line}


def test_hostile_traffic_grows_the_ingress_by_less_than_its_store_budget(
    serve_session: RayCluster,
) -> None:
    learn = {
        "name": "learn",
        "models": ["echo"],
        "selection": {"policy": "exp4", "params": {"field": "sum"}},
        "cache_size": 0,
    }
    args: dict[str, Any] = spec(
        [model_spec("echo", placement="colocated")],
        [learn],
        ingress={"num_cpus": 0.1, "store_budget_mb": BUDGET_MB, "max_label_bytes": 65_536},
    )
    serve.run(build_app(args), name=APP, route_prefix=f"/{APP}")
    base = f"{serve_session.http}/{APP}"
    label = {"sum": 10.0, "pad": "x" * LABEL_PAD}
    statuses: dict[int, int] = {}

    def feedbacks(n: int, client: httpx.Client) -> None:
        for i in range(n):
            body = {"input": [float(i), 0.0, 0.0, 1.0], "context": f"caller-{i}"}
            answer = client.post(f"{base}/v1/learn/predict", json=body).json()
            sent = {"query_id": answer["query_id"], "label": label}
            status = client.post(f"{base}/v1/learn/feedback", json=sent).status_code
            statuses[status] = statuses.get(status, 0) + 1

    with httpx.Client(timeout=60) as client:
        feedbacks(100, client)  # the process at its steady state before the measure,
        client.get(f"{base}/v1/models/echo/plan")  # the plan's modules imported, as exports do
        before = _rss(base)
        feedbacks(FEEDBACKS, client)
        for i in range(UNKNOWN):
            missing = client.post(f"{base}/v1/nobody-{i}/predict", json={"input": [0.0] * 4})
            statuses[missing.status_code] = statuses.get(missing.status_code, 0) + 1
        too_long = {"input": [0.0] * 4, "context": "c" * 100_000}
        refused = client.post(f"{base}/v1/learn/predict", json=too_long).status_code
    grown = _rss(base) - before
    assert statuses == {200: 100 + FEEDBACKS, 404: UNKNOWN}
    assert refused == 413
    assert grown < 3 * BUDGET_MB * (1 << 20), f"grew {grown / (1 << 20):.1f} MiB"

    deadline, seen = time.monotonic() + 60, set()
    while time.monotonic() < deadline and "unknown" not in seen:
        seen = _requests_series(serve_session.metrics_port)
        time.sleep(1)
    assert "unknown" in seen
    assert not any(tag.startswith("nobody-") for tag in seen)
