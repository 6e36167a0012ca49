"""bench.fast_path's summary: medians over the rounds, ratios to the baseline, CPU per input."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from bench.fast_path import FAST_PATH, MANY, POINTS, SYSTEMS, _busy_s, by_round, start, table


def _rows(system: str, rate: float, cpu_us: list[float]) -> list[dict]:
    rows = []
    for k, cpu in enumerate(cpu_us):
        for point in POINTS if system != "baseline" else POINTS[:4]:
            many = point in MANY
            rows.append(
                {
                    "round": k,
                    "system": system,
                    "point": point,
                    "inputs_per_s": rate * (8 if many else 1) + k,
                    "p50_ms": 2.0,
                    "machine_cpu_us": cpu,
                }
            )
    return rows


def test_the_table_gives_the_median_cpu_an_input_and_its_ratio_to_the_baseline() -> None:
    rows = _rows("baseline", 1000.0, [200.0, 250.0, 900.0])  # one slow round: the median holds
    rows += _rows("raysrv", 500.0, [400.0, 500.0, 450.0])
    rows += _rows("raysrv-colocated", 800.0, [300.0, 375.0, 1.0])
    text = table(rows, 32)
    lines = {line.split(" | ")[0]: line for line in text.splitlines() if line.startswith("| ")}
    assert lines["| baseline"].endswith("| 250 |")
    assert lines["| raysrv"].endswith("| 450 |")
    assert "| 1001 |" in lines["| baseline"]  # inputs/s: the median of 1000, 1001, 1002
    summary = {line.split(" over ")[0]: line for line in text.splitlines() if " over " in line}
    assert set(summary) == set(SYSTEMS[1:])
    assert "the machine's CPU an HTTP input 1.80x" in summary["raysrv"]  # 450 / 250
    assert "the machine's CPU an HTTP input 1.20x" in summary["raysrv-colocated"]  # 300 / 250
    assert "HTTP inputs/s 0.50x" in summary["raysrv"]  # 501 / 1001
    assert "raysrv-colocated, HTTP inputs/s against the baseline's by round: 0.80x," in text


def test_each_rounds_ratio_is_over_the_baselines_saturation_in_that_round() -> None:
    rows = [
        {"round": k, "system": system, "point": point, "inputs_per_s": rate}
        for k, base in enumerate((1000.0, 2000.0, 500.0))
        for system, point, rate in (
            ("baseline", "http-32", base),
            ("baseline", "http-1", 1.0),  # another point: not the ratio's
            ("raysrv-colocated", "http-32", 900.0),
            ("raysrv-colocated", "http-32-model", 1000.0),
        )
    ]
    assert by_round(rows, "raysrv-colocated") == "0.90x, 0.45x, 1.80x"
    assert by_round(rows, "raysrv-colocated", "http-32-model") == "1.00x, 0.50x, 2.00x"
    assert by_round(rows, "raysrv") == "none"  # not measured


def test_the_machine_busy_time_is_in_seconds_and_counts_this_process_spinning() -> None:
    before, wall = _busy_s(), time.monotonic()
    start = time.process_time()
    while time.process_time() - start < 0.3:
        pass
    busy, elapsed = _busy_s() - before, time.monotonic() - wall
    assert 0.25 <= busy <= elapsed * (os.cpu_count() or 1) + 0.05


def test_a_bench_that_drives_wrk_exits_naming_it_before_starting_ray_without_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in FAST_PATH:  # set as Ray is about to start: they stay unset
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on it: no wrk
    with pytest.raises(SystemExit, match="wrk is not on the PATH.*apt-get install wrk"):
        start(serve_proxy=False)
    assert not set(FAST_PATH) & set(os.environ)
