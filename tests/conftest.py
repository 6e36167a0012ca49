"""Test tiers by folder: each test gets the marker of the folder it lives in."""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

TIERS = ("unit", "integration", "e2e")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).parts
        for tier in TIERS:
            if tier in parts:
                item.add_marker(getattr(pytest.mark, tier))


PORTS = range(20000, 32768)  # above Ray's worker ports, below the kernel's ephemeral ones
_given: set[int] = set()


def free_port() -> int:
    """A TCP port in ``PORTS`` that nothing holds right now on any of this machine's addresses
    (HAProxy binds its listeners on all of them, and a Ray process left by an earlier test may
    still hold a port on the node's own address only), and that this session has not handed
    out before. Not one of the kernel's ephemeral ports: the kernel gives those to outgoing
    connections, Ray's own among them, and one may take the port between this check and the
    server's bind (an HAProxy failed to start so once)."""
    while True:
        port = random.choice(PORTS)
        if port in _given:
            continue
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
        _given.add(port)
        return port


def haproxy_ports() -> dict[str, str]:
    """Serve's environment for an HAProxy whose metrics and stats listen on free ports rather
    than on 9101 and 8404, which an HAProxy left by another Ray session may still hold: one
    whose Ray was stopped at once, as ``kill -9`` stops it, outlives it."""
    return {
        "RAY_SERVE_HAPROXY_METRICS_PORT": str(free_port()),
        "RAY_SERVE_HAPROXY_STATS_PORT": str(free_port()),
    }


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real redis-server on a free port for this test session (CI installs the binary)."""
    binary = shutil.which("redis-server")
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is not installed; .ci/run installs it")
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    port = free_port()
    workdir = tmp_path_factory.mktemp("redis")
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen([*args, "--dir", str(workdir)], stdout=subprocess.DEVNULL)
    try:
        _wait_for_port(port, proc)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _wait_for_port(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on port {port} after {timeout_s} s")
