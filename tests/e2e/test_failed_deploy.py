"""`raysrv run` of a config whose model cannot load: it ends by itself, exit status 1, after
one line that names the app, the model and the cause (plain `serve run` keeps running with the
deploy failed, and Ray used to restart the model's worker on the same failure without end)."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from tests.conftest import free_port
from tests.e2e.serving import finished

ROOT = Path(__file__).parents[2]
CONFIG = ROOT / "examples" / "text" / "config.yaml"
TIMEOUT_S = 300  # Ray's start, Serve's tries of the ingress and Ray's shutdown, with room


def test_raysrv_run_ends_a_deploy_whose_model_cannot_load_with_one_line(tmp_path: Path) -> None:
    config = yaml.safe_load(CONFIG.read_text())
    config["http_options"]["port"] = free_port()
    (model,) = config["applications"][0]["args"]["models"]
    model["source"] = "raysrv.testing:UnloadableModel"
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    raysrv = str(Path(sys.executable).with_name("raysrv"))
    code, out = finished([raysrv, "run", str(path)], TIMEOUT_S)
    said = [line for line in out.splitlines() if line.startswith("raysrv run: app")]
    cause = "OSError: weights.bin: truncated at byte 512"
    assert said == [
        "raysrv run: app 'text' failed: raysrv could not start app 'text': LoadFailed: model "
        f"'embed' cannot be loaded: {cause}"
    ], out[-4000:]
    assert code == 1
    assert out.count("weights.bin: truncated") == 1, out[-4000:]  # no traceback repeats it
