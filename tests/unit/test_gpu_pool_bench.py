"""The GPU pool benchmark's parts that run anywhere (here on the CPU, as no GPU runs here): its
models are distinct per seed and, kept in host memory, built again without drawing; a saved
run's points simulate again to what the run printed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bench import gpu_pool


def _weights(model: torch.nn.Module) -> list[np.ndarray]:
    return [p.detach().numpy().copy() for p in model.parameters()]


def test_each_seed_draws_its_own_weights_and_hosted_ones_are_drawn_once() -> None:
    first, again, other = (gpu_pool.convnet(s, width=4) for s in (0, 0, 1))
    for a, b, c in zip(_weights(first), _weights(again), _weights(other), strict=True):
        np.testing.assert_array_equal(a, b)
        if a.ndim > 1:
            assert not np.array_equal(a, c)
    hosted = gpu_pool.convnet(0, width=4, hosted=True)
    rebuilt = gpu_pool.convnet(0, width=4, hosted=True)
    for a, b, c in zip(_weights(first), _weights(hosted), _weights(rebuilt), strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(b, c)
    size = sum(p.numel() * 4 for p in first.parameters())
    size += sum(b.numel() * b.element_size() for b in first.buffers())
    assert gpu_pool.weight_bytes(4) == size


def test_a_saved_point_simulates_again_to_what_its_run_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A small pool on the CPU, live, then the saved point simulated again: the same shares
    within the SLO, live, drawn and replayed, as the run itself printed."""
    out = tmp_path / "run.json"
    quick = ["--device", "cpu", "--quick", "--parts", "pool", "--loads", "0.8", "--out", str(out)]
    assert gpu_pool.main([*quick, "--seconds", "1.5", "--capacity-seconds", "1"]) == 0
    printed = [line for line in capsys.readouterr().out.splitlines() if "within the SLO" in line]
    saved = json.loads(out.read_text())
    (point,) = saved["pool"]["points"]
    assert point["queries"] > 0
    assert 0.0 <= point["live_within_slo"] <= 1.0
    assert saved["pool"]["peak_bytes"][0] <= saved["pool"]["capacity_bytes"]
    assert gpu_pool.main(["--resimulate", str(out)]) == 0
    again = [line for line in capsys.readouterr().out.splitlines() if "within the SLO" in line]
    assert again == printed
