"""The example and benchmark ONNX models: faithful exports, ordered accuracies, on-disk cache."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from bench.models import build_convnet
from examples.digits import build as digits

__all__: list[str] = []


def _session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return digits.build_all(tmp_path_factory.mktemp("digits"))


@pytest.fixture(scope="module")
def trained() -> dict[str, digits.TrainedModel]:
    return digits.train_models()


@pytest.mark.parametrize("name", digits.MODEL_NAMES)
def test_onnx_matches_framework_model(
    name: str, built: dict[str, Path], trained: dict[str, digits.TrainedModel]
) -> None:
    x_test, _ = digits.test_split()
    label, proba = _session(built[name]).run(["label", "probabilities"], {"input": x_test})
    expected = trained[name].predict_proba(x_test)
    np.testing.assert_array_equal(label, expected.argmax(axis=1))
    np.testing.assert_allclose(proba, expected, rtol=0, atol=1e-4)


@pytest.mark.parametrize("name", digits.MODEL_NAMES)
def test_onnx_signature(name: str, built: dict[str, Path]) -> None:
    session = _session(built[name])
    (inp,) = session.get_inputs()
    assert (inp.name, inp.type, inp.shape[1:]) == ("input", "tensor(float)", [64])
    assert isinstance(inp.shape[0], str)  # dynamic batch
    label, proba = session.run(["label", "probabilities"], {"input": digits.test_split()[0][:3]})
    assert (label.dtype, label.shape) == (np.int64, (3,))
    assert (proba.dtype, proba.shape) == (np.float32, (3, 10))
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, atol=1e-5)


def test_accuracies_are_ordered(built: dict[str, Path]) -> None:
    acc = json.loads((built["cnn"].parent / "accuracy.json").read_text())
    assert acc["logreg"] < acc["mlp"] <= acc["cnn"], acc
    assert acc["cnn"] - acc["logreg"] >= 0.03, acc
    assert 0.85 <= acc["logreg"] <= 0.93, acc


def test_second_build_is_a_cache_hit(built: dict[str, Path]) -> None:
    out_dir = built["cnn"].parent
    before = {p.name: p.stat().st_mtime_ns for p in out_dir.iterdir()}
    assert digits.build_all(out_dir) == built
    assert {p.name: p.stat().st_mtime_ns for p in out_dir.iterdir()} == before


def test_ensure_model_accepts_built_file_and_rejects_unknown(built: dict[str, Path]) -> None:
    digits.ensure_model(built["mlp"])
    with pytest.raises(ValueError, match=r"resnet\.onnx.*logreg"):
        digits.ensure_model(built["mlp"].parent / "resnet.onnx")


@pytest.mark.parametrize("batch", [1, 7])
def test_bench_convnet_runs(batch: int, tmp_path: Path) -> None:
    path = build_convnet(tmp_path / "convnet.onnx", seed=0)
    x = np.random.default_rng(0).random((batch, 3, 32, 32), dtype=np.float32)
    (logits,) = _session(path).run(["logits"], {"input": x})
    assert logits.shape == (batch, 10)
    assert logits.dtype == np.float32
    assert np.isfinite(logits).all()
