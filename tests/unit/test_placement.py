"""``placement: auto``: a pool goes into the ingress's process where its models are cheap
against a call to a worker actor, and stays on worker actors otherwise."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from raysrv import _workers
from raysrv._workers import AUTO_COLOCATE_MS, choose_placement
from raysrv.config import RaysrvSpec, ResolvedPool
from raysrv.testing import model_spec, spec
from tests.unit.test_runtimes import _onnx_matmul


def _pools(*models: dict[str, Any], **extra: Any) -> dict[str, ResolvedPool]:
    raw = spec(list(models), [{"name": "one", "models": [models[0]["name"]]}], **extra)
    return {p.name: p for p in RaysrvSpec.model_validate(raw).resolved_pools()}


def _onnx(name: str, path: Path, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "runtime": "onnx",
        "source": str(path),
        "placement": "auto",
        "input": {"shape": [4], "dtype": "float32"},
        **extra,
    }


def test_a_pool_of_cheap_models_is_colocated_and_says_what_it_measured(tmp_path: Path) -> None:
    pool = _pools(_onnx("linear", _onnx_matmul(tmp_path / "m.onnx")))["linear"]
    placement, medians = choose_placement(pool)
    assert placement == "colocated"
    assert set(medians) == {"linear"}
    assert 0.0 < medians["linear"] <= AUTO_COLOCATE_MS


def test_a_model_slower_than_the_call_keeps_the_pool_on_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = _pools(_onnx("linear", _onnx_matmul(tmp_path / "m.onnx")))["linear"]
    monkeypatch.setattr(_workers, "AUTO_COLOCATE_MS", 0.0)  # every run is slower than this
    placement, medians = choose_placement(pool)
    assert placement == "workers"
    assert medians["linear"] > 0.0


def test_python_models_gpu_pools_and_shared_pools_stay_on_workers_untimed(
    tmp_path: Path,
) -> None:
    python = _pools(model_spec("echo", placement="auto"))["echo"]
    gpu = _pools(
        _onnx("g", _onnx_matmul(tmp_path / "g.onnx"), device="gpu", resources={"num_gpus": 1})
    )["g"]
    shared = _pools(
        model_spec("m", pool="shared"),
        pools=[{"name": "shared", "memory_mb": 64, "placement": "auto"}],
    )["shared"]
    for pool in (python, gpu, shared):
        assert choose_placement(pool) == ("workers", {})
