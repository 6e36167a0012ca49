"""bench.gil_release's measure: every call counted, the other thread run beside it only when
asked, and stopped after."""

from __future__ import annotations

import threading

from bench.gil_release import calls_per_s


def test_it_counts_the_calls_and_runs_the_other_thread_only_when_asked() -> None:
    made = [0]

    def call() -> None:
        made[0] += 1

    threads = threading.active_count()
    rate, spun = calls_per_s(call, 0.05, contended=False)
    assert rate > 0
    assert spun == 0.0
    assert made[0] >= 100
    assert made[0] % 100 == 0  # whole rounds of 100
    rate, spun = calls_per_s(call, 0.05, contended=True)
    assert rate > 0
    assert spun > 0
    assert threading.active_count() == threads  # the other thread ended with the measure
