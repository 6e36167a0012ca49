"""The cluster definitions in ``clusters/``: the Ray cluster launcher file passes the launcher's
own published schema (the one the installed Ray ships, `ray/autoscaler/ray-schema.json`) and the
stricter one of the local provider kept in ``clusters/schemas/``, the KubeRay RayService passes
the schema of KubeRay's fields kept there, and every
node either starts carries Serve's fast path and the custom resources the two-node test uses
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
SCHEMAS = ROOT / "clusters" / "schemas"


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

    local = json.loads((SCHEMAS / "launcher-local.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(local)
    jsonschema.validate(config, local, cls=jsonschema.Draft202012Validator)
    assert config["max_workers"] >= len(config["provider"]["worker_ips"])
    # no worker addresses: Ray's schema lets it through, `ray up` would have no machine to use
    headless = {**config, "provider": {"type": "local", "head_ip": "10.0.0.1"}}
    jsonschema.validate(headless, schema)
    with pytest.raises(jsonschema.ValidationError, match="'worker_ips' is a required property"):
        jsonschema.validate(headless, local, cls=jsonschema.Draft202012Validator)
    never_started = {**config, "worker_start_ray_commands": ["ray stop"]}
    with pytest.raises(jsonschema.ValidationError, match="does not contain"):
        jsonschema.validate(never_started, local, cls=jsonschema.Draft202012Validator)


SERVICE = ROOT / "clusters" / "kuberay" / "rayservice.yaml"
SERVICE_SCHEMA = SCHEMAS / "rayservice.schema.json"
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


def _refusal(manifest: dict, schema: dict) -> tuple[str, str]:
    """Where the schema refuses the manifest, and why."""
    validator = jsonschema.Draft202012Validator(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(manifest))
    assert error is not None, "the schema accepted it"
    return ".".join(map(str, error.absolute_path)), error.message


CONTAINER = "template.spec.containers.0"


@pytest.mark.parametrize(
    ("field", "value", "refused_at", "reason"),
    [
        (  # a bare number where Kubernetes takes only strings
            "headGroupSpec.rayStartParams.metrics-export-port",
            8080,
            "headGroupSpec.rayStartParams.metrics-export-port",
            "is not of type 'string'",
        ),
        (  # a misspelt field, which the API server's strict field validation refuses
            "workerGroupSpec",
            [],
            "",
            "'workerGroupSpec' was unexpected",
        ),
        (
            f"workerGroupSpecs.0.{CONTAINER}.ports.0.containerPort",
            "8080",
            f"workerGroupSpecs.0.{CONTAINER}.ports.0.containerPort",
            "is not of type 'integer'",
        ),
        (
            f"headGroupSpec.{CONTAINER}.resources.limits.memory",
            "4 GB",
            f"headGroupSpec.{CONTAINER}.resources.limits.memory",
            "does not match",
        ),
        ("authOptions.mode", "password", "authOptions.mode", "is not one of"),
    ],
)
def test_the_ray_service_passes_the_schema_of_kuberays_fields_and_a_mistake_does_not(
    field: str, value: object, refused_at: str, reason: str
) -> None:
    schema = json.loads(SERVICE_SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    manifest = yaml.safe_load(SERVICE.read_text())
    jsonschema.validate(manifest, schema, cls=jsonschema.Draft202012Validator)
    for group in manifest["spec"]["rayClusterConfig"]["workerGroupSpecs"]:
        # KubeRay's operator refuses a group whose bounds do not hold its replicas
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]

    *parents, last = [int(k) if k.isdigit() else k for k in field.split(".")]
    node = manifest["spec"]["rayClusterConfig"]
    for key in parents:
        node = node[key]
    node[last] = value
    where, why = _refusal(manifest, schema)
    assert where == ".".join(filter(None, ("spec.rayClusterConfig", refused_at)))
    assert reason in why
