"""Partitioned models on Ray: a pool's leader in bundle 0 of its placement group and its shard
actors in the others, one each, giving the whole model's outputs under every option; served
over HTTP by a worker that holds less than the whole model; a shard that dies fails its
batches with a 500 and is started again; a leader that dies comes back in its bundle with new
shards; the group ends with its model.

The models are small torch nets with random weights (torch's CPU build, the examples extra),
exported to ONNX here."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import pytest
import ray
from ray import serve

from raysrv import _partitioned as partitioned
from raysrv._partitioned import (
    SHARD_PREFIX,
    PartitionedRuntime,
    Probe,
    ShardActor,
    TimedShard,
    _Rehearsal,
    amid_plan,
    calls_s,
)
from raysrv._workers import WORKERS_NAMESPACE
from raysrv.analytics.forkjoin import EMG
from raysrv.app import build_app
from raysrv.config import ModelSpec
from raysrv.partitioning import PerfModel, layers, shards
from raysrv.partitioning.latency import Plan, stage
from raysrv.testing import spec
from tests.integration.conftest import RayCluster, until

torch = pytest.importorskip("torch")
nn = torch.nn

APP = "partitioned"
SHAPE = (3, 8, 8)
LIMIT_MB = 1.5


def _net() -> Any:
    """Two convolutions and a pooling, then 4 MiB of fully connected weights."""
    torch.manual_seed(3)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 4 * 4, 2048), nn.ReLU(), nn.Linear(2048, 10),
    )  # fmt: skip


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("partitioned") / "net.onnx"
    torch.onnx.export(
        _net().eval(), (torch.zeros(1, *SHAPE),), str(path), dynamo=False,
        input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "n"}, "y": {0: "n"}},
    )  # fmt: skip
    return path


def _spec(path: Path) -> dict[str, Any]:
    return {
        "name": "net",
        "runtime": "onnx",
        "source": str(path),
        "resources": {"num_cpus": 0.25},
        "partition": {"workers": 2, "memory_limit_mb": LIMIT_MB, "num_cpus": 0.25},
        "batching": {"policy": "fixed", "params": {"max_batch_size": 4}},
        "slo_ms": 30_000,  # generous: these tests check answers, not a loaded machine's speed
        "input": {"shape": list(SHAPE)},
    }


def _whole(path: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    return ort.InferenceSession(str(path)).run(None, {"x": x})[0]


def _inputs(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, *SHAPE)).astype(np.float32)


def _mixed_plan(path: Path) -> Plan:
    """The convolutions split by rows in three, the leader taking one; the first fully
    connected layer split by channels on two workers; the rest on one worker."""
    return _plan(path, [("spatial", 3, True), ("channel", 2, False), ("none", 1, False)])


def _plan(path: Path, cuts: list[tuple[str, int, bool]]) -> Plan:
    """Three stages, each ``(option, parts, leader)``: the layers before the first fully
    connected one, that layer, the rest."""
    found = layers(onnx.load(str(path)))
    perf = PerfModel({"default": (1e-6, 1e9)}, 1e9, EMG(1e-4, 1e-5, 1e-5))
    head = next(k for k, layer in enumerate(found) if "Flatten" in layer.ops)
    ends = [(0, head - 1), (head, head), (head + 1, len(found) - 1)]
    stages = []
    for (first, last), (option, parts, leader) in zip(ends, cuts, strict=True):
        group = found[first : last + 1]
        pieces = tuple(shards(group, option, parts))
        stages.append(stage(group, first, option, pieces, leader, perf, 1.0))
    return Plan(tuple(found), tuple(stages), model=str(path))


def _shard_actors() -> list[str]:
    return sorted(
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["namespace"] == WORKERS_NAMESPACE and a["name"].startswith(SHARD_PREFIX + "net:")
    )


def test_every_option_runs_on_shard_actors_in_their_own_bundles(
    ray_cluster: RayCluster, model_file: Path
) -> None:
    plan = _mixed_plan(model_file)
    x = _inputs(5)
    expected = _whole(model_file, x)
    np.testing.assert_allclose(plan.run_local(x), expected, rtol=1e-5, atol=1e-6)
    runtime = PartitionedRuntime(ModelSpec.model_validate(_spec(model_file)), plan)
    placement = runtime.placement_group
    try:
        got = np.array(runtime.predict_batch(x), dtype=np.float32)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
        workers = len(plan.worker_shards())
        assert workers == 2 + 2 + 1
        table = ray.util.placement_group_table(placement)
        assert len(table["bundles"]) == workers
        names = _shard_actors()
        assert [int(n.split(":")[-2]) for n in names] == list(range(workers))
        ready = [ray.get(a.ready.remote()) for a in runtime.shard_actors]
        group = placement.id.hex()
        assert [r["placement_group"] for r in ready] == [group] * workers
        assert len({r["pid"] for r in ready}) == workers
        held = [r["model_bytes"] for r in ready]
        # the convolutions' shards hold their weights; the big layer's, half of its
        conv_bytes, fc_bytes = held[0], held[2]
        assert fc_bytes < 0.6 * sum(layer.weight_bytes for layer in plan.layers)
        assert conv_bytes < fc_bytes
        assert runtime.weight_bytes() < conv_bytes * 2  # the leader: one row shard
    finally:
        runtime.close()
    until(lambda: not _shard_actors(), 20, "the shard actors ended")
    assert ray.util.placement_group_table(placement)["state"] == "REMOVED"
    assert runtime.placement_group is None


class _CountingProbe(Probe):
    def __init__(self) -> None:
        self.calls = 0

    def echo(self, x: np.ndarray) -> np.ndarray:
        self.calls += 1
        return super().echo(x)

    def count(self) -> int:
        return self.calls


def test_the_planners_probe_rests_a_shard_while_it_keeps_calling_another(
    ray_cluster: RayCluster,
) -> None:
    probe, keeper = (ray.remote(_CountingProbe).options(num_cpus=0).remote() for _ in range(2))
    try:
        x = np.zeros(1024, np.uint8)
        start = time.perf_counter()
        timed = calls_s(probe, x, 30.0, 0.02, rounds=3, keeper=keeper)
        took = time.perf_counter() - start
        assert len(timed) == 3
        assert all(0 < t < took for t in timed)
        assert took >= 3 * 0.02  # each call after its rest
        assert ray.get(probe.count.remote()) == 3
        kept = ray.get(keeper.count.remote())
        assert kept >= 3  # the rests were spent calling the keeper
        calls_s(probe, x, 30.0, 0.02, rounds=2)
        assert ray.get(keeper.count.remote()) == kept  # without one, the caller sleeps
        assert ray.get(probe.count.remote()) == 5
    finally:
        ray.kill(probe)
        ray.kill(keeper)


SLOW_S = 0.05  # what each run of a shard actor of _SlowShard takes beyond its model's


class _Slow(ShardActor):
    def run(self, x: bytes) -> bytes:
        time.sleep(SLOW_S)
        return super().run(x)


class _SlowShard(TimedShard, _Slow):
    """A timed shard actor whose runs take ``SLOW_S`` longer, inside the time it keeps."""


def test_calls_are_timed_amid_the_plan_run_as_its_leader_runs_it(
    ray_cluster: RayCluster, model_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_Rehearsal, "shard_actor", _SlowShard)
    perf = PerfModel({"default": (1e-6, 1e9)}, 1e9, EMG(1e-4, 1e-5, 1e-5), overlap=9.0)
    plan = _mixed_plan(model_file)  # its last round: one worker, the leader idle
    start = time.perf_counter()
    timed = amid_plan(perf, plan, 30.0, batches=10)
    took = time.perf_counter() - start
    assert took >= 11 * len(plan.stages) * SLOW_S  # every batch ran every round's shards
    assert timed.delay != perf.delay
    assert 0 < timed.delay.mean < SLOW_S  # what the rounds took beyond their workers' runs
    assert replace(timed, delay=perf.delay) == perf  # no round of one worker beside the leader
    beside = _plan(model_file, [("none", 1, False), ("channel", 2, True), ("none", 1, False)])
    assert 0 <= amid_plan(perf, beside, 30.0, batches=10).overlap < 9.0  # timed in its round
    with pytest.raises(ValueError, match="no model"):
        amid_plan(perf, replace(plan, model=None), 30.0)

    def never(*args: Any) -> None:
        raise AssertionError("a plan with no round to time was run")

    monkeypatch.setattr(partitioned, "_Rehearsal", never)
    with_leader = replace(plan, stages=plan.stages[:1])  # the leader beside two workers
    assert amid_plan(perf, with_leader, 30.0, batches=10) is perf


def _leader() -> Any:
    """The pool worker of the served model: its partitioned model's leader."""
    name = next(
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["namespace"] == WORKERS_NAMESPACE and a["name"].startswith(f"raysrv:{APP}:net:")
    )
    return ray.get_actor(name, namespace=WORKERS_NAMESPACE)


def _in_one_group(leader: Any) -> tuple[Any, list[Any]]:
    """The leader's placement group and its shard actors, checked to be of its plan's
    size and to run in that group."""
    group = ray.get(leader.placement_group.remote())
    assert group is not None
    names = _shard_actors()
    assert len(names) >= 2
    assert len(ray.util.placement_group_table(group)["bundles"]) == 1 + len(names)
    actors = [ray.get_actor(name, namespace=WORKERS_NAMESPACE) for name in names]
    ready = [ray.get(a.ready.remote()) for a in actors]
    assert {r["placement_group"] for r in ready} == {group.id.hex()}
    return group, ready


def _recovers(
    client: httpx.Client, url: str, x: np.ndarray, want: np.ndarray, failure: str
) -> list[int]:
    """The statuses of queries sent until three in a row are answered (a minute at most),
    each 500 saying ``failure`` and the last answer right."""
    statuses = []
    give_up = time.monotonic() + 60
    while time.monotonic() < give_up:
        answer = client.post(url, json={"input": x.tolist()})
        statuses.append(answer.status_code)
        if answer.status_code == 500:
            assert failure in answer.text
        if statuses[-3:] == [200, 200, 200]:
            break
        time.sleep(0.1)
    assert statuses[-3:] == [200, 200, 200], statuses
    np.testing.assert_allclose(answer.json()["output"], want, rtol=1e-5, atol=1e-5)
    return statuses


def test_a_model_over_twice_a_workers_limit_is_served_and_outlives_shard_and_leader_deaths(
    serve_session: RayCluster, model_file: Path
) -> None:
    weights = sum(layer.weight_bytes for layer in layers(onnx.load(str(model_file))))
    assert weights > 2 * LIMIT_MB * 2**20
    apps = [{"name": "net", "models": ["net"], "cache_size": 0}]
    serve.run(
        build_app(spec([_spec(model_file)], apps, ingress={"num_cpus": 0.1})),
        name=APP,
        route_prefix=f"/{APP}",
    )
    url = f"{serve_session.http}/{APP}/v1/models/net/predict"
    x = _inputs(6, seed=1)
    expected = _whole(model_file, x)
    with httpx.Client(timeout=60) as client:
        for row, want in zip(x, expected, strict=True):
            answer = client.post(url, json={"input": row.tolist()})
            assert answer.status_code == 200, answer.text
            np.testing.assert_allclose(answer.json()["output"], want, rtol=1e-5, atol=1e-5)

        leader = _leader()
        group, ready = _in_one_group(leader)
        assert max(r["model_bytes"] for r in ready) <= LIMIT_MB * 2**20, ready
        os.kill(ready[0]["pid"], signal.SIGKILL)
        shard_failed = "a shard worker of the partitioned model failed"
        statuses = _recovers(client, url, x[0], expected[0], shard_failed)
        assert 500 in statuses, statuses  # the batch the death caught
        assert set(statuses) <= {200, 500}, statuses

        before = set(_shard_actors())
        os.kill(ray.get(leader.ready.remote())["pid"], signal.SIGKILL)
        statuses = _recovers(client, url, x[1], expected[1], "model 'net' failed on a batch")
        assert set(statuses) <= {200, 500, 503}, statuses
        again, _ = _in_one_group(leader)  # the same group, with new shard actors
        assert again.id == group.id
        assert not before & set(_shard_actors())

    serve.delete(APP)
    until(lambda: not _shard_actors(), 30, "the shard actors ended with their leader")
    until(
        lambda: ray.util.placement_group_table(group)["state"] == "REMOVED",
        30,
        "the group removed with its leader",
    )


class _Leader:
    """A leader made outside a placement group: a detached actor that Ray restarts, whose
    shards get a group of their own."""

    def __init__(self, spec: dict[str, Any]) -> None:
        from raysrv.runtimes import load_runtime

        self.runtime = load_runtime(ModelSpec.model_validate(spec))

    def run(self, x: np.ndarray) -> list[Any]:
        return self.runtime.predict_batch(x)

    def pid(self) -> int:
        return os.getpid()

    def placement_group(self) -> str:
        return self.runtime.placement_group.id.hex()


def test_a_leader_outside_a_group_comes_back_with_a_new_one_and_the_old_one_removed(
    ray_cluster: RayCluster, model_file: Path
) -> None:
    options = {"num_cpus": 0.25, "lifetime": "detached", "max_restarts": -1}
    leader = ray.remote(_Leader).options(**options).remote(_spec(model_file))
    x = _inputs(2, seed=2)
    expected = _whole(model_file, x)
    try:
        np.testing.assert_allclose(ray.get(leader.run.remote(x)), expected, rtol=1e-5, atol=1e-5)
        first = ray.get(leader.placement_group.remote())
        os.kill(ray.get(leader.pid.remote()), signal.SIGKILL)

        def answers() -> bool:
            try:
                got = ray.get(leader.run.remote(x), timeout=10)
            except (ray.exceptions.RayError, TimeoutError):
                return False
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
            return True

        until(answers, 120, "the restarted leader answering")
        second = ray.get(leader.placement_group.remote())
        assert second != first
        table = ray.util.placement_group_table()
        assert table[first]["state"] == "REMOVED"
        assert table[second]["state"] == "CREATED"
    finally:
        ray.kill(leader, no_restart=True)
    until(
        lambda: ray.util.placement_group_table()[second]["state"] == "REMOVED",
        30,
        "the group removed with its leader",
    )
    until(lambda: not _shard_actors(), 30, "the shard actors ended with their leader")


def test_an_orphaned_leader_removes_its_group(serve_session: RayCluster, model_file: Path) -> None:
    apps = [{"name": "net", "models": ["net"], "cache_size": 0}]
    # Serve checks the replica only once a minute: it will not start another in its place.
    ingress = {"num_cpus": 0.1, "orphan_timeout_s": 3.0, "health_check_period_s": 60.0}
    args = spec([_spec(model_file)], apps, ingress=ingress)
    serve.run(build_app(args), name=APP, route_prefix=f"/{APP}")
    group, _ = _in_one_group(_leader())
    (replica,) = [
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith(f"SERVE_REPLICA::{APP}#ingress#")
    ]
    ray.kill(ray.get_actor(replica, namespace="serve"), no_restart=True)  # as a crash would
    serve.delete(APP)
    until(
        lambda: ray.util.placement_group_table(group)["state"] == "REMOVED",
        30,
        "the orphaned leader's group removed",
    )
    until(lambda: not _shard_actors(), 30, "the shard actors ended with their leader")
