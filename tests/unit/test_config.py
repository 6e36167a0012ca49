"""Config validation: good and bad files, every problem named by its field path and value."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from raysrv.cli import main
from raysrv.config import LiveConfig, RaysrvSpec
from raysrv.testing import model_spec, spec
from raysrv.validate import validate_document, validate_file

EXAMPLE = Path(__file__).parents[2] / "examples" / "digits" / "config.yaml"


def _example() -> dict[str, Any]:
    return yaml.safe_load(EXAMPLE.read_text())


def _args(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["applications"][0]["args"]


def _problems(doc: Any) -> list[str]:
    return [str(p) for p in validate_document(doc)]


def test_shipped_example_is_valid() -> None:
    assert validate_file(EXAMPLE) == []


def test_bare_spec_is_valid() -> None:
    doc = spec([model_spec("a"), model_spec("b")], [{"name": "x", "models": ["a", "b"]}])
    assert validate_document(doc) == []


@pytest.mark.parametrize(
    ("mutate", "path", "value"),
    [
        (lambda a: a["models"][0].update(replica=2), "applications[0].args.models[0].replica", "2"),
        (
            lambda a: a["models"][1]["resources"].update(num_cpu=1),
            "models[1].resources.num_cpu",
            "1",
        ),
        (
            lambda a: a["models"][0].update(replicas=0),
            "applications[0].args.models[0].replicas",
            "0",
        ),
        (lambda a: a["models"][0].update(runtime="tf"), "models[0].runtime", "'tf'"),
        (lambda a: a["models"][0].update(device="tpu"), "models[0].device", "'tpu'"),
        (lambda a: a["models"][0]["input"].update(dtype="float8"), "input.dtype", "'float8'"),
        (lambda a: a["models"][0]["input"].update(shape=[8, 0]), "input.shape", "[8, 0]"),
        (lambda a: a["models"][0].update(slo_ms=-5), "models[0].slo_ms", "-5"),
        (lambda a: a["apps"][0].update(cache_size=-1), "apps[0].cache_size", "-1"),
        (lambda a: a["apps"][0].update(model=["cnn"]), "apps[0].model", "['cnn']"),
        (lambda a: a.update(state="postgres://x"), "args.state", "'postgres://x'"),
    ],
)
def test_bad_field_is_named_with_its_value(mutate: Any, path: str, value: str) -> None:
    doc = _example()
    mutate(_args(doc))
    problems = _problems(doc)
    assert any(path in p and value in p for p in problems), problems


def test_batching_params_are_checked_against_the_policy() -> None:
    doc = _example()
    _args(doc)["models"][1]["batching"] = {"policy": "aimd", "params": {"backof": 0.5}}
    _args(doc)["models"][2]["batching"] = {"policy": "aimd", "params": {"backoff": 1.5}}
    problems = _problems(doc)
    assert any("models[1].batching" in p and "params.backof" in p for p in problems), problems
    assert any("models[2].batching" in p and "params.backoff" in p and "1.5" in p for p in problems)


def test_unknown_policy_lists_the_known_ones() -> None:
    doc = _example()
    _args(doc)["models"][0]["batching"] = {"policy": "aimdd"}
    (problem,) = _problems(doc)
    assert "unknown batching policy 'aimdd'" in problem
    assert "aimd, ctmc, deadline, delayed, fixed, quantile" in problem


def test_cross_field_errors_carry_the_values() -> None:
    bad = spec(
        [model_spec("a"), model_spec("b", input={"shape": [3]}), model_spec("a")],
        [{"name": "x", "models": ["a", "b", "zzz"]}],
    )
    with pytest.raises(ValidationError) as info:
        RaysrvSpec.model_validate(bad)
    assert "repeated: ['a']" in str(info.value)
    fixed = copy.deepcopy(bad)
    fixed["models"].pop()
    with pytest.raises(ValidationError, match=r"unknown models \['zzz'\]"):
        RaysrvSpec.model_validate(fixed)
    fixed["apps"][0]["models"] = ["a", "b"]
    with pytest.raises(ValidationError, match="different inputs"):
        RaysrvSpec.model_validate(fixed)


def test_selection_params_must_fit_the_app() -> None:
    doc = _example()
    _args(doc)["apps"][0]["selection"] = {"policy": "split", "params": {"weights": {"resnet": 1}}}
    problems = _problems(doc)
    assert any("apps[0]" in p and "'resnet'" in p for p in problems), problems


def test_gpu_device_needs_gpus() -> None:
    doc = _example()
    _args(doc)["models"][0]["device"] = "gpu"
    problems = _problems(doc)
    assert any("models[0]" in p and "num_gpus" in p for p in problems), problems


def test_serve_level_misspellings_that_serve_ignores_are_reported() -> None:
    doc = _example()
    doc["http_options"]["prot"] = 9000
    doc["applications"][0]["deployments"][0]["num_replica"] = 2
    doc["applications"][0]["deployments"].append({"name": "model-resnet"})
    problems = _problems(doc)
    assert any(p.startswith("http_options.prot: unknown key") for p in problems), problems
    assert any("deployments[0].num_replica: unknown key" in p for p in problems), problems
    assert any(
        "deployments[1].name: no such deployment" in p and "model-resnet" in p for p in problems
    )


def test_live_user_config_is_validated_against_the_spec() -> None:
    doc = _example()
    doc["applications"][0]["deployments"][0]["user_config"] = {
        "models": {"cnn": {"slo_ms": 0}, "vgg": {}},
    }
    problems = _problems(doc)
    assert any("user_config.models.cnn.slo_ms" in p for p in problems), problems
    live = LiveConfig.model_validate({"models": {"vgg": {}}})
    with pytest.raises(ValueError, match=r"unknown entries \['vgg'\]"):
        live.check_against(RaysrvSpec.model_validate(_args(_example())))


def test_spec_live_part_round_trips() -> None:
    parsed = RaysrvSpec.model_validate(_args(_example()))
    live = LiveConfig.model_validate(parsed.live().model_dump(mode="json"))
    assert live.models["mlp"].batching is not None
    assert live.models["mlp"].batching.policy == "aimd"
    assert live.apps["digits"].cache_size == 4096


def test_cli_exit_codes_and_messages(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _example()
    _args(doc)["models"][0]["batching"]["params"]["max_batch_size"] = -3
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    broken = tmp_path / "broken.yaml"
    broken.write_text("applications: [\n")
    assert main(["validate", str(EXAMPLE)]) == 0
    assert main(["validate", str(bad), str(broken)]) == 1
    out = capsys.readouterr().out
    assert "params.max_batch_size" in out
    assert "-3" in out
    assert "not valid YAML" in out
