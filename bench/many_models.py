"""Many models on a pool of two CPU workers, every system in one run (issue 17).

    python -m bench.many_models [--models 1000] [--seconds 120] [--slo-ms 100] [--load 0.8]
        [--zipf 1.0] [--workloads zipf trace hot] [--systems raysrv multiplexed]
        [--capacity-seconds 30] [--capacity trace=QPS zipf=QPS] [--hot-seconds 10]
        [--hot-repeats 8] [--hot-concurrency 4] [--quick]

The models are :mod:`bench.zoo`'s: ``--models`` ONNX MLPs with distinct random weights, 2.8 MiB
each, whose square layer runs ``--passes`` times (``PASSES`` below says why), built here on
first use. Clockwork (OSDI'20) §6.2-6.5 serves thousands of models from
workers whose memory holds a few; here two CPU workers (one CPU and one onnxruntime thread each)
may hold 5% of the models between them.

Systems, each deployed afresh for each point and sent first ``LEAD_S`` of the workload at the
point's rate, not counted (its lead-in: the trace's last minutes, which come before its first,
or another draw of the Zipf), so that each starts the point in the state that load leaves;
driven from this process with Ray Serve in its throughput-optimized mode
(``RAY_SERVE_THROUGHPUT_OPTIMIZED=1``: gRPC between handles and replicas, user code on the
replica's main thread) and HAProxy as its HTTP ingress (``RAY_SERVE_ENABLE_HA_PROXY=1``), the
best a Ray user could configure (``--default-serve``: Serve's default mode, its Python proxy).
Queries go over HTTP through HAProxy, on pooled connections, but for ``multiplexed``'s,
which go through a handle. A handle call costs this process, which shares the 2 cores with
the servers, about four times the CPU of an HTTP request: on the trace at 80.9 queries a
second the load generator took 0.40 of a core over handles and 0.10 over HTTP
(``bench/RESULTS_ARCHIVE.md``, "where the 2 cores went, three trace points on worker
actors"):

* ``raysrv``: one shared pool of 2 workers, ``memory_mb`` for 2.5% of the models each, the
  workers threads of the ingress's process (``placement: colocated``; ``--placement
  workers``: worker actors, one process each, as runs up to 17 had them), the models declared
  as one model set with the ``deadline`` policy (batches of at most 16; ``--param`` sets its
  other parameters), the SLO sent with every query (``slo_ms``, and
  ``sent_at`` the time the query was scheduled for, where its latency is counted from; the
  ingress keeps back from each deadline, for the answer's way back, what its rule gives at
  ``--trip-back``, by default raysrv's ``trip_back_quantile``). Their LOADs bring a model in
  without the run of one that ends a LOAD by default (``warm_up: false``; ``--warm-up`` keeps
  it): a zoo model's first run after loading takes no longer than its next (each run prints
  both, over ``FIRST_RUNS`` models, and saves them as ``first_run``), so that run would only
  lengthen every cold start, which multiplexed's loads do not pay either.
  ``--handles`` sends them through a handle instead, as runs up to 16 did.
* ``multiplexed-http`` and ``multiplexed``: what a Ray user would pick, ``@serve.multiplexed``
  (:mod:`bench.multiplexed`): 2 replicas of one CPU, each keeping as many models as a raysrv
  worker may, ``@serve.batch`` by model. ``multiplexed-http`` is sent HTTP requests naming
  the model in Serve's ``serve_multiplexed_model_id`` header, which HAProxy, without an
  ingress request router, does not route by: it balances them over the replicas, each loading
  what it is asked for.
  ``multiplexed`` is called through a handle, whose router sends a model's queries to the
  replica that holds it, with admission bounded so overload is refused.
* A dedicated replica per model does not fit: each is a Ray worker process (about 400 MB
  resident here), 1,000 of them would need some 400 GB against this machine's 24 GB. It is
  measured where it fits: the hot model alone (``hot``).

Workloads, scaled to the capacity measured just before each workload (a closed loop of 32
queries in flight on raysrv with the workload's model mix and an SLO no answer reaches):

* ``zipf``: Poisson arrivals at ``--load`` of the capacity, each query's model drawn from a
  Zipf(``--zipf``) popularity over the models (:func:`bench.traces.zipf_arrivals`).
* ``trace``: ``bench/data/many_functions.csv`` replayed, function i driving model i, at a mean
  of ``--load`` of the capacity, one trace minute a second (its hourly spikes fall a minute
  apart): :func:`bench.traces.replay_functions`.
* ``hot``: one model under a closed loop of ``--hot-concurrency`` for ``--hot-seconds``: on a
  dedicated pool of 2 workers, ``--hot-repeats`` loops; then in the shared pool, with every
  model registered and with it alone, ``--hot-repeats`` pairs of loops in one deployment whose
  catalog is changed live between them (``Bench.hot``); the table gives each configuration's
  median, the ratio of the medians, each pair's ratio and how far their median moves when
  the pairs are resampled (``resampled_median``). With 4 in flight few queries are
  refused (a loop's p99 was 41-85 ms), so goodput measures throughput. With 8, 4-38% of a
  loop's queries were refused as predicted late, and the goodput swung with the estimates that
  refused them: one configuration's loops spread by 1.4-2.7x, and redeploying for every loop
  added each deployment's own speed. With ``--refused-wait`` a
  refused client sends its next query only once its last one's SLO is over, as if it had
  waited for the answer: otherwise the clients resend at once, and the refusals take the 2
  cores from the workers, whose slowness then refuses more.

Reported per point from the client's side (latency from each query's scheduled arrival): SLO
attainment (answered within the SLO over offered), goodput, answers within the SLO or refused
before any work (429/503), late answers (each listed with how long before its SLO it left the
ingress, how long the client's own loop had just been held and how much of that its thread
ran, ``late_answers``) and, in brackets, how many were late when they reached this machine
(over HTTP, by the kernel's stamp of their last bytes, ``bench.wire``: an answer that arrived
in time but was read late, because the client, which shares the 2 cores with the servers, was
held off them, is late only in the first count), 504s (dropped at their deadline, work
spent), p50 and p99 of answers; from the servers: loads, evictions and cold starts per second,
and the most weight any worker held (raysrv: the worker's own account and
its process's peak memory).
For each raysrv point, "simulator": the same arrivals through
:func:`raysrv.analytics.simulate_pool` with the run times and LOAD times the point measured per
model, their spread and the trips it measured (``Bench.simulate``): the same scheduler, on
simulated workers and hops; "replayed": the same with the runs, LOADs and calls replayed from
the live pool's timeline rather than drawn (``replay``), so that what differs is the
scheduling on the live run's weather: the median of ``REPLAYS`` replays, all but the first
with every query nudged by a fraction of a millisecond, and their range (``Bench.replays``).
Both simulate the lead-in too and count the point's queries only. Plots:
``bench/figures/many_models_cdf.png`` and ``many_models_goodput.png`` (``--replot`` draws them
again from a saved run); everything, the request logs included, in
``bench/out/many_models.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import itertools
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from bench.loadgen import (
    REJECTED,
    STALL_S,
    HandleClient,
    RequestLog,
    _awaited,
    _exception_status,
    closed_loop,
    favour_client,
    refusal_reason,
    replay,
    scheduled_at,
)
from bench.multiplexed import build_multiplexed, replica_stats
from bench.plots import attainment_panels, goodput_panels
from bench.traces import MANY_FUNCTIONS, read_functions, replay_functions, zipf_arrivals
from bench.validate_live import start_ray
from bench.wire import StampedHttp
from bench.zoo import DEFAULT_DIR, build_zoo, digits_like, model_size, run_times
from raysrv._pool import PROFILE_RUNS
from raysrv.analytics import SimModel, simulate_pool
from raysrv.analytics.poolsim import Legs, call_legs, replayed_weather
from raysrv.batching import make_policy
from raysrv.config import IngressSpec, ResourcesSpec

__all__ = [
    "Bench",
    "Point",
    "TallyClient",
    "goodput_of",
    "main",
    "popularity_table",
    "serve_mode",
    "timed_closed_loop",
]

FIGURES = Path(__file__).parent / "figures"
OUT = Path(__file__).parent / "out" / "many_models.json"
OVERRUN_BATCHES = 50  # models whose learned overrun the timing summary counts: enough batches
SHOWN_LATE = 20  # late answers printed per point (the JSON keeps them all)
POPULARITY_BANDS = (1, 3, 10, 50, 200)  # model ranks where ``popularity_table``'s rows end
FIRST_RUNS = 10  # zoo models whose first run after loading is timed against their next
SPREAD_BATCHES = 20  # batches of one size of one model before its spread counts (``_spread``)
MAX_BATCH = 16
# The zoo's square layer runs 400 times: a batch of 1 takes about 4.6 ms on one thread, of 16
# about 26 ms, while a model stays 2.8 MiB. With the plain 2 MiB models (0.05 ms a batch) the
# Python hops of every system (client, Serve, ingress, worker, each about a millisecond of
# CPU on this 2-core machine) were the whole cost and the workers sat idle; here the workers'
# run time dominates, as the GPUs' does in Clockwork's evaluation.
PASSES = 400
WORKERS = 2
SHARE = 0.05  # of the models, the pool's workers hold together
CONCURRENCY = 32  # in flight in every closed loop
INPUTS = 512  # distinct inputs the clients cycle through
HOT_CONCURRENCY = 4  # in flight on the hot model: its answers well within a 100 ms SLO
WARM_S = 5.0  # of a closed loop before the hot model's loops, not measured
# Before each point, this much of its workload at its rate, not counted: every system, and the
# simulator, start the point in the state that load leaves (after a closed loop of 8 on its mix
# raysrv kept back 44 ms for the way back where the trace settles at about 20:
# bench/RESULTS_ARCHIVE.md, "what the simulator lacked until run 12").
LEAD_S = 5.0
ALONE, REGISTERED = "pool, the model alone", "pool, every model registered"  # hot configs
MUX_HTTP = "multiplexed-http"  # the multiplexed baseline over HTTP
SYSTEMS = ("raysrv", MUX_HTTP, "multiplexed")
HTTP_CONNECTIONS = 1024  # the client's pooled connections: more than a point keeps in flight
HOT = "hot"  # the hot model's name: the zoo's first model's file, outside the zoo's model set
RESAMPLES = 5000  # of the hot model's pairs, for the spread of their median ratio
SETTLE_S = 5.0  # after a hot-model deployment: the last one's processes end meanwhile
# The replay runs this many times, each but the first with every query sent a draw of
# N(0, REPLAY_JITTER_S) apart from when it was: such nudges spread one point's five replays
# over up to 3 points (bench/RESULTS.md, "The simulator against the live system"), so the
# simulator's figure is the replays' median, with their range.
REPLAYS, REPLAY_JITTER_S = 5, 1e-4
# A raysrv point's timeline is fetched this often while it runs: the pool keeps its last
# 20,000 actions, some 70 s of the trace, and the replay needs all of the point's
TIMELINE_EVERY_S = 1.0
# raysrv's default: what its ingress keeps back for the answer's way back (a quantile of its
# workers' answers' trips to it, ``raysrv._server.TripBack``)
TRIP_BACK = IngressSpec.model_fields["trip_back_quantile"].default
NICENESS = ResourcesSpec.model_fields["niceness"].default
# a colocated pool's batches this many steps below the ingress's loop, which shares their
# process: fewer answers dropped at their deadline (bench/RESULTS.md, "Where the workers run")
COLOCATED_NICENESS = 10
LOAD_NICENESS = ResourcesSpec.model_fields["load_niceness"].default
# the client's threads' niceness; below 0 they take a core from the servers sooner, as a
# client on its own machine would, and the servers lose it (bench/RESULTS.md, "Late answers")
CLIENT_NICENESS = 0


class HttpCalls:
    """Queries over HTTP through Serve's HAProxy ingress, on pooled kept-alive connections
    (:class:`bench.wire.StampedHttp`): raysrv's to ``POST /raysrv/v1/models/{model}/predict``,
    ``multiplexed-http``'s to its route. Each call is a task whose result is the JSON body
    answered: raysrv's errors carry their status in theirs; any other reply that is not a 200
    with a JSON object becomes one that does. Every result gets ``arrived``: the wall time its
    answer reached this machine, by the kernel's stamp."""

    def __init__(self) -> None:
        self._http: StampedHttp | None = None  # once Serve has started (``start``)

    def start(self, port: int) -> None:
        self._http = StampedHttp("127.0.0.1", port, HTTP_CONNECTIONS)

    def raysrv(self, slo_ms: float) -> Any:
        def call(pair: tuple[str, np.ndarray]) -> asyncio.Task[dict[str, Any]]:
            name, x = pair
            body = {"input": x.tolist(), "slo_ms": slo_ms, "sent_at": scheduled_at()}
            return asyncio.ensure_future(self._post(f"/raysrv/v1/models/{name}/predict", body))

        return call

    def multiplexed(self) -> Any:
        """``multiplexed-http``'s queries: the model named in Serve's header, which HAProxy
        does not route by (without an ingress request router it balances over the replicas)."""

        def call(pair: tuple[str, np.ndarray]) -> asyncio.Task[dict[str, Any]]:
            name, x = pair
            header = {"serve_multiplexed_model_id": name}
            return asyncio.ensure_future(self._post(f"/{MUX_HTTP}", {"input": x.tolist()}, header))

        return call

    async def _post(
        self, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> dict[str, Any]:
        assert self._http is not None, "start() first"
        reply = await self._http.post(path, json.dumps(body).encode(), headers)
        text = reply.body.decode(errors="replace")
        try:
            answer = json.loads(text)
        except ValueError:
            answer = None
        if not isinstance(answer, dict) or (reply.status != 200 and "error" not in answer):
            answer = {"error": "http", "message": text[:200], "status": reply.status}
        return {**answer, "arrived": reply.arrived}

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()


@dataclass(frozen=True)
class Point:
    workload: str
    system: str
    offered: int
    seconds: float
    within_slo: float  # share of offered answered within the SLO
    goodput: float  # answers within the SLO per second
    within_or_refused: float  # share answered within the SLO or refused before any work
    late: int
    refused: int
    expired: int
    errors: int
    p50_ms: float
    p99_ms: float
    loads: int
    evictions: int
    cold_per_s: float
    peak_weights_mb: float  # the most weight one worker held (raysrv: as measured there)
    peak_rss_mb: float  # the largest worker process's peak memory (nan: not measured)
    capacity: float  # queries/s measured before the workload, or given (--capacity)
    simulated: float  # within SLO in the simulator (nan: not run)
    replayed: float = math.nan  # the same with the live run's timeline replayed as its weather:
    # the median of ``REPLAYS`` replays, and their lowest and highest
    replayed_low: float = math.nan
    replayed_high: float = math.nan
    # answers past the SLO as they reached this machine, not as the client's loop saw them
    # (``late``): over HTTP, by the kernel's stamp (-1: not known)
    late_on_arrival: int = -1


class TallyClient(HandleClient):
    """A handle client that also tallies why queries were not answered; for raysrv, each
    query's trip to the ingress as the ingress measured it (``transit_ms``, in its answer or
    its error) and, of its answers, how much longer than raysrv's own latency the client
    waited (the trips), how much of that came after the answer left the ingress (the ways
    back: the trip less the trip in) and when, from its scheduled time, it left (``left``);
    over HTTP, how long after an answer reached this machine the client saw it (``unseen``)."""

    def __init__(
        self, call: Any, pairs: list[tuple[str, np.ndarray]], counted_from: int = 0
    ) -> None:
        """Queries before ``counted_from`` (a lead-in) are not tallied but their transits."""
        super().__init__(call, pairs)
        self.counted_from = counted_from
        self.reasons: collections.Counter[str] = collections.Counter()
        self.trips: list[float] = []
        self.ways_back: list[float] = []
        self.transits: dict[int, float] = {}  # query -> seconds to the ingress
        # query -> seconds from its scheduled time to its answer leaving the ingress
        self.left: dict[int, float] = {}
        self.scheduled: dict[int, float] = {}  # query -> wall time it was scheduled for
        # query -> seconds from its answer reaching this machine (the kernel's stamp,
        # ``arrived`` in the result) to the client seeing it
        self.unseen: dict[int, float] = {}

    async def send(self, i: int) -> int:
        self.scheduled[i] = scheduled_at()
        start = time.perf_counter()
        response = self._call(self._inputs[i % len(self._inputs)])
        counted = i >= self.counted_from
        try:
            result = await asyncio.wait_for(_awaited(response), self._timeout_s)
        except asyncio.TimeoutError:
            response.cancel()
            self._tally(counted, "client timeout")
            return 0
        except Exception as exc:
            self._tally(counted, type(exc).__name__)
            return _exception_status(exc)
        transit = result.get("transit_ms") if isinstance(result, dict) else None
        if transit is not None:
            self.transits[i] = transit / 1000.0
        if isinstance(result, dict) and "error" in result:
            self._tally(counted, refusal_reason(result.get("message", "")))
            return int(result.get("status", 500))
        if counted and isinstance(result, dict) and "latency_ms" in result:
            trip = time.perf_counter() - start - result["latency_ms"] / 1000.0
            self.trips.append(trip)
            if transit is not None:
                self.ways_back.append(trip - transit / 1000.0)
                self.left[i] = (transit + result["latency_ms"]) / 1000.0
        if isinstance(result, dict) and "arrived" in result:
            self.unseen[i] = max(0.0, time.time() - result["arrived"])
        return 200

    def _tally(self, counted: bool, reason: str) -> None:
        if counted:
            self.reasons[reason] += 1


class Bench:
    """One run: the zoo, the Ray session, the workloads' arrivals."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.slo_s = args.slo_ms / 1000.0
        self.zoo = DEFAULT_DIR.with_name(f"zoo-p{args.passes}")
        self.paths = build_zoo(self.zoo, args.models, passes=args.passes)
        self.names = [p.stem for p in self.paths]
        self.size = model_size(passes=args.passes)
        self.per_worker = max(1, round(SHARE * args.models / WORKERS))
        self.inputs = list(digits_like(np.random.default_rng(7), INPUTS))
        self.trip_back = getattr(args, "trip_back", TRIP_BACK)  # absent from older saved runs
        self.placement = getattr(args, "placement", "workers")  # runs up to 17 had no other
        niceness = getattr(args, "niceness", NICENESS)
        if niceness is None:
            niceness = COLOCATED_NICENESS if self.placement == "colocated" else NICENESS
        self.resources = {
            "num_cpus": 1,
            "niceness": niceness,
            "load_niceness": getattr(args, "load_niceness", LOAD_NICENESS),
        }
        self.params: dict[str, Any] = {"max_batch_size": MAX_BATCH}
        self.http = HttpCalls()
        self.handles = getattr(args, "handles", True)  # runs saved before HTTP was the default
        self.http_trip_back = getattr(args, "http_trip_back", "replies")
        for item in getattr(args, "param", None) or []:
            key, _, value = item.partition("=")
            self.params[key] = json.loads(value)

    # -- systems ---------------------------------------------------------------------------

    def template(self, name: str | None = None) -> dict[str, Any]:
        """A zoo model's spec in the shared pool (``name``'s), or the model set's template."""
        template = {
            "runtime": "onnx",
            "batching": {"policy": "deadline", "params": self.params},
            "slo_ms": self.args.slo_ms,
            "input": {"shape": [64], "dtype": "float32"},
            "pool": "zoo",
            "warm_up": getattr(self.args, "warm_up", True),  # runs saved before it warmed up
        }
        if name is None:
            return template
        return {**template, "name": name, "source": str(self.zoo / f"{name}.onnx")}

    def model_set(self) -> dict[str, Any]:
        """Every zoo model, as one model set."""
        return {"name": "zoo", "source": str(self.zoo / "m*.onnx"), "template": self.template()}

    def raysrv_spec(self, models: list[str] | None = None, pool: bool = True) -> dict[str, Any]:
        """The raysrv spec: every zoo model (or ``models``) in one shared pool, or (without
        ``pool``) the first of ``models`` on a dedicated pool of 2 workers."""
        ingress = {
            "num_cpus": 0,
            "trip_back_quantile": self.trip_back,
            "http_trip_back": self.http_trip_back,
        }
        spec: dict[str, Any] = {"ingress": ingress}
        if not pool:
            name = models[0] if models else self.names[0]
            dedicated = {k: v for k, v in self.template(name).items() if k != "pool"}
            spec["models"] = [
                {
                    **dedicated,
                    "replicas": WORKERS,
                    "resources": self.resources,
                    "placement": self.placement,
                }
            ]
            return spec
        memory_mb = self.per_worker * self.size / (1 << 20) + 0.01
        spec["pools"] = [
            {
                "name": "zoo",
                "workers": WORKERS,
                "resources": self.resources,
                "placement": self.placement,
                "memory_mb": memory_mb,
            }
        ]
        if models is None:
            spec["model_sets"] = [self.model_set()]
        else:
            spec["models"] = [self.template(m) for m in models]
        return spec

    def deploy(self, system: str, spec: dict[str, Any] | None = None) -> Any:
        from ray import serve
        from ray.serve.schema import LoggingConfig

        from raysrv.app import build_app

        clear()
        quiet = LoggingConfig(enable_access_log=False, log_level="WARNING")
        if system in ("multiplexed", MUX_HTTP):
            app = build_multiplexed(self.zoo, WORKERS, models_per_replica=self.per_worker)
        else:
            app = build_app(spec or self.raysrv_spec())
        serve.run(app, name=system, route_prefix=f"/{system}", logging_config=quiet)
        return serve.get_app_handle(system)

    async def deploy_declared(
        self, spec: dict[str, Any], user_config: dict[str, Any], models: int
    ) -> Any:
        """raysrv serving ``spec`` with its ingress's ``user_config`` (what ``serve deploy`` of
        a config file does), once it lists ``models`` models: a config that changes only the
        ``user_config`` is applied to the running ingress, restarting nothing."""
        from ray import serve
        from ray.serve.context import _get_global_client
        from ray.serve.schema import ServeDeploySchema

        app = {
            "name": "raysrv",
            "route_prefix": "/raysrv",
            "import_path": "raysrv.app:build_app",
            "args": spec,
            "deployments": [{"name": "ingress", "user_config": user_config}],
            "logging_config": {"enable_access_log": False, "log_level": "WARNING"},
        }
        config = ServeDeploySchema.model_validate({"applications": [app]})
        _get_global_client().deploy_apps(config, _blocking=True)
        handle = serve.get_app_handle("raysrv")
        deadline = time.monotonic() + 120.0
        while len(await handle.models.remote()) != models:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the ingress did not come to serve {models} models")
            await asyncio.sleep(0.5)
        return handle

    def call(self, system: str, handle: Any, slo_ms: float) -> Any:
        if system == "raysrv" and not self.handles:
            return self.http.raysrv(slo_ms)
        if system == MUX_HTTP:
            return self.http.multiplexed()
        if system == "multiplexed":
            handles: dict[str, Any] = {}

            def multiplexed(pair: tuple[str, np.ndarray]) -> Any:
                name, x = pair
                if name not in handles:
                    handles[name] = handle.options(multiplexed_model_id=name)
                return handles[name].predict.remote(x)

            return multiplexed
        return lambda pair: handle.predict_model.remote(
            pair[0], pair[1], slo_ms=slo_ms, sent_at=scheduled_at()
        )

    def pairs(self, models: np.ndarray) -> list[tuple[str, np.ndarray]]:
        return [(self.names[m], self.inputs[i % INPUTS]) for i, m in enumerate(models)]

    # -- workloads -------------------------------------------------------------------------

    def mix(self, workload: str, n: int) -> np.ndarray:
        """``n`` models in the order the workload asks for them (for a closed loop)."""
        rng = np.random.default_rng(11)
        if workload == "zipf":
            return zipf_arrivals(n, 1.0, len(self.names), self.args.zipf, rng)[1]
        _, models = self.arrivals(workload, 50.0)
        return np.resize(models, n)

    def arrivals(
        self, workload: str, rate: float, lead: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """The point's arrival times and models; with ``lead``, its ``LEAD_S`` lead-in, at
        times in [-LEAD_S, 0): the trace's last minutes (the day before its first), or other
        draws of the same Zipf."""
        rng = np.random.default_rng(4 if lead else 3)
        seconds = LEAD_S if lead else self.args.seconds
        if workload == "zipf":
            times, models = zipf_arrivals(rate, seconds, len(self.names), self.args.zipf, rng)
        else:
            counts = read_functions(MANY_FUNCTIONS)
            matrix = np.vstack(list(counts.values()))[: len(self.names)]
            start = matrix.shape[1] - math.ceil(LEAD_S) if lead else 0
            times, models = replay_functions(matrix, rate, seconds, rng, 1.0, start)
        return (times - LEAD_S, models) if lead else (times, models)

    async def capacity(self, workload: str) -> float:
        """raysrv's closed-loop throughput on the workload's mix (no SLO reached)."""
        handle = self.deploy("raysrv")
        pairs = self.pairs(self.mix(workload, 200_000))
        client = HandleClient(self.call("raysrv", handle, 60_000.0), pairs, timeout_s=60.0)
        await closed_loop(client, 8, 5.0)  # warm-up
        result = await closed_loop(client, CONCURRENCY, self.args.capacity_seconds, first=50_000)
        return result.throughput_rps

    async def point(
        self, workload: str, system: str, capacity: float
    ) -> tuple[Point, RequestLog, dict[str, Any]]:
        """One system on the workload, after its lead-in (``LEAD_S``, not counted)."""
        rate = self.args.load * capacity
        times, models = self.arrivals(workload, rate)
        lead, lead_models = self.arrivals(workload, rate, lead=True)
        every = np.concatenate([lead, times])
        handle = self.deploy(system)
        call = self.call(system, handle, self.args.slo_ms)
        client = TallyClient(call, self.pairs(np.concatenate([lead_models, models])), lead.size)
        gathered = None
        if self.args.client_niceness and not favour_client(self.args.client_niceness):
            print(f"  the client keeps its niceness: {self.args.client_niceness} needs root")
        if system == "raysrv":
            done = asyncio.Event()
            gathered = asyncio.create_task(_gather_timeline(handle, time.time() - 1.0, done))
        offsets = every + LEAD_S
        log = _counted(await replay(client, offsets), LEAD_S)
        server = await self.server_state(system, handle)
        server["reasons"] = dict(client.reasons.most_common(8))
        server["trips"] = client.trips
        server["ways_back"] = client.ways_back
        transits = [client.transits.get(i, math.nan) for i in range(every.size)]
        server["lead"], server["lead_models"] = lead, lead_models
        server["lead_transits"], server["transits"] = transits[: lead.size], transits[lead.size :]
        print(f"  {system} on {workload}: not answered because {server['reasons']}")
        if system == "raysrv":
            # the wall time of the point's start, where the queries' offsets count from
            server["wall0"] = float(np.median([t - every[i] for i, t in client.scheduled.items()]))
            done.set()
            server["timeline"] = await gathered  # type: ignore[misc]
            server["timing"] = _timing(client.trips, server)
            print(f"  {system} on {workload}: timing (ms) {server['timing']}")
        point = summarize(log, workload, system, self.slo_s, self.args.seconds, capacity, server)
        # the counted log's scheduled offsets, as _counted computes them, to each query
        left = {float(o) - LEAD_S: client.left.get(i, math.nan) for i, o in enumerate(offsets)}
        unseen = {float(o) - LEAD_S: client.unseen.get(i, math.nan) for i, o in enumerate(offsets)}
        server["late"] = late_answers(log, self.slo_s, left, unseen)
        if client.unseen:
            point = replace(point, late_on_arrival=sum(not row[5] <= 0 for row in server["late"]))
        if server["late"]:
            shown = server["late"][:SHOWN_LATE]
            print(f"  {system} on {workload}: {len(server['late'])} late answers, the first")
            print(
                f"    {len(shown)} as (sent at s, ms late, ms before its SLO it left the "
                f"ingress, the client's loop held ms, its thread ran ms of it, ms late as it "
                f"reached this machine): {shown}"
            )
        return point, log, {"times": times, "models": models, **server}

    async def server_state(self, system: str, handle: Any) -> dict[str, Any]:
        if system in ("multiplexed", MUX_HTTP):
            stats = await replica_stats(handle, WORKERS)
            resident = max(len(s["models"]) for s in stats)
            return {
                "loads": sum(s["loads"] for s in stats),
                "evictions": sum(s["evictions"] for s in stats),
                "cold": sum(s["loads"] for s in stats),
                "peak_weights": resident * self.size,  # models kept at most, as configured
                "peak_rss": float("nan"),
                "replicas": stats,
            }
        (pool,) = await handle.pools.remote()
        models = await handle.models.remote()
        return {
            "call_overhead_ms": pool["call_overhead_ms"],
            "start_late_ms": pool["start_late_ms"],
            "return_ms": pool["return_ms"],
            "step_lag_ms": pool["step_lag_ms"],
            "trip_in_ms": pool["trip_in_ms"],
            "kept_back_ms": pool["kept_back_ms"],
            "loads": pool["loads"],
            "evictions": pool["evictions"],
            "cold": pool["cold_starts"],
            # the most weight a worker held, by its own account and by the scheduler's
            "peak_weights": max(
                max(w["process"]["peak_bytes"], w["peak_bytes"]) for w in pool["workers"]
            ),
            "peak_rss": max(w["process"]["peak_rss_bytes"] for w in pool["workers"]),
            "profiles": {
                m["name"]: {
                    "batch": m["batch_seconds"],
                    "counts": m["batch_counts"],
                    "load_ms": m["load_ms"],
                }
                for m in models
                if m["batches"] or m["loads"]
            },
            "overruns_ms": [
                m["batching"]["learned_overrun_ms"]
                for m in models
                if m["batches"] >= OVERRUN_BATCHES and "learned_overrun_ms" in m["batching"]
            ],
        }

    async def hot(self) -> list[dict[str, Any]]:
        """The hot model's goodput on a dedicated pool of 2 workers, ``--hot-repeats`` loops in
        one deployment; then in the shared pool with every model registered and with it alone,
        ``--hot-repeats`` pairs of loops in one deployment of the pool: its ``args`` declare
        the hot model (``HOT``, the zoo's first model's file), and its ingress's
        ``user_config`` catalog holds the zoo's model set or nothing, in turn (as ``serve
        deploy`` applies a changed config: no worker restarts, the hot model stays loaded), in
        the order ABBA... so that a drift of the machine's speed falls on both alike."""
        rows = []
        hot = {**self.template(self.names[0]), "name": HOT}
        dedicated = self.raysrv_spec([self.names[0]], pool=False)
        dedicated["models"][0]["name"] = HOT
        handle = self.deploy("raysrv", dedicated)
        await asyncio.sleep(SETTLE_S)
        for repeat in range(self.args.hot_repeats):
            rows.append(await self.hot_loop(handle, "dedicated pool", repeat))
        clear()
        spec = {**self.raysrv_spec([]), "models": [hot]}
        await self.deploy_declared(spec, {}, 1)
        await asyncio.sleep(SETTLE_S)
        registered = {"catalog": {"model_sets": [self.model_set()]}}
        configs = {ALONE: ({}, 1), REGISTERED: (registered, 1 + len(self.names))}
        labels = list(configs)
        for repeat in range(self.args.hot_repeats):
            order = labels if repeat % 2 == 0 else labels[::-1]
            for label in order:
                handle = await self.deploy_declared(spec, *configs[label])
                rows.append(await self.hot_loop(handle, label, repeat))
        return rows

    async def hot_loop(self, handle: Any, label: str, repeat: int) -> dict[str, Any]:
        """A closed loop of ``--hot-concurrency`` on the hot model for ``--hot-seconds``, after
        ``WARM_S`` of one not measured."""
        concurrency = getattr(self.args, "hot_concurrency", HOT_CONCURRENCY)
        pairs = [(HOT, self.inputs[i]) for i in range(INPUTS)]
        warm = HandleClient(self.call("raysrv", handle, self.args.slo_ms), pairs)
        await closed_loop(warm, concurrency, WARM_S)  # loads the model, warms up
        client = TallyClient(self.call("raysrv", handle, self.args.slo_ms), pairs)
        wait = self.slo_s if getattr(self.args, "refused_wait", False) else 0.0
        log = await timed_closed_loop(
            client, self.args.hot_seconds, concurrency, refused_wait_s=wait
        )
        goodput = goodput_of(log, self.slo_s)
        answered = np.asarray(log.status) == 200
        latency = (np.asarray(log.done) - np.asarray(log.scheduled))[answered] * 1000.0
        p50, p99 = np.percentile(latency, [50, 99]) if latency.size else (math.nan, math.nan)
        row = {
            "config": label,
            "repeat": repeat,
            "goodput": goodput,
            "p50_ms": float(p50),
            "p99_ms": float(p99),
            "statuses": dict(collections.Counter(log.status)),
            "reasons": dict(client.reasons.most_common(4)),
        }
        print(f"  hot: {label}: {goodput:.1f} within the SLO/s, p50 / p99 {p50:.0f} / {p99:.0f} ms")
        print(f"    statuses {row['statuses']}, not answered: {row['reasons']}")
        return row

    def replays(
        self, workload: str, extra: dict[str, Any], capacity_bytes: int
    ) -> tuple[np.ndarray, list[float]]:
        """The replay (:meth:`simulate` with ``replay``) ``REPLAYS`` times: which queries the
        first, on the arrivals as they were, answers within the SLO, and every replay's
        attainment, the others' with each query sent ``N(0, REPLAY_JITTER_S)`` apart from
        when it was (seeded by the replay's number)."""
        first = self.simulate(workload, extra, capacity_bytes, replay=True)
        shares = [_attainment(first)]
        for seed in range(1, REPLAYS):
            within = self.simulate(workload, extra, capacity_bytes, replay=True, jitter=seed)
            shares.append(_attainment(within))
        low, high = min(shares), max(shares)
        print(
            f"  simulator, replayed on {workload}: {REPLAYS} replays, median "
            f"{np.median(shares):.2%} ({low:.2%} to {high:.2%})"
        )
        return first, shares

    def simulate(
        self,
        workload: str,
        extra: dict[str, Any],
        capacity_bytes: int,
        replay: bool = False,
        jitter: int | None = None,
    ) -> np.ndarray:
        """Which of the point's queries (in their order in ``extra["times"]``) the simulator
        answers within the SLO, given the same arrivals and what the point measured (printed
        with why the rest were not answered and the overruns the simulated policies learned,
        as the live point's are):
        median run times and LOAD times per model (the pool's medians for a model that ran
        none), each batch's median multiplied by a factor drawn from the spread of the
        measured run times (``_spread``), each call's legs to a worker and back drawn from the
        ones measured (``_legs``). Each query reaches the scheduler after the
        trip to the ingress it took live (its ``transit_ms``; drawn from the pool's
        ``trip_in_ms`` for the few the client never heard back about), and its deadline there is
        the SLO less what the ingress's own rule (:class:`raysrv._server.TripBack`) keeps back,
        over the trips before it and replies drawn from the answers' trips from the workers
        measured (``return_ms``) and, with ``--http-trip-back loop``, the loop's lags drawn
        from the pool's steps' (``step_lag_ms``); it counts if its answer is back at the client
        within the SLO, after a way back drawn from the ones the client measured. The trips in
        are taken as they were rather than drawn: they come from the ingress's own queue, which
        grows with the trace's bursts, and every deadline depends on them.

        With ``replay``, the runs, LOADs and calls are not drawn but replayed from the live
        pool's timeline (:func:`raysrv.analytics.poolsim.replayed_weather`, the workers as
        one machine): an action takes its median times what the live actions of its kind (an
        INFER: of its own model near its time, else of any model, of its size band) took over
        theirs, one after another in their live order as long as the simulation keeps within
        200 ms of their live times; a call takes the legs of the live calls the same way, and
        the ingress's rule is fed the replies it took up live, in their order. What is left to
        compare is then the scheduling, on the live run's weather. The pool keeps its last
        20,000 actions, so a point's timeline is fetched every ``TIMELINE_EVERY_S`` while it
        runs. With ``jitter`` (a seed), each query is sent a draw of ``N(0,
        REPLAY_JITTER_S)`` apart from when it was (:meth:`replays`).

        The lead-in's queries go through the simulator first, as they went through the live
        pool, and only the point's count; before them the simulated pool takes the live pool's
        profiling step (``PROFILE_RUNS`` runs of each size the policy profiles)."""
        profiles = extra["profiles"]
        pooled = _pooled_table(p["batch"]["p50"] for p in profiles.values())
        rng = np.random.default_rng(11)
        spread = _spread(list(profiles.values()), rng)
        loads = [p["load_ms"]["p50"] for p in profiles.values() if p["load_ms"]["p50"]]
        pooled_load = float(np.median(loads)) / 1000.0 if loads else 0.0
        every = np.concatenate([extra["lead_models"], extra["models"]]).astype(int)
        used = sorted({self.names[m] for m in every})
        models = {}
        medians: dict[str, Any] = {}  # model -> its median run time of a batch of k
        for name in used:
            own = profiles.get(name, {})
            table = _table(own.get("batch", {}).get("p50") or {}) or pooled
            load_ms = (own.get("load_ms") or {}).get("p50")
            medians[name] = _service(table, lambda: 1.0)
            models[name] = SimModel(
                make_policy("deadline", self.params, self.slo_s),
                medians[name] if replay else _service(table, spread),
                load_s=pooled_load if load_ms is None else load_ms / 1000.0,
                weight_bytes=self.size,
                group="zoo",
            )

        def expected(kind: str, model: str, size: int) -> float | None:
            if model not in models:
                return None
            return medians[model](size) if kind == "infer" else models[model].load_s

        weather = None
        if replay:  # the 2 workers share this machine
            weather = replayed_weather(extra["timeline"], expected, extra["wall0"], True)
        names = [self.names[m] for m in every]
        times = np.concatenate([extra["lead"], extra["times"]])
        if jitter is not None:
            times = times + np.random.default_rng(jitter).normal(0.0, REPLAY_JITTER_S, times.size)
        trip_in = _drawn(extra["trip_in_ms"], rng)
        way = np.asarray([*extra["lead_transits"], *extra["transits"]], dtype=float)
        unknown = np.flatnonzero(np.isnan(way))  # the client gave up on them, or Ray failed
        way[unknown] = [trip_in() for _ in unknown]
        order = np.argsort(times + way, kind="stable")
        if replay:  # the replies the live ingress took up, in their order
            replies = _replayed_replies(extra["timeline"], extra["wall0"])
        else:
            draw = _drawn(extra["return_ms"], rng)
            replies = lambda t: (draw(),)  # noqa: E731 - one reply drawn with each query
        arrivals = (times + way)[order]
        lags = None  # a step's wait for the ingress's loop, which an HTTP answer meets too
        if self.http_trip_back == "loop" and not self.handles and extra.get("step_lag_ms"):
            lags = _drawn(extra["step_lag_ms"], rng)
        kept = _kept_back(arrivals, way[order], replies, self.trip_back, self.slo_s, lags)
        kept = kept[np.argsort(order)]
        deadlines = times + self.slo_s - kept
        ways_back = np.asarray(extra["ways_back"] or [0.0])
        result = simulate_pool(
            arrivals,
            [names[i] for i in order],
            models,
            workers=WORKERS,
            capacity_bytes=capacity_bytes,
            depth=2,
            hop_s=_legs(extra, rng),
            deadlines=deadlines[order],
            weather=weather,
            profile_runs=PROFILE_RUNS,
        )
        counted = order >= len(extra["lead"])  # not the lead-in
        back = result.arrivals + result.latencies + rng.choice(ways_back, times.size)
        answered = ~result.rejected & ~result.late & counted  # before the ingress's deadline
        met = answered & (back <= times[order] + self.slo_s)
        if jitter is None:  # the nudged replays only count
            self._report(workload, replay, result, counted, answered & ~met, models)
        within = np.empty_like(met)
        within[order] = met
        return within[len(extra["lead"]) :]

    @staticmethod
    def _report(
        workload: str,
        replay: bool,
        result: Any,
        counted: np.ndarray,
        late_back: np.ndarray,
        models: dict[str, SimModel],
    ) -> None:
        """Why the simulated queries were not answered, the late ones, and the overruns the
        simulated policies learned, as the live point prints them."""
        which = "simulator, replayed" if replay else "simulator"
        reasons = collections.Counter(result.why[counted & result.rejected].tolist())
        print(f"  {which} on {workload}: not answered because {dict(reasons)}")
        late = int((result.late & counted).sum())  # past the ingress's deadline: live, a 504
        print(f"  {which} on {workload}: {late} answered after the ingress's deadline")
        print(f"  {which} on {workload}: {int(late_back.sum())} back at the client after the SLO")
        batches = collections.Counter(result.batch_models.tolist())
        learned = [
            float(m.policy.describe()["learned_overrun_ms"])  # type: ignore[arg-type]
            for name, m in models.items()
            if batches[name] >= OVERRUN_BATCHES
        ]
        if learned:
            overrun = f"{np.median(learned):.1f} / {np.max(learned):.1f}"
            print(f"  {which} on {workload}: overrun median / max (ms) {overrun}")


def clear() -> None:
    """Delete every Serve application."""
    from ray import serve

    for name in list(serve.status().applications):
        serve.delete(name)


def _counted(log: RequestLog, lead_s: float) -> RequestLog:
    """The queries of ``log`` scheduled after its first ``lead_s``, on a clock whose 0 is
    then."""
    kept = RequestLog()
    for scheduled, sent, done, status in zip(
        log.scheduled, log.sent, log.done, log.status, strict=True
    ):
        if scheduled >= lead_s:
            kept.scheduled.append(scheduled - lead_s)
            kept.sent.append(sent - lead_s)
            kept.done.append(done - lead_s)
            kept.status.append(status)
    kept.stalls = [(t - lead_s, *held) for t, *held in log.stalls if t >= lead_s]
    return kept


def _legs(extra: dict[str, Any], rng: np.random.Generator) -> Any:
    """A function drawing a call's :class:`raysrv.analytics.poolsim.Legs`, each from the
    point's calls that measured it (:func:`raysrv.analytics.poolsim.call_legs`)."""
    measured = call_legs(extra["timeline"])

    def one(values: np.ndarray) -> float:
        return float(rng.choice(values)) if values.size else 0.0

    def draw() -> Legs:
        legs = Legs(*(one(values) for values in measured))
        return legs if measured.to_load.size else legs._replace(to_load=None)

    return draw


def _drawn(quantiles_ms: dict[str, float | None], rng: np.random.Generator) -> Any:
    """A function drawing seconds from the distribution given by its quantiles in ms
    (``{"p10": ..., "p99": ...}``), linear between them and clamped at the ends."""
    known = sorted((int(k[1:]) / 100.0, v / 1e3) for k, v in quantiles_ms.items() if v is not None)
    if not known:
        return 0.0
    qs, values = [0.0] + [q for q, _ in known] + [1.0], [known[0][1]] + [v for _, v in known]
    values.append(values[-1])
    return lambda: float(np.interp(rng.random(), qs, values))


def _kept_back(
    arrivals: np.ndarray,
    trips: np.ndarray,
    replies: Any,
    quantile: float,
    slo_s: float,
    lags: Callable[[], float] | None = None,
) -> np.ndarray:
    """What the ingress keeps back from each query's deadline, the queries arriving at
    ``arrivals`` after ``trips`` with an SLO of ``slo_s``, in this order, and the ingress taking
    up ``replies(t)`` from its workers (seconds) before a query at t: its own rule,
    :class:`raysrv._server.TripBack`;
    with ``lags`` (a draw of one step's wait for the loop, one per query), its loop's rule for
    answers over HTTP (``http_trip_back: loop``)."""
    from raysrv._server import TripBack

    rule, kept = TripBack(), np.empty(trips.size)
    for i, (t, trip) in enumerate(zip(arrivals, trips, strict=True)):
        for reply in replies(float(t)):
            rule.reply(reply)
        if lags is not None:
            rule.lag(lags())
        kept[i] = rule.kept(quantile, http=lags is not None)
        rule.arrived(float(trip), slo_s)
    return kept


async def _gather_timeline(handle: Any, since: float, done: asyncio.Event) -> dict[str, list[Any]]:
    """The pool's timeline from ``since`` until ``done`` is set, fetched every
    ``TIMELINE_EVERY_S`` (the pool keeps only its last actions) and once more after ``done``:
    each action once, in the order the pool kept them. Each fetch asks only for the actions
    kept since the last one (``after``), so that no one large fetch holds the client's loop:
    every 15 s, fetches of all the actions sent in the last 20 s held it 6-15 ms, and late
    answers followed them (bench/RESULTS.md, "Late answers")."""
    columns: dict[str, list[Any]] = {}
    after = -1
    while True:
        last = done.is_set()
        part = await handle.timeline.remote("zoo", since, after)
        if part["seq"]:
            if after >= 0 and part["seq"][0] != after + 1:
                raise RuntimeError(
                    f"the pool dropped actions {after + 1}-{part['seq'][0] - 1} between two "
                    "fetches of its timeline: fetch it more often"
                )
            after = part["seq"][-1]
            for name, values in part.items():
                columns.setdefault(name, []).extend(values)
        if last:
            return columns
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), TIMELINE_EVERY_S)


def _replayed_replies(timeline: dict[str, list[Any]], wall0: float) -> Any:
    """``replies(t)`` for :func:`_kept_back`: the live run's replies (a batch's end on its
    worker to the ingress taking its answer up) taken up since the last call and before t, on
    a clock whose 0 is the wall time ``wall0``."""
    ran = [
        (back - wall0, back - ended)
        for kind, ended, back in zip(
            timeline["kind"], timeline["ended"], timeline["back"], strict=True
        )
        if kind == "infer" and math.isfinite(ended)
    ]
    ran.sort()
    cursor = 0

    def replies(t: float) -> list[float]:
        nonlocal cursor
        start = cursor
        while cursor < len(ran) and ran[cursor][0] < t:
            cursor += 1
        return [max(0.0, reply) for _, reply in ran[start:cursor]]

    return replies


def _timing(trips: list[float], server: dict[str, Any]) -> dict[str, float]:
    """Where raysrv's time went beyond running models, in ms: the client's trips to the
    ingress and back and, of those, the ways back (p50, p90, p99); the trips to the ingress
    of every query and the time kept back from their deadlines, as the ingress measured them;
    a call to a worker beyond its run; and the overrun the ``deadline`` policy of the models
    with ``OVERRUN_BATCHES`` batches or more plans for (median, max over models)."""
    timing: dict[str, float] = {}
    for prefix, seconds in (("trip", trips), ("back", server["ways_back"])):
        for q in (50, 90, 99) if seconds else ():
            timing[f"{prefix}_p{q}"] = round(float(np.percentile(seconds, q)) * 1e3, 1)
    shown = {
        "trip_in_ms": "in",
        "kept_back_ms": "kept",
        "call_overhead_ms": "call",
        "start_late_ms": "start",
        "return_ms": "return",
        "step_lag_ms": "lag",
    }
    for name, prefix in shown.items():
        for key, value in server[name].items():
            if value is not None and key in ("p10", "p50", "p90", "p99"):
                timing[f"{prefix}_{key}"] = round(value, 1)
    if server["overruns_ms"]:
        timing["overrun_median"] = round(float(np.median(server["overruns_ms"])), 1)
        timing["overrun_max"] = round(float(np.max(server["overruns_ms"])), 1)
    return timing


async def timed_closed_loop(
    client: HandleClient, seconds: float, concurrency: int, refused_wait_s: float = 0.0
) -> RequestLog:
    """``concurrency`` clients, each sending its next query as its last is answered; with
    ``refused_wait_s``, a refused client sends its next that long after it sent the last."""
    log = RequestLog()
    t0 = time.perf_counter()
    ids = iter(range(10_000, 10**9))

    async def worker() -> None:
        while (now := time.perf_counter() - t0) < seconds:
            await log.timed(client, next(ids), now, t0)
            if refused_wait_s and log.status[-1] in REJECTED:  # this client's: no await since
                await asyncio.sleep(max(0.0, now + refused_wait_s - (time.perf_counter() - t0)))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return log


def goodput_of(log: RequestLog, slo_s: float) -> float:
    return float(_within(log, slo_s).sum()) / max(float(np.max(log.done)), 1e-9)


def _within(log: RequestLog, slo_s: float) -> np.ndarray:
    """Which queries of ``log`` were answered within ``slo_s`` of their schedule, in the log's
    order (as they ended; :func:`_in_schedule` puts them in the order they were sent)."""
    latency = np.asarray(log.done, dtype=float) - np.asarray(log.scheduled, dtype=float)
    return (np.asarray(log.status) == 200) & (latency <= slo_s)


def _in_schedule(log: RequestLog, per_query: np.ndarray) -> np.ndarray:
    """``per_query`` (in the log's order) in the order of the queries' schedule: a point's
    query i is its i-th arrival."""
    return per_query[np.argsort(np.asarray(log.scheduled), kind="stable")]


def _table(p50: dict[str, float]) -> dict[int, float]:
    return {int(k): float(v) for k, v in p50.items()}


def _pooled_table(tables: Any) -> dict[int, float]:
    seen: dict[int, list[float]] = {}
    for table in tables:
        for size, seconds in _table(table).items():
            seen.setdefault(size, []).append(seconds)
    return {k: float(np.median(v)) for k, v in sorted(seen.items())}


def _spread(profiles: list[dict[str, Any]], rng: np.random.Generator) -> Any:
    """A function drawing how much longer than its median a batch runs (a factor): the median,
    over every model and size with ``SPREAD_BATCHES`` batches measured or more, of each
    quantile of its run times over its median; linear between those quantiles (p10, p50,
    p90, p99), clamped at the ends. A size run once or twice has no spread to show, and the
    many-model workloads' rarely used models, counted alike, made the spread look narrow."""
    ratios: dict[float, list[float]] = {}
    for profile in profiles:
        table, counts = profile["batch"], profile["counts"]
        for key in table:
            q = int(key[1:]) / 100.0
            for size, seconds in table[key].items():
                median = table["p50"].get(size)
                if median and counts.get(size, 0) >= SPREAD_BATCHES:
                    ratios.setdefault(q, []).append(seconds / median)
    known = sorted((q, float(np.median(r))) for q, r in ratios.items())
    if not known:
        return lambda: 1.0
    qs = [0.0] + [q for q, _ in known] + [1.0]
    values = [known[0][1]] + [r for _, r in known] + [known[-1][1]]
    return lambda: float(np.interp(rng.random(), qs, values))


def _service(table: dict[int, float], spread: Any) -> Any:
    """Seconds a batch of k runs: the median measured (interpolated between sizes) times a
    factor drawn from ``spread``."""
    from raysrv.batching.profile import interpolate_batches

    sizes = sorted(table)
    values = [table[k] for k in sizes]
    if not sizes:
        return lambda k: 0.0
    return lambda k: float(interpolate_batches(sizes, values, k)) * spread()


def summarize(
    log: RequestLog,
    workload: str,
    system: str,
    slo_s: float,
    seconds: float,
    capacity: float,
    server: dict[str, Any],
) -> Point:
    status = np.asarray(log.status)
    latency = np.asarray(log.done) - np.asarray(log.scheduled)
    answered = status == 200
    within = _within(log, slo_s)
    refused = np.isin(status, (429, 503))
    shown = latency[answered] * 1e3
    p50, p99 = np.percentile(shown, [50, 99]) if shown.size else (np.nan, np.nan)
    n = max(1, status.size)
    return Point(
        workload,
        system,
        int(status.size),
        seconds,
        float(within.sum()) / n,
        float(within.sum()) / seconds,
        float((within | refused).sum()) / n,
        int((answered & ~within).sum()),
        int(refused.sum()),
        int((status == 504).sum()),
        int((~answered & ~refused & (status != 504)).sum()),
        float(p50),
        float(p99),
        int(server["loads"]),
        int(server["evictions"]),
        float(server["cold"]) / seconds,
        float(server["peak_weights"]) / (1 << 20),
        float(server["peak_rss"]) / (1 << 20),
        capacity,
        float("nan"),
    )


def late_answers(
    log: RequestLog,
    slo_s: float,
    left: dict[float, float] | None = None,
    unseen: dict[float, float] | None = None,
) -> list[tuple[float, ...]]:
    """Each answer past the SLO: when it was scheduled (s), how late it came (ms), how long
    before its SLO it left the ingress (ms, from ``left``: each scheduled offset's seconds to
    that; NaN where not known), how long the client's own loop had just been held (ms, 0 for
    none): a stall that ended within ``STALL_S`` of the answer being seen, or that it was
    seen in, how much of that the loop's thread ran (ms; NaN in logs saved before it was
    read), and how late it was as it reached this machine (ms, at most 0 for an answer that
    arrived in time and was seen late; from ``unseen``: each scheduled offset's seconds from
    its arrival to the client seeing it; NaN where not known)."""
    latency = np.asarray(log.done) - np.asarray(log.scheduled)
    late = np.flatnonzero((np.asarray(log.status) == 200) & (latency > slo_s))
    rows: list[tuple[float, ...]] = []
    for i in late:
        seen = log.done[i]
        held = [
            (stall[1], stall[2] if len(stall) > 2 else math.nan)
            for stall in log.stalls
            if stall[0] - stall[1] - STALL_S <= seen <= stall[0] + STALL_S
        ]
        longest, ran = max(held, default=(0.0, 0.0))
        gone = (left or {}).get(log.scheduled[i], math.nan)
        waited = (unseen or {}).get(log.scheduled[i], math.nan)
        rows.append(
            (
                round(log.scheduled[i], 3),
                round(float(latency[i] - slo_s) * 1e3, 1),
                round((slo_s - gone) * 1e3, 1),
                round(longest * 1e3, 1),
                round(ran * 1e3, 1),
                round(float(latency[i] - waited - slo_s) * 1e3, 1),
            )
        )
    return rows


def hot_table(rows: list[dict[str, Any]]) -> str:
    """Each hot-model configuration's goodput: its median, its loops, and the median's ratio to
    the model alone in the pool; then the pairs' ratios, registered over alone."""
    by: dict[str, list[float]] = {}
    for row in rows:
        by.setdefault(row["config"], []).append(row["goodput"])
    alone = float(np.median(by.get(ALONE, [np.nan])))
    lines = [
        "| hot model | goodput/s, median | each loop | median / alone |",
        "|---|---:|---|---:|",
    ]
    for config, values in by.items():
        shown = ", ".join(f"{v:.1f}" for v in values)
        median = float(np.median(values))
        lines.append(f"| {config} | {median:.1f} | {shown} | {median / alone:.3f} |")
    ratios = paired_ratios(rows)
    if ratios:
        shown = ", ".join(f"{r:.3f}" for r in ratios)
        low, high = resampled_median(ratios)
        lines.append(
            f"\nregistered / alone, pair by pair: median {np.median(ratios):.3f} ({shown}); "
            f"95% of {RESAMPLES:,} resampled medians within {low:.3f}-{high:.3f}"
        )
    return "\n".join(lines)


def resampled_median(values: list[float], seed: int = 0) -> tuple[float, float]:
    """The 2.5th and 97.5th percentiles of the medians of ``RESAMPLES`` resamples of ``values``
    (with replacement): how far the median of this many pairs moves with the pairs drawn."""
    rng = np.random.default_rng(seed)
    draws = rng.choice(np.asarray(values), size=(RESAMPLES, len(values)))
    low, high = np.percentile(np.median(draws, axis=1), [2.5, 97.5])
    return float(low), float(high)


def paired_ratios(rows: list[dict[str, Any]]) -> list[float]:
    """Each pair's goodput with every model registered over the model's alone."""
    pairs: dict[int, dict[str, float]] = {}
    for row in rows:
        pairs.setdefault(row["repeat"], {})[row["config"]] = row["goodput"]
    return [
        pair[REGISTERED] / pair[ALONE]
        for pair in pairs.values()
        if pair.get(ALONE) and REGISTERED in pair
    ]


def table(points: list[Point]) -> str:
    head = (
        "| workload | system | offered | within SLO | within or refused | goodput/s "
        "| late (on arrival) "
        "| refused | 504 | p50 ms | p99 ms | loads | evictions | cold/s | peak weights MiB "
        "| simulator | replayed |"
    )
    rule = "|" + "---|" * 17
    rows = [
        f"| {p.workload} | {p.system} | {p.offered} | {p.within_slo:.2%} | "
        f"{p.within_or_refused:.2%} | {p.goodput:.1f} | {_late(p)} | {p.refused} | {p.expired} | "
        f"{p.p50_ms:.0f} | {p.p99_ms:.0f} | {p.loads} | {p.evictions} | {p.cold_per_s:.1f} | "
        f"{p.peak_weights_mb:.1f} | {_share(p.simulated)} | {_replayed(p)} |"
        for p in points
    ]
    return "\n".join([head, rule, *rows])


def _late(p: Point) -> str:
    """Late answers as the client saw them, and as they reached this machine where known."""
    return f"{p.late}" if p.late_on_arrival < 0 else f"{p.late} ({p.late_on_arrival})"


def _share(value: float) -> str:
    return "" if np.isnan(value) else f"{value:.2%}"


def _replayed(point: Point) -> str:
    """The replays' median, and their range where there were several."""
    if np.isnan(point.replayed_low):
        return _share(point.replayed)
    low, high = point.replayed_low, point.replayed_high
    return f"{_share(point.replayed)} ({low:.2%}-{high:.2%})"


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every point and the hot model; what is measured so far is written to ``args.out``
    after each live point, before its simulation, so that nothing measured is lost."""
    bench = Bench(args)
    bench.http.start(start_ray())
    points: list[Point] = []
    logs: dict[str, dict[str, RequestLog]] = {}
    capacities: dict[str, float] = {}
    timing: dict[str, dict[str, float]] = {}
    measured: dict[str, dict[str, Any]] = {}
    hot: list[dict[str, Any]] = []

    first, steady = run_times(bench.paths[:FIRST_RUNS], 1, np.random.default_rng(3))
    first_run = {"first_ms": first * 1e3, "steady_ms": steady * 1e3}
    print(
        f"a fresh session's first run of one: {first * 1e3:.1f} ms, then {steady * 1e3:.1f} ms "
        f"(p50 over {FIRST_RUNS} models); LOADs warm up: {args.warm_up}"
    )

    def result() -> dict[str, Any]:
        return {
            "args": vars(args),
            "first_run": first_run,
            "per_worker_models": bench.per_worker,
            "model_bytes": bench.size,
            "capacities": capacities,
            "points": [asdict(p) for p in points],
            "timing_ms": timing,
            "hot": hot,
            "measured": measured,
            "logs": {w: {sys: asdict(log) for sys, log in by.items()} for w, by in logs.items()},
        }

    given = dict(_capacity(item) for item in args.capacity or [])
    for workload in [w for w in args.workloads if w != "hot"]:
        if workload in given:
            capacities[workload] = given[workload]
        else:
            capacities[workload] = await bench.capacity(workload)
        print(f"{workload}: capacity {capacities[workload]:.1f} queries/s")
        for system in args.systems:
            point, log, extra = await bench.point(workload, system, capacities[workload])
            logs.setdefault(workload, {})[system] = log
            if system == "raysrv":
                capacity_bytes = int(bench.per_worker * bench.size + 0.01 * (1 << 20))
                timing[workload] = extra["timing"]
                measured[workload] = _measured(extra, capacity_bytes)
                save(args.out, {**result(), "points": [asdict(p) for p in [*points, point]]})
                simulated = _attainment(bench.simulate(workload, extra, capacity_bytes))
                _, shares = bench.replays(workload, extra, capacity_bytes)
                replayed = {
                    "replayed": float(np.median(shares)),
                    "replayed_low": min(shares),
                    "replayed_high": max(shares),
                }
                point = Point(**{**asdict(point), "simulated": simulated, **replayed})
            points.append(point)
            save(args.out, result())
            print(table([point]).splitlines()[-1])
    if "hot" in args.workloads:
        hot = await bench.hot()
    await bench.http.close()
    if logs:
        plot(logs, bench.slo_s, capacities)
    return result()


def save(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, default=str))


def plot(
    logs: dict[str, dict[str, RequestLog]],
    slo_s: float,
    capacities: dict[str, float],
    folder: Path = FIGURES,
) -> None:
    """The two figures, each point's answers drawn from its request log."""
    folder.mkdir(exist_ok=True)
    attainment_panels(logs, slo_s, folder / "many_models_cdf.png")
    goodput_panels(logs, slo_s, capacities, folder / "many_models_goodput.png")


def replot(path: Path, folder: Path = FIGURES) -> None:
    """The plots again from the request logs a run saved (its --out)."""
    saved = json.loads(path.read_text())
    if not saved.get("logs"):
        raise SystemExit(f"{path} has no request logs (written before they were saved)")
    logs = {
        w: {system: RequestLog(**log) for system, log in by.items()}
        for w, by in saved["logs"].items()
    }
    plot(logs, saved["args"]["slo_ms"] / 1000.0, saved["capacities"], folder)


def _capacity(item: str) -> tuple[str, float]:
    workload, _, rate = item.partition("=")
    return workload, float(rate)


def _measured(extra: dict[str, Any], capacity_bytes: int) -> dict[str, Any]:
    """What the simulator of a raysrv point is given, kept so that it can be run again."""
    keys = (
        "lead_transits",
        "profiles",
        "call_overhead_ms",
        "start_late_ms",
        "return_ms",
        "trip_in_ms",
        "step_lag_ms",
        "reasons",
        "timeline",
        "wall0",
    )
    return {
        "times": extra["times"].tolist(),
        "models": extra["models"].tolist(),
        "lead": extra["lead"].tolist(),
        "lead_models": extra["lead_models"].tolist(),
        "trips": extra["trips"],
        "ways_back": extra["ways_back"],
        "transits": extra["transits"],
        "capacity_bytes": capacity_bytes,
        **{k: extra[k] for k in keys},
    }


def resimulate(path: Path, params: list[str] | None = None) -> None:
    """The simulator again on the raysrv points a run saved (``measured`` in its JSON), beside
    what the run measured live, and live against replayed by the popularity of the queries'
    models (:func:`popularity_table`): the simulator can be studied without the hour of a run. With
    ``params`` (``--param``), its policies take those in place of the run's own: what another
    setting would have done on the run's weather."""
    saved = json.loads(path.read_text())
    args = argparse.Namespace(**saved["args"])
    if params:
        args.param = params
    bench = Bench(args)
    live = {p["workload"]: p for p in saved["points"] if p["system"] == "raysrv"}
    for workload, measured in saved["measured"].items():
        extra = {**measured, "times": np.asarray(measured["times"])}
        extra["models"] = np.asarray(measured["models"])
        # runs saved before the points had a lead-in have none
        extra["lead"] = np.asarray(measured.get("lead", []), dtype=float)
        extra["lead_models"] = np.asarray(measured.get("lead_models", []), dtype=int)
        extra["lead_transits"] = measured.get("lead_transits", [])
        if "step_lag_ms" not in measured:  # saved before it was: its quantiles in the timing
            timing = saved["timing_ms"][workload]
            lags = {k.removeprefix("lag_"): v for k, v in timing.items() if k.startswith("lag_")}
            extra["step_lag_ms"] = lags
        print(f"{workload}: live not answered because {measured['reasons']}")
        print(f"{workload}: live timing (ms) {saved['timing_ms'][workload]}")
        share = _attainment(bench.simulate(workload, extra, measured["capacity_bytes"]))
        replayed, shares = None, [math.nan]
        if "timeline" in measured:  # runs saved before the pools kept one have none
            replayed, shares = bench.replays(workload, extra, measured["capacity_bytes"])
        print(
            f"{workload}: within the SLO live {live[workload]['within_slo']:.2%}, "
            f"simulated {share:.2%}, replayed {np.median(shares):.2%} (median of "
            f"{len(shares)}; the first, on the arrivals as they were: {_attainment(replayed):.2%})"
        )
        log = saved.get("logs", {}).get(workload, {}).get("raysrv")
        if replayed is not None and log is not None:
            request_log = RequestLog(**log)
            within = _in_schedule(request_log, _within(request_log, bench.slo_s))
            print(f"{workload}: live and replayed by the models' popularity in the point")
            print(popularity_table(extra["models"], within, replayed))


def _attainment(within: np.ndarray | None) -> float:
    """The share of queries answered within the SLO (NaN for none)."""
    return float(np.mean(within)) if within is not None and within.size else math.nan


def popularity_table(models: np.ndarray, live: np.ndarray, simulated: np.ndarray) -> str:
    """Within-SLO shares live and simulated, and the queries answered within the SLO by one
    only, by the popularity of their model in the point (its rank by queries, most first; ties
    by model): the simulator can match live attainment overall while it serves other models."""
    counts = np.bincount(models)
    rank = np.empty(counts.size, dtype=int)
    rank[np.lexsort((np.arange(counts.size), -counts))] = np.arange(counts.size)
    ranks = rank[models]
    rows = [
        "| models by popularity | queries | live | replayed | only live | only replayed |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    edges = [0, *(b for b in POPULARITY_BANDS if b < counts.size), counts.size]
    for low, high in itertools.pairwise(edges):
        band = (ranks >= low) & (ranks < high)
        if not band.any():
            continue
        label = f"{low + 1}" if high == low + 1 else f"{low + 1}-{high}"
        only_live = int((live & ~simulated & band).sum())
        only_sim = int((simulated & ~live & band).sum())
        rows.append(
            f"| {label} | {int(band.sum())} | {live[band].mean():.1%} | "
            f"{simulated[band].mean():.1%} | {only_live} | {only_sim} |"
        )
    return "\n".join(rows)


def serve_mode(default_mode: bool, ha_proxy: bool = False) -> None:
    """Ray Serve's throughput-optimized mode (Ray 2.56+) for every system, unless asked not
    to: the best a Ray user could configure, with ``ha_proxy`` its HAProxy ingress in front
    of the replicas for HTTP. And every process at one priority: Ray starts its workers at
    niceness 15, so whenever the 2 cores are short this process, the load generator, would
    run first and the servers' hops wait. All are read as Ray starts."""
    import os

    os.environ["RAY_worker_niceness"] = "0"  # noqa: SIM112 - the name Ray reads
    if not default_mode:
        os.environ["RAY_SERVE_THROUGHPUT_OPTIMIZED"] = "1"
        if ha_proxy:
            os.environ["RAY_SERVE_ENABLE_HA_PROXY"] = "1"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=1000)
    parser.add_argument(
        "--passes",
        type=int,
        default=PASSES,
        help="runs of the zoo models' square layer: what a batch costs (bench.zoo)",
    )
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--slo-ms", type=float, default=100.0)
    parser.add_argument("--load", type=float, default=0.8)
    parser.add_argument("--zipf", type=float, default=1.0)
    parser.add_argument("--capacity-seconds", type=float, default=30.0)
    parser.add_argument(
        "--capacity",
        nargs="*",
        metavar="WORKLOAD=QPS",
        help="take this capacity instead of measuring it (the load is --load of it): to "
        "compare two settings at the same offered load across runs, e.g. trace=160",
    )
    parser.add_argument("--hot-seconds", type=float, default=10.0)
    parser.add_argument("--hot-repeats", type=int, default=8)
    parser.add_argument(
        "--hot-concurrency",
        type=int,
        default=HOT_CONCURRENCY,
        help="queries in flight on the hot model (default %(default)s)",
    )
    parser.add_argument(
        "--refused-wait",
        action="store_true",
        help="the hot model's refused clients wait out their query's SLO before the next",
    )
    parser.add_argument("--workloads", nargs="+", default=["zipf", "trace", "hot"])
    parser.add_argument(
        "--systems", nargs="+", default=["raysrv", MUX_HTTP, "multiplexed"], choices=SYSTEMS
    )
    parser.add_argument(
        "--param",
        action="extend",
        nargs="+",
        metavar="KEY=JSON",
        help="a parameter of raysrv's deadline policy, e.g. overrun_quantile=0.9 (with "
        "--resimulate: the simulator's, in place of the run's)",
    )
    parser.add_argument(
        "--warm-up",
        action="store_true",
        help="raysrv's LOADs end with a run of one (its default; here off: see the docstring)",
    )
    parser.add_argument(
        "--trip-back",
        type=float,
        default=TRIP_BACK,
        help="raysrv's ingress.trip_back_quantile (default %(default)s)",
    )
    parser.add_argument(
        "--niceness",
        type=int,
        help=f"raysrv's resources.niceness for the workers (default {COLOCATED_NICENESS} "
        f"colocated, {NICENESS} on worker actors)",
    )
    parser.add_argument(
        "--load-niceness",
        type=int,
        default=LOAD_NICENESS,
        help="raysrv's resources.load_niceness for the workers (default %(default)s)",
    )
    parser.add_argument(
        "--client-niceness",
        type=int,
        default=CLIENT_NICENESS,
        help="the client's threads' niceness during each point (default %(default)s, as the "
        "servers'; below 0, as if on a machine of its own)",
    )
    parser.add_argument("--quick", action="store_true", help="short points: a smoke test")
    parser.add_argument(
        "--default-serve",
        action="store_true",
        help="Serve's default mode instead of RAY_SERVE_THROUGHPUT_OPTIMIZED=1",
    )
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument(
        "--http-trip-back",
        choices=("replies", "loop"),
        default="replies",
        help="raysrv's ingress.http_trip_back (default replies)",
    )
    parser.add_argument(
        "--placement",
        choices=("workers", "colocated"),
        default="colocated",
        help="where raysrv's pool runs: its own worker actors, or threads of the ingress "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--handles",
        action="store_true",
        help="send raysrv's queries through a Serve handle from this process, as runs up to "
        "16 did, rather than over HTTP",
    )
    parser.add_argument(
        "--resimulate",
        type=Path,
        metavar="JSON",
        help="run only the simulator, on the raysrv points a run wrote (its --out)",
    )
    parser.add_argument(
        "--replot",
        type=Path,
        metavar="JSON",
        help="draw only the plots, from the request logs a run wrote (its --out)",
    )
    args = parser.parse_args(argv)
    if args.resimulate:
        resimulate(args.resimulate, args.param)
        return 0
    if args.replot:
        replot(args.replot)
        return 0
    if args.quick:
        args.seconds, args.capacity_seconds, args.hot_seconds = 20.0, 10.0, 8.0
        args.hot_repeats = 2
    serve_mode(args.default_serve, ha_proxy=True)
    result = asyncio.run(run(args))
    print()
    if result["points"]:
        print(table([Point(**p) for p in result["points"]]))
    if result["hot"]:
        print(hot_table(result["hot"]))
    save(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
