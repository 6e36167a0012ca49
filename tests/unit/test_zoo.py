"""The model zoo (``bench.zoo``): names, shapes, distinct and reproducible weights, and a rerun
that keeps the files already built. Small widths keep it fast; one test sizes the real shape."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from bench.zoo import INPUT_DIM, build_zoo, digits_like, model_name, model_size, parameters

SMALL = {"width": 32, "narrow": 16}


def _weights(path: Path) -> list[np.ndarray]:
    return [numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer]


def _logits(path: Path, x: np.ndarray) -> np.ndarray:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"input": x})[0]


def test_the_zoo_names_its_models_by_index_lowercase_starting_with_a_letter(
    tmp_path: Path,
) -> None:
    paths = build_zoo(tmp_path, 3, **SMALL)
    assert [p.name for p in paths] == ["m0000.onnx", "m0001.onnx", "m0002.onnx"]
    assert sorted(tmp_path.iterdir()) == paths  # no temporary files left behind
    assert model_name(42) == "m0042"
    assert all(p.stem.islower() and p.stem[0].isalpha() for p in paths)


def test_every_model_maps_a_batch_of_digits_to_10_finite_logits(tmp_path: Path) -> None:
    path = build_zoo(tmp_path, 1, **SMALL)[0]
    for batch in (1, 4, 16):
        logits = _logits(path, digits_like(np.random.default_rng(batch), batch))
        assert logits.shape == (batch, 10)
        assert np.all(np.isfinite(logits))
    assert digits_like(np.random.default_rng(0), 2).shape == (2, INPUT_DIM)


def test_models_have_distinct_weights_reproducible_from_the_seed(tmp_path: Path) -> None:
    first = build_zoo(tmp_path / "a", 2, seed=5, **SMALL)
    again = build_zoo(tmp_path / "b", 2, seed=5, **SMALL)
    other = build_zoo(tmp_path / "c", 1, seed=6, **SMALL)
    assert first[0].read_bytes() == again[0].read_bytes()
    assert first[0].read_bytes() != first[1].read_bytes()
    assert first[0].read_bytes() != other[0].read_bytes()
    x = digits_like(np.random.default_rng(0), 4)
    assert not np.allclose(_logits(first[0], x), _logits(first[1], x))


def test_a_rerun_keeps_the_files_of_the_right_size_and_rewrites_the_others(
    tmp_path: Path,
) -> None:
    paths = build_zoo(tmp_path, 3, **SMALL)
    assert {p.stat().st_size for p in paths} == {model_size(**SMALL)}
    os.utime(paths[0], (0, 0))
    paths[1].write_bytes(b"torn")
    build_zoo(tmp_path, 3, **SMALL)
    assert paths[0].stat().st_mtime == 0  # kept as it was
    assert paths[1].stat().st_size == model_size(**SMALL)
    assert _weights(paths[1])[0].shape == (INPUT_DIM, 32)


def test_a_rerun_with_another_seed_or_shape_writes_every_model_again(tmp_path: Path) -> None:
    first = build_zoo(tmp_path, 2, seed=1, **SMALL)[0].read_bytes()
    second = build_zoo(tmp_path, 2, seed=2, **SMALL)[0].read_bytes()
    assert len(first) == len(second)
    assert first != second
    assert build_zoo(tmp_path, 2, seed=2, width=16, narrow=8)[0].stat().st_size == model_size(16, 8)


def test_the_default_model_holds_about_2_mib_of_weights() -> None:
    assert parameters() == 64 * 1024 + 1024 + 1024 * 448 + 448 + 448 * 10 + 10
    assert 2.0 * 2**20 < model_size() < 2.1 * 2**20


def test_an_empty_zoo_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="count must be at least 1, got 0"):
        build_zoo(tmp_path, 0)
