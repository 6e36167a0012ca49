"""raysrv and plain Ray Serve under overload over HTTP: one answer per request, quick
refusals, goodput held at capacity, and how soon answers are normal again.

    python -m bench.overload [--serve-proxy] [--factor 3] [--seconds 20] [--slo-ms 200]
        [--passes 2000] [--systems raysrv baseline] [--bound-raysrv] [--capacity C]
        [--ongoing N] [--queued N] [--ingress KEY=VALUE ...] [--trace]
        [--stall S [--stall-at T]] [--out JSON]

One Ray instance, started with ``raysrv run``'s environment (:data:`raysrv.cli.FAST_PATH`:
HAProxy ingress, gRPC handles, user code on the replica's main thread), or with Serve's
defaults under ``--serve-proxy``. Both systems serve one :mod:`bench.zoo` model (the digits
input, its square layer run ``--passes`` times with weights that keep the activations' size,
``steady``: a batch of 4 takes about 30 ms and one of 16 about 120 ms on one onnxruntime
thread, so that the load generator, a Python process on the same 2 cores, can offer three
times the capacity) from one replica of one CPU:

* ``raysrv``: the model on a worker actor, the ``deadline`` policy, batches of at most
  ``MAX_BATCH``; each query carries its SLO (``slo_ms``) and when it was scheduled
  (``sent_at``), so that time spent in front of the ingress counts;
* ``baseline``: ``@serve.batch(MAX_BATCH, 5 ms)`` (:mod:`bench.baseline`), with admission
  tuned for the SLO the way Serve offers: ``max_ongoing_requests`` as many full batches as
  run one after another within the SLO at the capacity measured
  (:func:`bench.baseline.admitted`), ``max_queued_requests`` 1, beyond which Serve refuses
  (503).

For each system in turn: its capacity, the answers per second of a closed loop of
``MAX_BATCH`` in flight for ``CAPACITY_S`` (one full batch at a time, well within the SLO; a
deeper loop has raysrv refuse what it cannot answer within the SLO, and its callers, resending
at once, take the cores from the model); then one open loop of Poisson arrivals, ``BEFORE_S`` at
half the capacity, ``--seconds`` at ``--factor`` times it and ``AFTER_S`` at half again,
every request its own input. Reported from the client's side, latency from each request's
scheduled time: requests with no answer (none within ``TIMEOUT_S``, or the connection
failed), statuses, goodput within the SLO during the overload as a share of the capacity,
answers late (after the SLO), refusals (429/503) and their latency p50 and p99, and the
recovery: from the overload's end, when the requests start to be normal, every one answered
within the SLO over each later ``WINDOW_S`` of scheduled times (:func:`recovery_s`).

``--capacity C`` takes C answers a second as the capacity in place of the closed loop's (which
behind Serve's proxy varies from run to run as raysrv refuses more or less of that loop), so
that runs with different bounds get the same load; ``--ongoing N`` and ``--queued N`` set the
bounded system's ``max_ongoing_requests`` and ``max_queued_requests`` in place of the ones from
capacity and SLO. ``--ingress KEY=VALUE``: a field of raysrv's ``ingress``, as
``max_ongoing_requests=auto max_queued_requests=1``.
Writes every request's scheduled time, latency and status to ``--out``; with ``--trace``, for
raysrv also what its policy plans with every ``TRACE_S`` of the open loop (``GET
/v1/models/zoo``'s ``batching``), each refusal's reason and time in transit (before it reached
raysrv's code, as the refusal tells it) by its scheduled time, and the pool's batches (``GET
/v1/pools/{pool}/timeline``), to see why a query was refused and where a slow refusal's time went.
``--stall S``: a slow spell of the machine at a known time, as its neighbours cause them, one
busy loop a core (other processes) for ``S`` seconds from ``--stall-at`` seconds into the
overload (:func:`stall`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from bench.loadgen import (
    REJECTED,
    HttpClient,
    RequestLog,
    closed_loop,
    poisson_offsets,
    refusal_reason,
    replay,
    scheduled_at,
)
from raysrv.cli import FAST_PATH

__all__ = ["check", "key_value", "main", "recovery_s", "stall", "summarize"]

HOST = "127.0.0.1"
MAX_BATCH = 16
CAPACITY_S = 10.0
BEFORE_S = 5.0
AFTER_S = 10.0
WINDOW_S = 0.25
TIMEOUT_S = 30.0
INPUTS = 4096
TRACE_S = 0.25
JSON = {"Content-Type": "application/json"}
SYSTEMS = ("raysrv", "baseline")


def raysrv_spec(path: Path, slo_ms: float) -> dict[str, Any]:
    model = {
        "name": "zoo",
        "runtime": "onnx",
        "source": str(path),
        "resources": {"num_cpus": 1, "threads": 1},
        "batching": {"policy": "deadline", "params": {"max_batch_size": MAX_BATCH}},
        "slo_ms": slo_ms,
        "input": {"shape": [64], "dtype": "float32"},
    }
    return {
        "models": [model],
        "apps": [{"name": "zoo", "models": ["zoo"], "cache_size": 0}],
        "ingress": {"num_cpus": 0},
    }


def raysrv_body(slo_ms: float) -> Callable[[str, float], bytes]:
    """raysrv's body of one input (JSON text) scheduled at a wall-clock time: the input, its
    SLO and that time as ``sent_at``."""
    return lambda x, t: f'{{"input":{x},"slo_ms":{slo_ms:g},"sent_at":{t:.6f}}}'.encode()


class TimedClient(HttpClient):
    """POSTs each request's own input, in the ``body`` made for it as it is sent at its
    scheduled time (:func:`raysrv_body` by default); keeps each error's reason and latency."""

    def __init__(
        self,
        url: str,
        inputs: list[Any],
        slo_ms: float,
        body: Callable[[str, float], bytes] | None = None,
    ) -> None:
        super().__init__(url, [], connections=2048, timeout_s=TIMEOUT_S)
        self._inputs = [json.dumps(x) for x in inputs]
        self._body = body or raysrv_body(slo_ms)
        # each error's reason, seconds taken and, from its body, seconds before it reached
        # raysrv's code (its transit_ms; NaN from Serve, which refuses before raysrv)
        self.errors: list[tuple[str, float, float]] = []
        # each error's scheduled wall time, reason and seconds in transit (as in ``errors``)
        self.refusals: list[tuple[float, str, float]] = []

    async def send(self, i: int) -> int:
        sent_at = scheduled_at()
        body = self._body(self._inputs[i % len(self._inputs)], sent_at)
        try:
            async with self._session.post(self.url, data=body, headers=JSON) as response:
                answer = await response.read()
                if response.status != 200:
                    reason, transit_s = _reason(answer)
                    self.errors.append((reason, time.time() - sent_at, transit_s))
                    self.refusals.append((sent_at, reason, transit_s))
                return response.status
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
            return 0


def _reason(body: bytes) -> tuple[str, float]:
    """An error's reason and its time in transit to raysrv in seconds (NaN if not told)."""
    try:
        error = json.loads(body)
        transit_ms = error.get("transit_ms")
        transit_s = math.nan if transit_ms is None else transit_ms / 1e3
        return refusal_reason(error["message"]), transit_s
    except (ValueError, KeyError, TypeError, AttributeError):
        return body[:60].decode(errors="replace"), math.nan  # Serve's own are plain text


def start(serve_proxy: bool) -> int:
    if not serve_proxy:
        os.environ.update(FAST_PATH)  # read as Serve is imported and as Ray starts
    os.environ["RAY_worker_niceness"] = "0"  # noqa: SIM112 - Ray's name; client and servers alike
    # a deleted application's direct ingress drains for 30 s by default
    os.environ["RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"] = "2"
    from bench.validate_live import start_ray

    return start_ray()


def deploy(
    system: str,
    path: Path,
    slo_ms: float,
    capacity: float | None,
    ongoing: int | None = None,
    queued: int = 1,
    model: dict[str, Any] | None = None,
    ingress: dict[str, Any] | None = None,
) -> str:
    """Deploy ``system`` (untuned without a ``capacity``); its URL. With one, Serve's bounds
    in front of the baseline's replica, or of raysrv's ingress (``--bound-raysrv``), are set
    from it and the SLO (``max_ongoing_requests`` to ``ongoing`` where one is given), and
    ``max_queued_requests`` to ``queued``; raysrv's model with the fields of ``model`` set, and
    its ingress with those of ``ingress``."""
    from ray import serve
    from ray.serve.schema import LoggingConfig

    from bench.baseline import admitted, build_baseline
    from raysrv.app import build_app

    quiet = LoggingConfig(enable_access_log=False, log_level="WARNING")
    bound = {}
    if capacity is not None:
        ongoing = ongoing or admitted(capacity, slo_ms / 1000.0, MAX_BATCH)
        bound = {"max_ongoing_requests": ongoing, "max_queued_requests": queued}
    if system == "raysrv":
        spec = raysrv_spec(path, slo_ms)
        spec["ingress"].update(ingress or {}, **bound)
        spec["models"][0].update(model or {})
        serve.run(build_app(spec), name=system, route_prefix=f"/{system}", logging_config=quiet)
        return f"/{system}/v1/zoo/predict"
    app = build_baseline(str(path), (64,), MAX_BATCH, 0.005, **bound)
    serve.run(app, name=system, route_prefix=f"/{system}", logging_config=quiet)
    return f"/{system}"


def recovery_s(
    scheduled: np.ndarray, good: np.ndarray, start: float, end: float, window: float = WINDOW_S
) -> float:
    """Seconds from ``start`` until the requests are normal: the start of the first window of
    ``window`` seconds (of scheduled times, up to ``end``) from which on every window's
    requests were all ``good``; ``end - start`` if the last one was not."""
    edges = np.arange(start, end, window)
    bad = [not good[(scheduled >= a) & (scheduled < a + window)].all() for a in edges]
    last_bad = max((k for k, b in enumerate(bad) if b), default=-1)
    return min((last_bad + 1) * window, end - start)


def summarize(
    log: RequestLog, slo_s: float, capacity: float, over: tuple[float, float], end: float
) -> dict[str, Any]:
    """The overload's figures from one open loop's ``log`` (``over``: the overload's start and
    end, ``end`` the loop's, in scheduled seconds)."""
    scheduled = np.asarray(log.scheduled)
    latency = np.asarray(log.done) - scheduled
    status = np.asarray(log.status)
    good = (status == 200) & (latency <= slo_s)
    during = (scheduled >= over[0]) & (scheduled < over[1])
    refused = np.isin(status, list(REJECTED))
    statuses = {str(s): int((status == s).sum()) for s in np.unique(status)}
    refusals = latency[during & refused] * 1e3
    answered = latency[during & (status == 200)] * 1e3
    return {
        "requests": len(status),
        "no_answer": int((status == 0).sum()),
        "statuses": statuses,
        "offered_per_s": float(during.sum() / (over[1] - over[0])),
        "goodput_per_s": float((good & during).sum() / (over[1] - over[0])),
        "goodput_share": float((good & during).sum() / (over[1] - over[0]) / capacity),
        "late": int(((status == 200) & (latency > slo_s)).sum()),
        "refused": int((during & refused).sum()),
        "refusal_p50_ms": _pct(refusals, 50),
        "refusal_p99_ms": _pct(refusals, 99),
        "answer_p50_ms": _pct(answered, 50),
        "answer_p99_ms": _pct(answered, 99),
        "recovery_s": recovery_s(scheduled, good, over[1], end),
    }


def _by_reason(errors: list[tuple[str, float, float]]) -> dict[str, dict[str, float]]:
    """Per reason: how many errors, the p50 and p99 of their latency (ms) and of the part of it
    before they reached raysrv's code (``transit``: in the load generator, the kernel, HAProxy
    and Serve; NaN where no error told it)."""
    reasons: dict[str, list[tuple[float, float]]] = {}
    for reason, seconds, transit_s in errors:
        reasons.setdefault(reason, []).append((seconds * 1e3, transit_s * 1e3))
    out = {}
    for reason, values in reasons.items():
        taken, transit = np.array(values).T
        transit = transit[~np.isnan(transit)]
        out[reason] = {
            "count": len(values),
            "p50_ms": _pct(taken, 50),
            "p99_ms": _pct(taken, 99),
            "transit_p50_ms": _pct(transit, 50),
            "transit_p99_ms": _pct(transit, 99),
        }
    return out


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if values.size else math.nan


async def _one(system: str, port: int, args: argparse.Namespace, path: Path) -> dict[str, Any]:
    from bench.zoo import digits_like

    rng = np.random.default_rng(7)
    inputs = digits_like(rng, INPUTS).tolist()
    model = policy_params(args.param) if system == "raysrv" else None
    ingress = dict(args.ingress)
    url = f"http://{HOST}:{port}" + deploy(
        system, path, args.slo_ms, None, model=model, ingress=ingress
    )
    slo_s = args.slo_ms / 1000.0
    async with TimedClient(url, inputs, args.slo_ms) as client:
        await closed_loop(client, MAX_BATCH, 3.0)  # warm-up
        log = RequestLog()
        await closed_loop(client, MAX_BATCH, CAPACITY_S, log=log)
    capacity = float(np.sum(np.asarray(log.status) == 200) / CAPACITY_S)
    statuses = dict(zip(*np.unique(log.status, return_counts=True), strict=True))
    print(f"{system}: capacity {capacity:.0f} answers/s {statuses}", file=sys.stderr)
    if not capacity:
        raise RuntimeError(f"{system} answered nothing at {url}")
    capacity = args.capacity or capacity
    if system == "baseline" or args.bound_raysrv:
        bounds = {"ongoing": args.ongoing, "queued": args.queued}
        url = f"http://{HOST}:{port}" + deploy(
            system, path, args.slo_ms, capacity, **bounds, model=model, ingress=ingress
        )
    low, high = 0.5 * capacity, args.factor * capacity
    gen = np.random.default_rng(11)
    over = (BEFORE_S, BEFORE_S + args.seconds)
    end = over[1] + AFTER_S
    offsets = np.concatenate(
        [
            poisson_offsets(low, gen, BEFORE_S),
            over[0] + poisson_offsets(high, gen, args.seconds),
            over[1] + poisson_offsets(low, gen, AFTER_S),
        ]
    )
    base = f"http://{HOST}:{port}/{system}"
    async with TimedClient(url, inputs, args.slo_ms) as client:
        trace = Trace(base) if args.trace and system == "raysrv" else None
        polling = asyncio.create_task(trace.poll()) if trace else None
        cores = os.cpu_count() or 1
        at = over[0] + args.stall_at
        stalling = asyncio.create_task(stall(at, args.stall, cores)) if args.stall else None
        log = await replay(client, offsets)
        if stalling:
            await stalling
        if trace and polling:
            polling.cancel()
            await trace.finish(client.refusals, log)
    figures = summarize(log, slo_s, capacity, over, end)
    figures |= {"system": system, "capacity_per_s": capacity, "errors": _by_reason(client.errors)}
    if args.stall:
        figures["stall"] = {"at_s": at, "seconds": args.stall, "processes": cores}
    print(f"{system}: {figures}", file=sys.stderr, flush=True)
    figures["log"] = {
        "scheduled": log.scheduled,
        "latency": (np.asarray(log.done) - np.asarray(log.scheduled)).tolist(),
        "status": log.status,
    }
    if trace:
        figures["trace"] = trace.report()
    from ray import serve

    serve.delete(system)
    return figures


class Trace:
    """What raysrv's policy plans with, sampled every ``TRACE_S``, each refusal's scheduled
    time and reason, and the pool's batches; times in seconds from the start of the open
    loop's schedule, as the request log's (:meth:`finish`)."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.t0 = time.time()
        self.policy: list[tuple[float, dict[str, Any]]] = []
        self.refusals: list[tuple[float, str, float]] = []
        self.timeline: dict[str, list[Any]] = {}

    async def poll(self) -> None:
        async with aiohttp.ClientSession() as session:
            while True:
                async with session.get(f"{self.base}/v1/models/zoo") as response:
                    model = await response.json()
                self.policy.append((time.time() - self.t0, model.get("batching", {})))
                await asyncio.sleep(TRACE_S)

    def rebase(self, log: RequestLog) -> None:
        """Count every time from the start of ``log``'s schedule, which the client's collector
        pass delays past this trace's start (tens of ms)."""
        start = time.time() - (time.perf_counter() - log.start)
        self.policy = [(t + self.t0 - start, plan) for t, plan in self.policy]
        self.t0 = start

    async def finish(self, refusals: list[tuple[float, str, float]], log: RequestLog) -> None:
        """Keep the ``refusals`` (scheduled wall time, reason, seconds in transit) and read the
        pool's actions, every time from the start of ``log``'s schedule (:meth:`rebase`)."""
        self.rebase(log)
        self.refusals = [(t - self.t0, reason, transit) for t, reason, transit in refusals]
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{self.base}/v1/models/zoo") as response:
                pool = (await response.json())["pool"]
            async with session.get(f"{self.base}/v1/pools/{pool}/timeline") as response:
                columns = await response.json()
        for name in ("decided", "sent", "started", "ended", "back", "acted"):
            columns[name] = [None if v is None else v - self.t0 for v in columns[name]]
        self.timeline = columns

    def report(self) -> dict[str, Any]:
        return {"policy": self.policy, "refusals": self.refusals, "timeline": self.timeline}


def table(points: list[dict[str, Any]], factor: float, slo_ms: float) -> str:
    lines = [
        f"| system | capacity/s | offered/s at {factor:g}x | goodput/s | share of capacity | "
        "late | refused | refusal p50 ms | refusal p99 ms | answer p99 ms | no answer | "
        "normal again after s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in points:
        lines.append(
            f"| {p['system']} | {p['capacity_per_s']:.0f} | {p['offered_per_s']:.0f} | "
            f"{p['goodput_per_s']:.0f} | {p['goodput_share']:.0%} | {p['late']} | "
            f"{p['refused']} | {p['refusal_p50_ms']:.1f} | {p['refusal_p99_ms']:.1f} | "
            f"{p['answer_p99_ms']:.0f} | {p['no_answer']} | {p['recovery_s']:.2f} |"
        )
    lines.append(
        f"\nSLO {slo_ms:g} ms; statuses: "
        + "; ".join(f"{p['system']} {p['statuses']}" for p in points)
    )
    return "\n".join(lines)


def policy_params(params: list[tuple[str, Any]]) -> dict[str, Any] | None:
    """raysrv's model fields for ``--param``'s ``deadline`` parameters (None: its defaults)."""
    if not params:
        return None
    return {
        "batching": {"policy": "deadline", "params": {"max_batch_size": MAX_BATCH, **dict(params)}}
    }


def key_value(item: str) -> tuple[str, Any]:
    """``KEY=VALUE``, the value read as JSON, else kept as text (``auto``)."""
    key, _, value = item.partition("=")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve-proxy", action="store_true", help="Serve's default mode")
    parser.add_argument("--factor", type=float, default=3.0, help="the overload's multiple")
    parser.add_argument("--seconds", type=float, default=20.0, help="of overload")
    parser.add_argument("--slo-ms", type=float, default=200.0)
    parser.add_argument("--passes", type=int, default=2000, help="of the zoo model's layer")
    parser.add_argument(
        "--bound-raysrv",
        action="store_true",
        help="raysrv's ingress bounded by Serve as the baseline is (from capacity and SLO)",
    )
    parser.add_argument("--capacity", type=float, help="answers/s taken as the capacity")
    parser.add_argument("--ongoing", type=int, help="the bounded max_ongoing_requests")
    parser.add_argument("--queued", type=int, default=1, help="the bounded max_queued_requests")
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    parser.add_argument(
        "--param",
        action="extend",
        nargs="+",
        type=key_value,
        default=[],
        metavar="KEY=JSON",
        help="a parameter of raysrv's deadline policy, e.g. plan_arrivals=1",
    )
    parser.add_argument(
        "--ingress",
        nargs="*",
        type=key_value,
        default=[],
        metavar="KEY=VALUE",
        help="a field of raysrv's ingress, e.g. max_ongoing_requests=auto",
    )
    parser.add_argument(
        "--trace", action="store_true", help="record raysrv's plan, refusals and batches"
    )
    parser.add_argument(
        "--stall", type=float, default=0.0, help="seconds of a busy loop on every core"
    )
    parser.add_argument(
        "--stall-at", type=float, default=5.0, help="seconds into the overload it begins"
    )
    parser.add_argument("--out", type=Path, default=Path("bench/out/overload.json"))
    return parser


def check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """``args``, or the parser's error for a stall that is negative or outside the overload."""
    if args.stall < 0 or not 0 <= args.stall_at <= args.seconds:
        parser.error(
            f"--stall must be >= 0 and --stall-at within the overload's {args.seconds:g} s; got "
            f"{args.stall:g} and {args.stall_at:g}"
        )
    return args


LOOP = "while True: pass"  # a stall's busy loop


async def stall(at_s: float, seconds: float, processes: int) -> None:
    """After ``at_s``, ``processes`` busy loops, each its own process, for ``seconds``, then
    none left behind."""
    await asyncio.sleep(at_s)
    busy: list[asyncio.subprocess.Process] = []
    try:
        for _ in range(processes):
            busy.append(await asyncio.create_subprocess_exec(sys.executable, "-c", LOOP))
        await asyncio.sleep(seconds)
    finally:
        for process in busy:
            process.kill()
        for process in busy:
            await process.wait()


def main(argv: list[str] | None = None) -> int:
    options = parser()
    args = check(options, options.parse_args(argv))
    from bench.zoo import build_zoo

    (path,) = build_zoo(Path("bench/out/overload-zoo"), 1, passes=args.passes, steady=True)
    port = start(args.serve_proxy)
    try:
        points = [asyncio.run(_one(s, port, args, path)) for s in args.systems]
    finally:
        import ray

        ray.shutdown()
    print(table(points, args.factor, args.slo_ms))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "command": ["python", "-m", "bench.overload", *(argv or sys.argv[1:])],
        "mode": "serve-proxy" if args.serve_proxy else "fast-path",
        "points": points,
    }
    args.out.write_text(json.dumps(report) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
