"""A Ray cluster of two nodes on one machine: a head (`ray start --head`) and a second node that
joins it, each offering a custom resource of its own. The config places one model's workers on
each node through those resources and spreads two ingress replicas over the nodes
(`ingress.max_replicas_per_node: 1`); each replica owns a worker of each model, and queries
through the HTTP ingress reach both replicas, each using the workers where the config put
them. Where each actor runs is read from Ray's own list of actors (`ray list actors`)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from raysrv.testing import model_spec, spec
from tests.conftest import free_port
from tests.e2e.serving import answers, environment, finished, ray_node

BIN = Path(sys.executable).parent
APPS = ("here", "there")
DEPLOY_S = 120  # for the deploy, and for queries to have reached both ingress replicas


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[str]:
    """Two nodes, offering `node-a` and `node-b`: the head's dashboard address."""
    gcs, dashboard = free_port(), free_port()
    start = [str(BIN / "ray"), "start", "--block", "--num-cpus=2", "--disable-usage-stats"]
    head = [*start, "--head", f"--port={gcs}", f"--dashboard-port={dashboard}"]
    url = f"http://127.0.0.1:{dashboard}"
    with ray_node(
        [*head, '--resources={"node-a": 1}'], tmp_path / "head.log", lambda: answers(url), gcs
    ):
        second = [*start, f"--address=127.0.0.1:{gcs}", '--resources={"node-b": 1}']
        with ray_node(second, tmp_path / "second.log", lambda: _nodes(url) == 2, gcs):
            yield url


def _ray(url: str, *args: str) -> list[dict]:
    done = subprocess.run(
        [str(BIN / "ray"), *args, "--address", url, "--format", "json"],
        env=environment() | {"RAY_AUTH_MODE": "token"},
        capture_output=True,
        timeout=60,
    )
    if done.returncode != 0 or not done.stdout.lstrip().startswith(b"["):
        return []  # not up yet, or nothing listed ("No resource in the cluster")
    return json.loads(done.stdout)


def _nodes(url: str) -> int:
    return sum(node["state"] == "ALIVE" for node in _ray(url, "list", "nodes"))


def test_workers_go_where_the_config_puts_them_and_each_nodes_ingress_answers(
    cluster: str, tmp_path: Path
) -> None:
    port = free_port()
    models = [
        model_spec(name, resources={"num_cpus": 0.1, "custom": {node: 0.1}})
        for name, node in (("here", "node-a"), ("there", "node-b"))
    ]
    apps = [{"name": m["name"], "models": [m["name"]], "cache_size": 0} for m in models]
    ingress = {"replicas": 2, "max_replicas_per_node": 1, "num_cpus": 0.1}
    config = {
        "proxy_location": "HeadOnly",
        "http_options": {"host": "127.0.0.1", "port": port},
        "applications": [
            {
                "name": "two",
                "route_prefix": "/",
                "import_path": "raysrv.app:build_app",
                "args": spec(models, apps, ingress=ingress),
            }
        ],
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    url = f"http://127.0.0.1:{port}"
    code, out = finished([str(BIN / "raysrv"), "deploy", str(path), "--address", cluster], 120)
    assert code == 0, out[-4000:]

    pids: dict[str, set[int]] = defaultdict(set)
    sent, deadline = 0, time.monotonic() + DEPLOY_S
    while any(len(pids[app]) < 2 for app in APPS) and time.monotonic() < deadline:
        # a connection a query, HAProxy picking a replica for each: three of one app in a
        # row, or a round robin over two replicas would send each app to one replica alone
        for app in (a for a in APPS for _ in range(3)):
            try:
                answer = httpx.post(f"{url}/v1/{app}/predict", json={"input": [sent, 0, 0, 0]})
            except httpx.HTTPError:
                continue  # the deploy is not up yet
            sent += 1
            if not pids[app] and answer.status_code != 200:
                continue  # nor is the app: Serve's own 404 or 503 until it is
            assert answer.status_code == 200, answer.text  # once up, every query answered
            pids[app].add(answer.json()["output"]["pid"])
        time.sleep(0.1)

    alive = [a for a in _ray(cluster, "list", "actors", "--limit", "1000") if a["state"] == "ALIVE"]
    nodes = {n["node_id"]: n["resources_total"] for n in _ray(cluster, "list", "nodes")}
    where = {a["pid"]: a["node_id"] for a in alive}
    ingresses = [a["node_id"] for a in alive if "#ingress#" in (a.get("name") or "")]
    assert len(ingresses) == 2
    assert len(set(ingresses)) == 2  # one ingress replica on each node
    for app, node in zip(APPS, ("node-a", "node-b"), strict=True):
        seen = {(a.get("name"), a["pid"], a["node_id"][:8]) for a in alive}
        assert len(pids[app]) == 2, (pids, seen)  # each replica's own worker: both answered
        for pid in pids[app]:
            assert node in nodes[where[pid]], (app, pid)
