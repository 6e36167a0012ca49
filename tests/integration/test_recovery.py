"""Worker actors outlive an ingress replica that dies: a new replica takes them over with their
models loaded, and a group that no replica takes over ends itself after ``orphan_timeout_s``.
A worker looks its owner up once as it is claimed, so that what the first look-up costs is not
paid by the batches it serves.
While no replica is up, a request that carries Serve's ``x-request-timeout-seconds`` gets a
408 when it runs out; without it, it waits for a replica.

An ingress replica is killed with ``ray.kill``, which ends its process as a crash would:
Serve never calls its ``__del__``.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import httpx
import ray
from ray import serve

from raysrv._workers import ORPHAN_CHECK_S, WORKERS_NAMESPACE, _RayWorker, alive
from raysrv.app import build_app
from raysrv.testing import model_spec, spec
from tests.integration.conftest import RayCluster, until

APP = "orphans"


def _spec(**ingress: Any) -> dict[str, Any]:
    apps = [{"name": "echo", "models": ["echo"], "cache_size": 0}]
    return spec([model_spec("echo")], apps, ingress={"num_cpus": 0.1, **ingress})


def _workers() -> dict[str, int]:
    """The app's live worker actors, by name, and their processes."""
    names = [
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["namespace"] == WORKERS_NAMESPACE and a["name"].startswith(f"raysrv:{APP}:")
    ]
    found = {}
    for name in names:
        try:  # one may end between the listing and its answer
            actor = ray.get_actor(name, namespace=WORKERS_NAMESPACE)
            found[name] = ray.get(actor.ready.remote(), timeout=60)["pid"]
        except (ValueError, ray.exceptions.RayActorError):
            continue
    return found


def _replicas() -> set[str]:
    return {
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith(f"SERVE_REPLICA::{APP}#ingress#")
    }


def _kill(replica: str) -> None:
    ray.kill(ray.get_actor(replica, namespace="serve"), no_restart=True)


def _answers(handle: Any) -> bool:
    answer = handle.predict.remote("echo", [1.0, 2.0, 3.0, 4.0]).result(timeout_s=60)
    return answer.get("output", {}).get("sum") == 10.0


def test_a_new_ingress_replica_takes_over_the_workers_of_one_that_died(
    serve_session: RayCluster,
) -> None:
    handle = serve.run(
        build_app(_spec(replicas=2, orphan_timeout_s=600)), name=APP, route_prefix=f"/{APP}"
    )
    before = _workers()
    groups = {name.split(":")[-2] for name in before}
    assert groups == {"0", "1"}, before  # a live replica's group is never taken
    replicas = _replicas()
    dead = sorted(replicas)[0]
    _kill(dead)
    until(lambda: len(_replicas() - {dead}) == 2, 60, "a replica in place of the one killed")
    until(lambda: serve.status().applications[APP].status == "RUNNING", 60, "the app running")
    assert _workers() == before  # the same actors, never restarted: taken over, not remade
    assert all(_answers(handle) for _ in range(20))

    serve.delete(APP)  # replicas stopped in order end their workers at once
    until(lambda: not _workers(), 20, "the workers ended with their replicas")


def test_workers_that_no_replica_takes_over_end_after_the_orphan_timeout(
    serve_session: RayCluster,
) -> None:
    # Serve checks the replica only once a minute: it will not start another in its place.
    args = _spec(orphan_timeout_s=3.0, health_check_period_s=60.0)
    handle = serve.run(build_app(args), name=APP, route_prefix=f"/{APP}")
    assert _answers(handle)
    workers = _workers()
    assert len(workers) == 1
    (replica,) = _replicas()
    _kill(replica)
    until(lambda: replica not in _replicas(), 20, "the replica gone")
    assert _workers() == workers  # they outlive their owner
    serve.delete(APP)
    until(lambda: not _workers(), 30, "the orphaned workers ended")


def test_a_worker_knows_its_owner_alive_without_importing_serve(
    serve_session: RayCluster,
) -> None:
    """A process's first handle to an actor imports the module of its class: for an ingress
    replica, Serve's, about 0.35 s of the worker's interpreter (a stall of every new worker's
    batches a second into its service, when its owner watcher first looked; bench/RESULTS.md,
    "Elastic capacity"). A worker claimed by a live replica and watching it never imports it,
    and it tells a replica that is not there from one that is."""
    serve.run(build_app(_spec()), name=APP, route_prefix=f"/{APP}")
    (replica,) = _replicas()
    worker = ray.remote(_RayWorker).options(num_cpus=0).remote(None, [], (0, 0), 600.0)
    try:
        imported = "ray.serve._private.replica"
        assert ray.get(worker.claim.remote((replica, "serve")))
        time.sleep(2.5 * ORPHAN_CHECK_S)  # the watcher has looked at least twice
        assert not ray.get(worker.__ray_call__.remote(lambda _: imported in sys.modules))
        assert ray.get(worker.__ray_call__.remote(lambda _: alive((replica, "serve"))))
        assert not ray.get(worker.__ray_call__.remote(lambda _: alive(("gone", "serve"))))
    finally:
        ray.kill(worker, no_restart=True)
        serve.delete(APP)


def test_while_no_ingress_replica_is_up_serves_timeout_header_bounds_the_wait(
    serve_session: RayCluster,
) -> None:
    # Serve checks the replica only once a minute: none takes the killed one's place meanwhile.
    args = _spec(health_check_period_s=60.0)
    handle = serve.run(build_app(args), name=APP, route_prefix=f"/{APP}")
    assert _answers(handle)
    url = f"{serve_session.http}/{APP}/v1/echo/predict"
    body = {"input": [1.0, 2.0, 3.0, 4.0]}
    (replica,) = _replicas()
    _kill(replica)
    until(lambda: replica not in _replicas(), 20, "the replica gone")
    timeout = {"x-request-timeout-seconds": "1"}
    with httpx.Client(timeout=60.0) as client:
        answer = client.post(url, json=body, headers=timeout)
    assert answer.status_code == 408, answer.text  # Serve gave up, not the client's 60 s
    serve.delete(APP)
