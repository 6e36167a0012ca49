"""The query path inside the ingress: validate, select, cache, schedule, combine, remember.

:class:`Server` is Ray-free: it is given the workers of each pool (in production Ray actors, in
tests in-process fakes) and owns the roles that share the ingress process, each its own object:
the selection policies, one prediction cache per app, one :class:`~raysrv._pool.Pool` (a
scheduler over a pool's workers) per pool and the state store. They share a process because
every actor hop costs about a millisecond of CPU per call here: what crosses a process boundary
is a batch or a LOAD, never a single query.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import hashlib
import heapq
import itertools
import json
import logging
import math
import os
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from functools import cache, partial
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from raysrv import batching, policies
from raysrv._model_spec import NUMERIC
from raysrv._planner import predict as predict_plan
from raysrv._pool import Pool
from raysrv._workers import Workers
from raysrv.batching.profile import SortedWindow
from raysrv.cache import JoinExpired, PredictionCache, cache_key
from raysrv.config import (
    AppLive,
    AppSpec,
    Input,
    InputSpec,
    LiveConfig,
    ModelLive,
    ModelSpec,
    RaysrvSpec,
    SelectionSpec,
)
from raysrv.errors import (
    BadRequest,
    Conflict,
    DeadlineExpired,
    NotFound,
    PayloadTooLarge,
    RaysrvError,
    Rejected,
)
from raysrv.metrics import UNKNOWN_APP, Metrics
from raysrv.policies.base import State
from raysrv.policies.feedback import FeedbackParams, check_label
from raysrv.state import MemoryStore, StateStore

logger = logging.getLogger(__name__)

__all__ = [
    "DESCRIBE_CHUNK",
    "Server",
    "coerce_input",
    "coerce_inputs",
    "counted_bodies",
    "json_depth",
    "json_object",
    "shown",
    "unexpected",
    "unexpected_error",
]


MAX_JSON_DEPTH = 32  # arrays and objects nested in a request body; an input of 8 dimensions
# in a request's list of inputs is 9
SHORT_BODY = 4096  # bytes; a shorter body's brackets are counted before their nesting is
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = np.zeros(256, dtype=np.int8)  # a bracket's step in depth
_STEP[[ord("["), ord("{")]] = 1
_STEP[[ord("]"), ord("}")]] = -1


SHOWN_NAME = 64  # characters of a caller's name or id an error message repeats


def shown(name: object) -> str:
    """A name or id a caller sent, as an error message repeats it: its ``repr``, cut after
    ``SHOWN_NAME`` characters."""
    text = repr(name)
    return text if len(text) <= SHOWN_NAME else f"{text[:SHOWN_NAME]}..."


def json_depth(body: bytes | bytearray) -> int:
    """How deep arrays and objects nest in the JSON text ``body`` where that is more than
    ``MAX_JSON_DEPTH``; else a number no more than it. Counted in C, at a few percent of
    parsing's cost on a body of numbers: every bracket, then, if they nest too deep, those
    outside strings."""
    if len(body) <= SHORT_BODY and body.count(b"[") + body.count(b"{") <= MAX_JSON_DEPTH:
        return MAX_JSON_DEPTH  # too few brackets to nest deeper: counting them costs less
    depth = _nesting(body)
    if depth > MAX_JSON_DEPTH and b'"' in body:
        depth = _nesting(_JSON_STRING.sub(b"", body))
    return depth


_NON_FINITE = re.compile(rb"NaN|Infinity")


def _nesting(text: bytes | bytearray) -> int:
    steps = _STEP[np.frombuffer(bytes(text).translate(None, _NOT_BRACKETS), dtype=np.uint8)]
    return int(np.cumsum(steps, dtype=np.int64).max(initial=0))


def json_object(body: bytes | bytearray, exact: bool = True) -> dict[str, Any]:
    """A request's body as a JSON object, else a 400 that says why: not JSON, not an object,
    or nested deeper than ``MAX_JSON_DEPTH``, which Python's parser would meet only at its
    recursion limit.

    Without ``exact`` the body is read by orjson, a tenth of the standard parser's time on a
    body of numbers (:mod:`bench.ingress_cost`), strict JSON: no ``NaN`` or ``Infinity``, no
    lone surrogates, and an integer past 64 bits read as a float. A prediction's body is read
    so; a feedback's label, kept as sent, exactly."""
    if (depth := json_depth(body)) > MAX_JSON_DEPTH:
        raise BadRequest(f"body nests {depth} levels deep; at most {MAX_JSON_DEPTH} are read")
    try:
        data = json.loads(body) if exact else orjson.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        hint = " (JSON has no NaN or Infinity)" if _NON_FINITE.search(body) else ""
        raise BadRequest(f"body is not valid JSON{hint}: {exc}") from None
    if not isinstance(data, dict):
        raise BadRequest(f"body must be a JSON object, got {type(data).__name__}")
    return data


PLAN_EXPORTS = 8  # models whose plan one export round refreshes at most (tens of ms each)
TRACEBACK_EVERY_S = 60.0  # an unexpected error's traceback is logged at most this often
_last_traceback = -math.inf


def unexpected(exc: BaseException, where: str) -> RaysrvError:
    """The documented 500 for an exception raysrv did not expect (a defect); logged with its
    traceback at most every ``TRACEBACK_EVERY_S``, else in one line."""
    global _last_traceback
    now = time.monotonic()
    detailed = now - _last_traceback >= TRACEBACK_EVERY_S
    if detailed:
        _last_traceback = now
    logger.error("unexpected %s in %s: %.200s", type(exc).__name__, where, exc, exc_info=detailed)
    return unexpected_error(exc)


def unexpected_error(exc: BaseException) -> RaysrvError:
    """The documented 500 for ``exc``, not logged (:func:`unexpected` logs it)."""
    return RaysrvError(f"unexpected {type(exc).__name__}; the server logged it")


def coerce_input(value: Any, spec: InputSpec) -> Input:
    """``value`` as an input of the model's kind, or the :class:`RaysrvError` (400, or 413 for
    an over-long string or bytes) saying why: an array of its shape and dtype, a ``str``, or
    ``bytes`` (sent as such by a handle or as a raw body, as ``{"b64": ...}`` in JSON)."""
    if spec.text:
        return _text(value, spec)
    try:
        array = np.asarray(value)
    except (ValueError, TypeError) as exc:
        raise BadRequest(f"input is not a rectangular array of numbers: {exc}") from None
    if array.dtype.kind not in "biuf":
        raise BadRequest(f"input must hold numbers, got elements of type {array.dtype}")
    if array.shape != spec.shape:
        raise BadRequest(f"input has shape {list(array.shape)}, expected {list(spec.shape)}")
    target = _DTYPES[spec.dtype]
    if not _castable(array.dtype, target):
        raise BadRequest(f"input of dtype {array.dtype} cannot be read as {target}")
    out = np.ascontiguousarray(array, dtype=target)
    if target.kind == "f" and not _finite(out):
        raise BadRequest(_NOT_FINITE.format(target))
    return out


_DTYPES: dict[str, np.dtype[Any]] = {name: np.dtype(name) for name in NUMERIC}


@cache
def _castable(given: np.dtype[Any], target: np.dtype[Any]) -> bool:
    """Whether ``given`` reads as ``target`` (numpy's same-kind casting), once per pair."""
    return bool(np.can_cast(given, target, casting="same_kind"))


def _finite(array: np.ndarray) -> bool:
    """Whether the float ``array`` holds no NaN or infinity: its sum, in float64, is finite if
    so (a float32 or float16 input's cannot overflow), else NaN or infinite; only where a
    float64 input's sum overflows is each value looked at. The sum keeps the interpreter's
    lock; a dot product with zeros, twice as fast alone, lets go of it for BLAS and must then
    wait for any thread that took it: beside a thread running Python, 36 us a call against
    the sum's 1.9 (``bench.gil_release``; bench/RESULTS_ARCHIVE.md, "Calls that let go of the
    GIL"). From :data:`DOT_FROM` values on, where the sum would take longer than that wait, the dot
    product: 0 if every value is finite (0 times an infinity is NaN)."""
    if array.size >= DOT_FROM:
        return math.isfinite(array.ravel().dot(_zeros(array.size, array.dtype)))
    return math.isfinite(np.add.reduce(array, axis=None, dtype=np.float64)) or bool(
        np.isfinite(array).all()
    )


DOT_FROM = 1 << 16  # values: 150,528 took the sum 65 us, the dot product 12


@cache
def _zeros(size: int, dtype: np.dtype[Any]) -> np.ndarray:
    zeros = np.zeros(size, dtype)
    zeros.flags.writeable = False
    return zeros


_NOT_FINITE = "input holds NaN or infinite values, or values beyond the range of {}"


def _text(value: Any, spec: InputSpec) -> str | bytes:
    if spec.dtype == "string":
        if not isinstance(value, str):
            raise BadRequest(f"input must be a string, got {type(value).__name__}")
        unit = "characters"
    else:
        value = _bytes(value)
        unit = "bytes"
    if len(value) > spec.max_length:
        raise PayloadTooLarge(
            f"input of {len(value)} {unit} exceeds the model's input.max_length {spec.max_length}"
        )
    return value


def _bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, dict) and list(value) == ["b64"] and isinstance(value["b64"], str):
        try:
            return base64.b64decode(value["b64"], validate=True)
        except ValueError as exc:  # binascii.Error is one
            raise BadRequest(f"input.b64 is not base64: {exc}") from None
    raise BadRequest(
        'a bytes input is {"b64": "<base64>"} in JSON, or the whole body as '
        f"application/octet-stream; got {type(value).__name__}"
    )


def coerce_inputs(values: list[Any] | np.ndarray, spec: InputSpec) -> list[Input | RaysrvError]:
    """Each of ``values`` as :func:`coerce_input` makes it, or the error it raised. When
    every value is a number array of the model's shape, one conversion of them all: the rows
    of one array."""
    if spec.text:
        return [_coerced_or_error(value, spec) for value in values]
    try:
        array = np.asarray(values)
    except (ValueError, TypeError):
        array = None
    if (
        array is not None
        and array.shape == (len(values), *spec.shape)
        and array.dtype.kind in "biuf"
        and _castable(array.dtype, _DTYPES[spec.dtype])
    ):
        rows = np.ascontiguousarray(array, dtype=spec.dtype)
        if rows.dtype.kind != "f" or np.isfinite(rows).all():
            return list(rows)
    return [_coerced_or_error(value, spec) for value in values]


def _coerced_or_error(value: Any, spec: InputSpec) -> Input | RaysrvError:
    try:
        return coerce_input(value, spec)
    except RaysrvError as exc:
        return exc


TRIP_WINDOW = 200  # replies (or queries with ``sent_at``) behind the trip-back estimate
FLOOR_WINDOW = 2000  # queries with ``sent_at`` behind its shortest trip
TRIPS_KNOWN = 20  # trips (and replies) seen before they are relied on
SENT_AT_SKEW_S = 5.0  # how far a caller's clock may run ahead of the ingress's
SENT_AT_MAX_AGE_S = 600.0  # the longest a query may have been on its way
DESCRIBE_CHUNK = 50  # models described between turns of the event loop


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


class _transit_told:  # noqa: N801 - used as a function: ``with _transit_told(ask):``
    """A query's error carries its trip to the ingress, as its answer does: on a copy, since
    one error may answer several queries (a refused batch, a shared cache miss). A class
    rather than a generator, as every query enters it several times: 0.3 us in and out against
    0.9 us here."""

    __slots__ = ("_ask",)

    def __init__(self, ask: _Ask) -> None:
        self._ask = ask

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: BaseException | None, traceback: Any) -> bool:
        if isinstance(exc, RaysrvError) and self._ask.transit_s is not None:
            raise _told(exc, self._ask) from exc
        return False


ID_BYTES = 16
IDS_A_READ = 256


class _QueryIds:
    """Unguessable query ids, 32 hex digits each, as ``uuid4().hex`` would give, from the
    operating system's random source read ``ID_BYTES * IDS_A_READ`` bytes at a time rather
    than once an id: a feedback names its query by id, so no caller may guess another's."""

    def __init__(self) -> None:
        self._random, self._at = b"", 0

    def next(self) -> str:
        if self._at >= len(self._random):
            self._random, self._at = os.urandom(ID_BYTES * IDS_A_READ), 0
        at, self._at = self._at, self._at + ID_BYTES
        return self._random[at : self._at].hex()


def _told(exc: RaysrvError, ask: _Ask) -> RaysrvError:
    """A copy of ``exc`` carrying the query's trip to the ingress (``exc`` without one)."""
    if ask.transit_s is None:
        return exc
    told = copy.copy(exc)
    told.transit_ms = _ms(ask.transit_s)
    return told


def _model_answer(model: str, output: Any, seconds: float, ask: _Ask) -> dict[str, Any]:
    """One model's answer to one query, ``seconds`` after the ingress took it."""
    return {
        "output": output,
        "model": model,
        "latency_ms": seconds * 1e3,
        "transit_ms": _ms(ask.transit_s),
    }


async def _each(
    answers: Iterable[Awaitable[dict[str, Any]]],
) -> list[dict[str, Any] | RaysrvError]:
    """Every answer, concurrently and in order, or the :class:`RaysrvError` it raised; any
    other exception (a bug, a cancellation) propagates."""
    done = await asyncio.gather(*answers, return_exceptions=True)
    for answer in done:
        if isinstance(answer, BaseException) and not isinstance(answer, RaysrvError):
            raise answer
    return done  # type: ignore[return-value]


async def _each_input(
    inputs: list[Input | RaysrvError],
    answer: Callable[[Input], Awaitable[dict[str, Any]]],
    ask: _Ask,
) -> list[dict[str, Any] | RaysrvError]:
    """:func:`_each` over the coerced ``inputs``: those that could not be read keep their error
    in their place."""
    good = [x for x in inputs if not isinstance(x, RaysrvError)]
    answers = iter(await _each(answer(x) for x in good))
    return [_told(x, ask) if isinstance(x, RaysrvError) else next(answers) for x in inputs]


def counted_bodies(
    entries: list[dict[str, Any] | RaysrvError], metrics: Metrics, where: str, seconds: float
) -> list[dict[str, Any]]:
    """The results of a request of many inputs, in order: each an answer or an error body,
    each counted under ``where`` as one query; the request's time, ``seconds``, is one
    observation of the latency, as a request of one input is."""
    bodies = []
    latency: float | None = seconds
    for entry in entries:
        if isinstance(entry, RaysrvError):
            metrics.error(where, entry)
            bodies.append(entry.to_json())
        else:
            metrics.request(where, 200, latency)
            latency = None
            bodies.append(entry)
    return bodies


def _label_fits(
    app: str, label: Any, selection: policies.SelectionPolicy, predictions: Mapping[str, Any]
) -> None:
    """400 unless ``label`` fits ``predictions`` (:func:`check_label`), as the app's policy
    reads them if it reads labels."""
    reading = selection.params if isinstance(selection.params, FeedbackParams) else None
    try:
        check_label(label, predictions, reading)
    except ValueError as exc:
        raise _unfit(app, label, exc) from None


def _unfit(app: str, label: Any, why: ValueError) -> BadRequest:
    """The 400 of a label that ``app``'s policy, or its predictions, cannot take."""
    return BadRequest(f"label {shown(label)} does not fit app {app!r}: {why}")


def _context_key(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


NO_CONTEXT = _context_key("")  # most queries': hashed once


class Alarms:
    """Ends a query's wait for its model's answer at its time, if the answer is not in by then,
    as every query waits: with one timer on the event loop for the earliest time rather than
    one each, and no future or callback of its own between the answer and its caller. The
    times wait in a heap of lists, which compares in C, where asyncio's own loop compares its
    timers in Python; a query answered before its time leaves its entry behind, emptied, and
    dropped when that time comes, or before, once the heap is twice the entries still waiting
    (:data:`ALARMS_COMPACTED`)."""

    def __init__(self) -> None:
        self._heap: list[list[Any]] = []  # [loop time, n, the future it ends or None]
        self._numbers = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._at = math.inf  # the loop time the timer is set for
        self._compact_at = ALARMS_COMPACTED

    async def result(self, answer: asyncio.Future[Any], timeout: float) -> Any:
        """``answer``'s result (or its error), or :class:`TimedOut` once ``timeout`` seconds
        pass first: the answer then holds that error, so whoever owes it sees it done."""
        if answer.done():
            return answer.result()
        entry = self._add(timeout, answer)
        try:
            return await answer
        finally:
            entry[2] = None

    async def until_done(self, answer: asyncio.Future[Any], timeout: float | None) -> None:
        """Until ``answer`` is done or ``timeout`` seconds pass (None: no limit), leaving it
        be."""
        if answer.done():
            return
        waiter = asyncio.get_running_loop().create_future()

        def wake(_: Any = None) -> None:
            if not waiter.done():
                waiter.set_result(None)

        answer.add_done_callback(wake)
        try:
            if timeout is None:
                await waiter
            else:
                await self.result(waiter, timeout)
        except TimedOut:
            pass
        finally:
            answer.remove_done_callback(wake)

    def _add(self, timeout: float, future: asyncio.Future[Any]) -> list[Any]:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a new loop: the old one's waiters wait no more
            self._heap, self._loop, self._timer, self._at = [], loop, None, math.inf
        when = loop.time() + timeout
        entry = [when, next(self._numbers), future]
        heapq.heappush(self._heap, entry)
        if when < self._at:
            self._set(when)
        if len(self._heap) >= self._compact_at:
            self._heap = [e for e in self._heap if e[2] is not None and not e[2].done()]
            heapq.heapify(self._heap)
            self._compact_at = max(ALARMS_COMPACTED, 2 * len(self._heap))
        return entry

    def _set(self, when: float) -> None:
        assert self._loop is not None
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._at = self._loop.call_at(when, self._ring), when

    def _ring(self) -> None:
        """End the waits due, then drop the answered ones ahead of the next still waiting, so
        that the timer is set for a wait that may need it: set for the next entry whatever it
        held, it rang once for every query answered in time."""
        assert self._loop is not None
        self._timer, self._at = None, math.inf
        heap, now = self._heap, self._loop.time()
        while heap and (heap[0][0] <= now or heap[0][2] is None or heap[0][2].done()):
            future = heapq.heappop(heap)[2]
            if future is not None and not future.done():
                future.set_exception(TimedOut())
        if heap:  # the timer may ring a hair early: the next is set again, however close
            self._set(heap[0][0])


class TimedOut(Exception):
    """A wait :class:`Alarms` ended before its answer came."""


ALARMS_COMPACTED = 1024  # the fewest entries at which Alarms drops those answered


def _in_transit(sent_at: Any) -> float:
    """Seconds since the caller sent the query (never negative), or a 400 for a ``sent_at``
    that is not a time, is more than ``SENT_AT_SKEW_S`` ahead of this clock or more than
    ``SENT_AT_MAX_AGE_S`` behind it."""
    if isinstance(sent_at, bool) or not isinstance(sent_at, (int, float)):
        raise BadRequest(f"sent_at must be wall-clock seconds, got {shown(sent_at)}")
    trip = time.time() - float(sent_at)
    if not math.isfinite(trip) or not -SENT_AT_SKEW_S <= trip <= SENT_AT_MAX_AGE_S:
        raise BadRequest(
            f"sent_at must be the wall-clock time the query was sent, within "
            f"{SENT_AT_MAX_AGE_S:.0f} s before this server's clock and {SENT_AT_SKEW_S:.0f} s "
            f"after it; got {shown(sent_at)}, {trip:.3g} s ago"
        )
    return max(0.0, trip)


INSIDE_WINDOW_S = 0.1  # the most requests inside at once is kept over one to two of these


class Inside:
    """The requests inside the ingress's predict calls now (``now``; a request of many inputs
    counts once) and the most of them at once over the last one to two windows of
    ``window_s`` (:meth:`peak`): what the pools' policies see as
    ``BatcherView.concurrency``. Requests that came together lately are likely to again, their
    clients sending the next as each answer arrives, and a burst's level lasts for a while."""

    def __init__(self, clock: Callable[[], float], window_s: float = INSIDE_WINDOW_S) -> None:
        self.now = 0
        self._clock, self._window = clock, window_s
        self._since = clock()  # the start of the window under way
        self._high = 0  # the most inside at once in it
        self._before = 0  # and in the one before it

    def enter(self) -> None:
        self.now += 1
        if self.now > self._high:
            self._high = self.now

    def leave(self, *_: object) -> None:
        self.now -= 1

    __enter__, __exit__ = enter, leave  # ``with inside:`` for one request

    def peak(self) -> int:
        t = self._clock()
        if t - self._since >= self._window:  # a new window
            if t - self._since < 2 * self._window:
                self._before = self._high
            else:  # the high so far may be older than two windows: only the present is sure
                self._before = self.now
            self._high, self._since = self.now, t
        return max(self._before, self._high)


class TripBack:
    """The time kept back from a query's deadline for its answer's way back to a caller that
    sends ``sent_at``: the smaller of two estimates of the way back at the same quantile, or
    the smallest of three for an answer over HTTP with the loop's rule.

    - Replies: a quantile of the last ``TRIP_WINDOW`` replies this ingress took up from its
      workers (from a worker's end of a batch to this event loop taking the answer up), plus
      the shortest of the last ``FLOOR_WINDOW`` trips here. An answer's way back is a reply of
      the same kind, on the same machine and through the same queues; the shortest trip is
      what every trip pays, how far away the callers are, and a long window keeps out a burst
      whose queries all wait in front of the ingress.
    - Trips: the quantile of the last ``TRIP_WINDOW`` trips here. Under load they include the
      wait in front of the ingress, which answers do not meet, so they overstate the way back
      (``bench/RESULTS_ARCHIVE.md``, "What is kept back for the way back"); but every query renews
      them, refused ones too, while replies come only from batches that ran: a stall that
      slowed the last replies would otherwise refuse every query, and none would run to
      measure the replies again.
    - With ``http`` (an answer over HTTP, with the ingress's ``http_trip_back: loop``), a
      third: the shortest of the last ``FLOOR_WINDOW`` trips plus a quantile of how long this
      event loop lately took to get to work that was ready (the pools' step lag, ``lag``). An
      HTTP answer goes back through the sockets and the HAProxy its query came through,
      without the queue in front of the ingress, and leaves once the loop gets to it; the
      workers' replies cross Ray and the trips in wait in that queue, so both overstate it:
      on the many-model trace at 105.9 queries a second they kept back 19.6 ms at the median
      while the client's answers came back in 6.7 ms at the p99. Kept back less, more queries
      are answered within the SLO, but a few answers arrive late, as the client's own delays
      in reading them are not seen here: hence not the default (``bench/RESULTS_ARCHIVE.md``,
      "the time kept back for an answer over HTTP, with worker actors").

    Nothing is kept back until ``TRIPS_KNOWN`` trips are seen, and the trips alone count until
    ``TRIPS_KNOWN`` replies are; the third counts once ``TRIPS_KNOWN`` lags are. The simulator
    of ``bench.many_models`` keeps its queries' time back with this same rule."""

    def __init__(self) -> None:
        self._trips = SortedWindow(TRIP_WINDOW)
        self._floor = SortedWindow(FLOOR_WINDOW)
        self._replies = SortedWindow(TRIP_WINDOW)
        self._lags = SortedWindow(TRIP_WINDOW)

    def add(self, trip_s: float) -> None:
        self._trips.add(trip_s)
        self._floor.add(trip_s)

    def arrived(self, trip_s: float, slo_s: float) -> None:
        """A well-formed query's trip here, counted unless it took the whole SLO: such a query
        is refused as late, and its trip, whatever a caller's ``sent_at`` made it, must not
        set what is kept back from every other caller's deadline."""
        if trip_s < slo_s:
            self.add(trip_s)

    def reply(self, seconds: float) -> None:
        self._replies.add(max(0.0, seconds))

    def lag(self, seconds: float) -> None:
        self._lags.add(max(0.0, seconds))

    def kept(self, quantile: float, http: bool = False) -> float:
        """Seconds kept back at ``quantile``; ``http``: with the third estimate, the loop's, for
        an answer that goes back over HTTP."""
        if len(self._trips) < TRIPS_KNOWN:
            return 0.0
        kept = self._trips.quantile(quantile)
        floor = self._floor.quantile(0.0)
        if len(self._replies) >= TRIPS_KNOWN:
            kept = min(kept, floor + self._replies.quantile(quantile))
        if http and len(self._lags) >= TRIPS_KNOWN:
            kept = min(kept, floor + self._lags.quantile(quantile))
        return kept


@dataclass(frozen=True)
class _Ask:
    """What a caller asked of one query beyond its input: its SLO and its priority class, the
    time kept back from its deadline for the answer's trip to the caller, and how long it took
    to get here (None: the caller did not say when it sent it)."""

    slo_ms: float | None
    priority: int
    trip_back_s: float = 0.0
    transit_s: float | None = None


_PLAIN = _Ask(None, 0)  # what most queries ask: nothing beyond their input


@dataclass(slots=True)
class _App:
    spec: AppSpec
    input: InputSpec
    selection: policies.SelectionPolicy
    cache: PredictionCache
    slo_ms: float | None
    selection_spec: SelectionSpec  # what ``selection`` was made from
    fixed: str | None = None  # the one model it always asks, if so (``fixed_model``)


class Server:
    """Answers ``predict`` and ``feedback`` for every app of one spec."""

    def __init__(
        self,
        spec: RaysrvSpec,
        workers: Mapping[str, Workers],
        store: StateStore | None = None,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: np.random.Generator | None = None,
        root: Path | None = None,
    ) -> None:
        """``spec`` with its model sets expanded; ``workers``: each pool's (a dedicated pool is
        named after its model); ``root``: where relative sources of models added live are."""
        if spec.model_sets:
            raise ValueError("list the model sets' models first: RaysrvSpec.expanded(root)")
        self.spec = spec
        self._store = store or MemoryStore(budget_bytes=spec.ingress.store_budget_bytes())
        self._metrics = metrics or Metrics()
        self._clock = clock
        self._root = root or Path.cwd()
        self._trips = TripBack()
        self._ids = _QueryIds()
        self._rng = rng or np.random.default_rng(spec.ingress.seed)
        trips = self._trips
        # the loop's lags only where a rule reads them, as each step would add one
        lags = trips.lag if spec.ingress.http_trip_back == "loop" else None
        self._inside = Inside(clock)  # requests in predict and its kin
        self._alarms = Alarms()  # their waits for answers, until their deadlines
        self.pools = {
            p.name: Pool(
                p, workers[p.name], clock, self._metrics, trips.reply, lags, self._inside.peak
            )
            for p in spec.resolved_pools()
        }
        self._models: dict[str, ModelSpec] = {}
        self._slo_ms: dict[str, float] = {}
        self._batching: dict[str, tuple[Any, float]] = {}  # (batching spec, SLO) per model
        self._added: set[str] = set()  # models of the live catalog
        self._exported: dict[str, tuple[float, int]] = {}  # last arrival seen, round, by model
        self._export_round = 0
        for model in spec.models:
            self._add_model(model)
        self.apps = {a.name: self._make_app(a) for a in spec.apps}

    def _add_model(self, model: ModelSpec) -> None:
        policy = batching.make_policy(
            model.batching.policy, model.batching.params, model.slo_ms / 1000.0
        )
        self._pool(model).add_model(model, policy)
        self._models[model.name] = model
        self._slo_ms[model.name] = model.slo_ms
        self._batching[model.name] = (model.batching, model.slo_ms)

    def _pool(self, model: ModelSpec) -> Pool:
        return self.pools[model.pool or model.name]

    def pool_of(self, model: str) -> Pool:
        """The pool serving ``model``, or :class:`NotFound`."""
        spec = self._models.get(model)
        if spec is None:
            raise NotFound(f"unknown model {shown(model)}; known: {sorted(self._models)[:20]}")
        return self._pool(spec)

    async def profile(self) -> None:
        """Profile every pool (``Pool.profile``), one after another, then start the pools'
        autoscalers. Call it before the first query; the ingress does, before it takes
        traffic."""
        for pool in self.pools.values():
            await pool.profile()
        for pool in self.pools.values():
            pool.start_scaling()

    def _make_app(self, app: AppSpec) -> _App:
        selection = policies.make_policy(
            app.selection.policy, app.models, app.selection.params, self._rng
        )
        model_input = self._models[app.models[0]].input
        cache = PredictionCache(app.cache_size, self._clock)
        fixed = selection.fixed_model()
        return _App(app, model_input, selection, cache, app.slo_ms, app.selection, fixed)

    def configure(self, live: LiveConfig) -> None:
        """Apply live knobs (``user_config``): the catalog of models on shared pools, then
        batching, SLOs, selection and cache sizes. ``live`` is the whole wanted state, as Serve
        hands it over: a knob it leaves out goes back to the model's or app's declared value.
        A policy is made anew only when its spec or SLO changed: a new one would forget what
        the old one learned (AIMD's batch size, a selection's weights)."""
        added = live.catalog.expanded(self._root)
        live.check_against(self.spec, added)
        self._apply_catalog(added)
        for name, model in self._models.items():
            knobs = live.models.get(name) or ModelLive()
            wanted = (knobs.batching or model.batching, knobs.slo_ms or model.slo_ms)
            if wanted != self._batching[name]:
                spec, slo_ms = wanted
                policy = batching.make_policy(spec.policy, spec.params, slo_ms / 1000.0)
                self.pool_of(name).set_policy(name, policy)
                self._batching[name] = wanted
                self._slo_ms[name] = slo_ms
        for name, app in self.apps.items():
            app_knobs = live.apps.get(name) or AppLive()
            selection = app_knobs.selection or app.spec.selection
            if selection != app.selection_spec:
                app.selection = policies.make_policy(
                    selection.policy, app.spec.models, selection.params, self._rng
                )
                app.selection_spec = selection
                app.fixed = app.selection.fixed_model()
            size = app.spec.cache_size if app_knobs.cache_size is None else app_knobs.cache_size
            if size != app.cache.capacity:
                app.cache.resize(size)
            app.slo_ms = app.spec.slo_ms if app_knobs.slo_ms is None else app_knobs.slo_ms

    def _apply_catalog(self, added: list[ModelSpec]) -> None:
        """Serve the catalog's models and no other added ones: new ones join their pools,
        ones no longer listed leave theirs, one changed is served anew; no worker restarts."""
        wanted = {m.name: m for m in added}
        for name in sorted(self._added):
            if wanted.get(name) != self._models[name]:
                self._pool(self._models.pop(name)).remove_model(name)
                self._added.discard(name)
                del self._slo_ms[name], self._batching[name]
                self._exported.pop(name, None)
        for name, model in wanted.items():
            if name not in self._added:
                self._add_model(model)
                self._added.add(name)

    def context_field(self, app: str) -> str:
        """The request field that holds ``app``'s context key."""
        return self._app(app).spec.context_field

    def input_spec(self, kind: str, name: str) -> InputSpec:
        """The shape and dtype of one input of the app (``kind`` "app") or model ``name``."""
        if kind == "app":
            return self._app(name).input
        self.pool_of(name)  # 404 for an unknown model
        return self._models[name].input

    def metric_tag(self, app: str) -> str:
        """``app`` as the metrics' tag of its requests: a served app's name, else ``unknown``,
        so that the series stay as many as the apps whatever names requests carry."""
        return app if isinstance(app, str) and app in self.apps else UNKNOWN_APP

    def _app(self, name: str) -> _App:
        app = self.apps.get(name)
        if app is None:
            raise NotFound(f"unknown app {shown(name)}; serving: {sorted(self.apps)}")
        return app

    async def predict(
        self,
        app: str,
        input: Any,
        context: str | None = None,
        slo_ms: float | None = None,
        *,
        best_effort: bool = False,
        priority: int = 0,
        sent_at: float | None = None,
        http: bool = False,
    ) -> dict[str, Any]:
        """Answer one query: output, models, cache_hit, query_id, latency_ms, confidence,
        missing (models asked that did not answer in time) and default (the output is the app's
        default answer, given when the confidence is below the app's threshold).

        Its deadline is arrival + ``slo_ms`` (else the app's, else the model's SLO); with
        ``best_effort`` it has none, and is answered late rather than refused. ``priority`` 1
        marks a batch client, which policies that know classes serve in idle time only.
        ``sent_at`` (wall-clock seconds, from the caller) starts the SLO when the query was sent
        rather than when it reached the ingress, so time queued in front of raysrv counts, and
        the answer's trip back is kept out of the time the scheduler may use (``trip_back``;
        ``http``: the query came over HTTP and its answer goes back that way)."""
        start = self._clock()
        with self._inside:
            target = self._app(app)
            origin, ask = self._ask(start, slo_ms, best_effort, priority, sent_at, http)
            with _transit_told(ask):
                x = coerce_input(input, target.input)
                context = self._context(context)
                self._arrived(ask)
                state = None if target.fixed is not None else await self._state(target, context)
            return await self._answer(target, x, context, state, start, origin, ask)

    async def predict_many(
        self,
        app: str,
        inputs: Any,
        context: str | None = None,
        slo_ms: float | None = None,
        *,
        best_effort: bool = False,
        priority: int = 0,
        sent_at: float | None = None,
        http: bool = False,
    ) -> list[dict[str, Any] | RaysrvError]:
        """Answer each of ``inputs`` as :meth:`predict` answers one, together and in order:
        each its answer or its error. They share the request's options, deadline and trip.
        The request as a whole fails only where every input would: an unknown app, a bad
        option, or not a list of 1 to ``ingress.max_inputs`` inputs."""
        start = self._clock()
        with self._inside:
            target = self._app(app)
            batch = self._inputs(inputs)
            origin, ask = self._ask(start, slo_ms, best_effort, priority, sent_at, http)
            with _transit_told(ask):
                context = self._context(context)
            inputs = coerce_inputs(batch, target.input)
            self._arrived(ask)
            with _transit_told(ask):
                state = await self._state(target, context)
            return await _each_input(
                inputs,
                lambda x: self._answer(target, x, context, state, start, origin, ask),
                ask,
            )

    def _inputs(self, inputs: Any) -> list[Any] | np.ndarray:
        """``inputs`` if a list (or an array, one input a row) of 1 to ``ingress.max_inputs``
        inputs, else the error."""
        rows = isinstance(inputs, np.ndarray) and inputs.ndim > 0
        if not (isinstance(inputs, list) or rows) or not len(inputs):
            raise BadRequest("inputs must be a non-empty list of inputs")
        limit = self.spec.ingress.max_inputs
        if len(inputs) > limit:
            raise PayloadTooLarge(f"{len(inputs)} inputs exceed the limit of {limit} a request")
        return inputs

    async def _state(self, target: _App, context: str) -> Any:
        """The app's selection state for ``context`` (the policy's initial one if none, or if
        the policy never learns: then the store is not asked)."""
        selection = target.selection
        if not selection.learns():
            return selection.init()
        return await self._store.get_state(target.spec.name, context) or selection.init()

    async def _answer(
        self,
        target: _App,
        x: Input,
        context: str,
        state: Any,
        start: float,
        origin: float,
        ask: _Ask,
    ) -> dict[str, Any]:
        """The answer to one coerced input, selected from ``state``. An app that always asks one
        model (``fixed``, :meth:`SelectionPolicy.fixed_model`) and keeps no cache asks it as
        the model's own route does, with no state (``state`` None), selection or combination
        (bench/RESULTS.md, "The fast path")."""
        app = target.spec.name
        with _transit_told(ask):
            missing: list[str] = []  # models of an ensemble that had no answer in time
            fixed = target.fixed
            if fixed is not None and not target.cache.capacity:
                self._metrics.selection(app, fixed)
                deadline = self._deadline(fixed, origin, ask, target.slo_ms)
                output = await self._ask_model(self.pool_of(fixed), fixed, x, deadline, ask)
                chosen, predictions, confidence, cache_hit = [fixed], {fixed: output}, 1.0, False
            else:
                chosen = target.selection.select(state, x)
                if len(chosen) == 1:  # one model: its answer or its error
                    value, cache_hit = await self._predict_one(target, chosen[0], x, origin, ask)
                    predictions = {chosen[0]: value}
                else:
                    predictions, cache_hit = await self._ask_models(target, chosen, x, origin, ask)
                    missing = [m for m in chosen if m not in predictions]
                output, confidence = target.selection.combine(state, x, predictions)
            default = confidence < target.spec.confidence_threshold
            if default:
                output = target.spec.default_output
            query_id = self._ids.next()
            if target.spec.feedback:
                record = {"app": app, "context": context, "input": x, "predictions": predictions}
                await self._store.put_prediction(query_id, record)
            return {
                "output": output,
                "models": chosen,
                "cache_hit": cache_hit,
                "query_id": query_id,
                "latency_ms": (self._clock() - start) * 1000.0,
                "transit_ms": _ms(ask.transit_s),
                "confidence": confidence,
                "missing": missing,
                "default": default,
            }

    def _ask(
        self,
        start: float,
        slo_ms: float | None,
        best_effort: bool,
        priority: int,
        sent_at: float | None,
        http: bool = False,
    ) -> tuple[float, _Ask]:
        """Where a query's SLO starts (``origin``) and what it asks, or :class:`BadRequest`:
        every API's options are checked here, once. Its trip here counts towards what is kept
        back for others only once its input is read too (``_arrived``)."""
        numeric = isinstance(slo_ms, (int, float)) and not isinstance(slo_ms, bool)
        if slo_ms is not None and not (numeric and 0 < slo_ms < math.inf):
            raise BadRequest(f"slo_ms must be a positive number, got {slo_ms!r}")
        if not isinstance(best_effort, bool):
            raise BadRequest(f"best_effort must be true or false, got {best_effort!r}")
        if isinstance(priority, bool) or priority not in (0, 1):
            raise BadRequest(
                f"priority must be 0 (latency-sensitive) or 1 (batch), got {priority!r}"
            )
        if best_effort:
            slo_ms = math.inf
        if sent_at is None:
            return start, _PLAIN if slo_ms is None and priority == 0 else _Ask(slo_ms, priority)
        trip = _in_transit(sent_at)
        return start - trip, _Ask(slo_ms, priority, self.trip_back(http), trip)

    async def predict_model(
        self,
        model: str,
        input: Any,
        slo_ms: float | None = None,
        *,
        best_effort: bool = False,
        priority: int = 0,
        sent_at: float | None = None,
        http: bool = False,
    ) -> dict[str, Any]:
        """Answer one query of one model, without an app's selection, cache or feedback:
        ``{"output", "model", "latency_ms"}``. Deadlines as :meth:`predict`'s, from the
        model's SLO, and ``http`` as there."""
        start = self._clock()
        with self._inside:
            pool = self.pool_of(model)
            origin, ask = self._ask(start, slo_ms, best_effort, priority, sent_at, http)
            return await self._predict_model(model, pool, input, start, origin, ask)

    async def predict_model_many(
        self,
        model: str,
        inputs: Any,
        slo_ms: float | None = None,
        *,
        best_effort: bool = False,
        priority: int = 0,
        sent_at: float | None = None,
        http: bool = False,
    ) -> list[dict[str, Any] | RaysrvError]:
        """:meth:`predict_model` for each of ``inputs``, as :meth:`predict_many`."""
        start = self._clock()
        with self._inside:
            pool = self.pool_of(model)
            batch = self._inputs(inputs)
            origin, ask = self._ask(start, slo_ms, best_effort, priority, sent_at, http)
            inputs = coerce_inputs(batch, self._models[model].input)
            self._arrived(ask)
            return await self._run_model_many(model, pool, inputs, start, origin, ask)

    async def _run_model_many(
        self,
        model: str,
        pool: Pool,
        inputs: list[Input | RaysrvError],
        start: float,
        origin: float,
        ask: _Ask,
    ) -> list[dict[str, Any] | RaysrvError]:
        """:meth:`_run_model` for each of one request's coerced inputs, in order, an error in
        place of each that fails. They share one deadline, so one wait covers them all, with
        no task of its own for each (``bench.fast_path``'s requests of 32 inputs)."""
        deadline, trip = self._deadline(model, origin, ask), self._trip(ask)
        entries: list[asyncio.Future[Any] | RaysrvError] = []
        for x in inputs:
            if isinstance(x, RaysrvError):
                entries.append(_told(x, ask))
                continue
            try:
                entries.append(pool.submit(model, x, deadline, ask.priority, trip))
            except RaysrvError as exc:
                entries.append(_told(exc, ask))
        answers = [e for e in entries if not isinstance(e, RaysrvError)]
        taken_up: dict[asyncio.Future[Any], float] = {}  # when this loop took each answer up
        for answer in answers:
            answer.add_done_callback(lambda a: taken_up.setdefault(a, self._clock()))
        if answers:
            await self._wait_until(deadline, answers, model)
        now = self._clock()
        results: list[dict[str, Any] | RaysrvError] = []
        for entry in entries:
            if isinstance(entry, RaysrvError):
                results.append(entry)
                continue
            at = taken_up.get(entry, now)
            try:
                output = self._settled(entry, deadline, model, at)
            except RaysrvError as exc:
                results.append(_told(exc, ask))
                continue
            results.append(_model_answer(model, output, at - start, ask))
        return results

    async def _predict_model(
        self, model: str, pool: Pool, input: Any, start: float, origin: float, ask: _Ask
    ) -> dict[str, Any]:
        with _transit_told(ask):
            x = coerce_input(input, self._models[model].input)
        self._arrived(ask)
        return await self._run_model(model, pool, x, start, origin, ask)

    async def _run_model(
        self, model: str, pool: Pool, x: Input, start: float, origin: float, ask: _Ask
    ) -> dict[str, Any]:
        """One model's answer to one coerced input."""
        with _transit_told(ask):
            deadline = self._deadline(model, origin, ask)
            output = await self._ask_model(pool, model, x, deadline, ask)
            return _model_answer(model, output, self._clock() - start, ask)

    async def _ask_models(
        self, app: _App, chosen: list[str], x: Input, origin: float, ask: _Ask
    ) -> tuple[dict[str, Any], bool]:
        """The predictions of an ensemble's chosen models that arrive by the deadline, and
        whether all came from the cache (one model's is its answer or its error, :meth:`_answer`).

        Straggler mitigation, clipper §5.2.2: each model's wait ends at the query's deadline
        less the app's ``ensemble_reserve_ms`` (``_by_deadline``), so the ensemble is combined
        then from the predictions that arrived and answered in time; a model that is late,
        refused or failed is left out and lowers the confidence. Only when none arrived does
        the query fail, with the first model's error.
        """
        reserve = app.spec.ensemble_reserve_ms / 1000.0
        ask = replace(ask, trip_back_s=ask.trip_back_s + reserve)
        answers = await asyncio.gather(
            *(self._predict_one(app, m, x, origin, ask) for m in chosen), return_exceptions=True
        )
        for answer in answers:
            if isinstance(answer, BaseException) and not isinstance(answer, RaysrvError):
                raise answer  # a bug or a cancellation, not a straggler
        arrived = {m: a for m, a in zip(chosen, answers, strict=True) if isinstance(a, tuple)}
        for model in chosen:
            if model not in arrived:
                self._metrics.missing(app.spec.name, model)
        if not arrived:
            raise next(a for a in answers if isinstance(a, RaysrvError))
        return {m: value for m, (value, _) in arrived.items()}, all(h for _, h in arrived.values())

    async def _predict_one(
        self, app: _App, model: str, x: Input, origin: float, ask: _Ask
    ) -> tuple[Any, bool]:
        self._metrics.selection(app.spec.name, model)
        deadline = self._deadline(model, origin, ask, app.slo_ms)
        compute = partial(self._ask_model, self.pool_of(model), model, x, deadline, ask)
        if not app.cache.capacity:  # no cache: no key to build, nothing to coalesce
            return await compute(), False

        key = cache_key(model, self._models[model].version, x)
        try:
            value, hit = await app.cache.get_or_compute(key, compute, deadline)
        except JoinExpired:
            self._metrics.rejection(model, "deadline_expired")
            raise DeadlineExpired(
                f"model {model!r} had no answer by the query's deadline; an identical query's "
                f"computation it joined goes on (pass best_effort to wait for it)"
            ) from None
        self._metrics.cache(app.spec.name, model, hit)
        return value, hit

    def _deadline(
        self, model: str, origin: float, ask: _Ask, app_slo_ms: float | None = None
    ) -> float:
        """When a query to ``model`` must be answered by, less the time kept for its way back:
        from the query's SLO, else its app's (``app_slo_ms``), else the model's."""
        slo_ms = ask.slo_ms or app_slo_ms or self._slo_ms[model]
        return origin + slo_ms / 1000.0 - ask.trip_back_s

    def _ask_model(
        self, pool: Pool, model: str, x: Input, deadline: float, ask: _Ask
    ) -> Awaitable[Any]:
        """``model``'s answer to ``x`` from ``pool`` by ``deadline`` (:meth:`_by_deadline`):
        the wait itself, not a coroutine around it."""
        answer = pool.submit(model, x, deadline, ask.priority, self._trip(ask))
        return self._by_deadline(answer, deadline, model)

    def _arrived(self, ask: _Ask) -> None:
        """A well-formed query's trip here joins the trip-back estimate (``TripBack.arrived``;
        its SLO the largest model's where it has none of its own)."""
        if ask.transit_s is None:
            return
        slo_ms = ask.slo_ms if ask.slo_ms is not None and math.isfinite(ask.slo_ms) else None
        self._trips.arrived(
            ask.transit_s, (slo_ms or max(self._slo_ms.values(), default=0.0)) / 1000.0
        )

    @staticmethod
    def _trip(ask: _Ask) -> tuple[float, float] | None:
        """The query's trip here and the time kept back for its way back, for the pool's
        account of where its queries' time went (None without ``sent_at``)."""
        return None if ask.transit_s is None else (ask.transit_s, ask.trip_back_s)

    def trip_back(self, http: bool = False) -> float:
        """Seconds kept for an answer's trip back to a caller that sends ``sent_at``
        (:class:`TripBack`, at the ingress's ``trip_back_quantile``; ``http``: over HTTP, where
        the ingress's ``http_trip_back`` says which rule)."""
        ingress = self.spec.ingress
        loop = http and ingress.http_trip_back == "loop"
        return self._trips.kept(ingress.trip_back_quantile, loop)

    async def _by_deadline(self, answer: asyncio.Future[Any], deadline: float, model: str) -> Any:
        """The answer, or an error once the query's deadline passes first: never a late answer.

        A query still queued then is withdrawn and refused as the policies refuse it (429,
        "deadline passed while queued"); one already in a running batch is dropped with 504
        ("deadline_expired"), as Clockwork's controller times a request out at its SLO rather
        than answer it late (clockwork §6.5). So is an answer this process takes up only after
        the deadline (its loop held up, the answer and the timeout due together): from here it
        would reach the caller later than the time kept for its trip back allows.
        """
        if not math.isfinite(deadline):
            return await answer
        try:
            output = await self._alarms.result(answer, max(0.0, deadline - self._clock()))
        except TimedOut:
            raise self._expired(model, self._withdraw(model, answer)) from None
        except asyncio.CancelledError:
            self._left(model, [answer])
            raise
        if self._clock() > deadline:  # taken up late: from here it would reach its caller late
            raise self._expired(model, False)
        return output

    async def _wait_until(
        self, deadline: float, answers: list[asyncio.Future[Any]], model: str
    ) -> None:
        """Until every one of ``answers`` is in, or ``deadline`` (if finite); if the caller
        leaves first, each is withdrawn from its queue or dropped."""
        timeout = max(0.0, deadline - self._clock()) if math.isfinite(deadline) else None
        try:
            if len(answers) == 1:
                await self._alarms.until_done(answers[0], timeout)
            else:
                await asyncio.wait(answers, timeout=timeout)
        except asyncio.CancelledError:
            self._left(model, answers)
            raise

    def _left(self, model: str, answers: list[asyncio.Future[Any]]) -> None:
        """The caller left: each of ``answers`` out of its queue, or dropped from its batch."""
        for answer in answers:
            self._withdraw(model, answer)
            answer.cancel()

    def _settled(self, answer: asyncio.Future[Any], deadline: float, model: str, at: float) -> Any:
        """``answer``'s result, taken up at ``at`` (or, not in, when the wait for it ended),
        or, if it was not in by ``deadline``, the error :meth:`_by_deadline` says."""
        if answer.done() and (at <= deadline or answer.exception() is not None):
            return answer.result()
        # an answer taken up late is in no queue: no need to look for it there
        queued = not answer.done() and self._withdraw(model, answer)
        answer.cancel()  # a running batch's answer for it is dropped
        raise self._expired(model, queued)

    def _expired(self, model: str, queued: bool) -> RaysrvError:
        """The error of a query not answered by its deadline: refused if it was still
        ``queued``, else dropped from the batch that ran it."""
        if queued:
            reason = "deadline passed while queued"
            self._metrics.rejection(model, reason)
            return Rejected(f"model {model!r}: {reason}")
        self._metrics.rejection(model, "deadline_expired")
        return DeadlineExpired(
            f"model {model!r} had no answer by the query's deadline; it was dropped "
            f"rather than answered late (pass best_effort to wait for it)"
        )

    def _withdraw(self, model: str, answer: asyncio.Future[Any]) -> bool:
        spec = self._models.get(model)
        return spec is not None and self._pool(spec).withdraw(model, answer)

    async def feedback(self, app: str, query_id: str, label: Any) -> dict[str, Any]:
        """Join ``label`` with the answered query and let the app's selection policy learn.
        One feedback a query: a second gets 409, so that no caller can replay one query's
        feedback to steer the selection every caller of its context gets; with the app's
        ``relabel``, a second replaces the first, whose effect the policy takes back. A label
        must read as an answer of the kind the query's predictions read as (400). An app
        with ``feedback: false`` keeps no query: its feedback gets 404."""
        target = self._app(app)
        if not target.spec.feedback:
            raise NotFound(f"app {app!r} takes no feedback (feedback: false): it keeps no query")
        self._check_label(label)
        record, x = await self._answered(target, query_id)
        selection, predictions = target.selection, record["predictions"]
        _label_fits(app, label, selection, predictions)
        relabelled, old = await self._keep_feedback(target, query_id, label)

        def learn(state: State) -> State:
            if relabelled:
                state = selection.unobserve(state, x, old, predictions)
            return selection.observe(state, x, label, predictions)

        try:  # atomic: concurrent feedback loses no update (§5.3)
            if selection.learns():  # else it has no state to change (``_state``)
                await self._store.update_state(app, record["context"], selection.init, learn)
        except BaseException as exc:
            if relabelled:  # not used: the old label stands, as the policy still has it
                await self._store.swap_feedback(query_id, old)
            else:  # not used: it may be given again
                await self._store.drop_feedback(query_id)
            if isinstance(exc, ValueError):  # the policy cannot read the label
                raise _unfit(app, label, exc) from None
            raise
        self._metrics.feedback(app)
        return {"query_id": query_id, "app": app, "accepted": True, "relabelled": relabelled}

    async def _answered(self, target: _App, query_id: str) -> tuple[dict[str, Any], Any]:
        """The stored record of the app's answered query and its input as the model read it."""
        record = await self._store.get_prediction(query_id)
        app = target.spec.name
        if record is None or record["app"] != app:
            raise NotFound(
                f"no answered query {shown(query_id)} in app {app!r} (unknown or expired)"
            )
        x = record["input"]
        if not target.input.text:
            x = np.asarray(x, dtype=target.input.dtype)
        return record, x

    async def _keep_feedback(self, target: _App, query_id: str, label: Any) -> tuple[bool, Any]:
        """Store ``label`` as the query's feedback: whether it replaced one, and that one."""
        if target.spec.relabel:
            return await self._store.swap_feedback(query_id, label)
        if await self._store.put_feedback(query_id, label):
            return False, None
        raise Conflict(f"query {shown(query_id)} has had its feedback: one a query")

    def _check_label(self, label: Any) -> None:
        """400 for a label JSON cannot hold, 413 for one larger than ``max_label_bytes``."""
        limit = self.spec.ingress.max_label_bytes
        try:
            size = len(json.dumps(label, allow_nan=False))
        except (TypeError, ValueError, RecursionError):
            raise BadRequest(f"label must be a JSON value, got {type(label).__name__}") from None
        if size > limit:
            raise PayloadTooLarge(f"label of {size} bytes as JSON exceeds {limit} bytes")

    def _context(self, context: Any) -> str:
        """The key of the query's selection state: a hash of its context (of "" for none), 32 hex
        digits however long or odd the context (a store's keys stay one size and no context
        reads as another app's in a Redis key), or 413 past ``max_context_chars``."""
        text = "" if context is None else str(context)
        if len(text) > (limit := self.spec.ingress.max_context_chars):
            raise PayloadTooLarge(f"context of {len(text)} characters exceeds {limit}")
        return _context_key(text) if text else NO_CONTEXT

    async def export_plans(self, limit: int = PLAN_EXPORTS) -> list[str]:
        """Export the plan view's predicted p99 (``ray_raysrv_plan_predicted_p99_ms``, which
        :meth:`plan` sets too) of at most ``limit`` models queried since their last export,
        those exported longest ago first, one after another off the loop; the models
        exported. The ingress calls it every ``ingress.plan_export_s``: the gauge is there
        without anyone asking for a plan, and idle models cost no plan."""
        self._export_round += 1
        due = []
        for name in list(self._models):
            last = self.pool_of(name).last_arrival(name)
            seen, round_ = self._exported.get(name, (None, 0))
            if last is not None and last != seen:
                due.append((round_, name, last))
        chosen = sorted(due)[:limit]
        for _, name, last in chosen:
            self._exported[name] = (last, self._export_round)
            if name in self._models:  # not removed live meanwhile
                await self.plan(name)
        return [name for _, name, _ in chosen]

    async def plan(self, model: str) -> dict[str, Any]:
        """What the analytic model predicts for ``model``'s batching now, and from what."""
        pool = self.pool_of(model)
        view = await asyncio.to_thread(predict_plan, pool.plan_snapshot(model))
        if view["predicted"] is not None:
            self._metrics.plan(model, view["predicted"]["p99_ms"])
        view["pool"] = {
            key: value
            for key, value in pool.describe_model(model).items()
            if key not in ("batching", "batch_seconds")
        }
        configurations = pool.describe_configurations()
        if configurations is not None:
            view["configurations"] = configurations
        return view

    def describe_apps(self) -> list[dict[str, Any]]:
        return [
            {
                "name": a.spec.name,
                "models": list(a.spec.models),
                "selection": {
                    "policy": a.selection.name,
                    "params": a.selection.params.model_dump(),
                },
                "cache": {"size": a.cache.capacity, "entries": len(a.cache)},
                "context_field": a.spec.context_field,
                "slo_ms": a.slo_ms,
                "input": a.input.model_dump(),
            }
            for a in self.apps.values()
        ]

    async def describe_models(self) -> list[dict[str, Any]]:
        """Every model (:meth:`describe_model`), handing the event loop back after each
        ``DESCRIBE_CHUNK``: a thousand models take tens of milliseconds to describe, and the
        queries in flight would wait that long (``bench/RESULTS_ARCHIVE.md``, "listing the models
        while serving, as summarized on c14's day")."""
        shown = []
        for i, name in enumerate(list(self._models)):
            if i and i % DESCRIBE_CHUNK == 0:
                await asyncio.sleep(0)
            if name in self._models:  # not removed live meanwhile
                shown.append(self.describe_model(name))
        return shown

    def describe_model(self, name: str) -> dict[str, Any]:
        """One model: what it is, where it is loaded, its batching (:class:`NotFound`)."""
        pool = self.pool_of(name)
        m = self._models[name]
        return {
            "name": m.name,
            "runtime": m.runtime,
            "version": m.version,
            "device": pool.spec.device,
            "slo_ms": self._slo_ms[m.name],
            "input": m.input.model_dump(),
            **pool.describe_model(m.name),
        }

    async def describe_pools(self) -> list[dict[str, Any]]:
        return [await pool.describe() for pool in self.pools.values()]

    def timeline(self, pool: str, since: float = 0.0, after: int = -1) -> dict[str, list[Any]]:
        """``Pool.timeline`` of the pool named ``pool``, or :class:`NotFound`."""
        if pool not in self.pools:
            raise NotFound(f"unknown pool {shown(pool)}; pools: {sorted(self.pools)}")
        return self.pools[pool].timeline(since, after)

    async def close(self) -> None:
        await asyncio.gather(*(p.close() for p in self.pools.values()))
        await self._store.close()
