"""``ingress.max_ongoing_requests: auto``: Serve's bound on an ingress replica's requests, from
its models timed where the application is built and their SLOs."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from raysrv._admission import FALLBACK, admitted, auto_bound, full_batch, longest_slo_ms
from raysrv.app import build_app
from raysrv.config import RaysrvSpec
from raysrv.testing import model_spec, spec
from tests.unit.test_runtimes import _onnx_matmul


def _onnx(name: str, path: Path, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "runtime": "onnx",
        "source": str(path),
        "input": {"shape": [4], "dtype": "float32"},
        "batching": {"policy": "fixed", "params": {"max_batch_size": 8}},
        **extra,
    }


def _spec(*models: dict[str, Any], **extra: Any) -> RaysrvSpec:
    apps = [{"name": "one", "models": [m["name"] for m in models]}]
    return RaysrvSpec.model_validate(spec(list(models), apps, **extra))


def test_what_is_admitted_finishes_within_the_slo_and_one_batch_more_would_not() -> None:
    rng = random.Random(3)
    for _ in range(2000):
        batch, workers = rng.randint(1, 64), rng.randint(1, 4)
        batch_s, slo_s = rng.uniform(0.001, 0.2), rng.uniform(0.01, 1.0)
        n = admitted(batch, batch_s, workers, slo_s)
        behind = n // (batch * workers)  # full batches queued on each worker
        assert n == behind * batch * workers
        assert behind >= 1
        # the last queued batch ends after a just-started running one and those ahead of it
        if behind > 1:
            assert (behind + 1) * batch_s <= slo_s
        assert (behind + 2) * batch_s > slo_s  # one batch more per worker would end late


def test_the_longest_slo_a_model_is_served_under_counts() -> None:
    raw = spec(
        [
            model_spec("a", slo_ms=100.0),
            model_spec("b", slo_ms=100.0),
            model_spec("c", slo_ms=100.0),
        ],
        [
            {"name": "slow", "models": ["a"], "slo_ms": 500.0},
            {"name": "fast", "models": ["a", "b"], "slo_ms": 20.0},
            {"name": "plain", "models": ["c"]},
        ],
    )
    parsed = RaysrvSpec.model_validate(raw)
    assert longest_slo_ms(parsed.models, parsed.apps) == {"a": 500.0, "b": 100.0, "c": 100.0}


def test_a_full_batch_is_the_policys_largest() -> None:
    parsed = _spec(
        model_spec("f", batching={"policy": "fixed", "params": {"max_batch_size": 12}}),
        model_spec("a", batching={"policy": "aimd", "params": {"max_batch_size": 48}}),
    )
    assert [full_batch(m) for m in parsed.models] == [12, 48]


def test_a_timed_bound_is_whole_batches_and_grows_with_the_slo(tmp_path: Path) -> None:
    path = _onnx_matmul(tmp_path / "m.onnx")
    bounds = []
    for slo_ms in (1.0, 10_000.0):
        parsed = _spec(_onnx("m", path, slo_ms=slo_ms, replicas=2))
        bounds.append(auto_bound(parsed.resolved_pools(), {"m": slo_ms}))
    assert all(b % (8 * 2) == 0 and b >= 8 * 2 for b in bounds)  # batches of 8 on 2 workers
    assert bounds[1] > 100 * bounds[0]


def test_pools_that_cannot_be_timed_here_leave_the_fixed_bound(tmp_path: Path) -> None:
    path = _onnx_matmul(tmp_path / "g.onnx")
    gpu = _spec(_onnx("g", path, device="gpu", resources={"num_gpus": 1}))
    shared = _spec(model_spec("m", pool="shared"), pools=[{"name": "shared", "memory_mb": 64}])
    for parsed in (gpu, shared):
        assert auto_bound(parsed.resolved_pools(), {"g": 100.0, "m": 100.0}) == FALLBACK


def test_the_built_application_carries_the_timed_bound(tmp_path: Path) -> None:
    path = _onnx_matmul(tmp_path / "m.onnx")
    for ongoing in ("auto", 40):
        raw = spec(
            [_onnx("m", path, slo_ms=50.0)],
            [{"name": "one", "models": ["m"]}],
            ingress={"max_ongoing_requests": ongoing, "max_queued_requests": 1},
        )
        config = build_app(raw)._bound_deployment._deployment_config
        assert config.max_queued_requests == 1
        if ongoing == "auto":  # a batch of 8 of a 4x2 matmul takes far less than 50 ms / 2
            assert config.max_ongoing_requests % 8 == 0
            assert config.max_ongoing_requests > 16
        else:
            assert config.max_ongoing_requests == 40


@pytest.mark.parametrize("value", ["sometimes", 0, -3, 2.5])
def test_a_bound_neither_auto_nor_a_positive_whole_number_is_refused(value: object) -> None:
    raw = spec([model_spec("m")], [{"name": "one", "models": ["m"]}])
    raw["ingress"] = {"max_ongoing_requests": value}
    with pytest.raises(ValidationError) as caught:
        RaysrvSpec.model_validate(raw)
    assert "max_ongoing_requests" in str(caught.value)
