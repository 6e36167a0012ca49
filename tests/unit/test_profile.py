"""Action profiles (clockwork §5.3): one record of run times per model, read at any quantile."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raysrv.batching.profile import STALE_BATCHES, RunProfile, RunTimes

FAST = settings(max_examples=60, deadline=None)


def test_a_window_reads_only_the_latest_measurements() -> None:
    runs = RunTimes(window=3)
    for seconds in [100.0, 1.0, 2.0, 3.0]:
        runs.observe(4, seconds)
    assert runs.count(4) == 3
    assert runs.estimate(4, quantile=0.5, window=3) == pytest.approx(2.0)
    assert runs.estimate(4, quantile=0.5, window=1) == pytest.approx(3.0)


def test_estimates_match_numpy_on_the_window() -> None:
    values = np.random.default_rng(11).lognormal(-4.0, 0.3, size=25)
    runs = RunTimes()
    for v in values:
        runs.observe(8, float(v))
    assert runs.estimate(8, 0.99, 10) == pytest.approx(float(np.quantile(values[-10:], 0.99)))
    assert runs.estimate(8, 0.5, 25) == pytest.approx(float(np.median(values)))


def test_nothing_measured_reads_none() -> None:
    runs = RunTimes()
    assert runs.estimate(1) is None
    assert runs.service_times(4) is None
    assert runs.table() == {}
    assert runs.load_time() is None
    assert runs.count(1) == 0


def test_unseen_batch_sizes_interpolate_between_neighbours() -> None:
    runs = RunTimes()
    for size, seconds in [(2, 0.02), (4, 0.04), (8, 0.10)]:
        runs.observe(size, seconds)
    assert runs.estimate(4) == pytest.approx(0.04)
    assert runs.estimate(3) == pytest.approx(0.03)
    assert runs.estimate(6) == pytest.approx(0.07)
    assert runs.estimate(1) == pytest.approx(0.02)
    assert runs.estimate(16) == pytest.approx(0.20)


def test_service_times_are_monotone_unless_asked_per_size() -> None:
    runs = RunTimes()
    runs.observe(1, 0.05)
    runs.observe(2, 0.03)  # faster than a batch of 1: raised for the latency models
    runs.observe(4, 0.08)
    np.testing.assert_allclose(runs.service_times(5), [0.05, 0.05, 0.055, 0.08, 0.10])
    np.testing.assert_allclose(
        runs.service_times(5, running_max=False), [0.05, 0.03, 0.055, 0.08, 0.10]
    )


def test_a_model_never_run_reads_its_groups_record_until_it_runs() -> None:
    profile = RunProfile()
    sibling = profile.runs("m1", "cpu", group="zoo")
    fresh = profile.runs("m2", "cpu", group="zoo")
    sibling.observe(1, 0.010)
    sibling.observe_load(0.030, weight_bytes=2_000_000)
    assert fresh.estimate(1) == pytest.approx(0.010)
    fresh.weight_bytes = 4_000_000
    assert fresh.load_time() == pytest.approx(0.060)  # scaled by weight bytes
    before = fresh.version
    fresh.observe(1, 0.002)
    assert fresh.version != before
    assert fresh.estimate(1) == pytest.approx(0.002)
    assert sibling.estimate(1) == pytest.approx(0.010)


def test_the_version_moves_when_a_group_estimate_moves() -> None:
    profile = RunProfile()
    fresh = profile.runs("m2", "cpu", group="zoo")
    before = fresh.version
    profile.runs("m1", "cpu", group="zoo").observe(1, 0.01)
    assert fresh.version != before


def test_a_reader_with_a_longer_window_keeps_more() -> None:
    runs = RunTimes(window=5)
    runs.require(20)
    for i in range(30):
        runs.observe(1, float(i))
    assert runs.count(1) == 20


def test_kinds_are_kept_apart() -> None:
    profile = RunProfile()
    profile.runs("m", "cpu").observe(1, 0.01)
    assert profile.runs("m", "gpu").estimate(1) is None


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: RunTimes(window=0), "window must be >= 1, got 0"),
        (lambda: RunTimes().observe(1, -0.1), "seconds must be finite"),
        (lambda: RunTimes().observe(0, 0.1), "batch size must be >= 1"),
        (lambda: RunTimes().observe_load(float("nan")), "seconds must be finite"),
    ],
)
def test_validation_names_the_argument(call: Callable[[], object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()


@FAST
@given(
    values=st.lists(st.floats(0.0, 10.0), min_size=1, max_size=40),
    window=st.integers(1, 12),
    quantile=st.floats(0.0, 1.0),
)
def test_an_estimate_stays_within_its_window(
    values: list[float], window: int, quantile: float
) -> None:
    runs = RunTimes()
    for v in values:
        runs.observe(2, v)
    kept = values[-window:]
    estimate = runs.estimate(2, quantile, window)
    assert estimate is not None
    assert min(kept) - 1e-12 <= estimate <= max(kept) + 1e-12
    assert estimate == pytest.approx(float(np.quantile(kept, quantile)))


@FAST
@given(
    measured=st.dictionaries(st.integers(1, 32), st.floats(0.0, 1.0), min_size=1, max_size=8),
    max_batch=st.integers(1, 48),
)
def test_service_times_positive_and_non_decreasing(
    measured: dict[int, float], max_batch: int
) -> None:
    runs = RunTimes()
    for size, seconds in measured.items():
        runs.observe(size, seconds)
    times = runs.service_times(max_batch)
    assert times is not None
    assert times.shape == (max_batch,)
    assert np.all(times > 0)
    assert np.all(np.diff(times) >= 0)


def test_a_size_left_unused_forgets_its_slowest_runs_down_to_one() -> None:
    runs = RunTimes()
    for seconds in (0.012, 0.013, 0.120):  # one slow batch of 2 among fast ones
        runs.observe(2, seconds)
    assert runs.estimate(2) == pytest.approx(np.quantile([0.012, 0.013, 0.120], 0.99))
    for _ in range(STALE_BATCHES - 1):
        runs.observe(1, 0.010)
    assert runs.count(2) == 3  # not yet stale
    runs.observe(1, 0.010)
    assert runs.count(2) == 2
    assert runs.estimate(2) == pytest.approx(np.quantile([0.012, 0.013], 0.99))
    for _ in range(5 * STALE_BATCHES):
        runs.observe(1, 0.010)
    assert runs.samples()[2] == (0.012,)  # its fastest stays: the size is still measured
    assert runs.count(1) == 100  # the size that runs keeps its window


def test_a_model_left_unused_forgets_as_its_group_runs() -> None:
    """A model whose queries are all refused runs no batch of its own; its group's batches age
    its sizes, and the forgetting shows in the version a reader caches on."""
    profile = RunProfile()
    rare = profile.runs("rare", group="zoo")
    busy = profile.runs("busy", group="zoo")
    for seconds in (0.012, 0.013, 0.120):
        rare.observe(1, seconds)
    seen = rare.version
    for _ in range(STALE_BATCHES - 1):
        busy.observe(1, 0.010)
    assert rare.version == seen  # the group's batches alone are not news to this model
    assert rare.count(1) == 3
    busy.observe(1, 0.010)
    assert rare.version != seen
    assert rare.estimate(1) == pytest.approx(np.quantile([0.012, 0.013], 0.99))
    for _ in range(3 * STALE_BATCHES):
        busy.observe(1, 0.010)
    assert rare.samples()[1] == (0.012,)
    assert busy.count(1) == 100  # its own size runs: kept whole


def test_a_model_that_keeps_running_ages_its_sizes_on_its_own_batches() -> None:
    profile = RunProfile()
    hot = profile.runs("hot", group="zoo")
    other = profile.runs("other", group="zoo")
    for seconds in (0.012, 0.120):
        hot.observe(2, seconds)
    for _ in range(STALE_BATCHES - 1):  # the group runs 99 of every 100 batches
        for _ in range(STALE_BATCHES - 1):
            other.observe(1, 0.010)
        hot.observe(1, 0.010)
    assert hot.count(2) == 2
    hot.observe(1, 0.010)
    assert hot.samples()[2] == (0.012,)


def test_a_size_run_now_and_then_plans_on_its_runs_of_the_last_batches() -> None:
    """A slow spell fills the window of 16, then 16 runs once in twenty batches: its estimate
    reads its runs of the last ``STALE_BATCHES`` batches, not the spell's."""
    runs = RunTimes()
    for _ in range(10):
        runs.observe(16, 0.134)
    for i in range(1, STALE_BATCHES):
        runs.observe(16 if i % 20 == 0 else 8, 0.085 if i % 20 == 0 else 0.045)
    # the last 100 batches hold the spell's last run and four since
    assert runs.estimate(16) == pytest.approx(np.quantile([0.134] + [0.085] * 4, 0.99))
    runs.observe(8, 0.045)
    assert runs.estimate(16) == pytest.approx(0.085)
    assert runs.count(16) == 14  # kept, not read
    assert runs.estimate(8) == pytest.approx(0.045)


def test_a_size_plans_on_its_runs_of_the_last_batches_else_on_its_last_ones() -> None:
    runs = RunTimes()
    for seconds in (0.012, 0.013, 0.014):  # batches 1-3
        runs.observe(2, seconds)
    for _ in range(STALE_BATCHES - 2):
        runs.observe(1, 0.010)
    assert runs.estimate(2, 0.5) == pytest.approx(0.0135)  # the first of 2's runs is old
    runs.observe(1, 0.010)
    assert runs.estimate(2, 0.5) == pytest.approx(0.014)  # the last alone is recent
    runs.observe(1, 0.010)  # none recent, and 2 unused: it forgets its slowest as before
    assert runs.samples()[2] == (0.012, 0.013)
    assert runs.estimate(2, 0.5) == pytest.approx(0.0125)  # read whole


def test_a_size_that_keeps_running_keeps_its_slow_runs() -> None:
    runs = RunTimes()
    runs.observe(2, 0.120)
    for i in range(3 * STALE_BATCHES):
        runs.observe(1 if i % 10 else 2, 0.010)
    assert max(runs.samples()[2]) == pytest.approx(0.120)
