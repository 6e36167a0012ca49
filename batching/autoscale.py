"""How many workers a pool should have: from a model of its queue, or from its requests in flight.

Three scalers behind one method, :meth:`Scaler.decide`, which reads a :class:`PoolLoad` (the
pool's recent arrivals, its queries in flight, its measured run times) and returns a
:class:`ScaleDecision`. None holds a clock, an event loop or Ray: the live pool and the
simulator call them alike.

``analytic`` (batch §IV, eq. 2 taken over the number of workers). The arrivals of the last
``window_s`` are fitted by a MAP2 (``fit_map2``, batch §III-A) and the run times per batch size
give S_k. The pool is modelled as BATCH's buffer (a batch is cut at ``max_batch`` queries or
``timeout`` after its first) in front of c workers that serve batches first come first served;
:meth:`~raysrv.analytics.BatchBufferModel.latency_bounds` bounds the ``percentile`` of latency
from above for each c. The scaler asks for the fewest workers whose bound meets the SLO (cost,
eq. 1 with reserved workers, grows with c alone), searching the buffer's cap and timeout over
a small grid: the live policies cut batches as workers free, which the buffer stands for with
the cap and timeout that serve the load with the fewest workers. The bound is pessimistic by
design (it charges every batch the largest batch's time once c > 1), so a count that meets it
meets the SLO. Three corrections make it plan ahead rather than react:

* **A rise of rate.** When two Poisson rates split at some arrival, the later higher, explain
  the window far better than one (a likelihood-ratio test), only the arrivals since the split
  are fitted: the window would mix two regimes, which a MAP2 reads as one bursty process and
  over-provisions for. A fall is not cut off, so that a burst that ended is planned for until
  it leaves the window.
* **Cold start.** A worker asked for now serves only after ``cold_start_s``; while the rate
  rises within the arrivals fitted, the rate planned for is extrapolated over the cold start
  (at most twice the rate measured), and in any case times ``1 + headroom``.
* **Scale to zero** (``min: 0``) only after ``idle_s`` without an arrival, and never sooner than
  ten cold starts: an idle spell shorter than that costs the next query more than the worker
  saves.

A shared pool's models are taken as one queue: their arrivals together, and for a batch of k
the mean of the models' run times weighted by their arrivals in the window
(:func:`mixed_run_times`), under the largest batch cap of their policies and the tightest SLO.
That is an approximation: a batch holds one model's queries, so batches come smaller than one
queue would cut them, and the workers also spend time loading models, which it leaves out.

``reactive`` is the rule Ray Serve's autoscaler applies to replicas: ``ceil(ongoing /
target_ongoing)``, ``ongoing`` averaged over ``look_back_s``. It sees a spike only once its
queries are queued, which is the comparison the analytic scaler is measured against
(``bench/RESULTS.md``, "Elastic capacity").

``serf`` (:class:`SerfScaler`) chooses the threads of each worker as well as their number:
the configuration SERF's reference table (serf §IV) gives the lowest predicted mean latency at
the measured load, from a short profile of the per-query service rate with 1, 2, ... queries
running at once, per thread count, taken before the pool serves. A change of threads is a
rolling replacement: the pool starts the new workers, puts them in service, and only then
drains the old ones.

All go through the same hysteresis (:class:`Hysteresis`): up once the need has stayed above
the workers in service for ``up_after_s`` (0: at once), down once it has stayed below for
``down_after_s``, and then only to the largest need seen over that span. Removing a worker is
the pool's business: it drains the worker first (:meth:`PoolScheduler.drain`), so no query is
lost to a scale-down.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "AutoscalingSpec",
    "Hysteresis",
    "PoolLoad",
    "ScaleDecision",
    "Scaler",
    "SerfScaler",
    "make_scaler",
    "mixed_run_times",
]

MIN_GAPS = 30  # gaps the analytic scaler fits a MAP2 to, at the least (``fit_map2`` needs 30)
# twice the log-likelihood ratio of two Poisson rates against one over the window that counts
# as a change of rate: 1,000 steady windows at each of 5 to 2,000 per second passed it in none
CHANGE_LLR = 25.0
MIN_SINCE = 10  # arrivals after a change of rate, at the least (fewer than MIN_GAPS: Poisson)
RAMP_SDS = 3.0  # how far the last half's count strays above half the arrivals' in a ramp
MAX_AHEAD = 2.0  # the most a ramp's extrapolation multiplies the rate planned for
IDLE_COLD_STARTS = 10  # scale to zero after at least this many cold starts without an arrival
TIMEOUT_FRACTIONS = (0.0, 0.25, 0.5, 1.0)  # the buffer timeouts searched, as shares of S_B
MAX_BUSY = 0.7  # the busiest the bound's workers are planned, charged S_B a batch
CAPS = 3  # batch caps searched: the policy's, its half and its quarter
# the bound's lattice: coarser than its default, about 5 times faster, a few % looser
LATTICE_POINTS = 100
MAX_POINTS = 2000
# Lindley steps a bound may take: a queue slower to settle is nearly saturated, and counts as
# missing the SLO (cheaper, and on the safe side: more workers)
MAX_STEPS = 300
LOAD_LEVELS = 20  # the rows of SERF's table, spread up to the most a configuration serves

Config = tuple[int, int, int]  # SERF's configuration of a pool: workers, threads, lanes


class AutoscalingSpec(BaseModel):
    """``autoscaling:`` of a pool or of a model's dedicated workers."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    policy: Literal["analytic", "reactive", "serf"] = Field(
        "analytic",
        description="'analytic': the fewest workers a model of the queue says meet the SLO "
        "(BATCH eq. 2 over workers); 'reactive': queries in flight over target_ongoing, as "
        "Ray Serve scales replicas; 'serf': the configuration (workers, threads, lanes) SERF's "
        "table gives the lowest mean latency at the measured load.",
    )
    min: int = Field(1, ge=0, le=1024, description="Fewest workers; 0 lets an idle pool stop.")
    max: int = Field(ge=1, le=1024, description="Most workers.")
    percentile: float = Field(
        0.99, gt=0.0, lt=1.0, description="The latency quantile that must meet the SLO."
    )
    slo_ms: float | None = Field(
        None,
        gt=0.0,
        description="The SLO the analytic scaler plans for; unset: the tightest SLO of the "
        "pool's models.",
    )
    every_s: float = Field(2.0, gt=0.0, le=600.0, description="Seconds between decisions.")
    window_s: float = Field(
        10.0, gt=0.0, le=3600.0, description="Seconds of arrivals the analytic scaler fits."
    )
    headroom: float = Field(
        0.1, ge=0.0, le=10.0, description="Plan for this much more load than measured."
    )
    target_ongoing: float = Field(
        2.0, gt=0.0, le=1e6, description="Reactive: queries in flight per worker aimed at."
    )
    look_back_s: float = Field(
        5.0, gt=0.0, le=3600.0, description="Reactive: seconds the in-flight count is averaged."
    )
    up_after_s: float = Field(
        0.0, ge=0.0, le=3600.0, description="Scale up once the need has held this long."
    )
    down_after_s: float = Field(
        10.0, ge=0.0, le=3600.0, description="Scale down once the need has held this long."
    )
    idle_s: float = Field(
        60.0, gt=0.0, le=86400.0, description="With min 0: stop after this long without queries."
    )
    threads: tuple[int, ...] = Field(
        (1, 2),
        min_length=1,
        description="SERF: the intra-op thread counts a worker's configuration may take.",
    )
    lanes: tuple[int, ...] | None = Field(
        None,
        min_length=1,
        description="SERF: the lanes (workers to a process) a configuration may take; unset: "
        "the model's `lanes`.",
    )
    cores: int | None = Field(
        None,
        ge=1,
        le=4096,
        description="SERF: the cores the pool's workers share, workers x threads at most; "
        "unset: the CPUs of the ingress's host.",
    )
    profile_queries: int = Field(
        20, ge=2, le=10_000, description="SERF: queries each profiled degree runs, per worker."
    )
    profile_s: float = Field(
        0.25,
        ge=0.0,
        le=60.0,
        description="SERF: each profiled degree runs for this long at the least, more than "
        "`profile_queries` queries where a query is short (the shorter the run, the noisier).",
    )

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingSpec:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) is above max ({self.max})")
        bad = [t for t in self.threads if not 1 <= t <= 256]
        if bad:
            raise ValueError(f"threads must each lie in 1..256, got {bad}")
        bad = [b for b in self.lanes or () if not 1 <= b <= 64]
        if bad:
            raise ValueError(f"lanes must each lie in 1..64, got {bad}")
        if self.lanes is not None and self.policy != "serf":
            raise ValueError(
                f"lanes {list(self.lanes)} with policy {self.policy!r}: only 'serf' switches "
                "lanes; give the model's `lanes` instead"
            )
        return self


@dataclass(frozen=True)
class PoolLoad:
    """What a scaler reads of a pool at one decision (times in seconds on the pool's clock)."""

    now: float
    workers: int  # in service, not draining
    arrivals: Sequence[float]  # arrival times, oldest first, over at least the scaler's window
    ongoing: float  # queries queued or running now
    run_times: Mapping[int, float]  # batch size -> median run time, the sizes measured
    max_batch: int  # the largest batch the pool's policy cuts
    slo_s: float  # the SLO to plan for
    cold_start_s: float = 0.0  # from asking for a worker to its first batch
    threads: int = 1  # intra-op threads of the workers in service
    lanes: int = 1  # workers that share each of their processes


@dataclass(frozen=True)
class ScaleDecision:
    """The workers to have, what the rule asked for before the hysteresis, and why."""

    workers: int
    needed: int
    reason: str
    rate: float | None = None  # analytic, serf: the arrival rate planned for, per second
    # analytic: the bound on the percentile at ``needed``; serf: the predicted mean latency
    predicted_s: float | None = None
    timeout_s: float | None = None  # analytic: the buffer's timeout that met the bound
    max_batch: int | None = None  # analytic: and its batch cap
    threads: int | None = None  # serf: each worker's intra-op threads; None: as they are
    lanes: int | None = None  # serf: workers that share a process; None: as they are


@dataclass
class Hysteresis:
    """Up once the need has held above the workers for ``up_after_s``, down once it has held
    below for ``down_after_s``, to the largest need of that span; otherwise no change."""

    up_after_s: float
    down_after_s: float
    _needs: deque[tuple[float, int]] = field(default_factory=deque)

    def apply(self, now: float, current: int, needed: int) -> int:
        self._needs.append((now, needed))
        span = max(self.up_after_s, self.down_after_s)
        while len(self._needs) > 1 and self._needs[1][0] <= now - span:
            self._needs.popleft()
        up = self._held(now, self.up_after_s)
        if up is not None and min(up) > current:
            return min(up)
        down = self._held(now, self.down_after_s)
        if down is not None and max(down) < current:
            return max(down)
        return current

    def _held(self, now: float, span_s: float) -> list[int] | None:
        """The needs over the last ``span_s``, if the record covers that span."""
        if self._needs[0][0] > now - span_s:
            return None
        start = max(i for i, (t, _) in enumerate(self._needs) if t <= now - span_s)
        return [n for _, n in list(self._needs)[start:]]


class Scaler:
    """A pool's scaler: :meth:`decide` once every ``spec.every_s``."""

    def __init__(self, spec: AutoscalingSpec) -> None:
        self.spec = spec
        self._hysteresis = Hysteresis(spec.up_after_s, spec.down_after_s)

    def decide(self, load: PoolLoad) -> ScaleDecision:
        needed, reason, extra = self._need(load)
        needed = min(max(needed, self.spec.min), self.spec.max)
        if load.workers == 0 and load.ongoing > 0:
            needed = max(needed, 1)  # queries wait for a worker: no hysteresis from zero
            target = needed
        else:
            target = self._hysteresis.apply(load.now, load.workers, needed)
        return ScaleDecision(
            min(max(target, self.spec.min), self.spec.max), needed, reason, **extra
        )

    def _need(self, load: PoolLoad) -> tuple[int, str, dict[str, Any]]:
        raise NotImplementedError

    def _idle(self, load: PoolLoad) -> bool:
        """Whether a pool allowed to stop has gone long enough without a query."""
        if self.spec.min > 0 or load.ongoing > 0:
            return False
        last = load.arrivals[-1] if len(load.arrivals) else -math.inf
        return load.now - last >= max(self.spec.idle_s, IDLE_COLD_STARTS * load.cold_start_s)


class ReactiveScaler(Scaler):
    """Queries in flight over ``target_ongoing``, averaged over ``look_back_s``."""

    def __init__(self, spec: AutoscalingSpec) -> None:
        super().__init__(spec)
        self._ongoing: deque[tuple[float, float]] = deque()

    def _need(self, load: PoolLoad) -> tuple[int, str, dict[str, Any]]:
        self._ongoing.append((load.now, load.ongoing))
        while self._ongoing[0][0] < load.now - self.spec.look_back_s:
            self._ongoing.popleft()
        if self._idle(load):
            return 0, "idle", {}
        mean = sum(n for _, n in self._ongoing) / len(self._ongoing)
        need = math.ceil(mean / self.spec.target_ongoing - 1e-9)
        return max(need, 1), f"{mean:.1f} in flight", {}


class AnalyticScaler(Scaler):
    """The fewest workers whose latency bound meets the SLO (see the module docstring)."""

    def _need(self, load: PoolLoad) -> tuple[int, str, dict[str, Any]]:
        if self._idle(load):
            return 0, "idle", {}
        if not load.run_times:
            return max(load.workers, 1), "no run times measured yet", {}
        from raysrv.analytics import Poisson, fit_map2

        arrivals = np.asarray(load.arrivals, dtype=float)
        recent = arrivals[(arrivals >= load.now - self.spec.window_s) & (arrivals <= load.now)]
        service = _service_times(load.run_times, load.max_batch)
        fitted, seconds, factor = self._regime(recent, load)
        fit = f"{fitted.size} arrivals over {seconds:.1f} s"
        if fitted.size < recent.size:
            fit += " since the rate changed"
        if factor > 1.0 + self.spec.headroom + 1e-9:
            fit += f", {factor:.2f}x their rate ahead"
        if fitted.size <= MIN_GAPS:  # too few to fit: Poisson at their count
            few = " (few arrivals: Poisson)"
            arrival = Poisson(max(fitted.size, 1) / seconds * factor)
        else:
            few = ""
            gaps = np.diff(fitted)
            fit += f", gaps' SCV {np.var(gaps) / np.mean(gaps) ** 2:.2f}"
            arrival = fit_map2(gaps / factor)
        slo = self.spec.slo_ms / 1000.0 if self.spec.slo_ms is not None else load.slo_s
        best = _fewest(arrival, service, slo, self.spec.percentile, self.spec.max)
        extra = {"rate": float(arrival.rate)}
        if best is None:
            return self.spec.max, "the SLO is out of reach: max", extra
        workers, bound, timeout, batch = best
        extra |= {"predicted_s": bound, "timeout_s": timeout, "max_batch": batch}
        reason = f"p{self.spec.percentile * 100:g} bound {bound * 1000:.1f} ms; {fit}{few}"
        return workers, reason, extra

    def _regime(self, recent: np.ndarray, load: PoolLoad) -> tuple[np.ndarray, float, float]:
        """The arrivals to fit, the seconds they span, and how much faster than their rate to
        plan for.

        The rate rose when a split of the window into two Poisson rates, the later higher, is
        far likelier than one rate (:func:`_change`). Then only the arrivals since the split
        are fitted, the regime now: the whole window would mix two, which a MAP2 reads as one
        bursty process. A fall is not cut off: a burst that ended stays in the fit until it
        leaves the window, so that workers are kept for bursts that recur (and go, once they
        stop, after ``down_after_s``). If the rate is still rising within the arrivals fitted
        (the last half's count above half theirs by more than ``RAMP_SDS`` standard
        deviations of a steady rate's), it is extrapolated over the cold start, ``MAX_AHEAD``
        times their rate at most. The headroom applies in any case."""
        if recent.size <= MIN_SINCE:
            return recent, self.spec.window_s, 1.0 + self.spec.headroom
        start = load.now - self.spec.window_s
        split = _change(recent, start, load.now)
        if split is not None and split / max(recent[split] - start, 1e-9) >= (
            recent.size - split
        ) / max(load.now - recent[split], 1e-9):
            split = None  # a fall: the burst before it is kept in view while in the window
        since = recent if split is None else recent[split:]
        seconds = self.spec.window_s if split is None else load.now - since[0]
        span = max(load.now - since[0], 1e-9)
        rate = since.size / span
        half = int(np.count_nonzero(since >= load.now - span / 2))
        ahead = 1.0
        if half - since.size / 2 > RAMP_SDS * math.sqrt(since.size) / 2:
            rising = half / (span / 2)
            slope = (rising - rate) / (span / 4)  # the two rates are span / 4 apart
            ahead = min(MAX_AHEAD, (rising + slope * (span / 4 + load.cold_start_s)) / rate)
        return since, seconds, ahead * (1.0 + self.spec.headroom)


def _change(times: np.ndarray, start: float, end: float) -> int | None:
    """The index of the first arrival after the likeliest change of a Poisson rate over
    ``[start, end]``, if twice its log-likelihood ratio against one rate passes ``CHANGE_LLR``
    and at least ``MIN_SINCE`` arrivals follow it; else None."""
    n = times.size
    if n <= MIN_SINCE + 1:
        return None
    k = np.arange(1, n - MIN_SINCE + 1)  # k arrivals before the split, at times[k]
    before = np.maximum(times[k] - start, 1e-9)
    after = np.maximum(end - times[k], 1e-9)
    one = n * math.log(n / (end - start))
    ratio = k * np.log(k / before) + (n - k) * np.log((n - k) / after) - one
    best = int(np.argmax(ratio))
    return int(k[best]) if 2.0 * ratio[best] > CHANGE_LLR else None


def mixed_run_times(
    tables: Mapping[str, Mapping[int, float]], shares: Mapping[str, float], max_batch: int
) -> dict[int, float]:
    """The run time of a batch of each size 1..``max_batch`` on a shared pool, its models
    taken as one: each model's own (the sizes it has not run filled in as for one model), the
    mean weighted by ``shares`` (its arrivals). A model with no run time measured is left out;
    with no share anywhere, each counts alike; with nothing measured, empty."""
    measured = {name: table for name, table in tables.items() if table}
    arrived = {name: table for name, table in measured.items() if shares.get(name, 0.0) > 0.0}
    chosen = arrived or measured  # a model without arrivals weighs nothing: not filled in
    if not chosen:
        return {}
    weights = np.array([shares[name] if arrived else 1.0 for name in chosen], dtype=float)
    times = np.array([_service_times(table, max_batch) for table in chosen.values()])
    mixed = weights @ times / weights.sum()
    return {size: float(t) for size, t in enumerate(mixed, start=1)}


def _service_times(run_times: Mapping[int, float], max_batch: int) -> np.ndarray:
    from raysrv.batching.profile import interpolate_batches, monotone_service_times

    sizes = sorted(run_times)
    raw = interpolate_batches(sizes, [run_times[k] for k in sizes], np.arange(1, max_batch + 1))
    return monotone_service_times(raw)


def _fewest(
    arrival: object, service: np.ndarray, slo: float, q: float, most: int
) -> tuple[int, float, float, int] | None:
    """(workers, bound, timeout, batch): the fewest workers, up to ``most``, whose bound on the
    ``q``-percentile meets ``slo`` with one of the buffers searched (the policy's batch cap, its
    half and its quarter, timeouts of shares of the batch's time); None if none do. A buffer
    whose latency with as many workers as batches (its lower bound) misses the SLO is skipped."""
    from raysrv.analytics import BatchBufferModel

    best: tuple[int, float, float, int] | None = None
    caps = sorted({max(1, service.size >> i) for i in range(CAPS)})
    for cap in caps:
        for timeout in sorted({f * float(service[cap - 1]) for f in TIMEOUT_FRACTIONS}):
            if timeout + float(service[0]) > slo:
                continue
            model = BatchBufferModel(arrival, service[:cap], cap, timeout)  # type: ignore[arg-type]
            if model.latency_percentile(q) > slo:
                continue
            most_here = most if best is None else best[0] - 1
            found = _bisect(model, q, slo, arrival.rate, most_here)  # type: ignore[attr-defined]
            if found is not None:
                best = (found[0], found[1], timeout, cap)
    return best


def _bisect(model: Any, q: float, slo: float, rate: float, most: int) -> tuple[int, float] | None:
    """The fewest workers up to ``most`` whose bound meets ``slo``, and the bound. One worker
    is charged each batch's own time; more are charged the largest batch's, so fewer than
    keep those below ``MAX_BUSY`` of their time busy are not tried: nearly saturated, their
    bound is far above any SLO, and slow to compute."""
    if most < 1:
        return None
    per_batch = rate / model.mean_batch_size()
    if per_batch * float(model.batch_size_pmf() @ model.service) < MAX_BUSY:
        bound = _bound(model, q, 1)
        if bound <= slo:
            return 1, bound
    lo, hi = max(2, math.ceil(per_batch * float(model.service[-1]) / MAX_BUSY)), most
    found = None
    while lo <= hi:  # the bound falls as workers are added
        c = (lo + hi) // 2
        bound = _bound(model, q, c)
        if bound <= slo:
            found, hi = (c, bound), c - 1
        else:
            lo = c + 1
    return found


def _bound(model: object, q: float, workers: int) -> float:
    try:
        bounds = model.latency_bounds(q, workers, _points(model), MAX_STEPS)  # type: ignore[attr-defined]
        return float(bounds.upper)
    except ValueError:  # too few workers for the load: no bound
        return math.inf


def _points(model: Any) -> int:
    """The bound's lattice: ``LATTICE_POINTS`` over the longest batch, the timeout and the mean
    gap, more where the gap is long against a batch of one (a slow trickle), so that a step
    stays within an eighth of that batch, up to ``MAX_POINTS``."""
    span = float(model.service[-1]) + model.timeout + 1.0 / model.rate
    return int(min(MAX_POINTS, max(LATTICE_POINTS, math.ceil(8 * span / float(model.service[0])))))


class SerfScaler(Scaler):
    """SERF's scheduler (serf §IV-D): the table's best configuration at the measured load.

    :meth:`set_profile` takes mu_1 .. mu_n per (threads, lanes) (the per-query service rate
    with i queries running at once, serf §IV-B) and builds the configuration reference table
    (``serf_config_table``, §IV-C) at ``LOAD_LEVELS`` loads spread up to the most any
    configuration serves. A configuration here is (workers, threads, lanes): each worker runs
    one batch at a time, ``lanes`` of them to a process on one copy of the model, so SERF's
    service parallelism c is the number of workers, which take the pool's one queue first
    come first served, as the M/D_interf/c queue does. ``cores`` bounds workers x threads, as
    a machine's cores bound ``c * C_intra`` (§IV-C).

    At a decision the load is the window's arrival rate times ``1 + headroom``, looked up at
    the next level up (``lookup_config``); beyond the table, the configuration that serves
    the most. Configurations are ordered by what they serve (c mu_c), and the hysteresis runs
    on that order: a switch to one that serves more after ``up_after_s``, to one that serves
    less after ``down_after_s``.
    """

    def __init__(self, spec: AutoscalingSpec) -> None:
        super().__init__(spec)
        self.rates: dict[tuple[int, int], tuple[float, ...]] = {}  # (threads, lanes) -> mu
        self.cores = 0
        self.table: tuple[Any, ...] = ()
        self._ranked: list[Config] = []  # by what they serve
        # configurations within the bounds and cores -> what it serves, c mu_c per second
        self.capacity: dict[Config, float] = {}

    def set_profile(
        self, rates: Mapping[int | tuple[int, int], Sequence[float]], cores: int
    ) -> None:
        """Build the table from ``rates[(threads, lanes)]`` = mu_1 .. mu_n (per second; a key
        of threads alone: one lane) on ``cores``."""
        from raysrv.analytics.serf import lanes_differ, serf_config_table

        shaped = {(k, 1) if isinstance(k, int) else k: mu for k, mu in rates.items()}
        self.rates = {k: tuple(float(m) for m in mu) for k, mu in sorted(shaped.items())}
        self.cores = cores
        lanes = {t: [b for u, b in self.rates if u == t] for t, _ in self.rates}
        self.capacity = {
            (c, t, b): c * mu[c - 1]
            for (t, b), mu in self.rates.items()
            for c in range(max(1, self.spec.min), min(len(mu), self.spec.max) + 1)
            if c * t <= cores and lanes_differ(c, b, lanes[t])
        }
        if not self.capacity:
            raise ValueError(
                f"no configuration fits: (threads, lanes) {sorted(self.rates)}, workers "
                f"{self.spec.min}..{self.spec.max}, {cores} cores"
            )
        # what serves more first, then fewer processes
        self._ranked = sorted(self.capacity, key=lambda k: (self.capacity[k], -k[0], k[2]))
        top = max(self.capacity.values())
        loads = [top * k / (LOAD_LEVELS + 1) for k in range(1, LOAD_LEVELS + 1)]
        profile = {
            (1, t, b): mu[: min(len(mu), self.spec.max, cores // t)]
            for (t, b), mu in self.rates.items()
            if cores // t >= 1
        }
        self.table = serf_config_table(profile, loads, machines=1, cores_per_machine=cores)

    def decide(self, load: PoolLoad) -> ScaleDecision:
        if not self.table:
            return ScaleDecision(load.workers, load.workers, "not profiled yet")
        if self._idle(load):
            return ScaleDecision(0, 0, "idle")
        from raysrv.analytics import lookup_config

        recent = [t for t in load.arrivals if t >= load.now - self.spec.window_s]
        rate = len(recent) / self.spec.window_s * (1.0 + self.spec.headroom)
        row = lookup_config(self.table, rate)
        fits = row.best is not None and row.load >= rate
        wanted: Config
        if fits:
            config = row.best.config
            wanted = (max(config.service, self.spec.min), config.intra_threads, config.lanes)
            predicted = row.best.latency
        else:
            wanted, predicted = self._ranked[-1], None
        if wanted not in self.capacity:  # raised to ``min``, past the cores: serve the most
            wanted = self._ranked[-1]
        if load.workers == 0 and load.ongoing > 0:
            target = wanted  # queries wait for a worker: no hysteresis from zero
        else:
            current = self._rank((load.workers, load.threads, load.lanes))
            target = self._ranked[
                self._hysteresis.apply(load.now, current, self._ranked.index(wanted))
            ]
        reason = (
            f"{rate:.1f}/s: the table's row {row.load:.1f}/s"
            if fits
            else f"{rate:.1f}/s: beyond the table, the configuration that serves the most"
        )
        workers, threads, lanes = target
        return ScaleDecision(
            workers, wanted[0], reason, rate=rate, predicted_s=predicted, threads=threads,
            lanes=lanes,
        )  # fmt: skip

    def _rank(self, config: Config) -> int:
        """The place of ``config`` in the order; one not in it takes the place of the
        configuration that serves closest to what it would."""
        if config in self.capacity:
            return self._ranked.index(config)
        workers, threads, lanes = config
        mu = self.rates.get((threads, lanes), ())
        serves = workers * mu[min(workers, len(mu)) - 1] if mu and workers else 0.0
        return min(
            range(len(self._ranked)),
            key=lambda i: abs(self.capacity[self._ranked[i]] - serves),
        )

    def describe(self) -> dict[str, Any]:
        """The profile and the table, as the plan view shows them."""
        return {
            "cores": self.cores,
            "rates": [
                {"threads": t, "lanes": b, "mu": list(mu)} for (t, b), mu in self.rates.items()
            ],
            "table": [
                {
                    "load": row.load,
                    "best": _choice(row.best),
                    "runner_up": _choice(row.runner_up),
                }
                for row in self.table
            ],
        }


def _choice(choice: Any) -> dict[str, Any] | None:
    if choice is None:
        return None
    return {
        "workers": choice.config.service,
        "threads": choice.config.intra_threads,
        "lanes": choice.config.lanes,
        "mean_ms": choice.latency * 1000.0,
    }


def make_scaler(spec: AutoscalingSpec) -> Scaler:
    if spec.policy == "serf":
        return SerfScaler(spec)
    return AnalyticScaler(spec) if spec.policy == "analytic" else ReactiveScaler(spec)
