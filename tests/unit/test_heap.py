"""raysrv._heap: the serving processes' heap frozen after start-up, their young generation
collected at CPython's threshold unless the environment sets another."""

from __future__ import annotations

import gc
import sys
import weakref
from collections.abc import Iterator

import pytest

from raysrv._heap import YOUNG_ENV, settle, young_objects

RAISED = 20_000


@pytest.fixture
def restored() -> Iterator[None]:
    """The collector's thresholds and frozen objects as they were before the test."""
    before = gc.get_threshold()
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()


@pytest.fixture
def alone() -> Iterator[None]:
    """This thread keeps the interpreter until it waits on something: the test counts the objects
    it makes, and another thread's (a Ray client's, in the full suite) would run a pass early."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(60.0)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def test_settle_freezes_the_heap_and_leaves_the_thresholds_unless_told(
    restored: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(YOUNG_ENV, raising=False)
    gc.set_threshold(700, 10, 10)
    settle()
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (700, 10, 10)


def test_the_environment_raises_only_the_young_threshold(
    restored: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(YOUNG_ENV, str(RAISED))
    gc.set_threshold(700, 9, 8)
    settle()
    assert gc.get_threshold() == (RAISED, 9, 8)


def test_a_cycle_made_after_settling_at_a_raised_threshold_is_still_collected_unasked(
    restored: None, alone: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(YOUNG_ENV, str(RAISED))
    settle()
    first, second = _Node(), _Node()
    first.other, second.other = second, first
    gone = weakref.ref(first)
    del first, second
    assert gone() is not None  # a cycle: only the collector frees it
    kept = [[] for _ in range(RAISED + 1)]  # past the threshold: the young pass runs
    assert gone() is None
    assert len(kept) == RAISED + 1


@pytest.mark.parametrize("given", ["0", "-5", "many", "", "1e4"])
def test_a_threshold_that_is_not_a_positive_integer_names_the_variable(
    given: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(YOUNG_ENV, given)
    with pytest.raises(ValueError, match=f"{YOUNG_ENV} must be a positive integer, got '{given}'"):
        young_objects()
