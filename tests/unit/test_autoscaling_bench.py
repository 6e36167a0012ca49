"""The elastic-capacity benchmark's own arithmetic (``bench.autoscaling``): the trace's ramp and
spikes, and what its summary counts, on hand-made logs."""

from __future__ import annotations

import numpy as np
import pytest

from bench.autoscaling import SPIKE, arrivals, rates, summarize, trace_seconds
from bench.loadgen import RequestLog


def test_the_trace_ramps_spikes_and_comes_back_down() -> None:
    t = np.array([0.0, 10.0, 40.0, 59.9, 61.0, 64.0, 70.5, 100.0, 130.0])
    assert rates(t).tolist() == pytest.approx([20, 20, 90, 160, 260, 160, 260, 90, 20], abs=0.5)
    assert trace_seconds(2.0) == 2 * trace_seconds(1.0)
    assert rates(2.0 * t, scale=2.0).tolist() == pytest.approx(rates(t).tolist())
    times = arrivals(1.0, np.random.default_rng(0))
    expected = np.trapezoid(rates(np.linspace(0, 140, 14_001)), dx=0.01)
    assert len(times) == pytest.approx(expected, rel=0.03)
    first, _, every, lasting, extra = SPIKE
    spiking = (times >= first) & (np.mod(times - first, every) < lasting) & (times < 90)
    plateau = (times >= first) & (times < 90) & ~spiking
    spike_rate = spiking.sum() / (3 * lasting)
    assert spike_rate == pytest.approx(160 + extra, rel=0.15)
    assert plateau.sum() / (30 - 3 * lasting) == pytest.approx(160, rel=0.1)


def test_the_summary_counts_what_went_wrong_after_a_scale_down() -> None:
    log = RequestLog()
    # (scheduled, latency, status): on time, late, refused, no answer, late 1 s after the drop
    for scheduled, latency, status in [
        (1.0, 0.1, 200),
        (2.0, 0.5, 200),
        (3.0, 0.01, 429),
        (4.0, 30.0, 0),
        (6.0, 0.4, 200),
        (9.5, 0.1, 200),
    ]:
        log.scheduled.append(scheduled)
        log.done.append(scheduled + latency)
        log.status.append(status)
    samples = [(0.0, 2, 2), (5.0, 2, 1), (5.5, 1, 1), (10.0, 1, 1)]  # one drop, at 5.5 s
    out = summarize(log, samples, slo_s=0.25, duration=10.0)
    assert (out["offered"], out["late"], out["refused"], out["failed"]) == (6, 2, 1, 1)
    assert out["within_slo"] == pytest.approx(2 / 6)
    assert out["scale_downs"] == 1
    assert out["late_or_failed_after_down"] == 1  # the late answer at 6.0 s, not the one at 2.0
    assert out["worker_seconds"] == pytest.approx(2 * 5.0 + 1.5 * 0.5 + 1 * 4.5)
    assert out["max_workers"] == 2
