"""A long-lived server, run as the README says: `ray start --head` with the fast path's
variables, `raysrv deploy` of the digits example, answers over HTTP and to a Python caller in
another process that names the cluster's address and presents Ray's token, a live knob
applied by deploying the file again (the ingress replica not restarted), and `raysrv run`
refusing the port that the server holds."""

from __future__ import annotations

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
from tests.e2e.serving import ROOT, environment, finished, stop

CONFIG = ROOT / "examples" / "digits" / "config.yaml"
START_S = 120  # Ray's head node, then the app's deploy
BIN = Path(sys.executable).parent

CALLER = """
import ray
from ray import serve

ray.init(address="{address}")
digits = serve.get_app_handle("digits")
answer = digits.predict.remote("digits", [0.0] * 64).result()
print(answer["models"], answer["output"]["label"])
"""


@pytest.fixture
def head(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A Ray head node of its own (`ray start --head --block`), with the fast path's
    variables: its address and its dashboard's."""
    gcs, dashboard = free_port(), free_port()
    argv = [
        str(BIN / "ray"), "start", "--head", "--block", f"--port={gcs}",
        f"--dashboard-port={dashboard}", "--disable-usage-stats",
    ]  # fmt: skip
    with (tmp_path / "ray.log").open("wb") as log:
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=environment() | FAST_PATH, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            _wait_until(lambda: _answers(f"http://127.0.0.1:{dashboard}/api/version"), proc)
            yield f"127.0.0.1:{gcs}", f"http://127.0.0.1:{dashboard}"
        finally:
            stop(proc)


def _wait_until(ready: object, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, "ray start ended"
        if ready():  # type: ignore[operator]
            return
        time.sleep(1)
    raise TimeoutError("ray start --head did not come up")


def _answers(url: str) -> bool:
    """Whether anything answers at ``url`` (the dashboard asks for Ray's token: a 401 is up)."""
    try:
        httpx.get(url, timeout=2)
    except httpx.HTTPError:
        return False
    return True


def _deploy(path: Path, dashboard: str) -> None:
    code, out = finished([str(BIN / "raysrv"), "deploy", str(path), "--address", dashboard], 120)
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
    head: tuple[str, str], tmp_path: Path
) -> None:
    address, dashboard = head
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

    caller = tmp_path / "caller.py"
    caller.write_text(CALLER.format(address=address))
    env = {k: v for k, v in environment().items() if k not in FAST_PATH} | {
        "RAY_AUTH_MODE": "token"
    }
    done = subprocess.run(
        [sys.executable, str(caller)], cwd=tmp_path, env=env, capture_output=True, timeout=120
    )
    assert done.returncode == 0, done.stderr.decode()[-4000:]
    models, label = done.stdout.decode().strip().splitlines()[-1].rsplit(" ", 1)
    assert int(label) in range(10)
    assert any(name in models for name in ("logreg", "mlp", "cnn"))  # split picks one

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
