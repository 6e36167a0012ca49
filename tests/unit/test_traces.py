"""Replaying traces in the Azure Functions trace's format (``bench.traces``), the trace shipped
with the benchmark, and the live benchmark's ``trace 50%`` workload."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.traces import PERIODIC_SPIKES, periodic_spikes, read_counts, replay_times, write_counts
from bench.workloads import TRACE_MINUTE_SLOS, TRACE_START, workload

HEADER = "HashOwner,HashApp,HashFunction,Trigger"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text(text)
    return path


def test_counts_round_trip_and_sum_the_chosen_rows(tmp_path: Path) -> None:
    path = tmp_path / "day.csv"
    write_counts(path, {"a": np.array([1, 2, 3]), "b": np.array([10, 0, 5])})
    assert path.read_text().splitlines()[0] == f"{HEADER},1,2,3"
    np.testing.assert_array_equal(read_counts(path), [11, 2, 8])
    np.testing.assert_array_equal(read_counts(path, {"b"}), [10, 0, 5])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("Owner,App,Function,Trigger,1\nx,y,z,http,3\n", "header must start with HashOwner"),
        (f"{HEADER},1,2\nx,y,z,http,3,four\n", r"trace.csv:2: a count is not a number"),
        (f"{HEADER},1,2\nx,y,z,http,3\n", r"trace.csv:2: 5 fields, the header has 6"),
        (f"{HEADER},1,2\nx,y,z,http,0,0\n", "no invocations"),
        ("", "header must start"),
    ],
)
def test_a_malformed_trace_names_the_line_and_the_fault(
    tmp_path: Path, text: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        read_counts(_write(tmp_path, text))


def test_replay_follows_the_counts_at_the_asked_mean_rate() -> None:
    counts = np.array([100.0, 100.0, 300.0, 100.0] * 51)  # minute 2 of every 4: 3x the others
    times = replay_times(counts, 40.0, 200.0, np.random.default_rng(0), minute_s=1.0, start=4)
    assert np.all(np.diff(times) >= 0)
    assert times.min() >= 0.0
    assert times.max() < 200.0
    # 8,000 expected: Poisson's standard deviation is about 90
    assert times.size == pytest.approx(40.0 * 200.0, abs=400)
    per_minute = np.bincount(times.astype(int), minlength=200).reshape(-1, 4).sum(axis=0)
    spike, others = per_minute[2], per_minute[[0, 1, 3]]
    assert spike / others.mean() == pytest.approx(3.0, rel=0.1)


def test_replay_needs_enough_trace() -> None:
    with pytest.raises(ValueError, match="needs 30 minutes of trace"):
        replay_times(np.ones(40), 10.0, 60.0, np.random.default_rng(0), minute_s=2.0, start=20)


def test_the_shipped_trace_is_the_one_its_generator_writes(tmp_path: Path) -> None:
    path = tmp_path / "again.csv"
    write_counts(path, periodic_spikes(np.random.default_rng(2026)))
    assert path.read_text() == PERIODIC_SPIKES.read_text()


def test_the_shipped_trace_spikes_every_hour_and_less_every_15_minutes() -> None:
    counts = read_counts(PERIODIC_SPIKES)
    assert counts.size == 1440  # a day of minutes, as the Azure Functions trace
    minute = np.arange(counts.size)
    hourly = counts[minute % 60 == 0] / counts.mean()
    quarter = counts[(minute % 15 == 0) & (minute % 60 != 0)] / counts.mean()
    quiet = counts[(minute % 15 != 0) & (minute % 60 != 1)] / counts.mean()
    assert np.median(hourly) == pytest.approx(2.1, abs=0.15)
    assert np.median(quarter) == pytest.approx(1.34, abs=0.1)
    assert np.percentile(quiet, 99) < np.min(hourly)
    assert np.percentile(quiet, 99) < np.median(quarter)


def test_the_trace_workload_replays_at_half_the_capacity_with_its_spikes() -> None:
    capacity, slo_s, seconds = 48.0, 0.8, 180.0
    times = workload("trace 50%", capacity, slo_s, seconds)
    np.testing.assert_array_equal(times, workload("trace 50%", capacity, slo_s, seconds))
    assert times.size / seconds == pytest.approx(0.5 * capacity, rel=0.05)
    minute_s = TRACE_MINUTE_SLOS * slo_s
    spikes = [(m - TRACE_START) * minute_s for m in (60, 120)]  # the hourly ones in the window
    in_spike = np.sum([(times >= t) & (times < t + minute_s) for t in spikes]) / (2 * minute_s)
    assert in_spike / capacity == pytest.approx(1.05, rel=0.2)


def test_a_short_row_is_named_even_when_only_some_functions_are_read(tmp_path: Path) -> None:
    path = _write(tmp_path, f"{HEADER},1,2\nx,y\nx,y,z,http,1,2\n")
    with pytest.raises(ValueError, match=r"trace.csv:2: 2 fields, the header has 6"):
        read_counts(path, {"z"})
