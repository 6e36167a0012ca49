"""Profiling this machine on a model gives a performance model of positive lines for the kinds
it measured, transfers and delays; a model with nothing to split is refused. (How well the
model predicts is measured in bench/partition.py, not asserted here.)"""

from __future__ import annotations

import pytest

from raysrv.partitioning import layers, shards
from raysrv.partitioning.profile import profile
from tests.unit.partitioning.nets import to_onnx


def test_a_profile_predicts_the_model_it_was_measured_on() -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    nn = torch.nn
    # Convolutions of FLOPs a hundredfold apart: their line's slope stands out of the noise.
    model = to_onnx(
        nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
            nn.Conv2d(8, 32, 3, padding=1), nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 5),
        )
    )  # fmt: skip
    found = layers(model)
    perf = profile(model, max_parts=2, repeats=5)
    assert {"default", "Conv"} <= set(perf.runs)
    assert all(overhead >= 0 and rate > 0 for overhead, rate in perf.runs.values())
    assert perf.delay.mean > 0
    assert perf.bandwidth > 0
    assert all(perf.latency_s([layer], shards([layer], "none", 1), True) > 0 for layer in found)


def test_a_model_with_nothing_to_split_cannot_be_profiled_for_fork_join() -> None:
    torch = pytest.importorskip("torch")
    model = to_onnx(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Softmax(dim=1)))
    with pytest.raises(ValueError, match="no layer to split into 2 parts"):
        profile(model, repeats=2)
