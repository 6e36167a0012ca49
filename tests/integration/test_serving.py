"""raysrv on a real Ray Serve: batching, cache, handles from another app, live knobs, metrics."""

from __future__ import annotations

import asyncio
import itertools
import os
import time
import urllib.request
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from ray import serve

from raysrv.app import build_app
from raysrv.errors import BadRequest, raise_for_error
from raysrv.metrics import LE_LABELS
from raysrv.testing import model_spec, spec
from tests.integration.conftest import RayCluster
from tests.unit.test_runtimes import WEIGHTS, _onnx_matmul

ROOT = Path(__file__).parents[2]


def _two_model_spec(onnx_path: Path, **ingress: Any) -> dict[str, Any]:
    slow = model_spec("slow", init_kwargs={"delay_s": 0.05})
    fast = {
        "name": "fast",
        "runtime": "onnx",
        "source": str(onnx_path),
        "resources": {"num_cpus": 0.1},
        "batching": {"policy": "aimd", "params": {"initial_batch_size": 4}},
        "slo_ms": 10_000,
        "input": {"shape": [4], "dtype": "float32"},
    }
    apps = [
        {"name": "echo", "models": ["slow"], "cache_size": 64},
        {"name": "linear", "models": ["fast"], "cache_size": 0},
    ]
    return spec([slow, fast], apps, ingress={"num_cpus": 0.1, **ingress})


@pytest.fixture
def raysrv_app(serve_session: RayCluster, tmp_path: Path) -> Any:
    app = build_app(_two_model_spec(_onnx_matmul(tmp_path / "linear.onnx")))
    return serve.run(app, name="raysrv", route_prefix="/raysrv")


def _predict_each(handle: Any, app: str, inputs: list[list[float]]) -> list[dict[str, Any]]:
    responses = [handle.predict.remote(app, x) for x in inputs]
    return [r.result(timeout_s=60) for r in responses]


def test_concurrent_queries_are_batched_and_each_gets_its_answer(raysrv_app: Any) -> None:
    inputs = [[float(i), 0.0, 0.0, 1.0] for i in range(40)]
    answers = _predict_each(raysrv_app, "echo", inputs)
    assert [a["output"]["sum"] for a in answers] == [i + 1.0 for i in range(40)]
    sizes = [a["output"]["batch_size"] for a in answers]
    assert max(sizes) > 1
    batches = {a["output"]["batch"] for a in answers}
    assert len(batches) < 40
    linear = _predict_each(raysrv_app, "linear", [[1, 0, 0, 0], [0, 0, 0, 1]])
    assert [a["output"] for a in linear] == [[0.0, 1.0], [6.0, 7.0]]
    assert all(a["models"] == ["fast"] for a in linear)


def test_one_call_of_many_inputs_answers_each_in_order(raysrv_app: Any) -> None:
    inputs = [[float(i), 0.0, 0.0, 2.0] for i in range(40)] + [[1.0]]
    many = raysrv_app.predict_many.remote("echo", inputs).result(timeout_s=60)["results"]
    assert [a["output"]["sum"] for a in many[:-1]] == [i + 2.0 for i in range(40)]
    assert max(a["output"]["batch_size"] for a in many[:-1]) > 1
    assert (many[-1]["status"], many[-1]["error"]) == (400, "bad_request")
    model = raysrv_app.predict_model_many.remote("fast", [[0, 0, 0, 1]]).result(timeout_s=60)
    assert model["results"][0]["output"] == [6.0, 7.0]


def test_repeats_hit_the_cache_without_running_the_model(raysrv_app: Any) -> None:
    first = raysrv_app.predict.remote("echo", [1, 2, 3, 4]).result(timeout_s=60)
    again = raysrv_app.predict.remote("echo", [1, 2, 3, 4]).result(timeout_s=60)
    assert (first["cache_hit"], again["cache_hit"]) == (False, True)
    assert again["output"] == first["output"]  # same batch counter: the model did not run again
    other = raysrv_app.predict.remote("echo", [1, 2, 3, 5]).result(timeout_s=60)
    assert other["cache_hit"] is False
    assert other["output"]["batch"] > first["output"]["batch"]


@serve.deployment(ray_actor_options={"num_cpus": 0.1})
class Client:
    """A deployment of another Serve application that uses raysrv through a handle."""

    def __init__(self) -> None:
        self._raysrv = serve.get_app_handle("raysrv")

    async def ask(self, x: list[float]) -> dict[str, Any]:
        return await self._raysrv.predict.remote("linear", x)


def test_a_second_serve_application_calls_raysrv_through_a_handle(raysrv_app: Any) -> None:
    client = serve.run(Client.bind(), name="client", route_prefix="/client")
    answer = client.ask.remote([0.0, 1.0, 0.0, 0.0]).result(timeout_s=60)
    assert answer["output"] == [2.0, 3.0]
    assert set(answer) >= {"output", "models", "cache_hit", "query_id", "latency_ms"}
    fed = raysrv_app.feedback.remote("linear", answer["query_id"], 1).result(timeout_s=30)
    assert fed["accepted"] is True


def _haproxy_runs() -> bool:
    """Whether Serve's HTTP ingress is HAProxy (its manager actor is alive) or its own proxy."""
    from ray._private.state import actors

    alive = {a["ActorClassName"] for a in actors().values() if a["State"] == "ALIVE"}
    return "HAProxyManager" in alive


def test_http_through_serves_ingress(raysrv_app: Any, serve_session: RayCluster) -> None:
    # the fast path's run of this tier (tests/e2e/test_fast_path.py) sets the variable
    assert _haproxy_runs() == (os.environ.get("RAY_SERVE_ENABLE_HA_PROXY") == "1")

    async def scenario() -> list[httpx.Response]:
        url = f"{serve_session.http}/raysrv/v1/echo/predict"
        async with httpx.AsyncClient(timeout=60) as client:
            posts = [client.post(url, json={"input": [i, 1, 1, 1]}) for i in range(16)]
            json_type = {"content-type": "application/json"}
            posts.append(client.post(url, content=b"{oops", headers=json_type))
            return await asyncio.gather(*posts)

    responses = asyncio.run(scenario())
    assert [r.status_code for r in responses] == [200] * 16 + [400]
    assert [r.json()["output"]["sum"] for r in responses[:16]] == [i + 3.0 for i in range(16)]
    assert "not valid JSON" in responses[-1].json()["message"]
    models = httpx.get(f"{serve_session.http}/raysrv/v1/models", timeout=30).json()["models"]
    assert {m["name"] for m in models} == {"slow", "fast"}
    slow = next(m for m in models if m["name"] == "slow")
    assert slow["batch_seconds"]["p99"]  # the replicas' measured run times per batch size
    plan = httpx.get(f"{serve_session.http}/raysrv/v1/models/slow/plan", timeout=30).json()
    assert plan["inputs"]["arrivals"] == 16
    assert set(plan["inputs"]["run_p99_ms"]) == set(slow["batch_seconds"]["p99"])
    handle = serve.get_app_handle("raysrv")
    assert handle.plan.remote("nope").result(timeout_s=30)["status"] == 404


def _replica_pid(handle: Any) -> int:
    return handle.predict.remote("echo", list(np.random.default_rng().random(4))).result(
        timeout_s=60
    )["output"]["pid"]


def test_user_config_changes_apply_live_without_restarting_replicas(
    serve_session: RayCluster, tmp_path: Path
) -> None:
    """The `serve run config.yaml` path: a Serve config whose ingress user_config changes."""
    from ray.serve.context import _get_global_client
    from ray.serve.schema import ServeDeploySchema

    args = _two_model_spec(_onnx_matmul(tmp_path / "linear.onnx"))

    def deploy(user_config: dict[str, Any] | None) -> None:
        deployments = [{"name": "ingress", "user_config": user_config}] if user_config else []
        app = {
            "name": "raysrv",
            "route_prefix": "/raysrv",
            "import_path": "raysrv.app:build_app",
            "args": args,
            "deployments": deployments,
        }
        config = ServeDeploySchema.model_validate({"applications": [app]})
        _get_global_client().deploy_apps(config, _blocking=True)

    deploy(None)
    handle = serve.get_app_handle("raysrv")
    pid_before = _replica_pid(handle)
    policy = {"policy": "fixed", "params": {"max_batch_size": 3}}
    deploy({"models": {"slow": {"batching": policy}}, "apps": {"echo": {"cache_size": 0}}})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        models = {m["name"]: m for m in handle.models.remote().result(timeout_s=30)}
        if models["slow"]["batching"]["policy"] == "fixed":
            break
        time.sleep(0.5)
    assert models["slow"]["batching"]["params"]["max_batch_size"] == 3
    assert _replica_pid(handle) == pid_before  # the model replica was not restarted
    answers = _predict_each(handle, "echo", [[float(i), 0, 0, 0] for i in range(12)])
    assert max(a["output"]["batch_size"] for a in answers) <= 3
    repeat = [handle.predict.remote("echo", [9, 9, 9, 9]).result(timeout_s=60) for _ in range(2)]
    assert [r["cache_hit"] for r in repeat] == [False, False]  # cache_size 0 now


def test_metrics_of_every_role_reach_the_ray_metrics_endpoint(
    raysrv_app: Any, serve_session: RayCluster
) -> None:
    _predict_each(raysrv_app, "echo", [[float(i % 3), 0, 0, 0] for i in range(12)])
    refused = raysrv_app.predict.remote("echo", [1, 2]).result(timeout_s=30)
    assert refused["status"] == 400
    with pytest.raises(BadRequest, match=r"shape \[2\], expected \[4\]"):
        raise_for_error(refused)
    wanted = {
        "ray_raysrv_requests_total",
        "ray_raysrv_rejections_total",
        "ray_raysrv_request_latency_ms_bucket",
        "ray_raysrv_cache_hits_total",
        "ray_raysrv_cache_misses_total",
        "ray_raysrv_selections_total",
        "ray_raysrv_queue_length",
        "ray_raysrv_batch_size_bucket",
        "ray_raysrv_execution_ms_bucket",
    }
    url = f"http://127.0.0.1:{serve_session.metrics_port}/metrics"
    found: set[str] = set()
    latency: dict[str, tuple[list[float], float | None]] = {}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (found != wanted or not _a_histogram(latency)):
        body = urllib.request.urlopen(url, timeout=10).read().decode()
        found = {w for w in wanted if f"\n{w}{{" in body}
        latency = _latency_series(body, "echo")
        time.sleep(1)
    assert found == wanted, f"missing: {sorted(wanted - found)} (pid {os.getpid()})"
    assert _a_histogram(latency), latency


def _latency_series(body: str, app: str) -> dict[str, tuple[list[float], float | None]]:
    """The app's request latency in Ray's metrics text, by series (its tags but ``le``: one a
    replica): the buckets' running totals in order of their bounds (infinity's last), and the
    count."""
    buckets: dict[str, dict[float, float]] = {}
    counts: dict[str, float] = {}
    for line in body.splitlines():
        name, _, rest = line.partition("{")
        tags, _, value = rest.rpartition("} ")
        if f'app="{app}"' not in tags.split(","):
            continue
        if name == "ray_raysrv_request_latency_ms_bucket":
            le = next(t for t in tags.split(",") if t.startswith("le="))
            series = ",".join(t for t in tags.split(",") if t != le)
            buckets.setdefault(series, {})[float(le[4:-1])] = float(value)
        elif name == "ray_raysrv_request_latency_ms_count":
            counts[tags] = float(value)
    return {s: ([b[le] for le in sorted(b)], counts.get(s)) for s, b in buckets.items()}


def _a_histogram(series: dict[str, tuple[list[float], float | None]]) -> bool:
    """Whether one of ``series`` reads as a histogram of requests: a bucket for each bound and
    infinity, each holding at least the one below, infinity's holding every request."""
    return any(
        len(buckets) == len(LE_LABELS)
        and all(a <= b for a, b in itertools.pairwise(buckets))
        and count is not None
        and buckets[-1] == count > 0
        for buckets, count in series.values()
    )


def test_a_redeploy_with_the_same_models_keeps_answering(
    serve_session: RayCluster, tmp_path: Path
) -> None:
    """Serve replaces the ingress on a redeploy (here only the ingress options change); the new
    ingress must not be left holding model workers that die with the old one."""
    onnx_path = _onnx_matmul(tmp_path / "linear.onnx")
    serve.run(build_app(_two_model_spec(onnx_path)), name="raysrv", route_prefix="/raysrv")
    handle = serve.get_app_handle("raysrv")
    before = _predict_each(handle, "linear", [[1.0, 2.0, 3.0, 4.0]])
    changed = _two_model_spec(onnx_path, max_queued_requests=64)
    serve.run(build_app(changed), name="raysrv", route_prefix="/raysrv")
    handle = serve.get_app_handle("raysrv")
    after = _predict_each(handle, "linear", [[1.0, 2.0, 3.0, float(i)] for i in range(8)])
    assert "error" not in before[0]
    assert all("error" not in a for a in after), after
    assert after[4]["output"] == before[0]["output"]


def test_an_ensemble_on_serve_answers_by_its_deadline_without_its_straggler(
    serve_session: RayCluster,
) -> None:
    """clipper §5.2.2 on real replicas: the slow model's batch outlives the app's SLO, so the
    answer comes from the quick one, with the straggler listed as missing; feedback joins."""
    models = [
        model_spec("quick", source="raysrv.testing:LabelModel", init_kwargs={"label": 1}),
        model_spec(
            "sluggish",
            source="raysrv.testing:LabelModel",
            init_kwargs={"label": 2, "delay_s": 3.0},
        ),
    ]
    app = {
        "name": "vote",
        "models": ["quick", "sluggish"],
        "selection": {"policy": "exp4"},
        "slo_ms": 1000,
    }
    handle = serve.run(
        build_app(spec(models, [app], ingress={"num_cpus": 0.1})),
        name="raysrv",
        route_prefix="/raysrv",
    )
    handle.predict.remote("vote", [0, 0, 0, 0], best_effort=True).result(timeout_s=60)  # warm
    answer = handle.predict.remote("vote", [1, 0, 0, 0]).result(timeout_s=60)
    assert answer["missing"] == ["sluggish"], answer
    assert answer["output"] == {"label": 1}
    assert answer["confidence"] == pytest.approx(0.5)
    ack = handle.feedback.remote("vote", answer["query_id"], 1).result(timeout_s=60)
    assert ack["accepted"] is True


def test_strings_and_bytes_reach_python_models_over_http_and_handles(
    serve_session: RayCluster,
) -> None:
    """A string model on a worker actor (its batches cross to another process as lists of
    ``str``) and a bytes model in the ingress's process."""
    words = model_spec(
        "words", source="raysrv.testing:TextModel", input={"dtype": "string", "max_length": 64}
    )
    blobs = {
        **words,
        "name": "blobs",
        "placement": "colocated",
        "input": {"dtype": "bytes", "max_length": 64, "example": "abc"},
    }
    app = build_app(spec([words, blobs], [{"name": "words", "models": ["words"]}]))
    handle = serve.run(app, name="text", route_prefix="/text")
    url = f"{serve_session.http}/text/v1"
    many = httpx.post(f"{url}/words/predict", json={"inputs": ["a b c", "é"]}, timeout=60)
    raw = httpx.post(
        f"{url}/models/blobs/predict",
        content=b"\x00\xffz",
        headers={"content-type": "application/octet-stream"},
        timeout=60,
    )
    too_long = httpx.post(f"{url}/words/predict", json={"input": "w" * 65}, timeout=60)
    by_handle = handle.predict_model.remote("blobs", b"\x01 two").result(timeout_s=60)
    assert [a["output"]["words"] for a in many.json()["results"]] == [3, 1]
    assert [a["output"]["first"] for a in many.json()["results"]] == ["a", "é"]
    assert raw.json()["output"]["first"] == [0]
    assert raw.json()["output"]["length"] == 3
    assert too_long.status_code == 413
    assert (by_handle["output"]["length"], by_handle["output"]["words"]) == (5, 2)


def test_tritons_own_client_infers_through_serves_ingress(
    raysrv_app: Any, serve_session: RayCluster
) -> None:
    """The Open Inference Protocol as Triton's HTTP client speaks it: tensors as bytes by
    default, or as JSON numbers when asked."""
    import tritonclient.http as triton

    client = triton.InferenceServerClient(url=f"127.0.0.1:{serve_session.http_port}/raysrv")
    try:
        assert client.is_server_live()
        assert client.get_model_metadata("fast")["inputs"][0]["shape"] == [-1, 4]
        x = np.arange(12, dtype=np.float32).reshape(3, 4)
        for binary in (True, False):
            tensor = triton.InferInput("input", [3, 4], "FP32")
            tensor.set_data_from_numpy(x, binary_data=binary)
            asked = None if binary else [triton.InferRequestedOutput("output", binary_data=False)]
            result = client.infer("fast", [tensor], outputs=asked)
            np.testing.assert_allclose(result.as_numpy("output"), x @ WEIGHTS, rtol=1e-6)
        wrong = triton.InferInput("input", [1, 3], "FP32")
        wrong.set_data_from_numpy(np.zeros((1, 3), np.float32))
        with pytest.raises(triton.InferenceServerException, match=r"must be \[N, 4\]"):
            client.infer("fast", [wrong])
    finally:
        client.close()


def test_the_text_example_embeds_strings_as_its_model_does_offline(
    serve_session: RayCluster,
) -> None:
    """``examples/text/config.yaml``'s application: a string model on a worker actor."""
    import yaml

    from examples.text.model import HashedEmbedding

    config = yaml.safe_load((ROOT / "examples/text/config.yaml").read_text())
    serve.run(build_app(config["applications"][0]["args"]), name="text", route_prefix="/text")
    texts = ["serving models on ray", "serving models", "é"]
    url = f"{serve_session.http}/text/v1/embed/predict"
    # The example's SLO is 100 ms; a busy 2-core machine can take longer over the first call.
    answer = httpx.post(url, json={"inputs": texts, "slo_ms": 10_000}, timeout=60)
    too_long = httpx.post(url, json={"input": "w" * 4097}, timeout=60)
    offline = HashedEmbedding().predict_batch(texts)
    for result, expected in zip(answer.json()["results"], offline, strict=True):
        np.testing.assert_allclose(result["output"]["embedding"], expected["embedding"])
        assert result["output"]["words"] == expected["words"]
    assert too_long.status_code == 413
