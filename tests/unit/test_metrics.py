"""The requests' latency histogram, summed in the ingress and handed to Ray as running totals."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from raysrv.metrics import LATENCY_BOUNDARIES_MS, LE_LABELS, ServeMetrics, Summed


def test_a_value_counts_in_every_bucket_at_or_above_it() -> None:
    summed = Summed([1.0, 2.0, 5.0])
    for value in (0.5, 1.0, 1.5, 5.0, 7.0):  # a value on a bound is at or below it
        summed.observe(value)
    assert summed.cumulative() == [2, 3, 4, 5]
    assert (summed.count, summed.total) == (5, pytest.approx(15.0))


class _Gauge:
    """Stands in for a Ray gauge: the values set, by their tags."""

    def __init__(self) -> None:
        self.values: dict[tuple[tuple[str, str], ...], float] = {}

    def set(self, value: float, tags: dict[str, str]) -> None:
        self.values[tuple(sorted(tags.items()))] = value


def _serve_metrics() -> tuple[ServeMetrics, _Gauge, _Gauge, _Gauge]:
    """ServeMetrics outside Serve (Ray's metrics then record nothing), its latency gauges
    replaced by recorders."""
    metrics = ServeMetrics()
    gauges = _Gauge(), _Gauge(), _Gauge()
    metrics._latency_buckets, metrics._latency_sum, metrics._latency_count = gauges
    return metrics, *gauges


def _bucket(gauge: _Gauge, app: str, le: str) -> Any:
    return gauge.values.get((("app", app), ("le", le)))


def test_the_latency_reaches_ray_as_a_histogram_s_running_totals_once_a_flush() -> None:
    metrics, buckets, sums, counts = _serve_metrics()

    async def requests() -> None:  # in a loop, as in Serve: flushed a second later
        for ms in (0.5, 3.0, 3.0):
            metrics.request("a", 200, ms / 1000.0)
        metrics.request("b", 200, 20.0)  # past the last bound
        metrics.request("a", 429)  # refused: counted, no latency
        assert buckets.values == {}  # nothing reaches Ray before the flush
        metrics.flush()

    asyncio.run(requests())
    assert len(LE_LABELS) == len(LATENCY_BOUNDARIES_MS) + 1
    assert [_bucket(buckets, "a", le) for le in ("1.0", "2.0", "5.0", "+Inf")] == [1, 1, 3, 3]
    assert [_bucket(buckets, "b", le) for le in ("10000.0", "+Inf")] == [0, 1]
    assert sums.values[(("app", "a"),)] == pytest.approx(6.5)
    assert counts.values == {(("app", "a"),): 3, (("app", "b"),): 1}

    buckets.values.clear()
    metrics.request("a", 200, 0.0015)
    metrics.flush()  # totals since the start, and only the apps that changed
    assert {tags[0] for tags in buckets.values} == {("app", "a")}
    assert [_bucket(buckets, "a", le) for le in ("1.0", "2.0", "+Inf")] == [1, 2, 4]
    assert counts.values[(("app", "a"),)] == 4
