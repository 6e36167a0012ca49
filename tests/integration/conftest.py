"""One Ray + Serve session for the whole integration tier; applications deleted after each test."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.conftest import free_port

SEPARATE_LOOP = "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP"


@dataclass(frozen=True)
class RayCluster:
    http_port: int
    metrics_port: int

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[RayCluster]:
    import ray
    from ray import serve

    metrics_port = free_port()
    # On Serve's fast path a handle's router runs on its caller's event loop, and these tests
    # call handles from plain functions: the fast path's run of this tier gives this process's
    # handles a loop of their own (Serve read the variable on import) and keeps the variable
    # out of the cluster it starts, whose replicas keep the fast path's routers.
    os.environ.pop(SEPARATE_LOOP, None)
    ray.init(
        num_cpus=4,
        include_dashboard=True,  # it keeps the metrics' service-discovery file
        dashboard_port=free_port(),
        namespace="serve",
        _metrics_export_port=metrics_port,
        logging_level="warning",
        log_to_driver=False,
    )
    cluster = RayCluster(http_port=_serve_started(), metrics_port=metrics_port)
    try:
        yield cluster
    finally:
        serve.shutdown()
        ray.shutdown()


def _serve_started(tries: int = 3) -> int:
    """Serve started on a free port; its port. A port free when picked can be taken by one of
    the processes Ray starts before Serve's proxy binds it: then again on another."""
    from ray import serve

    for attempt in range(tries):
        port = free_port()
        try:
            serve.start(http_options={"host": "127.0.0.1", "port": port})
            return port
        except Exception as exc:  # Ray wraps the proxy's failure to bind in its own types
            if "bind" not in str(exc) or attempt == tries - 1:
                raise
            serve.shutdown()
    raise AssertionError("unreachable")


@pytest.fixture
def serve_session(ray_cluster: RayCluster) -> Iterator[RayCluster]:
    """The shared cluster, with every application deleted after the test."""
    from ray import serve

    yield ray_cluster
    for name in list(serve.status().applications):
        serve.delete(name)


def until(check: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """``check()``'s first truthy answer, asked every 0.2 s; AssertionError naming ``what``
    if none comes within ``timeout_s``."""
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        if found := check():
            return found
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout_s} s: {what}")
