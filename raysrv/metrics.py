"""Metrics of every role, as one small interface with a no-op default and a Ray Serve backend.

Roles call the :class:`Metrics` methods; :class:`ServeMetrics` turns them into
``ray.serve.metrics`` counters, gauges and histograms, exported by Ray as ``ray_raysrv_*`` on the
node's metrics port (and so into the Ray dashboard and Prometheus). Serve adds the
``application``, ``deployment`` and ``replica`` tags itself. Model replicas, plain Ray actors,
report their run times as ``ray_raysrv_execution_ms`` themselves (``raysrv._workers``). Pools
count LOADs, UNLOADs (evictions among them), cold starts' latency and each worker's weights,
tagged by pool and worker, never by model: a pool may hold thousands of models.
"""

from __future__ import annotations

import asyncio
import bisect
import contextvars
import itertools
from typing import Any

from raysrv.errors import ModelFailed, RaysrvError

__all__ = ["LATENCY_BOUNDARIES_MS", "UNKNOWN_APP", "Metrics", "ServeMetrics", "Summed"]

LATENCY_BOUNDARIES_MS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000]
BATCH_SIZE_BOUNDARIES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
UNKNOWN_APP = "unknown"  # the app tag of requests to a name that is not served
FLUSH_S = 1.0  # counters and gauges reach Ray at most this long after they change
LATENCY = "raysrv_request_latency_ms"  # the requests' latency histogram (ServeMetrics)
LE_LABELS = [repr(float(b)) for b in LATENCY_BOUNDARIES_MS] + ["+Inf"]  # its buckets' tags


class Summed:
    """A histogram kept in this process, as Prometheus counts one: for each upper bound of
    ``boundaries`` (ascending) and for infinity, the values observed at or below it
    (:meth:`cumulative`), and their sum and count, since it began."""

    def __init__(self, boundaries: list[float]) -> None:
        self._bounds = boundaries
        self._counts = [0] * (len(boundaries) + 1)  # by bucket, the last above every bound
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self._counts[bisect.bisect_left(self._bounds, value)] += 1
        self.total += value
        self.count += 1

    def cumulative(self) -> list[int]:
        """Each bucket's count of the values at or below its bound, infinity's last."""
        return list(itertools.accumulate(self._counts))


class Metrics:
    """The metrics every role reports; this base records nothing (for tests and tools)."""

    def request(self, app: str, status: int, latency_s: float | None = None) -> None:
        """Ingress: one request answered with ``status`` (latency recorded for answers)."""

    def error(self, app: str, error: RaysrvError) -> None:
        """Ingress: one request answered with ``error``; refusals also count as rejections."""
        self.request(app, error.status)
        if error.status != ModelFailed.status:
            self.rejection("ingress", error.reason)

    def rejection(self, where: str, reason: str) -> None:
        """Any role: one query refused (overload, deadline, bad input)."""

    def cache(self, app: str, model: str, hit: bool) -> None:
        """Cache: one lookup."""

    def selection(self, app: str, model: str) -> None:
        """Selection: ``model`` was chosen for one query."""

    def feedback(self, app: str) -> None:
        """Selection: one feedback observed."""

    def missing(self, app: str, model: str) -> None:
        """Selection: ``model``'s prediction missed an ensemble's deadline (or failed)."""

    def queue_length(self, model: str, length: int) -> None:
        """Scheduler: the model's queue now holds ``length`` queries."""

    def plan(self, model: str, p99_ms: float) -> None:
        """The plan view's predicted p99 latency of ``model``."""

    def batch(self, model: str, size: int, latency_s: float) -> None:
        """Scheduler: one batch of ``size`` answered, ``latency_s`` from dispatch to answer."""

    def store_fallback(self, operation: str) -> None:
        """State store: one ``operation`` served from memory because Redis was unreachable."""

    def load(self, pool: str, status: str, seconds: float) -> None:
        """Pool: one LOAD ended with ``status`` (``ok``, ``late``, ``no_room``, ``failed``)."""

    def unload(self, pool: str, evicted: bool) -> None:
        """Pool: one UNLOAD, to make room (``evicted``) or for a model removed."""

    def cold_start(self, pool: str, latency_s: float) -> None:
        """Pool: a query whose model was loaded nowhere when it arrived was answered."""

    def worker_memory(self, pool: str, worker: int, weight_bytes: int) -> None:
        """Pool: the model weights ``worker`` holds now."""


class ServeMetrics(Metrics):
    """:class:`Metrics` through ``ray.serve.metrics`` (call inside a Serve replica).

    Counters are summed and gauges kept at their last value in this process, and handed to Ray
    once every ``FLUSH_S`` from the event loop: each call into Ray's metrics costs tens of
    microseconds, and recorded one by one they took about a sixth of the ingress's throughput
    on a many-model load (bench/RESULTS.md, "Many models").

    The requests' latency, observed once a request, is summed here too (:class:`Summed`) and
    handed over as Prometheus's histogram series under their usual names, as gauges of running
    totals: ``ray_raysrv_request_latency_ms_bucket`` (tagged ``le``), ``..._sum`` and
    ``..._count``, which ``histogram_quantile`` and ``rate`` read as they read a histogram's.
    A Ray histogram's observation lets go of the interpreter's lock and must then wait for any
    thread that took it (beside a thread running Python, 550 us a call, ``bench.gil_release``);
    one a request cost the fast path about a tenth of its throughput (bench/RESULTS.md, "The
    fast path"). The other histograms, observed once a batch or once a LOAD, are recorded as
    observed.
    """

    def __init__(self) -> None:
        from ray.serve import metrics as m

        self._counts: dict[tuple[Any, tuple[tuple[str, str], ...]], float] = {}
        self._levels: dict[tuple[Any, tuple[tuple[str, str], ...]], float] = {}
        self._flushing: asyncio.TimerHandle | None = None

        self._requests = m.Counter(
            "raysrv_requests", "Requests answered.", tag_keys=("app", "status")
        )
        self._latencies: dict[str, Summed] = {}  # by app
        self._latency_changed: set[str] = set()
        latency = "End-to-end latency inside raysrv, in ms"
        self._latency_buckets = m.Gauge(
            f"{LATENCY}_bucket", f"{latency}: requests at or below le.", tag_keys=("app", "le")
        )
        self._latency_sum = m.Gauge(f"{LATENCY}_sum", f"{latency}: their sum.", tag_keys=("app",))
        self._latency_count = m.Gauge(
            f"{LATENCY}_count", f"{latency}: requests.", tag_keys=("app",)
        )
        self._rejections = m.Counter(
            "raysrv_rejections", "Queries refused.", tag_keys=("where", "reason")
        )
        self._hits = m.Counter(
            "raysrv_cache_hits", "Prediction cache hits.", tag_keys=("app", "model")
        )
        self._misses = m.Counter(
            "raysrv_cache_misses", "Prediction cache misses.", tag_keys=("app", "model")
        )
        self._selected = m.Counter(
            "raysrv_selections", "Model chosen by selection.", tag_keys=("app", "model")
        )
        self._feedback = m.Counter("raysrv_feedback", "Feedback observed.", tag_keys=("app",))
        self._missing = m.Counter(
            "raysrv_missing_predictions",
            "Ensemble predictions left out: late at the deadline, refused or failed.",
            tag_keys=("app", "model"),
        )
        self._queue = m.Gauge(
            "raysrv_queue_length", "Queries waiting in a batcher.", tag_keys=("model",)
        )
        self._plan_p99 = m.Gauge(
            "raysrv_plan_predicted_p99_ms",
            "p99 latency the analytic model predicts for the current batching.",
            tag_keys=("model",),
        )
        self._batch_size = m.Histogram(
            "raysrv_batch_size", "Queries per dispatched batch.", BATCH_SIZE_BOUNDARIES, ("model",)
        )
        self._batch_latency = m.Histogram(
            "raysrv_batch_latency_ms",
            "Dispatch to answer of a batch.",
            LATENCY_BOUNDARIES_MS,
            ("model",),
        )
        self._loads = m.Counter(
            "raysrv_loads", "LOADs of models into pool workers.", tag_keys=("pool", "status")
        )
        self._load_ms = m.Histogram(
            "raysrv_load_ms", "Run time of a LOAD.", LATENCY_BOUNDARIES_MS, ("pool",)
        )
        self._unloads = m.Counter(
            "raysrv_unloads", "UNLOADs from pool workers.", tag_keys=("pool", "evicted")
        )
        self._cold = m.Histogram(
            "raysrv_cold_start_latency_ms",
            "Latency of queries whose model was loaded nowhere when they arrived.",
            LATENCY_BOUNDARIES_MS,
            ("pool",),
        )
        self._memory = m.Gauge(
            "raysrv_worker_weights_bytes",
            "Model weights a pool worker holds.",
            tag_keys=("pool", "worker"),
        )
        self._store_fallbacks = m.Counter(
            "raysrv_state_store_fallbacks",
            "State store operations served from memory while Redis was unreachable.",
            tag_keys=("operation",),
        )

    def _add(self, counter: Any, **tags: str) -> None:
        key = (counter, tuple(tags.items()))
        self._counts[key] = self._counts.get(key, 0.0) + 1.0
        self._soon()

    def _set(self, gauge: Any, value: float, **tags: str) -> None:
        self._levels[(gauge, tuple(tags.items()))] = value
        self._soon()

    def _soon(self) -> None:
        if self._flushing is not None:
            return
        try:
            # outside any request's context, so that Serve tags no series with its route
            self._flushing = asyncio.get_running_loop().call_later(
                FLUSH_S, self.flush, context=contextvars.Context()
            )
        except RuntimeError:  # no event loop in this thread: hand it over now
            self.flush()

    def flush(self) -> None:
        """Hand the summed counters and the gauges' last values to Ray."""
        self._flushing = None
        counts, levels = self._counts, self._levels
        self._counts, self._levels = {}, {}
        for (counter, tags), value in counts.items():
            counter.inc(value, tags=dict(tags))
        for (gauge, tags), value in levels.items():
            gauge.set(value, tags=dict(tags))
        changed, self._latency_changed = self._latency_changed, set()
        for app in changed:
            summed = self._latencies[app]
            for le, count in zip(LE_LABELS, summed.cumulative(), strict=True):
                self._latency_buckets.set(count, tags={"app": app, "le": le})
            self._latency_sum.set(summed.total, tags={"app": app})
            self._latency_count.set(summed.count, tags={"app": app})

    def request(self, app: str, status: int, latency_s: float | None = None) -> None:
        self._add(self._requests, app=app, status=str(status))
        if latency_s is not None:
            summed = self._latencies.get(app)
            if summed is None:
                summed = self._latencies[app] = Summed(LATENCY_BOUNDARIES_MS)
            summed.observe(latency_s * 1000.0)
            self._latency_changed.add(app)  # flushed with the count above

    def rejection(self, where: str, reason: str) -> None:
        self._add(self._rejections, where=where, reason=reason)

    def cache(self, app: str, model: str, hit: bool) -> None:
        self._add(self._hits if hit else self._misses, app=app, model=model)

    def selection(self, app: str, model: str) -> None:
        self._add(self._selected, app=app, model=model)

    def feedback(self, app: str) -> None:
        self._add(self._feedback, app=app)

    def missing(self, app: str, model: str) -> None:
        self._add(self._missing, app=app, model=model)

    def queue_length(self, model: str, length: int) -> None:
        self._set(self._queue, length, model=model)

    def plan(self, model: str, p99_ms: float) -> None:
        self._set(self._plan_p99, p99_ms, model=model)

    def batch(self, model: str, size: int, latency_s: float) -> None:
        tags: Any = {"model": model}
        self._batch_size.observe(size, tags=tags)
        self._batch_latency.observe(latency_s * 1000.0, tags=tags)

    def store_fallback(self, operation: str) -> None:
        self._add(self._store_fallbacks, operation=operation)

    def load(self, pool: str, status: str, seconds: float) -> None:
        self._add(self._loads, pool=pool, status=status)
        if status == "ok":
            self._load_ms.observe(seconds * 1000.0, tags={"pool": pool})

    def unload(self, pool: str, evicted: bool) -> None:
        self._add(self._unloads, pool=pool, evicted=str(evicted).lower())

    def cold_start(self, pool: str, latency_s: float) -> None:
        self._cold.observe(latency_s * 1000.0, tags={"pool": pool})

    def worker_memory(self, pool: str, worker: int, weight_bytes: int) -> None:
        self._set(self._memory, weight_bytes, pool=pool, worker=str(worker))
