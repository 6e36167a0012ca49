"""A long-lived server, run with the README's commands ("A long-lived server", "Calling from
Python", "Monitoring"): `ray start --head` with the fast path's variables, `raysrv deploy` of
the digits example, answers over HTTP and to the README's Python caller in another process,
raysrv's metrics on the node's metrics port, a live knob applied by deploying the file again
(the ingress replica not restarted), and `raysrv run` refusing the port that the server holds.
Each command is the README's, with this test's ports, address and copy of the file; the head
is stopped as Ctrl-C stops `ray start --block`, not by `ray stop`, which would stop every Ray
of the machine, this test session's own included."""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from raysrv.cli import FAST_PATH
from tests.conftest import free_port
from tests.e2e.serving import ROOT, answers, environment, finished, ray_node
from tests.readme import blocks

CONFIG = ROOT / "examples" / "digits" / "config.yaml"
START_S = 120  # Ray's head node, then the app's deploy
METRICS_S = 60  # Ray exports metrics every few seconds
BIN = Path(sys.executable).parent
(SERVER,) = blocks("### A long-lived server", "bash")
(CALLER,) = blocks("### Calling from Python", "python")
(METRICS,) = [b for b in blocks("### Monitoring", "bash") if b.startswith("curl ")]


def _line(block: str, starts: str) -> list[str]:
    """The words of the block's line that starts with ``starts``, without its comment."""
    (line,) = [line for line in block.splitlines() if line.startswith(starts)]
    return shlex.split(line, comments=True)


def test_the_readme_runs_the_server_with_the_fast_paths_variables() -> None:
    words = _line(SERVER, "export ")
    assert dict(word.split("=", 1) for word in words[1:]) == FAST_PATH


@pytest.fixture
def head(tmp_path: Path) -> Iterator[tuple[str, str, int]]:
    """A Ray head node of its own, started by the README's `ray start` line (`--block` added,
    its ports free ones), with the fast path's variables: its address, its dashboard's and its
    metrics port."""
    gcs, dashboard, metrics = free_port(), free_port(), free_port()
    argv = _line(SERVER, "ray start ")
    argv = [word.replace("8080", str(metrics)) for word in argv]
    argv = [str(BIN / argv[0]), *argv[1:], "--block", f"--port={gcs}"]
    argv += [f"--dashboard-port={dashboard}", "--disable-usage-stats"]
    url = f"http://127.0.0.1:{dashboard}"
    with ray_node(argv, tmp_path / "ray.log", lambda: answers(f"{url}/api/version"), gcs):
        yield f"127.0.0.1:{gcs}", url, metrics


def _deploy(path: Path, dashboard: str) -> None:
    """The README's `raysrv deploy` line, on ``path``, to the dashboard at ``dashboard``."""
    argv = _line(SERVER, "raysrv deploy ")
    argv = [str(BIN / argv[0]), *argv[1:-1], str(path), "--address", dashboard]
    code, out = finished(argv, 120)
    assert code == 0, out[-4000:]


def _mlp_policy(url: str) -> str | None:
    try:
        return httpx.get(f"{url}/v1/models/mlp/plan", timeout=5).json()["policy"]
    except (httpx.HTTPError, KeyError, ValueError):
        return None


def _ingress_pids() -> set[int]:
    found = subprocess.run(["pgrep", "-f", "ServeReplica:digits:ingress"], capture_output=True)
    return {int(pid) for pid in found.stdout.split()}


def test_a_long_lived_server_deployed_called_and_changed_live(
    head: tuple[str, str, int], tmp_path: Path
) -> None:
    address, dashboard, metrics = head
    config = yaml.safe_load(CONFIG.read_text())
    port = free_port()
    config["http_options"]["port"] = port
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    (tmp_path / "models").symlink_to(CONFIG.parent / "models", target_is_directory=True)
    url = f"http://127.0.0.1:{port}"
    _deploy(path, dashboard)
    deadline = time.monotonic() + START_S
    while _mlp_policy(url) != "aimd" and time.monotonic() < deadline:
        time.sleep(1)
    assert _mlp_policy(url) == "aimd"  # as the args declare it
    body = {"input": [0.0] * 64}
    assert httpx.post(f"{url}/v1/digits/predict", json=body, timeout=30).status_code == 200

    assert CALLER.startswith("# RAY_AUTH_MODE=token python caller.py\n")
    caller = tmp_path / "caller.py"
    caller.write_text(CALLER.replace("10.0.0.1:6379", address))
    env = {k: v for k, v in environment().items() if k not in FAST_PATH}
    done = subprocess.run(
        [sys.executable, str(caller)], cwd=tmp_path, env=env | {"RAY_AUTH_MODE": "token"},
        capture_output=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()[-4000:]
    models, label = done.stdout.decode().strip().splitlines()[-1].rsplit(" ", 1)
    assert int(label) in range(10)
    assert any(name in models for name in ("logreg", "mlp", "cnn"))  # split picks one

    scrape = METRICS.replace("localhost:8080", f"localhost:{metrics}")
    deadline = time.monotonic() + METRICS_S
    while time.monotonic() < deadline:
        shown = subprocess.run(["bash", "-o", "pipefail", "-c", scrape], capture_output=True)
        if shown.returncode == 0:
            break
        time.sleep(2)
    assert shown.returncode == 0, "no ray_raysrv_requests_total on the metrics port"
    assert 'app="digits"' in shown.stdout.decode()

    before = _ingress_pids()
    assert len(before) == 1
    knobs = config["applications"][0]["deployments"][0]["user_config"]
    knobs["models"]["mlp"] = {"batching": {"policy": "fixed", "params": {"max_batch_size": 8}}}
    path.write_text(yaml.safe_dump(config))
    _deploy(path, dashboard)
    deadline = time.monotonic() + 60
    while _mlp_policy(url) != "fixed" and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _mlp_policy(url) == "fixed"
    assert _ingress_pids() == before  # applied live: the same replica

    code, out = finished([str(BIN / "raysrv"), "run", str(path)], 60)
    assert code == 1
    assert f"something already answers on 127.0.0.1:{port}" in out
    assert _mlp_policy(url) == "fixed"  # and the server it refused to share with answers
