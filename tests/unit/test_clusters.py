"""The cluster definitions in ``clusters/``: the Ray cluster launcher file passes the launcher's
own published schema (the one the installed Ray ships, `ray/autoscaler/ray-schema.json`), and
every node it starts carries Serve's fast path and the custom resources the two-node test uses
(``tests/e2e/test_two_nodes.py``)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import jsonschema
import pytest
import ray
import yaml

from raysrv.cli import FAST_PATH

ROOT = Path(__file__).parents[2]
LAUNCHER = ROOT / "clusters" / "launcher" / "local.yaml"


def _environment(command: str) -> dict[str, str]:
    words = shlex.split(command)
    return dict(w.split("=", 1) for w in words[: words.index("ray")])


def test_the_launcher_file_passes_rays_own_schema_with_the_fast_path_on_every_node() -> None:
    schema = json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())
    config = yaml.safe_load(LAUNCHER.read_text())
    jsonschema.validate(config, schema)
    (head,) = [c for c in config["head_start_ray_commands"] if "ray start" in c]
    (worker,) = [c for c in config["worker_start_ray_commands"] if "ray start" in c]
    for start in (head, worker):
        assert FAST_PATH.items() <= _environment(start).items()
    assert _environment(worker)["RAY_AUTH_MODE"] == "token"
    assert "--head" in head
    assert """--resources='{"node-b": 1}'""" in worker
    broken = {**config, "provider": {"head_ip": "10.0.0.1"}}  # no type: the schema refuses
    with pytest.raises(jsonschema.ValidationError, match="'type' is a required property"):
        jsonschema.validate(broken, schema)


SERVICE = ROOT / "clusters" / "kuberay" / "rayservice.yaml"
EXAMPLE = ROOT / "examples" / "digits" / "config.yaml"


def test_the_ray_service_embeds_the_example_and_runs_the_fast_path_in_every_container(
    tmp_path: Path,
) -> None:
    """Its ``serveConfigV2`` is the digits example but for the root the image keeps it in, the
    config `raysrv validate` checks inside the manifest; every Ray container has Serve's fast
    path, and the cluster's Ray is the installed one."""
    from raysrv.validate import validate_file

    manifest = yaml.safe_load(SERVICE.read_text())
    assert (manifest["apiVersion"], manifest["kind"]) == ("ray.io/v1", "RayService")
    embedded = yaml.safe_load(manifest["spec"]["serveConfigV2"])
    (app,) = embedded["applications"]
    assert app["args"].pop("root") == "/home/ray/raysrv/examples/digits"
    assert embedded["applications"] == yaml.safe_load(EXAMPLE.read_text())["applications"]
    assert validate_file(SERVICE, sources=False) == []
    cluster = manifest["spec"]["rayClusterConfig"]
    assert cluster["rayVersion"] == ray.__version__
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    for group in groups:
        (container,) = group["template"]["spec"]["containers"]
        env = {e["name"]: e["value"] for e in container["env"]}
        assert FAST_PATH.items() <= env.items(), container["name"]
    wrong = manifest["spec"]["serveConfigV2"].replace("slo_ms: 50", "slo_ms: soon", 1)
    broken = tmp_path / "rayservice.yaml"
    broken.write_text(
        yaml.safe_dump({**manifest, "spec": {**manifest["spec"], "serveConfigV2": wrong}})
    )
    (problem,) = validate_file(broken, sources=False)
    assert problem.path == "spec.serveConfigV2.applications[0].args.models[0].slo_ms"
    assert problem.value == "soon"
