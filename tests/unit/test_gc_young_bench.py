"""bench.gc_young's summary: per threshold, each system's median and raysrv's ratio."""

from __future__ import annotations

import pytest

from bench.gc_young import summary


def _points(young: int, baseline: list[float], raysrv: list[float]) -> list[dict]:
    return [
        {"young": young, "system": system, "inputs_per_s": rate}
        for system, rates in (("baseline", baseline), ("raysrv-colocated", raysrv))
        for rate in rates
    ]


def test_each_threshold_gets_its_own_medians_and_ratio() -> None:
    points = _points(700, [5000.0, 6000.0, 9000.0], [3000.0, 2500.0, 100.0])
    points += _points(20000, [6000.0, 6400.0], [3600.0, 3400.0])
    rows = summary(points)
    assert list(rows) == [700, 20000]
    assert rows[700]["baseline"] == 6000.0  # the median holds against one odd point
    assert rows[700]["raysrv-colocated"] == 2500.0
    assert rows[700]["ratio"] == pytest.approx(2500.0 / 6000.0)
    assert rows[20000]["baseline"] == 6200.0
    assert rows[20000]["ratio"] == pytest.approx(3500.0 / 6200.0)
