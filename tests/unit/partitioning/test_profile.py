"""Profiling this machine on a model gives a performance model of positive lines for the kinds
it measured, transfers, delays and how much shards side by side slow each other; a model with
nothing to split is refused. (How well the
model predicts is measured in bench/partition.py, not asserted here.)"""

from __future__ import annotations

import numpy as np
import pytest

from raysrv.partitioning import layers, shards
from raysrv.partitioning.profile import _side_by_side, profile
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


def test_side_by_side_is_the_slope_of_the_rounds_excess_on_their_run_alone() -> None:
    rng = np.random.default_rng(0)
    timed = [
        (alone, list(0.3 * alone + 1e-4 + rng.exponential(2e-5, 20)))
        for alone in (1e-4, 5e-4, 1e-3, 2e-3)
    ]
    slope, delays = _side_by_side(timed)
    assert slope == pytest.approx(0.3, abs=0.02)
    assert len(delays) == 80
    assert 1e-4 < float(np.median(delays)) < 1.5e-4  # the delay left once the slope is out
    flat = [(alone, [2e-4] * 5) for alone in (1e-4, 1e-3)]
    assert _side_by_side(flat)[0] == 0.0
    shrinking = [(alone, [1e-3 - 0.5 * alone] * 5) for alone in (1e-4, 1e-3)]
    assert _side_by_side(shrinking)[0] == 0.0  # never faster side by side
