"""Plans run fork-join in one process give the whole model's outputs: every group of
consecutive layers under every option it allows and several numbers of parts, on three models,
and the DP's own plans under tight memory; each shard's model holds only its share of weights."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from raysrv.analytics.forkjoin import EMG
from raysrv.partitioning import Plan, Stage, latency_optimal, layers, options, shards
from raysrv.partitioning.local import LocalPlan, Sharder
from raysrv.partitioning.perf import PerfModel
from tests.unit.partitioning.nets import inception, resnet, to_onnx, vgg

BUILDS = {"resnet": resnet, "inception": inception, "vgg": vgg}


@pytest.fixture(scope="module", params=list(BUILDS))
def model(request: pytest.FixtureRequest) -> onnx.ModelProto:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    return to_onnx(BUILDS[request.param]())


def _whole(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]


def _stage(found: list, first: int, last: int, option: str, parts: int) -> Stage:
    pieces = tuple(shards(found[first : last + 1], option, parts))
    return Stage(first, last, option, parts, False, pieces, 0.0, 0)


def _with(found: list, middle: Stage) -> Plan:
    """``middle`` with every other layer a round of its own, unsplit."""
    before = [_stage(found, k, k, "none", 1) for k in range(middle.first)]
    after = [_stage(found, k, k, "none", 1) for k in range(middle.last + 1, len(found))]
    return Plan(tuple(found), (*before, middle, *after))


def test_every_group_and_option_computes_the_whole_models_outputs(model: onnx.ModelProto) -> None:
    found = layers(model)
    x = np.random.default_rng(1).standard_normal((2, 3, 16, 16)).astype(np.float32)
    expected = _whole(model, x)
    tried = set()
    for first in range(len(found)):
        for last in range(first, len(found)):
            for option in options(found[first : last + 1]):
                for parts in (1, 2, 3, 5) if option != "none" else (1,):
                    try:
                        stage = _stage(found, first, last, option, parts)
                    except ValueError:  # more parts than rows or channels
                        continue
                    with LocalPlan(model, _with(found, stage)) as local:
                        got = local.run(x)
                    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
                    tried.add(option)
    assert tried == {"none", "spatial", "channel"}


def test_the_dps_plans_under_tight_memory_compute_the_same(model: onnx.ModelProto) -> None:
    found = layers(model)
    perf = PerfModel({"default": (1e-5, 1e8)}, 1e9, EMG(5e-5, 5e-6, 1e-5))
    x = np.random.default_rng(2).standard_normal((1, 3, 16, 16)).astype(np.float32)
    expected = _whole(model, x)
    largest = max(layer.weight_bytes for layer in found)
    for limit in (4 * largest + 40_000, largest // 2 + 8_000):
        try:
            plan = latency_optimal(found, perf, 3, limit)
        except ValueError:
            continue
        with LocalPlan(model, plan) as local:
            np.testing.assert_allclose(local.run(x), expected, rtol=1e-5, atol=1e-5)


def test_a_channel_shard_holds_only_its_filters() -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = to_onnx(resnet())
    found = layers(model)
    fc = len(found) - 1
    stage = _stage(found, fc, fc, "channel", 4)
    held = [
        sum(numpy_helper.to_array(t).nbytes for t in shard.graph.initializer)
        for shard, _ in Sharder(model).shard_models(_with(found, stage), stage)
    ]
    assert sum(held) == found[fc].weight_bytes
    assert held == [p.weight_bytes for p in stage.shards]  # what the planner counted
    assert held == [2 * 513 * 4, 3 * 513 * 4, 3 * 513 * 4, 2 * 513 * 4]  # outputs' rows and bias


def test_a_spatial_shard_receives_its_rows_and_halo() -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = to_onnx(vgg())
    found = layers(model)
    stage = _stage(found, 0, 1, "spatial", 2)  # two 3x3 convolutions over 16 rows
    built = Sharder(model).shard_models(_with(found, stage), stage)
    rows = [received for _, received in built]
    assert rows == [(0, 10), (6, 16)]
