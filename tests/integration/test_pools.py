"""A shared pool on a real Ray Serve: ONNX models declared as one set, loaded on demand and
evicted within the workers' capacity, exact answers, and models added and removed live."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from ray.serve.context import _get_global_client
from ray.serve.schema import ServeDeploySchema

from bench.zoo import build_zoo, model_size
from tests.integration.conftest import RayCluster

MODELS = 5
PER_WORKER = 2  # the capacity holds two models per worker


def _args(directory: Path, placement: str = "workers") -> dict[str, Any]:
    return {
        "pools": [
            {
                "name": "shared",
                "workers": 1,
                "resources": {"num_cpus": 0.5},
                "placement": placement,
                "memory_mb": PER_WORKER * model_size(1024, 448) / (1 << 20) + 0.01,
            }
        ],
        "model_sets": [
            {
                "name": "zoo",
                "source": str(directory / "m*.onnx"),
                "template": {
                    "runtime": "onnx",
                    "pool": "shared",
                    "batching": {"policy": "deadline", "params": {"max_batch_size": 4}},
                    "slo_ms": 20_000,
                    "input": {"shape": [64], "dtype": "float32"},
                },
            }
        ],
        "ingress": {"num_cpus": 0.1},
    }


def _deploy(args: dict[str, Any], user_config: dict[str, Any] | None = None) -> None:
    deployments = [{"name": "ingress", "user_config": user_config}] if user_config else []
    app = {
        "name": "zoo",
        "route_prefix": "/zoo",
        "import_path": "raysrv.app:build_app",
        "args": args,
        "deployments": deployments,
    }
    _get_global_client().deploy_apps(
        ServeDeploySchema.model_validate({"applications": [app]}), _blocking=True
    )


def _offline(path: Path, x: np.ndarray) -> list[float]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x[None]})[0][0].tolist()


@pytest.fixture
def zoo(
    serve_session: RayCluster, tmp_path: Path, request: pytest.FixtureRequest
) -> tuple[Any, list[Path]]:
    from ray import serve

    paths = build_zoo(tmp_path, MODELS)
    _deploy(_args(tmp_path, getattr(request, "param", "workers")))
    return serve.get_app_handle("zoo"), paths


def _named_actors() -> list[str]:
    """The names of the live Ray actors of app ``zoo``'s pools' workers."""
    import ray

    named = ray.util.list_named_actors(all_namespaces=True)
    return [a["name"] for a in named if a["name"].startswith("raysrv:zoo:")]


def _pool_actors() -> list[str]:
    """The live Ray actors that are the workers of app ``zoo``'s pool ``shared``."""
    return [name for name in _named_actors() if ":shared:" in name]


@pytest.mark.parametrize("zoo", ["workers", "colocated"], indirect=True)
def test_a_shared_pool_serves_every_model_exactly_within_its_capacity(
    zoo: tuple[Any, list[Path]], serve_session: RayCluster, request: pytest.FixtureRequest
) -> None:
    """The same on worker actors and, ``placement: colocated``, on threads of the ingress
    (then no worker actor exists)."""
    handle, paths = zoo
    placement = request.node.callspec.params["zoo"]
    x = np.random.default_rng(0).random(64).astype(np.float32)
    order = [0, 1, 0, 2, 3, 0, 4, 1]
    for i in order:
        answer = handle.predict_model.remote(paths[i].stem, x.tolist()).result(timeout_s=60)
        assert "error" not in answer, answer
        np.testing.assert_allclose(answer["output"], _offline(paths[i], x), rtol=1e-5)
    models = {m["name"]: m for m in handle.models.remote().result(timeout_s=30)}
    loaded = [name for name, m in models.items() if m["loaded_on"]]
    assert len(loaded) <= PER_WORKER
    assert all(m["pool"] == "shared" for m in models.values())
    assert sum(m["evictions"] for m in models.values()) >= 3
    assert models[paths[0].stem]["loads"] >= 1
    one = handle.model.remote(paths[0].stem).result(timeout_s=30)
    assert (one["name"], one["loads"]) == (paths[0].stem, models[paths[0].stem]["loads"])
    assert handle.model.remote("nope").result(timeout_s=30)["status"] == 404
    (pool,) = handle.pools.remote().result(timeout_s=30)
    assert pool["placement"] == placement
    if placement == "colocated":  # any actor of the app before it is gone with its ingress
        assert _until(_pool_actors, lambda actors: not actors) == []
    else:
        assert len(_pool_actors()) == 1
    (worker,) = pool["workers"]
    assert worker["peak_bytes"] <= pool["capacity_bytes"]
    assert worker["process"]["peak_bytes"] <= pool["capacity_bytes"]  # as the worker counted
    assert worker["process"]["rss_bytes"] > 0
    assert pool["loads"] >= len(set(order))
    assert pool["evictions"] >= 3
    timeline = handle.timeline.remote("shared").result(timeout_s=30)
    columns = ("kind", "model", "sent", "started", "ended", "back")
    rows = list(zip(*(timeline[k] for k in columns), strict=True))
    served = [model for kind, model, *_ in rows if kind == "infer"]
    assert served[-len(order) :] == [paths[i].stem for i in order]  # each query's batch, in turn
    assert [kind for kind, *_ in rows].count("load") >= len(set(order))
    for _, _, sent, started, ended, back in [r for r in rows if r[0] != "unload"]:
        assert sent <= started <= ended <= back  # one machine: the workers' clock is the ingress's
    assert handle.timeline.remote("nope").result(timeout_s=30)["status"] == 404

    url = f"http://127.0.0.1:{serve_session.metrics_port}/metrics"
    metrics = ("ray_raysrv_loads_total", "ray_raysrv_unloads_total")
    deadline, body = time.monotonic() + 60, ""
    # a counter is exported from the first report after its first count: wait for both
    while time.monotonic() < deadline and not all(f"\n{m}{{" in body for m in metrics):
        body = urllib.request.urlopen(url, timeout=10).read().decode()
        time.sleep(1)
    for metric in metrics:
        assert f"\n{metric}{{" in body, metric


def test_models_join_and_leave_a_shared_pool_live_without_restarting_its_workers(
    zoo: tuple[Any, list[Path]], tmp_path: Path
) -> None:
    handle, paths = zoo
    x = np.zeros(64, np.float32).tolist()
    assert "error" not in handle.predict_model.remote(paths[0].stem, x).result(timeout_s=60)
    pids = {p["process"]["pid"] for p in handle.pools.remote().result(timeout_s=30)[0]["workers"]}
    extra = tmp_path / "more"
    (added,) = build_zoo(extra, 1, seed=7)
    catalog = {
        "catalog": {
            "models": [
                {
                    "name": "late-joiner",
                    "runtime": "onnx",
                    "source": str(added),
                    "pool": "shared",
                    "input": {"shape": [64]},
                }
            ]
        }
    }
    _deploy(_args(tmp_path), catalog)
    answer = _until_served(handle, "late-joiner", x)
    np.testing.assert_allclose(answer["output"], _offline(added, np.zeros(64, np.float32)))
    _deploy(_args(tmp_path), {"catalog": {"models": []}})
    gone = _until(lambda: handle.predict_model.remote("late-joiner", x).result(timeout_s=60))
    assert gone["status"] == 404
    workers = handle.pools.remote().result(timeout_s=30)[0]["workers"]
    assert {w["process"]["pid"] for w in workers} == pids  # the same worker processes
    assert "late-joiner" not in workers[0]["models"]


def _until_served(handle: Any, model: str, x: list[float]) -> dict[str, Any]:
    return _until(
        lambda: handle.predict_model.remote(model, x).result(timeout_s=60),
        lambda answer: "error" not in answer,
    )


def _until(call: Any, done: Any = lambda answer: "error" in answer) -> Any:
    deadline = time.monotonic() + 60
    while True:
        answer = call()
        if done(answer) or time.monotonic() > deadline:
            return answer
        time.sleep(0.5)


def test_a_dedicated_pool_colocated_in_the_ingress_serves_its_model(
    serve_session: RayCluster, tmp_path: Path
) -> None:
    """A model without ``pool`` and ``placement: colocated``: each of its workers is a pair of
    the ingress's threads with the model loaded at start, and no worker actor is started."""
    from ray import serve

    (path,) = build_zoo(tmp_path, 1)
    model = {
        "name": "solo",
        "runtime": "onnx",
        "source": str(path),
        "replicas": 2,
        "resources": {"num_cpus": 0.5},
        "placement": "colocated",
        "slo_ms": 20_000,
        "input": {"shape": [64], "dtype": "float32"},
    }
    _deploy({"models": [model], "ingress": {"num_cpus": 0.1}})
    handle = serve.get_app_handle("zoo")
    x = np.random.default_rng(1).random(64).astype(np.float32)
    answer = handle.predict_model.remote("solo", x.tolist()).result(timeout_s=60)
    assert "error" not in answer, answer
    np.testing.assert_allclose(answer["output"], _offline(path, x), rtol=1e-5)
    (pool,) = handle.pools.remote().result(timeout_s=30)
    assert (pool["name"], pool["placement"], pool["shared"]) == ("solo", "colocated", False)
    assert [list(w["process"]["models"]) for w in pool["workers"]] == [["solo"], ["solo"]]
    assert len({w["process"]["pid"] for w in pool["workers"]}) == 1  # one process: the ingress
    assert not any(":solo:" in name for name in _named_actors())


def test_auto_placement_colocates_the_cheap_model_and_keeps_the_slow_one_on_an_actor(
    serve_session: RayCluster, tmp_path: Path
) -> None:
    """``placement: auto`` on two dedicated pools: the zoo model whose square layer runs 2,000
    times (a batch of one in tens of milliseconds on one thread) on a worker actor, the same
    model without the passes (tens of microseconds) in the ingress's process."""
    from ray import serve

    (cheap,) = build_zoo(tmp_path / "cheap", 1)
    (slow,) = build_zoo(tmp_path / "slow", 1, passes=2000, steady=True)
    models = [
        {
            "name": name,
            "runtime": "onnx",
            "source": str(path),
            "resources": {"num_cpus": 0.25, "threads": 1},
            "placement": "auto",
            "slo_ms": 20_000,
            "input": {"shape": [64], "dtype": "float32"},
        }
        for name, path in (("cheap", cheap), ("slow", slow))
    ]
    _deploy({"models": models, "ingress": {"num_cpus": 0.1}})
    handle = serve.get_app_handle("zoo")
    x = np.random.default_rng(2).random(64).astype(np.float32)
    for name, path in (("cheap", cheap), ("slow", slow)):
        answer = handle.predict_model.remote(name, x.tolist()).result(timeout_s=60)
        assert "error" not in answer, answer
        np.testing.assert_allclose(answer["output"], _offline(path, x), rtol=1e-5)
    pools = {p["name"]: p for p in handle.pools.remote().result(timeout_s=30)}
    assert (pools["cheap"]["placement"], pools["slow"]["placement"]) == ("colocated", "workers")
    cheap_ms = pools["cheap"]["auto"]["batch_of_one_ms"]["cheap"]
    slow_ms = pools["slow"]["auto"]["batch_of_one_ms"]["slow"]
    assert cheap_ms <= pools["cheap"]["auto"]["colocate_within_ms"] < slow_ms
    assert not any(":cheap:" in name for name in _named_actors())
    assert any(":slow:" in name for name in _named_actors())
