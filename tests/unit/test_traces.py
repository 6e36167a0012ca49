"""Replaying traces in the Azure Functions trace's format (``bench.traces``), the traces shipped
with the benchmark (one summed, one row per function), the live benchmark's ``trace 50%``
workload, and Zipf arrivals over many models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.traces import (
    MANY_FUNCTIONS,
    MANY_SEED,
    PERIODIC_SPIKES,
    many_function_rows,
    many_functions,
    periodic_spikes,
    read_counts,
    read_functions,
    replay_functions,
    replay_times,
    write_counts,
    zipf_arrivals,
)
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


# Many functions: one row each (read_functions, replay_functions, the shipped many_functions.csv)


def test_function_rows_round_trip_in_the_file_order_with_their_triggers(tmp_path: Path) -> None:
    path = tmp_path / "functions.csv"
    rows = {"b": np.array([0, 2, 1]), "a": np.array([5, 0, 0])}
    write_counts(path, rows, triggers={"a": "timer"})
    assert path.read_text().splitlines()[1:] == [
        "raysrv,bench,b,http,0,2,1",
        "raysrv,bench,a,timer,5,0,0",
    ]
    read = read_functions(path)
    assert list(read) == ["b", "a"]
    for name, counts in rows.items():
        np.testing.assert_array_equal(read[name], counts)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (f"{HEADER},1\nx,y,f,http,1\nx,y,g,http,2\nx,y,f,http,3\n", r"trace.csv:4: .*'f'.*line 2"),
        (f"{HEADER},1,2\nx,y,f,http,1,x\n", r"trace.csv:2: a count is not a number"),
        (f"{HEADER},1,2\nx,y,f,http,1\n", r"trace.csv:2: 5 fields, the header has 6"),
        (f"{HEADER},1\nx,y,f,http,0\n", r"trace.csv: no invocations"),
        (f"{HEADER},1\n", r"trace.csv: no invocations"),
        ("HashOwner,HashApp\n", "header must start with HashOwner"),
    ],
)
def test_a_malformed_function_trace_names_the_line_and_the_fault(
    tmp_path: Path, text: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        read_functions(_write(tmp_path, text))


def test_the_shipped_many_function_trace_is_the_one_its_generator_writes(tmp_path: Path) -> None:
    path = tmp_path / "again.csv"
    write_counts(path, *many_function_rows(np.random.default_rng(MANY_SEED)))
    assert path.read_text() == MANY_FUNCTIONS.read_text()
    assert MANY_FUNCTIONS.stat().st_size < 500_000


@pytest.fixture(scope="module")
def shipped() -> np.ndarray:
    """The shipped many-function trace, functions x minutes, f0000 first."""
    rows = read_functions(MANY_FUNCTIONS)
    assert list(rows) == [f"f{i:04d}" for i in range(1000)]
    return np.vstack(list(rows.values()))


def test_the_many_function_trace_is_heavy_tailed_most_functions_rare(shipped: np.ndarray) -> None:
    assert shipped.shape == (1000, 120)
    means = shipped.mean(axis=1)
    assert np.all(np.diff(means) <= 0)  # f0000 the most invoked, and on down
    share = np.cumsum(means) / means.sum()
    assert 0.2 < share[0] < 0.5  # a few functions heavily invoked...
    assert share[49] > 0.9  # the top 5% take most of the invocations
    assert share[185] == pytest.approx(0.996, abs=0.003)  # Shahrad et al.: 18.6% take 99.6%
    assert np.median(means) < means.mean() / 500  # ...most rarely
    assert np.mean(means <= 1 / 60) == pytest.approx(0.45, abs=0.1)  # at most once an hour
    assert 600 < np.count_nonzero(means) < 800
    assert means[0] / means[means > 0].min() > 1e5  # five orders of magnitude and more


def test_the_many_function_trace_spikes_every_hour_and_less_every_quarter_hour(
    shipped: np.ndarray,
) -> None:
    total = shipped.sum(axis=0) / np.median(shipped.sum(axis=0))
    minute = np.arange(total.size)
    hourly = total[minute % 60 == 0]
    quarter = total[(minute % 15 == 0) & (minute % 60 != 0)]
    quiet = total[(minute % 15 != 0) & (minute % 60 != 1)]
    assert np.all(hourly > 2.0)
    assert np.all((quarter > 1.25) & (quarter < np.min(hourly)))
    assert np.percentile(quiet, 99) < np.min(quarter)
    active = np.count_nonzero(shipped, axis=0)  # the timers fire together at the hour
    assert np.min(active[minute % 60 == 0]) > 1.3 * np.mean(active[minute % 15 != 0])


def test_the_timers_fire_once_every_1_5_15_or_60_minutes(tmp_path: Path) -> None:
    rows, triggers = many_function_rows(np.random.default_rng(MANY_SEED))
    timers = [name for name, trigger in triggers.items() if trigger == "timer"]
    assert len(timers) == 160  # 16% of the functions
    periods = set()
    for name in timers:
        fired = np.flatnonzero(rows[name])
        assert set(rows[name]) <= {0.0, 1.0}
        gaps = set(np.diff(fired).tolist()) or {60}  # an hourly timer fires twice in 120 min
        assert len(gaps) == 1
        periods |= gaps
    assert periods <= {1, 5, 15, 60}
    assert len(periods) >= 3


def test_many_functions_is_deterministic_for_a_seed() -> None:
    a = many_functions(np.random.default_rng(7), functions=50, minutes=30)
    b = many_functions(np.random.default_rng(7), functions=50, minutes=30)
    assert list(a) == [f"f{i:04d}" for i in range(50)]
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])


def test_replay_functions_scales_the_total_rate_and_keeps_each_functions_share() -> None:
    counts = np.array([[10.0] * 100, [20.0] * 100, [70.0] * 100])
    times, index = replay_functions(counts, 50.0, 100.0, np.random.default_rng(0), minute_s=2.0)
    assert np.all(np.diff(times) >= 0)
    assert times.min() >= 0.0
    assert times.max() < 100.0
    assert times.size == pytest.approx(5000, abs=300)  # Poisson: sd about 70
    shares = np.bincount(index, minlength=3) / index.size
    np.testing.assert_allclose(shares, [0.1, 0.2, 0.7], atol=0.02)


def test_replay_functions_maps_each_arrival_to_its_function_and_minute() -> None:
    minutes = np.arange(60)
    counts = {"even": np.where(minutes % 2 == 0, 5.0, 0.0), "odd": np.where(minutes % 2, 5.0, 0.0)}
    times, index = replay_functions(counts, 10.0, 40.0, np.random.default_rng(1), start=10)
    minute = times.astype(int) + 10
    assert set(index.tolist()) == {0, 1}
    assert np.all(minute[index == 0] % 2 == 0)
    assert np.all(minute[index == 1] % 2 == 1)
    same = replay_functions(
        np.vstack(list(counts.values())), 10.0, 40.0, np.random.default_rng(1), start=10
    )
    np.testing.assert_array_equal(same[0], times)
    np.testing.assert_array_equal(same[1], index)


def test_replay_functions_follows_a_spike_in_the_total() -> None:
    counts = np.ones((20, 100))
    counts[3, 50] = 81.0  # minute 50: 5x the total of any other minute
    times, index = replay_functions(counts, 20.0, 100.0, np.random.default_rng(2))
    per_minute = np.bincount(times.astype(int), minlength=100)
    assert per_minute[50] / np.median(per_minute) == pytest.approx(5.0, rel=0.3)
    assert np.mean(index[times.astype(int) == 50] == 3) == pytest.approx(0.81, abs=0.1)


@pytest.mark.parametrize(
    ("counts", "message"),
    [
        (np.ones((3, 20)), "needs 30 minutes of trace"),
        (np.zeros((3, 40)), "no invocations"),
        (np.ones(40), "functions x minutes"),
        (-np.ones((2, 40)), "negative"),
    ],
)
def test_replay_functions_refuses_what_it_cannot_replay(counts: np.ndarray, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        replay_functions(counts, 10.0, 60.0, np.random.default_rng(0), minute_s=2.0)


def test_zipf_arrivals_make_model_0_the_most_popular_by_the_power_law() -> None:
    times, model = zipf_arrivals(200.0, 100.0, 1000, 1.0, np.random.default_rng(3))
    assert np.all(np.diff(times) >= 0)
    assert times.size == pytest.approx(20_000, abs=600)
    counts = np.bincount(model, minlength=1000)
    assert counts.argmax() == 0
    assert counts[0] / counts[9] == pytest.approx(10.0, rel=0.25)  # (10 / 1) ** s
    harmonic = np.sum(1.0 / np.arange(1, 1001))
    assert counts[0] / model.size == pytest.approx(1 / harmonic, rel=0.05)


def test_zipf_arrivals_with_s_0_spread_evenly_and_refuse_bad_arguments() -> None:
    _, model = zipf_arrivals(100.0, 100.0, 4, 0.0, np.random.default_rng(4))
    np.testing.assert_allclose(np.bincount(model) / model.size, 0.25, atol=0.02)
    with pytest.raises(ValueError, match="n_models >= 1"):
        zipf_arrivals(100.0, 10.0, 0, 1.0, np.random.default_rng(0))
