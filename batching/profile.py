"""Action profiles: the one record of how long a model's actions take on a kind of worker.

Clockwork (OSDI'20) §5.3 keeps "measurements of past 10 actions duration, stratified by action
type, model and batch size, to predict the duration of future action". :class:`RunTimes` is that
record for one (model, worker kind): the last durations of INFER per batch size, of LOAD and of
UNLOAD. Everything that needs a duration reads it here, each at its own quantile and window:

* the batching policies plan with a tail (``deadline``: the p99 of the last 10 of a size);
* the scheduler predicts when a worker's work in flight ends with the median of the last 10;
* ``GET /v1/models`` and the plan view show the p50 and p99 of the last 100.

Only the scheduler (live or simulated) writes, after a worker reports a measured duration; a
policy only reads, except what it learns for the models of a group together
(:meth:`RunTimes.shared`: the ``deadline`` policy's overruns). A model never measured reads its
group's record (the models declared by one bulk entry share an architecture), and a LOAD never
measured reads the group's loads scaled by the weight bytes, so the first cold start of a model
is planned on its siblings' times.

Sizes never measured are interpolated (:func:`interpolate_batches`).

A size's estimate reads only its measurements of the model's last ``STALE_BATCHES`` batches
while it has any there. A slow spell of the machine (a neighbour busy for a few seconds) fills
the window of every size running then, and a size the policy runs only now and then renews it
at that pace: at 3x overload one spell left the p99 of the last 10 batches of 16 at 134 ms for
17 s against runs of 81-86 ms, 16 planned that long stopped being the size chosen, 0-2 such
batches ran every 2 s, and the replicas served 83% of their capacity within the SLO. A size run
in every batch keeps its whole window this way; one run in one batch of twenty plans on its
last five. In the simulator with 6% run-time noise, ``deadline`` kept within 0.06 points as
many queries within the SLO, ``ctmc`` up to 0.47 fewer, and at most 0.03% of the answers were
late (``bench/RESULTS_ARCHIVE.md``, "ov196-ov205 and jit19").

A size the model stops running keeps its last measurements, and a policy that plans on their
tail may never choose the size again to measure it anew: one slow batch of 2 shut the
benchmark's hot model out of batches of 2 for a whole point, and one slow batch among the last
10 of a model asked less than once a second refused all its queries for the rest of one
(``bench/RESULTS.md``, "The simulator against the live system"). So a size forgets its slowest
measurement, down to one, each time the model runs ``STALE_BATCHES`` batches without one of
the size, and each time its group runs ``STALE_BATCHES`` batches while the model runs none
(done when the record is next read): the estimate of a size left unused, or of a model refused
everything, relaxes towards its fastest measurement, until a run measures the machine as it
is. A model that runs at least once in every ``STALE_BATCHES`` of its group's batches ages its
sizes on its own batches only. Planning on its fastest runs, a model asked every few seconds
gets more of its queries answered and a few more dropped at their deadline (the same
section of ``bench/RESULTS.md`` measures the trade).

Memory: at most ``window`` floats and as many batch counts per measured size, and the sizes of
the last ``STALE_BATCHES`` batches, per model. Reads cost O(sizes) once cached; an observation
costs O(sizes) and invalidates its own size and any that forgot or aged out a measurement, a
read that forgets for an idle model every size.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import deque
from collections.abc import Callable, Hashable
from typing import TypeVar

import numpy as np
from numpy.typing import ArrayLike

__all__ = [
    "DEFAULT_FLOOR_S",
    "STALE_BATCHES",
    "RunProfile",
    "RunTimes",
    "SortedWindow",
    "check_floor",
    "interpolate_batches",
    "monotone_service_times",
]

DEFAULT_FLOOR_S = 1e-6
"""Smallest service time handed to a latency model, in seconds."""

T = TypeVar("T")
DEFAULT_WINDOW = 100  # durations kept per batch size, and per LOAD / UNLOAD
STALE_BATCHES = 100  # a size's estimate reads its runs of the model's last this many batches
# (while it has any), and a size unused this many batches forgets its slowest run
_Cached = dict[tuple[float, int], dict[int, float]]


def check_floor(floor_s: float) -> None:
    if not (math.isfinite(floor_s) and floor_s > 0):
        raise ValueError(f"floor_s must be positive and finite, got {floor_s!r}")


def monotone_service_times(seconds: ArrayLike, floor_s: float = DEFAULT_FLOOR_S) -> np.ndarray:
    """Clip to ``floor_s`` then take the running maximum: positive and non-decreasing in k."""
    check_floor(floor_s)
    arr = np.maximum(np.asarray(seconds, dtype=np.float64), floor_s)
    return np.maximum.accumulate(arr)


def interpolate_batches(sizes: ArrayLike, seconds: ArrayLike, query: ArrayLike) -> np.ndarray:
    """Service time at ``query`` batch sizes from measured ``(sizes, seconds)``, sizes ascending.

    Linear between measured sizes, the smallest measured value below them. Above the largest,
    the line through the last two measured sizes, kept between the largest measured value
    (never decreasing) and proportional scaling ``seconds[-1] * query / sizes[-1]`` (never
    dearer per query than the largest measured batch); proportional from a single size.
    An affine cost ``a + b k`` is extended exactly, so a batcher that has only seen small
    batches under light load does not overrate large ones when a burst comes.
    """
    xs = np.asarray(sizes, dtype=np.float64)
    ys = np.asarray(seconds, dtype=np.float64)
    q = np.asarray(query, dtype=np.float64)
    inside = np.interp(q, xs, ys)
    proportional = ys[-1] * q / xs[-1]
    if xs.size >= 2:
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        beyond = np.clip(ys[-1] + slope * (q - xs[-1]), ys[-1], proportional)
    else:
        beyond = proportional
    return np.where(q > xs[-1], beyond, inside)


def _last(samples: deque[float], window: int) -> list[float]:
    start = max(0, len(samples) - window)
    return list(itertools.islice(samples, start, None))


def _quantile(values: list[float], q: float) -> float:
    """numpy's default (linear) quantile, without numpy's per-call cost on a short list."""
    return _sorted_quantile(sorted(values), q)


def _sorted_quantile(ordered: list[float], q: float) -> float:
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


class SortedWindow:
    """The last ``capacity`` values, also kept sorted: a quantile then costs an insertion per
    value rather than a sort or a numpy call over the window (tens of microseconds)."""

    def __init__(self, capacity: int) -> None:
        self._order: deque[float] = deque()
        self._sorted: list[float] = []
        self._capacity = capacity

    def __len__(self) -> int:
        return len(self._order)

    def add(self, value: float) -> None:
        if len(self._order) == self._capacity:
            del self._sorted[bisect.bisect_left(self._sorted, self._order.popleft())]
        self._order.append(value)
        bisect.insort(self._sorted, value)

    def quantile(self, q: float) -> float:
        """numpy's default (linear) rule; the window must not be empty."""
        return _sorted_quantile(self._sorted, q)

    def replace_last(self, value: float) -> None:
        """Put ``value`` in place of the value added last (the window must not be empty)."""
        del self._sorted[bisect.bisect_left(self._sorted, self._order.pop())]
        self._order.append(value)
        bisect.insort(self._sorted, value)


class _Series:
    """Durations of one action kind (LOAD or UNLOAD): the last ``capacity`` of them."""

    def __init__(self, capacity: int) -> None:
        self.samples: deque[float] = deque(maxlen=capacity)
        self._cache: dict[tuple[float, int], float] = {}

    def observe(self, seconds: float) -> None:
        self.samples.append(seconds)
        self._cache.clear()

    def quantile(self, q: float, window: int) -> float | None:
        if not self.samples:
            return None
        key = (q, window)
        if key not in self._cache:
            self._cache[key] = _quantile(_last(self.samples, window), q)
        return self._cache[key]


class RunTimes:
    """Measured durations of one model on one kind of worker (see the module docstring).

    ``version`` changes whenever an estimate read from here may have changed, so a reader may
    cache what it derived until then.
    """

    def __init__(self, window: int = DEFAULT_WINDOW, group: RunTimes | None = None) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self._capacity = window
        self._group = group
        self._infer: dict[int, deque[float]] = {}
        self._batches = 0  # INFERs observed, of every model when this is a group's record
        self._taken: dict[int, deque[int]] = {}  # per size, ``_batches`` at each measurement
        self._ran: deque[int] = deque(maxlen=STALE_BATCHES)  # the sizes of its last batches
        self._idle_from = 0  # the group's ``_batches`` at this model's last batch
        self._idle_forgot = 0  # rounds of ``_forget_idle`` since then
        self._cache: _Cached = {}
        self._load = _Series(window)
        self._unload = _Series(window)
        self._version = 0
        self._shared: dict[Hashable, object] = {}
        self.weight_bytes: int | None = None  # of the model, once known (scales group loads)

    # -- writing (the scheduler) -----------------------------------------------------------

    def require(self, window: int) -> None:
        """Keep at least ``window`` durations per size (a reader's window)."""
        if window > self._capacity:
            self._capacity = window
            self._infer = {k: deque(v, maxlen=window) for k, v in self._infer.items()}
            self._taken = {k: deque(v, maxlen=window) for k, v in self._taken.items()}
            self._load.samples = deque(self._load.samples, maxlen=window)
            self._unload.samples = deque(self._unload.samples, maxlen=window)

    def observe(self, size: int, seconds: float) -> None:
        """One INFER of a batch of ``size`` ran for ``seconds``."""
        _check(size, seconds)
        self._infer.setdefault(size, deque(maxlen=self._capacity)).append(float(seconds))
        self._batches += 1
        self._taken.setdefault(size, deque(maxlen=self._capacity)).append(self._batches)
        # the batch now ``STALE_BATCHES`` old: its size's recent measurements lose it
        aged = [self._ran[0]] if len(self._ran) == STALE_BATCHES else []
        self._ran.append(size)
        changed = [size, *aged, *self._forget_unused()]
        for table in self._cache.values():
            for k in changed:
                table.pop(k, None)
        self._version += 1
        if self._group is not None:
            self._group.observe(size, seconds)
            self._idle_from, self._idle_forgot = self._group._batches, 0

    def _forget_unused(self) -> list[int]:
        """Each size whose last run is a multiple of ``STALE_BATCHES`` of the model's batches
        ago drops its slowest measurement, while it has more than one; the sizes that did."""
        forgot = []
        for k, taken in self._taken.items():
            idle = self._batches - taken[-1]
            if idle and idle % STALE_BATCHES == 0 and len(taken) > 1:
                self._drop_slowest(k)
                forgot.append(k)
        return forgot

    def _drop_slowest(self, size: int) -> None:
        samples = self._infer[size]
        at = samples.index(max(samples))
        del samples[at]
        del self._taken[size][at]

    def _recent(self, size: int) -> int:
        """How many of the measurements of ``size`` are of the last ``STALE_BATCHES`` batches."""
        taken = self._taken[size]
        return len(taken) - bisect.bisect_right(taken, self._batches - STALE_BATCHES)

    def _forget_idle(self) -> None:
        """Each ``STALE_BATCHES`` batches of the group since the model's last batch, every size
        of the model drops its slowest measurement, while it has more than one."""
        if self._group is None or not self._infer:
            return
        due = (self._group._batches - self._idle_from) // STALE_BATCHES - self._idle_forgot
        if due <= 0:
            return
        self._idle_forgot += due
        for k, samples in self._infer.items():
            for _ in range(min(due, len(samples) - 1)):
                self._drop_slowest(k)
        self._cache.clear()
        self._version += 1

    def observe_load(self, seconds: float, weight_bytes: int | None = None) -> None:
        """One LOAD took ``seconds``; ``weight_bytes`` is what it brought into memory."""
        _check(1, seconds)
        self._load.observe(float(seconds))
        if weight_bytes is not None:
            self.weight_bytes = int(weight_bytes)
        self._version += 1
        if self._group is not None:
            self._group.observe_load(seconds, weight_bytes)

    def observe_unload(self, seconds: float) -> None:
        _check(1, seconds)
        self._unload.observe(float(seconds))
        self._version += 1
        if self._group is not None:
            self._group.observe_unload(seconds)

    def shared(self, key: Hashable, make: Callable[[], T]) -> T | None:
        """What a reader learns from every model of this record's group, under ``key``, made
        by ``make`` on first use; None when the model has no group."""
        if self._group is None:
            return None
        kept = self._group._shared
        if key not in kept:
            kept[key] = make()
        return kept[key]  # type: ignore[return-value]

    # -- reading ---------------------------------------------------------------------------

    @property
    def version(self) -> tuple[int, int]:
        self._forget_idle()
        group = self._group._version if self._group is not None and not self._infer else 0
        return self._version, group

    def measured(self) -> bool:
        """Whether a batch of this model itself was measured (not only its group)."""
        return bool(self._infer)

    def count(self, size: int) -> int:
        """Durations of batches of ``size`` measured on this model."""
        self._forget_idle()
        return len(self._infer.get(size, ()))

    def table(self, quantile: float = 0.99, window: int = 10) -> dict[int, float]:
        """The ``quantile`` of the last ``window`` durations of each measured size, ascending,
        of those of the last ``STALE_BATCHES`` batches where the size has any; the group's when
        this model has none measured; empty when neither has."""
        if not self._infer:
            return {} if self._group is None else self._group.table(quantile, window)
        self._forget_idle()
        cached = self._cache.setdefault((quantile, window), {})
        if len(cached) != len(self._infer):
            for size, samples in self._infer.items():
                if size not in cached:
                    recent = min(window, self._recent(size)) or window
                    cached[size] = _quantile(_last(samples, recent), quantile)
        return {k: cached[k] for k in sorted(cached)}

    def estimate(self, size: int, quantile: float = 0.99, window: int = 10) -> float | None:
        """Seconds a batch of ``size`` should take at ``quantile``: measured, else interpolated
        between measured sizes; None when nothing was measured."""
        table = self.table(quantile, window)
        if not table:
            return None
        if size in table:
            return table[size]
        return float(interpolate_batches(list(table), list(table.values()), size))

    def service_times(
        self,
        max_batch: int,
        quantile: float = 0.99,
        window: int = 10,
        running_max: bool = True,
        floor_s: float = DEFAULT_FLOOR_S,
    ) -> np.ndarray | None:
        """``S_1 .. S_max_batch`` (element k-1: a batch of k); None when nothing was measured.

        With ``running_max`` never decreasing in the size (what the latency models assume);
        without, each size's own estimate: some runtimes run a larger batch faster."""
        table = self.table(quantile, window)
        if not table:
            return None
        sizes = np.arange(1, max_batch + 1)
        raw = interpolate_batches(list(table), list(table.values()), sizes)
        return monotone_service_times(raw, floor_s) if running_max else np.maximum(raw, floor_s)

    def samples(self, window: int | None = None) -> dict[int, tuple[float, ...]]:
        """The last ``window`` (default: all kept) durations of each measured size."""
        keep = window or self._capacity
        self._forget_idle()
        return {k: tuple(_last(self._infer[k], keep)) for k in sorted(self._infer)}

    def load_time(self, quantile: float = 0.99, window: int = 10) -> float | None:
        """Seconds a LOAD of this model should take: its own measurements, else its group's
        scaled by weight bytes; None when neither was measured."""
        own = self._load.quantile(quantile, window)
        if own is not None or self._group is None:
            return own
        group = self._group.load_time(quantile, window)
        if group is None:
            return None
        mine, theirs = self.weight_bytes, self._group.weight_bytes
        return group * mine / theirs if mine and theirs else group

    def unload_time(self, quantile: float = 0.99, window: int = 10) -> float | None:
        own = self._unload.quantile(quantile, window)
        if own is not None or self._group is None:
            return own
        return self._group.unload_time(quantile, window)

    def loads_measured(self) -> int:
        return len(self._load.samples)


def _check(size: int, seconds: float) -> None:
    if size < 1:
        raise ValueError(f"batch size must be >= 1, got {size}")
    if not (np.isfinite(seconds) and seconds >= 0):
        raise ValueError(f"seconds must be finite and >= 0, got {seconds!r}")


class RunProfile:
    """Every model's :class:`RunTimes` on every kind of worker, and their groups'."""

    def __init__(self, window: int = DEFAULT_WINDOW) -> None:
        self._window = window
        self._runs: dict[tuple[Hashable, Hashable], RunTimes] = {}
        self._groups: dict[tuple[Hashable, Hashable], RunTimes] = {}

    def runs(self, model: Hashable, kind: Hashable = "", group: Hashable = None) -> RunTimes:
        """The record of ``model`` on ``kind``; created on first use, reading ``group``'s
        record until the model itself is measured."""
        key = (model, kind)
        if key not in self._runs:
            shared = None
            if group is not None:
                shared = self._groups.setdefault((group, kind), RunTimes(self._window))
            self._runs[key] = RunTimes(self._window, shared)
        return self._runs[key]

    def forget(self, model: Hashable, kind: Hashable = "") -> None:
        """Drop ``model``'s record (a model no longer served)."""
        self._runs.pop((model, kind), None)
