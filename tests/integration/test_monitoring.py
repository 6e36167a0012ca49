"""Monitoring with real servers: a real Prometheus, run on the shipped configuration
(``clusters/monitoring/prometheus.yml``, its intervals shortened), finds this session's Ray
through Ray's service-discovery file and scrapes it while raysrv serves a load that exercises
every metric; then every query of the Grafana dashboard (``raysrv dashboard``) finds data.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from ray import serve

from raysrv.app import build_app
from raysrv.dashboard import queries
from raysrv.testing import model_spec, spec
from tests.conftest import free_port
from tests.integration.conftest import RayCluster, until

ROOT = Path(__file__).parents[2]
SHIPPED = ROOT / "clusters" / "monitoring" / "prometheus.yml"
FOUND_S = 150  # Ray reports metrics every few seconds, Prometheus scrapes every second
ECHO = "raysrv.testing:EchoModel"


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[str]:
    """A real Prometheus on the shipped configuration, scraping every second: its URL."""
    binary = shutil.which("prometheus")
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("prometheus is not installed; .ci/run installs it")
        pytest.skip("prometheus is not installed (apt-get install prometheus)")
    config = yaml.safe_load(SHIPPED.read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    (job,) = config["scrape_configs"]
    job["file_sd_configs"][0]["refresh_interval"] = "1s"
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    argv = [
        binary, f"--config.file={path}", f"--storage.tsdb.path={tmp_path / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]  # fmt: skip
    with (tmp_path / "prometheus.log").open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            until(lambda: _ready(url), 30, "Prometheus ready")
            yield url
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/-/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _served(cluster: RayCluster) -> None:
    """Two raysrv applications under a load that gives every metric a series: answers, cache
    hits, a feedback, an ensemble that answers without its slow model, a refusal, LOADs and
    evictions on a shared pool, and a state store whose Redis is not there."""
    models = [
        model_spec("fast", placement="colocated"),
        model_spec("slow", init_kwargs={"delay_s": 0.5}),
        model_spec("strict", batching={"policy": "deadline", "params": {"max_batch_size": 8}}),
        *(model_spec(z, pool="shared", weights_mb=1.0) for z in ("z1", "z2")),
    ]
    apps = [
        {"name": "plain", "models": ["fast"], "cache_size": 64},
        {
            "name": "ensemble",
            "models": ["fast", "slow"],
            "selection": {"policy": "exp4", "params": {"field": "sum", "loss": "squared"}},
            "slo_ms": 200,
            "cache_size": 0,
        },
        {"name": "strict", "models": ["strict"]},
        {"name": "zoo", "models": ["z1", "z2"], "selection": {"policy": "split"}},
    ]
    pools = [{"name": "shared", "workers": 1, "memory_mb": 1.5}]
    ingress = {"num_cpus": 0.1, "plan_export_s": 1.0}
    served = spec(models, apps, pools=pools, ingress=ingress)
    serve.run(build_app(served), name="watched", route_prefix="/watched")
    no_redis = f"redis://127.0.0.1:{free_port()}/0"
    fallback = spec(
        [model_spec("lone", placement="colocated")], [{"name": "lone", "models": ["lone"]}]
    )
    serve.run(build_app({**fallback, "state": no_redis}), name="alone", route_prefix="/alone")

    base = f"{cluster.http}/watched/v1"
    with httpx.Client(timeout=60) as client:

        def ask(app: str, x: float, **extra: Any) -> httpx.Response:
            return client.post(f"{base}/{app}/predict", json={"input": [x, 0, 0, 0], **extra})

        answers = [ask("plain", i % 60).json() for i in range(80)]  # 20 cache hits
        assert sum(a["cache_hit"] for a in answers) == 20
        label = {"query_id": answers[0]["query_id"], "label": answers[0]["output"]}
        assert client.post(f"{base}/plain/feedback", json=label).status_code == 200
        assert all("slow" in ask("ensemble", i).json()["missing"] for i in range(3))
        assert ask("strict", 0, slo_ms=0.001).status_code == 429
        for i in range(6):  # one model's LOAD evicts the other's weights
            model = f"{base}/models/z{1 + i % 2}/predict"
            assert client.post(model, json={"input": [i, 0, 0, 0]}).status_code == 200
        alone = f"{cluster.http}/alone/v1/lone/predict"
        assert client.post(alone, json={"input": [1, 2, 3, 4]}).status_code == 200


def _missing(url: str, exprs: list[str]) -> list[str]:
    """The queries that Prometheus answers with no series."""
    empty = []
    for expr in exprs:
        found = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10).json()
        assert found["status"] == "success", found
        if not found["data"]["result"]:
            empty.append(expr)
    return empty


def test_every_dashboard_query_finds_data_in_a_real_prometheus(
    serve_session: RayCluster, prometheus: str
) -> None:
    _served(serve_session)
    left = queries(rate_interval="1m")
    give_up = time.monotonic() + FOUND_S
    while left and time.monotonic() < give_up:
        time.sleep(2)
        left = _missing(prometheus, left)
    assert left == [], f"queries without data after {FOUND_S} s: {left}"
    targets = httpx.get(f"{prometheus}/api/v1/targets", timeout=10).json()["data"]
    scraped = {t["scrapeUrl"] for t in targets["activeTargets"] if t["health"] == "up"}
    assert any(f":{serve_session.metrics_port}/" in u for u in scraped), scraped
