"""Config validation: good and bad files, every problem named by its field path and value."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from raysrv import cli
from raysrv.cli import FAST_PATH, main
from raysrv.config import LiveConfig, ModelSpec, RaysrvSpec
from raysrv.policies import SelectionPolicy
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
        (
            lambda a: a.update(ingress={"max_queued_requests": 0}),
            "ingress.max_queued_requests",
            "0",
        ),
        (lambda a: a.update(root="models"), "args.root", "'models'"),
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


class LearnsForGood(SelectionPolicy):
    """A policy that learns from feedback and cannot take any back."""

    name = "learns_for_good"

    def select(self, state: dict[str, Any], x: Any) -> list[str]:
        return [self.models[0]]

    def observe(self, state: dict[str, Any], x: Any, feedback: Any, predictions: Any) -> Any:
        return {**state, "seen": state.get("seen", 0) + 1}


@pytest.mark.parametrize(
    "policy", ["single", "split", "exp3", "exp4", "epsilon_greedy", "ucb1", "forgetful"]
)
def test_relabel_needs_a_policy_that_can_take_a_feedback_back(policy: str) -> None:
    doc = _example()
    app = _args(doc)["apps"][0]
    path = f"{__name__}:LearnsForGood"
    app["selection"] = {"policy": path if policy == "forgetful" else policy}
    app["relabel"] = True
    problems = _problems(doc)
    if policy == "forgetful":
        assert any("relabel: true" in p and "defines no unobserve" in p for p in problems)
    else:
        assert problems == []


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("selection", {"policy": "exp3"}, "its selection policy 'exp3' learns from feedback"),
        ("relabel", True, "relabel: true needs feedback: true"),
        ("feedback_keys", ["k" * 16], "feedback_keys needs feedback: true"),
    ],
)
def test_an_app_without_feedback_may_not_need_it(field: str, value: Any, named: str) -> None:
    doc = _example()
    app = _args(doc)["apps"][0]
    app["feedback"] = False
    assert _problems(doc) == []  # the example's policy does not learn
    app[field] = value
    problems = _problems(doc)
    assert any("apps[0]" in p and "feedback: false" in p and named in p for p in problems), problems


def test_a_live_selection_that_learns_is_refused_for_an_app_without_feedback() -> None:
    args = _args(_example())
    args["apps"][0]["feedback"] = False
    parsed = RaysrvSpec.model_validate(args)
    name = args["apps"][0]["name"]
    LiveConfig.model_validate({"apps": {name: {"selection": {"policy": "split"}}}}).check_against(
        parsed
    )
    live = LiveConfig.model_validate({"apps": {name: {"selection": {"policy": "ucb1"}}}})
    with pytest.raises(ValueError, match="'ucb1' learns from feedback"):
        live.check_against(parsed)


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


@pytest.mark.parametrize(("where", "field"), [("ingress", "api_keys"), ("app", "feedback_keys")])
def test_validate_names_a_weak_key_by_its_place_and_never_prints_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str, field: str
) -> None:
    doc = _example()
    secret = "short-secret"
    target = _args(doc).setdefault("ingress", {}) if where == "ingress" else _args(doc)["apps"][0]
    target[field] = [secret]
    path = tmp_path / "weak.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["validate", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"{field}[0] must be at least 16" in out
    assert secret not in out


def test_pydantics_own_errors_never_show_a_key(tmp_path: Path) -> None:
    """What plain ``serve run`` prints: Serve validates ``args`` into :class:`RaysrvSpec` and
    shows pydantic's text, inputs included. A weak key, and a strong one in an app whose other
    field is wrong (the error's input is the whole app), appear only as ``<hidden>``."""
    weak, strong = "short-secret", "a-strong-key-0123456789"
    args = _args(_example())
    args.setdefault("ingress", {})["api_keys"] = [weak]
    args["apps"][0]["feedback_keys"] = [strong]
    args["apps"][0]["relabel"] = True
    args["apps"][0]["selection"] = {"policy": f"{__name__}:LearnsForGood"}
    with pytest.raises(ValidationError) as raised:
        RaysrvSpec.model_validate(args)
    text = str(raised.value)
    assert "api_keys[0] must be at least 16" in text
    assert "defines no unobserve" in text
    assert weak not in text
    assert strong not in text
    assert "<hidden>" in text


def test_a_misspelled_key_field_is_named_and_its_value_never_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = "a-strong-key-0123456789"
    doc = _example()
    _args(doc).setdefault("ingress", {})["api_key"] = [secret]  # for api_keys
    path = tmp_path / "misspelled.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["validate", str(path)]) == 1
    out = capsys.readouterr().out
    assert "ingress.api_key" in out
    assert secret not in out
    with pytest.raises(ValidationError) as raised:  # as plain serve run shows it
        RaysrvSpec.model_validate(_args(doc))
    assert "api_key" in str(raised.value)
    assert secret not in str(raised.value)


def _serve_captured(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[str], dict[str, str]]]:
    """Each ``serve`` command line that ``raysrv run`` hands Serve's CLI, with the environment
    it runs in; the fast path's variables are put back as they were after the test."""
    from ray.serve import scripts

    calls: list[tuple[list[str], dict[str, str]]] = []
    for key in FAST_PATH:
        monkeypatch.delenv(key, raising=False)

    def run(args: list[str], prog_name: str) -> None:
        assert prog_name == "serve"
        calls.append((list(args), dict(cli.os.environ)))

    monkeypatch.setattr(scripts.cli, "main", run)
    return calls


def test_raysrv_run_serves_the_file_on_serves_fast_path_unless_told_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _serve_captured(monkeypatch)
    monkeypatch.setenv("RAY_SERVE_THROUGHPUT_OPTIMIZED", "0")  # set by the user: it wins
    assert main(["run", str(EXAMPLE), "--non-blocking", "--address", "auto"]) == 0
    for key in FAST_PATH:  # a process runs once: the variables of the run before are gone
        monkeypatch.delenv(key, raising=False)
    assert main(["run", "--serve-proxy", str(EXAMPLE)]) == 0
    (argv, env), (plain_argv, plain_env) = calls
    assert argv[0] == "run"
    assert argv[2:] == ["--non-blocking", "--address", "auto"]
    assert env["RAY_SERVE_ENABLE_HA_PROXY"] == "1"
    assert env["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "0"
    assert env["RAY_SERVE_PROXY_HEALTH_CHECK_PERIOD_S"] == "2"
    assert plain_argv[0] == "run"
    assert len(plain_argv) == 2
    assert "RAY_SERVE_ENABLE_HA_PROXY" not in plain_env
    assert set(FAST_PATH) == {
        "RAY_SERVE_ENABLE_HA_PROXY",
        "RAY_SERVE_THROUGHPUT_OPTIMIZED",
        "RAY_SERVE_PROXY_HEALTH_CHECK_PERIOD_S",
    }
    # the file served is the example with its directory as the raysrv app's root, else as is
    served = yaml.safe_load(Path(argv[1]).read_text())
    example = _example()
    assert _args(served).pop("root") == str(EXAMPLE.parent)
    assert served == example


def test_relative_model_paths_are_read_from_the_specs_root_which_raysrv_run_sets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relative source is read from ``root``, which ``raysrv run FILE`` sets to FILE's
    directory wherever the command starts (one the file names already wins); without one, from
    the working directory of the process that builds the application."""
    from raysrv.app import prepare_spec

    here, elsewhere = tmp_path / "deploy", tmp_path / "shell"
    (here / "models").mkdir(parents=True)
    elsewhere.mkdir()
    (here / "models" / "m.onnx").write_bytes(b"")
    monkeypatch.chdir(elsewhere)
    raw = spec([model_spec("m", runtime="onnx", source="models/m.onnx")], [])
    doc = {"applications": [{"name": "a", "import_path": "raysrv.app:build_app", "args": raw}]}
    doc["applications"].append({"name": "other", "import_path": "pkg.mod:app", "args": {}})
    given = {**raw, "root": "/elsewhere"}
    mine = {"applications": [{"name": "a", "import_path": "raysrv.app:build_app", "args": given}]}
    rooted_doc = cli.rooted(doc, here)
    assert _args(rooted_doc)["root"] == str(here)
    assert rooted_doc["applications"][1]["args"] == {}  # not raysrv's: left as it is
    assert "root" not in _args(doc)  # the file read is not changed
    assert _args(cli.rooted(mine, here))["root"] == "/elsewhere"
    (model,) = prepare_spec(RaysrvSpec.model_validate(_args(rooted_doc))).models
    assert model.source == str(here / "models" / "m.onnx")
    with pytest.raises(ValueError, match="does not exist"):
        prepare_spec(RaysrvSpec.model_validate(raw))  # from the working directory: not there


def test_raysrv_run_starts_nothing_for_an_invalid_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = _serve_captured(monkeypatch)
    doc = _example()
    _args(doc)["models"][0]["slo_ms"] = "soon"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    assert main(["run", str(bad)]) == 1
    assert calls == []
    assert "slo_ms" in capsys.readouterr().out


# -- pools, model sets and the live catalog -------------------------------------------------


def _pooled(**extra: Any) -> dict[str, Any]:
    return spec(
        [model_spec("a", pool="shared"), model_spec("b")],
        [{"name": "x", "models": ["a"]}],
        pools=[{"name": "shared", "workers": 2, "memory_mb": 64}],
        **extra,
    )


def test_models_join_a_shared_pool_or_get_a_dedicated_one() -> None:
    parsed = RaysrvSpec.model_validate(_pooled())
    pools = {p.name: p for p in parsed.resolved_pools()}
    assert sorted(pools) == ["b", "shared"]
    assert (pools["shared"].workers, pools["shared"].capacity_bytes) == (2, 64 << 20)
    assert pools["shared"].pinned == ()
    assert [m.name for m in pools["b"].pinned] == ["b"]
    assert pools["b"].capacity_bytes is None
    assert validate_document(_pooled()) == []


def test_a_pools_workers_load_its_models_with_the_pools_device_and_resources() -> None:
    """A model of a pool declares no device or resources of its own; the pool's workers load
    it on theirs (here a GPU and two threads), and the spec they receive validates again, as
    a worker checks it: no LOAD fails for the pool's settings its model did not repeat."""
    raw = _pooled()
    raw["pools"][0].update(device="gpu", resources={"num_gpus": 1, "threads": 2})
    (shared,) = [p for p in RaysrvSpec.model_validate(raw).resolved_pools() if p.name == "shared"]
    (model,) = [m for m in RaysrvSpec.model_validate(raw).models if m.name == "a"]
    assert (model.device, model.resources.num_gpus) == ("cpu", 0)
    loaded = ModelSpec.model_validate(shared.worker_model(model).model_dump(mode="json"))
    assert (loaded.device, loaded.resources.num_gpus, loaded.resources.threads) == ("gpu", 1, 2)


def test_a_colocated_pools_workers_are_reserved_with_the_ingress() -> None:
    """Workers that run in the ingress's process are reserved as part of it: its own CPUs plus
    theirs, for a shared pool and a model's dedicated one alike."""
    raw = _pooled()
    raw["pools"][0].update(placement="colocated", resources={"num_cpus": 0.5})
    raw["models"][1].update(placement="colocated", replicas=3, resources={"num_cpus": 0.25})
    parsed = RaysrvSpec.model_validate(raw)
    assert {p.name: p.placement for p in parsed.resolved_pools()} == {
        "shared": "colocated",
        "b": "colocated",
    }
    assert parsed.ingress_resources() == {"num_cpus": parsed.ingress.num_cpus + 2 * 0.5 + 3 * 0.25}
    raw["models"][1].update(placement="workers")
    assert RaysrvSpec.model_validate(raw).ingress_resources() == {
        "num_cpus": parsed.ingress.num_cpus + 1.0
    }


def test_custom_resources_go_with_the_workers_that_need_them() -> None:
    """A model's custom resources are asked for by each of its worker actors, by its
    partitioned leader's bundle, and, where its workers are colocated, by the ingress for
    each of them; Ray's own resources and amounts of 0 are refused, naming them."""
    from raysrv._partitioned import group_bundles
    from raysrv._workers import _actor_options

    raw = _pooled()
    raw["models"][1].update(resources={"num_cpus": 0.5, "custom": {"node-b": 0.1}}, replicas=2)
    parsed = RaysrvSpec.model_validate(raw)
    (pool,) = [p for p in parsed.resolved_pools() if p.name == "b"]
    assert _actor_options(pool, "w")["resources"] == {"node-b": 0.1}
    assert "resources" not in _actor_options(parsed.resolved_pools()[0], "w")
    assert "resources" not in parsed.ingress_resources()
    raw["models"][1].update(placement="colocated")
    assert RaysrvSpec.model_validate(raw).ingress_resources()["resources"] == {"node-b": 0.2}
    model = ModelSpec.model_validate(
        model_spec(
            "p",
            runtime="onnx",
            source="m.onnx",
            resources={"num_cpus": 1, "custom": {"node-b": 0.5}},
            partition={"memory_limit_mb": 8},
        )
    )

    class TwoShards:  # what group_bundles reads of a plan
        def worker_shards(self) -> list[int]:
            return [0, 1]

    leader, *shards = group_bundles(model, TwoShards())  # type: ignore[arg-type]
    assert leader == {"CPU": 1.0, "node-b": 0.5}
    assert shards == [{"CPU": 0.5}, {"CPU": 0.5}]  # shard workers go wherever they fit
    for custom, fragment in (({"CPU": 1}, "Ray's own resources ['CPU']"), ({"x": 0}, "['x']")):
        with pytest.raises(ValidationError, match=re.escape(fragment)):
            ModelSpec.model_validate(model_spec("m", resources={"custom": custom}))


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (lambda s: s["models"][0].update(pool="nope"), "unknown pool 'nope'; pools: ['shared']"),
        (
            lambda s: s["models"][0].update(replicas=3),
            "a model in pool 'shared' runs on the pool's workers: ['replicas']",
        ),
        (lambda s: s["pools"][0].update(memory_mb=0), "memory_mb"),
        (lambda s: s["pools"][0].update(device="gpu"), "device 'gpu' with resources.num_gpus=0"),
        (lambda s: s["pools"].append(dict(s["pools"][0])), "pool names must be unique"),
        (
            lambda s: s["models"].append(model_spec("shared")),
            "dedicated pool named like the shared pool",
        ),
        (lambda s: s["pools"][0].update(workerz=2), "workerz"),
        (
            lambda s: s["pools"][0].update(resources={"niceness": 20}),
            "pools[0].resources.niceness: Input should be less than or equal to 19 (value: 20)",
        ),
        (
            lambda s: s["models"][1].update(resources={"load_niceness": -1}),
            "models[1].resources.load_niceness: Input should be greater than or equal to 0",
        ),
        (
            lambda s: s["pools"][0].update(placement="inline"),
            "pools[0].placement: Input should be 'workers', 'colocated' or 'auto' "
            "(value: 'inline')",
        ),
        (
            lambda s: s["models"][0].update(placement="colocated"),
            "a model in pool 'shared' runs on the pool's workers: ['placement']",
        ),
    ],
)
def test_pool_mistakes_are_named_with_their_values(mutate: Any, fragment: str) -> None:
    raw = _pooled()
    mutate(raw)
    problems = _problems(raw)
    assert any(fragment in p for p in problems), problems


def _model_set(source: str, **extra: Any) -> dict[str, Any]:
    template = {"runtime": "onnx", "pool": "shared", "input": {"shape": [4]}}
    return {"name": "zoo", "source": source, "template": template, **extra}


def test_a_model_set_lists_one_model_per_file(tmp_path: Path) -> None:
    for stem in ("m2", "m1", "m10"):
        (tmp_path / f"{stem}.onnx").write_bytes(b"x" * 10)
    (tmp_path / "README.txt").write_text("not a model")
    raw = _pooled(model_sets=[_model_set("*.onnx", prefix="z-")])
    listed = RaysrvSpec.model_validate(raw).expanded(tmp_path)
    zoo = [m for m in listed.models if m.group == "zoo"]
    assert [m.name for m in zoo] == ["z-m1", "z-m10", "z-m2"]
    assert all(m.pool == "shared" and m.weight_bytes() == 10 for m in zoo)
    assert zoo[0].source == str(tmp_path / "m1.onnx")
    directory = _pooled(model_sets=[_model_set(str(tmp_path))])
    with pytest.raises(ValueError, match="'README.txt' gives the model name 'README'"):
        RaysrvSpec.model_validate(directory).expanded(tmp_path)  # a directory: every file
    (tmp_path / "README.txt").unlink()
    (tmp_path / "Bad Name.onnx").write_bytes(b"x")
    with pytest.raises(ValueError, match="file 'Bad Name.onnx' gives the model name"):
        RaysrvSpec.model_validate(raw).expanded(tmp_path)
    empty = _pooled(model_sets=[_model_set("nothing/*.onnx")])
    with pytest.raises(ValueError, match="model set 'zoo': no file matches"):
        RaysrvSpec.model_validate(empty).expanded(tmp_path)


def test_a_spec_needs_models() -> None:
    with pytest.raises(ValidationError, match="no models"):
        RaysrvSpec.model_validate({"apps": []})


def test_the_live_catalog_adds_models_only_to_shared_pools() -> None:
    parsed = RaysrvSpec.model_validate(_pooled())
    added = model_spec("c", pool="shared")
    live = LiveConfig.model_validate(
        {"catalog": {"models": [added]}, "models": {"c": {"slo_ms": 5}}}
    )
    live.check_against(parsed)
    with pytest.raises(ValidationError, match=r"must name a shared pool \(`pool`\): \['d'\]"):
        LiveConfig.model_validate({"catalog": {"models": [model_spec("d")]}})
    twice = LiveConfig.model_validate({"catalog": {"models": [model_spec("a", pool="shared")]}})
    with pytest.raises(ValueError, match=r"adds models the args already have: \['a'\]"):
        twice.check_against(parsed)
    elsewhere = LiveConfig.model_validate({"catalog": {"models": [model_spec("c", pool="gpu")]}})
    with pytest.raises(ValueError, match="names unknown pool 'gpu'"):
        elsewhere.check_against(parsed)


PARTITIONED = Path(__file__).parents[2] / "examples" / "partitioned" / "config.yaml"


def test_the_partitioned_example_is_valid() -> None:
    assert validate_file(PARTITIONED) == []


@pytest.mark.parametrize(
    ("update", "fragment"),
    [
        ({"runtime": "torch", "source": "pkg.mod:f"}, "got runtime 'torch'"),
        ({"pool": "shared"}, "got pool 'shared'"),
        ({"placement": "colocated"}, "got placement 'colocated'"),
        ({"partition": {"objective": "cost", "memory_limit_mb": 8}}, "objective 'cost' needs"),
        ({"partition": {"memory_limit_mb": 8, "workers": 0}}, "partition.workers"),
        ({"partition": {"memory_limit_mb": 8, "worker": 2}}, "partition.worker"),
        ({"partition": {"workers": 2}}, "partition.memory_limit_mb"),
        ({"resources": {"num_cpus": 0}}, "needs resources.num_cpus > 0"),
    ],
)
def test_partition_mistakes_are_named(update: dict[str, Any], fragment: str) -> None:
    model = {**model_spec("big", runtime="onnx", source="big.onnx")}
    model["partition"] = {"memory_limit_mb": 8}
    model.update(update)
    pools = [{"name": "shared", "memory_mb": 64}]
    doc = spec([model], [{"name": "x", "models": ["big"]}], pools=pools)
    problems = _problems(doc)
    assert any(fragment in p for p in problems), problems


def test_validate_and_plan_check_that_a_plan_fits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nets = pytest.importorskip("tests.unit.partitioning.nets")
    (tmp_path / "net.onnx").write_bytes(nets.to_onnx(nets.resnet()).SerializeToString())
    model = {
        **model_spec("net", runtime="onnx", source="net.onnx"),
        "input": {"shape": [3, 16, 16]},
    }
    model["partition"] = {"workers": 2, "memory_limit_mb": 0.02}
    doc = spec([model], [{"name": "x", "models": ["net"]}])
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(doc))
    assert main(["validate", str(good)]) == 0
    assert main(["plan", str(good)]) == 0
    out = capsys.readouterr().out
    assert "net: objective latency, 2 workers, 0.02 MiB a shard" in out
    assert "predicted latency" in out
    assert "shard workers; largest shard" in out
    model["partition"]["memory_limit_mb"] = 0.001
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(spec([model], [{"name": "x", "models": ["net"]}])))
    assert main(["validate", str(bad)]) == 1
    out = capsys.readouterr().out
    assert "models[0].partition.memory_limit_mb: net: no plan fits 0.001 MiB a shard" in out
    assert main(["plan", str(bad)]) == 1


def test_validate_checks_that_every_file_of_a_partitioned_model_set_fits(tmp_path: Path) -> None:
    nets = pytest.importorskip("tests.unit.partitioning.nets")
    (tmp_path / "sets").mkdir()
    # 300 KiB of weights: a third of them is still over the limit
    wide = nets.nn.Sequential(nets.nn.Flatten(), nets.nn.Linear(768, 100))
    for name, module in (("small", nets.resnet()), ("wide", wide)):
        (tmp_path / "sets" / f"{name}.onnx").write_bytes(nets.to_onnx(module).SerializeToString())
    template = {"runtime": "onnx", "input": {"shape": [3, 16, 16]}}
    template["partition"] = {"workers": 2, "memory_limit_mb": 0.02}
    zoo = {"name": "zoo", "source": "sets/*.onnx", "template": template}
    doc = spec([model_spec("a")], [{"name": "x", "models": ["a"]}], model_sets=[zoo])
    problems = [str(p) for p in validate_document(doc, tmp_path)]
    assert len(problems) == 1, problems
    where = "model_sets[0].template.partition.memory_limit_mb: wide: no plan fits 0.02 MiB"
    assert problems[0].startswith(where), problems
    template["partition"]["memory_limit_mb"] = 1
    assert validate_document(doc, tmp_path) == []


# -- sources: what a deploy would first find missing ------------------------------------------


def test_validate_finds_missing_files_and_import_paths_that_do_not_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each problem a deploy would meet only after its retries is named at its field, with
    the path or the import error; ``--no-sources`` leaves them for a config meant for another
    machine, and the schema is still checked."""
    (tmp_path / "here.onnx").write_bytes(b"")
    (tmp_path / "setmodels").mkdir()
    (tmp_path / "userpkg.py").write_text(
        "class NoPredict:\n    pass\n\nNOT_CALLABLE = 3\n\ndef make():\n    return None\n"
    )
    (tmp_path / "crashing.py").write_text("raise RuntimeError('needs a GPU driver')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    onnx = {"runtime": "onnx", "input": {"shape": [4]}}
    models = [
        model_spec("ok-file", source="here.onnx", **onnx),
        model_spec("ok-code"),  # raysrv.testing:EchoModel
        model_spec("missing", source="gone.onnx", **onnx),
        model_spec("built", source="later.onnx", build="userpkg:make", **onnx),
        model_spec("bad-hook", source="later.onnx", build="userpkg:nothing", **onnx),
        model_spec("typo", source="userpkgg:Model"),
        model_spec("no-predict", source="userpkg:NoPredict"),
        model_spec("constant", source="userpkg:NOT_CALLABLE"),
        model_spec("crashes", source="crashing:Model"),
        model_spec("torch-code", runtime="torch", source="userpkg:NOT_CALLABLE"),
        model_spec("torch-file", runtime="torch", source="weights.pt"),
    ]
    names = [m["name"] for m in models]
    raw = spec(models, [{"name": "a", "models": names}])
    raw["model_sets"] = [
        {"name": "empty", "source": "setmodels/*.onnx", "template": {**onnx, "pool": "p"}}
    ]
    raw["pools"] = [{"name": "p", "workers": 1, "memory_mb": 64}]
    raw["apps"] = [{"name": "a", "models": ["ok-file"]}]
    catalog = {"models": [model_spec("live", source="live.onnx", pool="p", **onnx)]}
    doc = {
        "applications": [
            {
                "name": "a",
                "import_path": "raysrv.app:build_app",
                "args": raw,
                "deployments": [{"name": "ingress", "user_config": {"catalog": catalog}}],
            }
        ]
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(doc))
    found = {p.path: p for p in validate_file(path)}
    at = "applications[0].args."
    assert sorted(found) == sorted(
        [
            *(f"{at}models[{i}].source" for i in (2, 5, 6, 7, 8, 9, 10)),
            f"{at}models[4].build",
            f"{at}model_sets[0].source",
            "applications[0].deployments[0].user_config.catalog.models[0].source",
        ]
    )
    assert found[f"{at}models[2].source"].message == f"no such file: {tmp_path / 'gone.onnx'}"
    assert "cannot import module 'userpkgg'" in found[f"{at}models[5].source"].message
    assert "has no predict_batch" in found[f"{at}models[6].source"].message
    assert "of type int, not a class or a function" in found[f"{at}models[7].source"].message
    assert "raised RuntimeError: needs a GPU driver" in found[f"{at}models[8].source"].message
    assert "not a class or a function" in found[f"{at}models[9].source"].message
    assert "no attribute 'nothing'" in found[f"{at}models[4].build"].message
    assert "no file matches" in found[f"{at}model_sets[0].source"].message
    assert validate_file(path, sources=False) == []
    assert main(["validate", "--no-sources", str(path)]) == 0
    assert main(["validate", str(path)]) == 1
    assert "10 problem(s)" in capsys.readouterr().out


def test_a_failed_deploy_is_told_in_one_line_from_serves_status_messages() -> None:
    """raysrv's own start error where Serve's messages hold one, else the last line of the
    last message (a build's traceback ends with its error)."""
    from raysrv._deployments import STARTING

    ours = f"{STARTING} 'text': LoadFailed: model 'embed' cannot be loaded: OSError: gone"
    replica = (
        "The deployment failed to start 3 times in a row. See controller logs.\n"
        "Traceback (most recent call last):\n  File ...\n"
        f"raysrv._deployments.StartFailed: {ours}\n"
    )
    assert cli.failure_line(["Deploying app 'text' failed.", replica]) == ours
    build = "Traceback (most recent call last):\n  ...\nValueError: model 'm': source missing\n\n"
    assert cli.failure_line([build, ""]) == "ValueError: model 'm': source missing"
    assert cli.failure_line(["", ""]) == "no reason given"


def test_raysrv_run_sees_a_server_already_on_its_address(tmp_path: Path) -> None:
    """What answers on the config's HTTP address (any interface read as this machine's), and
    nothing where nothing listens; Serve's defaults where the config gives none."""
    import socket

    from tests.conftest import free_port

    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert cli._answering({"host": "127.0.0.1", "port": port}) == f"127.0.0.1:{port}"
        assert cli._answering({"host": "0.0.0.0", "port": port}) == f"0.0.0.0:{port}"
    assert cli._answering({"port": free_port()}) is None


def test_raysrv_deploy_presents_rays_token_where_this_machine_keeps_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "token"))
    assert not cli._token_here()
    (tmp_path / "token").write_text("secret")
    assert cli._token_here()
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "none"))
    monkeypatch.setenv("RAY_AUTH_TOKEN", "secret")
    assert cli._token_here()
