"""LitServe, BentoML, plain Ray Serve and raysrv side by side: one model, one run.

    python -m bench.peers [--rounds 3] [--seconds 20] [--slo-ms 200] [--passes 2000]
        [--capacity-scale 1] [--systems litserve bentoml serve serve-proxy raysrv raysrv-proxy]
        [--raysrv FIELD=JSON ...] [--raysrv-ingress FIELD=VALUE ...] [--trace] [--out JSON]

Every system serves the :mod:`bench.overload` model (a :mod:`bench.zoo` model, one onnxruntime
thread, a batch of 16 in about 120 ms) from one worker process, in batches of at most
``MAX_BATCH``, each tuned with the knobs it offers:

* ``litserve``: LitServe's batching (cut ``WAIT_MS`` after a batch's first request), ZeroMQ
  queues and a request timeout of the SLO (``bench/peer_apps/litserve_app.py``);
* ``bentoml``: BentoML's adaptive batching with ``max_latency_ms`` the SLO and
  ``max_concurrency`` from the capacity and the SLO (``bench/peer_apps/bentoml_app.py``);
* ``serve`` and ``serve-proxy``: plain Ray Serve ``@serve.batch(MAX_BATCH, WAIT_MS)``,
  ``max_ongoing_requests`` from the capacity and the SLO and ``max_queued_requests`` 1
  (:mod:`bench.baseline`), on Serve's fast path (``raysrv run``'s environment: HAProxy ingress,
  gRPC between replicas) and behind Serve's Python proxy; ``serve-open`` on the fast path with
  ``SERVE_BOUNDS`` instead: room for a batch to form behind the one running, no bound on the
  queue (neither setting answers the most within the SLO on both loads);
* ``raysrv`` and ``raysrv-proxy``: raysrv's defaults (the ``deadline`` policy), the model on a
  worker actor, each query carrying its SLO and when it was scheduled, in the same two modes;
  ``--raysrv`` sets fields of its model, ``--raysrv-ingress`` of its ingress
  (``max_ongoing_requests=auto max_queued_requests=1``).

"The capacity" bounds and every offered load are from one figure for all: ``MAX_BATCH`` over
the median time of a batch of ``MAX_BATCH`` in this process before any server starts, what the
model can do with nothing else on the cores; ``--capacity-scale`` sets them all from a share of
it instead (below 1: lighter loads, as a faster minute of the machine makes them). LitServe and
BentoML each run in a virtual environment of their own (``PEER_PACKAGES``, made at first use
under ``bench/out/peers``, as their pins conflict with Ray's), each Ray mode in a child process
with a Ray instance of its own; this process is every system's load generator. For each system,
after ``WARM_S`` of warm-up:

* saturation: answers per second of a closed loop of ``MAX_BATCH`` in flight, ``SATURATION_S``;
* half load: Poisson arrivals at half the capacity for ``HALF_S``; the answers' p50 and p99;
* ``mmpp 80%`` (bursts at 120% of the capacity, :mod:`bench.workloads`) and ``poisson 150%``,
  ``--seconds`` each: the share of queries answered within the SLO, answers after it, refusals
  (429, 503), requests the server gave up on once they had waited (504) and requests with no
  answer (the client's ``TIMEOUT_S``).

Latency counts from each request's scheduled time. The systems run one after another, each for
about a minute, and this 2-core machine's speed drifts between them: in one run a peer kept 54%
of the bursty load within the SLO, in another 99.7%, as the load the capacity set turned out
heavy or light for its minute (``bench/RESULTS_ARCHIVE.md``, "pr41 and pr49", "pr39, pr40, pr42
and pr43"). So the whole sequence runs ``--rounds`` times, every system once a round, and the
table gives each figure's median over the rounds, the round-by-round table each load's share
within the SLO and its answers late (:func:`rounds_table`), with the rounds in which raysrv was
ahead of every other system, none late.

``--out`` gets the medians and every round's points; per point, each request's scheduled
time, latency and status; per phase, how many failures gave each reason and, for raysrv, the
quantiles of the queries' trips to its ingress and of the time it kept back for the answers'
way back; with ``--trace``, for raysrv on each of ``LOADS``, what its policy planned with every
``bench.overload.TRACE_S``, its refusals and its pool's batches (``bench.overload.Trace``), in
seconds from the start of the load's schedule as its requests: enough to see which batch each
refusal made way for.
``bench/figures/peers.png`` plots the medians of the shares within the SLO, with each round's as a
dot.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from bench.loadgen import REJECTED, RequestLog, closed_loop, poisson_offsets, replay
from bench.overload import TimedClient, Trace, key_value, raysrv_body

__all__ = [
    "ahead",
    "goodput",
    "latencies",
    "main",
    "median_point",
    "model_capacity",
    "new_reasons",
    "request_body",
    "rounds_table",
    "table",
]

HOST = "127.0.0.1"
MAX_BATCH = 16
WAIT_MS = 5.0
WARM_S = 3.0
SATURATION_S = 10.0
HALF_S = 10.0
TIMEOUT_S = 30.0
INPUTS = 4096
LOADS = ("mmpp 80%", "poisson 150%")
MAX_CAPACITY_SCALE = 2.0  # --capacity-scale's largest: 90 for 0.9 is refused, not run
PEERS = ("litserve", "bentoml")
# the systems each Ray mode's child process runs, by the mode's name
RAY_MODES = {
    "fast-path": ("serve", "serve-open", "raysrv"),
    "serve-proxy": ("serve-proxy", "raysrv-proxy"),
}
SYSTEMS = (*PEERS, "serve", "serve-open", "serve-proxy", "raysrv", "raysrv-proxy")
# plain Serve's max_ongoing_requests and max_queued_requests by system, where not from the
# capacity and the SLO (bench.baseline.admitted, and a queue of one): room for a batch to form
# behind the one running, and no bound on the queue
SERVE_BOUNDS = {"serve-open": (2 * MAX_BATCH, -1)}
PEER_PACKAGES = {"litserve": ("litserve==0.2.19",), "bentoml": ("bentoml==1.4.40",)}
PEERS_DIR = Path("bench/out/peers")
APPS = Path(__file__).with_name("peer_apps")
READY_S = 180.0


def model_capacity(path: Path, runs: int = 15) -> float:
    """Rows a second of back-to-back batches of ``MAX_BATCH`` on one onnxruntime thread in
    this process: ``MAX_BATCH`` over the median of ``runs`` timed batches."""
    import onnxruntime as ort

    from bench.zoo import digits_like

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    x = digits_like(np.random.default_rng(3), MAX_BATCH)
    session.run(None, {name: x})
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, {name: x})
        times.append(time.perf_counter() - start)
    return MAX_BATCH / float(np.median(times))


def request_body(system: str, slo_ms: float) -> Callable[[str, float], bytes]:
    """How ``system`` takes one input (JSON text) scheduled at a wall-clock time: raysrv with
    its SLO and that time, BentoML's batchable API as a batch of one row, the others bare."""
    if system.startswith("raysrv"):
        return raysrv_body(slo_ms)
    if system == "bentoml":
        return lambda x, t: f'{{"input":[{x}]}}'.encode()
    return lambda x, t: f'{{"input":{x}}}'.encode()


def _arrays(log: RequestLog) -> tuple[np.ndarray, np.ndarray]:
    scheduled = np.asarray(log.scheduled, dtype=float)
    return np.asarray(log.done, dtype=float) - scheduled, np.asarray(log.status, dtype=int)


def latencies(log: RequestLog) -> dict[str, Any]:
    """The answers' (200s') latency p50 and p99 in ms, and every status's count."""
    latency, status = _arrays(log)
    answered = latency[status == 200] * 1e3
    pct = lambda q: float(np.percentile(answered, q)) if answered.size else float("nan")  # noqa: E731
    statuses = {str(s): int(n) for s, n in zip(*np.unique(status, return_counts=True), strict=True)}
    return {"p50_ms": pct(50), "p99_ms": pct(99), "statuses": statuses}


def goodput(log: RequestLog, slo_s: float, seconds: float) -> dict[str, Any]:
    """One loaded point's figures: the share of its requests answered within ``slo_s``, the
    answers within it a second over ``seconds``, answers after it, refusals (429, 503),
    requests given up by the server after they waited (504), other errors and requests with
    no answer (the client gave up, or the connection failed)."""
    latency, status = _arrays(log)
    ok = status == 200
    within = ok & (latency <= slo_s)
    return {
        "offered": int(status.size),
        "within_share": float(within.mean()) if status.size else float("nan"),
        "goodput_per_s": float(within.sum() / seconds),
        "late": int((ok & (latency > slo_s)).sum()),
        "refused": int(np.isin(status, list(REJECTED)).sum()),
        "timed_out": int((status == 504).sum()),
        "other_errors": int((~ok & ~np.isin(status, [0, 504, *REJECTED])).sum()),
        "no_answer": int((status == 0).sum()),
    }


def _ingress(url: str) -> str:
    """The root of the raysrv ingress whose predict route is ``url``."""
    return url.split("/v1/")[0]


async def _ingress_json(url: str, path: str) -> Any:
    """``GET path`` of the raysrv ingress whose predict route is ``url``, as JSON."""
    async with (
        aiohttp.ClientSession() as session,
        session.get(_ingress(url) + path) as response,
    ):
        return await response.json()


async def _batches(url: str) -> dict[str, Any]:
    """raysrv's batch sizes so far, and the median run time of each, in ms (``GET
    /v1/models/zoo``)."""
    model = await _ingress_json(url, "/v1/models/zoo")
    medians = model["batch_seconds"]["p50"]
    return {"counts": model["batch_counts"], "p50_ms": {k: v * 1e3 for k, v in medians.items()}}


async def _trips(url: str) -> dict[str, Any]:
    """raysrv's ingress's view of the way to it and back, quantiles in ms: the queries' trips
    to it and the time it keeps back for the answers' way back (``GET /v1/pools``)."""
    pool = (await _ingress_json(url, "/v1/pools"))["pools"][0]
    return {"trip_in_ms": pool["trip_in_ms"], "kept_back_ms": pool["kept_back_ms"]}


def new_reasons(errors: list[tuple[str, float, float]], since: int) -> dict[str, int]:
    """How many of the errors (``TimedClient.errors``: reason, seconds, transit) from number
    ``since`` on gave each reason."""
    return dict(collections.Counter(reason for reason, *_ in errors[since:]))


def _saved(log: RequestLog) -> dict[str, list[Any]]:
    latency, _ = _arrays(log)
    return {"scheduled": log.scheduled, "latency": latency.tolist(), "status": log.status}


async def measure(
    system: str, url: str, capacity: float, args: argparse.Namespace
) -> dict[str, Any]:
    """Every figure of one system serving at ``url`` (see the module's docstring)."""
    from bench.workloads import workload
    from bench.zoo import digits_like

    inputs = digits_like(np.random.default_rng(7), INPUTS).tolist()
    slo_s = args.slo_ms / 1000.0
    point: dict[str, Any] = {"system": system, "capacity_per_s": capacity, "logs": {}}
    point |= {"reasons": {}, "trips": {}}
    body = request_body(system, args.slo_ms)
    async with TimedClient(url, inputs, args.slo_ms, body) as client:

        async def ended(phase: str, since: int) -> None:
            """Keep why the phase's requests failed and, for raysrv, its trips' figures."""
            point["reasons"][phase] = new_reasons(client.errors, since)
            if system.startswith("raysrv"):
                point["trips"][phase] = await _trips(url)

        await closed_loop(client, MAX_BATCH, WARM_S)
        await ended("warm-up", 0)
        since, saturation = len(client.errors), RequestLog()
        await closed_loop(client, MAX_BATCH, SATURATION_S, log=saturation)
        await ended("saturation", since)
        _, status = _arrays(saturation)
        point["saturation_per_s"] = float((status == 200).sum() / SATURATION_S)
        point["saturation_statuses"] = latencies(saturation)["statuses"]
        if system.startswith("raysrv"):  # how it batched that loop, as the ingress saw it
            point["saturation_batches"] = await _batches(url)
        since = len(client.errors)
        half = await replay(
            client, poisson_offsets(0.5 * capacity, np.random.default_rng(11), HALF_S)
        )
        await ended("half load", since)
        point["half_load"] = latencies(half)
        for name in LOADS:
            since, refused = len(client.errors), len(client.refusals)
            trace = Trace(_ingress(url)) if args.trace and system == "raysrv" else None
            polling = asyncio.create_task(trace.poll()) if trace else None
            log = await replay(client, workload(name, capacity, slo_s, args.seconds))
            if trace and polling:
                polling.cancel()
                await trace.finish(client.refusals[refused:], log)
                point.setdefault("trace", {})[name] = trace.report()
            await ended(name, since)
            point[name] = goodput(log, slo_s, args.seconds)
            point["logs"][name] = _saved(log)
    shown = {k: v for k, v in point.items() if k != "logs"}
    print(f"{system}: {shown}", file=sys.stderr, flush=True)
    return point


def _free_port() -> int:
    from bench.validate_live import free_port

    return free_port()


def peer_python(name: str) -> Path:
    """The Python of ``name``'s own environment, made (or made again, when its packages have
    changed) with ``PEER_PACKAGES[name]`` and this process's onnxruntime and numpy."""
    import onnxruntime

    venv = PEERS_DIR.resolve() / name
    wanted = "\n".join(
        [
            *PEER_PACKAGES[name],
            f"onnxruntime=={onnxruntime.__version__}",
            f"numpy=={np.__version__}",
        ]
    )
    stamp = venv / "raysrv-bench-requirements.txt"
    python = venv / "bin" / "python"
    if not (python.exists() and stamp.exists() and stamp.read_text() == wanted):
        print(f"{name}: making its environment in {venv}", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *wanted.split("\n")], check=True)
        stamp.write_text(wanted)
    return python


@contextlib.contextmanager
def peer(name: str, path: Path, capacity: float, slo_ms: float) -> Iterator[str]:
    """``name`` serving the model at ``path`` from its own environment until the block ends;
    yields its prediction URL once it has answered one request."""
    from bench.baseline import admitted

    python, port = peer_python(name), _free_port()
    env = {**os.environ, "PEER_MODEL": str(path.resolve()), "PEER_MAX_BATCH": str(MAX_BATCH)}
    if name == "litserve":
        command = [
            str(python),
            "litserve_app.py",
            "--model",
            env["PEER_MODEL"],
            "--port",
            str(port),
        ]
        command += [
            "--max-batch",
            str(MAX_BATCH),
            "--wait-ms",
            f"{WAIT_MS:g}",
            "--slo-ms",
            f"{slo_ms:g}",
        ]
    else:
        bound = admitted(capacity, slo_ms / 1000.0, MAX_BATCH)
        env |= {"PEER_SLO_MS": f"{slo_ms:.0f}", "PEER_CONCURRENCY": str(bound)}
        command = [str(python.with_name("bentoml")), "serve", "bentoml_app:Zoo"]
        command += ["--host", HOST, "--port", str(port)]
    log = (PEERS_DIR / f"{name}.log").open("w")
    process = subprocess.Popen(
        command, cwd=APPS, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        url = f"http://{HOST}:{port}/predict"
        _wait_ready(url, request_body(name, slo_ms)(json.dumps([0.0] * 64), time.time()), process)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


def _wait_ready(url: str, body: bytes, process: subprocess.Popen[bytes]) -> None:
    """Until a POST of ``body`` to ``url`` is answered 200; raise if ``process`` exits first
    or ``READY_S`` pass."""
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url}'s server exited with {process.returncode}")
        with (
            contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError),
            urllib.request.urlopen(request, timeout=5) as response,
        ):
            if response.status == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"{url} did not answer within {READY_S:g} s")


def ray_mode(
    mode: str, systems: list[str], capacity: float, args: argparse.Namespace
) -> list[dict[str, Any]]:
    """The points of ``systems`` on one Ray instance in ``mode`` (this is the child process)."""
    from bench.overload import deploy, start

    path = _model(args.passes)
    port = start(serve_proxy=mode == "serve-proxy")  # before Serve is imported: it reads the mode
    from ray import serve

    points = []
    try:
        for system in systems:
            kind = "baseline" if system.startswith("serve") else "raysrv"
            # the baseline bounded from the capacity and the SLO; raysrv with its defaults
            bound = capacity if kind == "baseline" else None
            route = deploy(
                kind,
                path,
                args.slo_ms,
                bound,
                *SERVE_BOUNDS.get(system, (None, 1)),
                model=dict(_setting(s) for s in args.raysrv),
                ingress=dict(args.raysrv_ingress),
            )
            points.append(
                asyncio.run(measure(system, f"http://{HOST}:{port}{route}", capacity, args))
            )
            serve.delete(kind)
    finally:
        import ray

        ray.shutdown()
    return points


def _child(
    mode: str, systems: list[str], capacity: float, args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Run ``ray_mode`` in a child process of its own, and read back its points."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "points.json"
        command = [
            sys.executable,
            "-m",
            "bench.peers",
            "--ray-mode",
            mode,
            "--capacity",
            repr(capacity),
        ]
        command += ["--seconds", f"{args.seconds:g}", "--slo-ms", f"{args.slo_ms:g}"]
        command += ["--passes", str(args.passes), "--systems", *systems, "--out", str(out)]
        command += ["--raysrv", *args.raysrv]
        command += ["--raysrv-ingress", *(f"{k}={json.dumps(v)}" for k, v in args.raysrv_ingress)]
        command += ["--trace"] if args.trace else []
        subprocess.run(command, check=True)
        return json.loads(out.read_text())["points"]


def _setting(text: str) -> tuple[str, Any]:
    """``FIELD=JSON`` as (field, value)."""
    field, _, value = text.partition("=")
    return field, json.loads(value)


def _model(passes: int) -> Path:
    from bench.zoo import build_zoo

    (path,) = build_zoo(Path("bench/out/overload-zoo"), 1, passes=passes, steady=True)
    return path


def median_point(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One system's figures over its rounds (``runs``, a point each): the median of each."""

    def mid(part: str, figure: str) -> float:
        return float(np.median([p[part][figure] for p in runs]))

    point = {key: runs[0][key] for key in ("system", "capacity_per_s")} | {"rounds": len(runs)}
    point["saturation_per_s"] = float(np.median([p["saturation_per_s"] for p in runs]))
    point["half_load"] = {k: mid("half_load", k) for k in ("p50_ms", "p99_ms")}
    for name in LOADS:
        point[name] = {k: mid(name, k) for k in runs[0][name]}
    return point


def ahead(points: list[dict[str, Any]], load: str) -> bool:
    """Whether raysrv (on the fast path) kept more of ``load`` within the SLO than every
    system not raysrv's, with no answer late."""
    mine = next(p[load] for p in points if p["system"] == "raysrv")
    others = [p[load]["within_share"] for p in points if not p["system"].startswith("raysrv")]
    return mine["late"] == 0 and all(mine["within_share"] > share for share in others)


def rounds_table(rounds: list[list[dict[str, Any]]]) -> str:
    """Each load's share within the SLO and answers late, round by round, a row per system; and
    the rounds in which raysrv was :func:`ahead` on each load."""
    cells = lambda p, load: f"{p[load]['within_share']:.2%} ({p[load]['late']:,})"  # noqa: E731
    names = [f"round {k + 1}" for k in range(len(rounds))]
    lines = [
        "| system | " + " | ".join(f"{load}: {n}" for load in LOADS for n in names) + " |",
        "|---|" + "---:|" * (len(LOADS) * len(rounds)),
    ]
    for i, point in enumerate(rounds[0]):
        row = [cells(r[i], load) for load in LOADS for r in rounds]
        lines.append(f"| {point['system']} | " + " | ".join(row) + " |")
    if any(p["system"] == "raysrv" for p in rounds[0]):
        held = [f"{load} {sum(ahead(r, load) for r in rounds)} of {len(rounds)}" for load in LOADS]
        lines.append("\nraysrv ahead of every other system, none late: " + ", ".join(held))
    return "\n".join(lines)


def table(points: list[dict[str, Any]], slo_ms: float) -> str:
    """The side-by-side table of ``points`` (one per system; figures or their medians)."""
    lines = [
        "| system | saturation answers/s | p50 ms at 50% | p99 ms at 50% | "
        + " | ".join(f"{n}: within SLO | {n}: late | {n}: refused / 504" for n in LOADS)
        + " |",
        "|---|" + "---:|" * (3 + 3 * len(LOADS)),
    ]
    for p in points:
        half = p["half_load"]
        cells = [f"{p['saturation_per_s']:.0f}", f"{half['p50_ms']:.1f}", f"{half['p99_ms']:.1f}"]
        for name in LOADS:
            g = p[name]
            cells += [f"{g['within_share']:.2%}", f"{g['late']:,g}"]
            cells.append(f"{g['refused']:,g} / {g['timed_out']:,g}")
        lines.append(f"| {p['system']} | " + " | ".join(cells) + " |")
    lines.append(
        f"\nSLO {slo_ms:g} ms; capacity {points[0]['capacity_per_s']:.1f} rows/s for every load"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="of the whole sequence")
    parser.add_argument("--seconds", type=float, default=20.0, help="of each loaded point")
    parser.add_argument("--slo-ms", type=float, default=200.0)
    parser.add_argument("--passes", type=int, default=2000, help="of the zoo model's layer")
    parser.add_argument(
        "--capacity-scale",
        type=float,
        default=1.0,
        help="set every load and bound from this share of the measured capacity (0.9: lighter)",
    )
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    parser.add_argument(
        "--raysrv",
        nargs="*",
        default=[],
        metavar="FIELD=JSON",
        help="raysrv's model with these fields set (pipeline_depth=1, placement='\"colocated\"')",
    )
    parser.add_argument(
        "--raysrv-ingress",
        nargs="*",
        type=key_value,
        default=[],
        metavar="FIELD=VALUE",
        help="raysrv's ingress with these fields set (max_ongoing_requests=auto)",
    )
    parser.add_argument(
        "--trace",
        action="store_true",
        help="record raysrv's plan, refusals and batches on each load (bench.overload's --trace)",
    )
    parser.add_argument("--out", type=Path, default=Path("bench/out/peers.json"))
    parser.add_argument("--ray-mode", choices=sorted(RAY_MODES), help=argparse.SUPPRESS)
    parser.add_argument("--capacity", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    if not 0.0 < args.capacity_scale <= MAX_CAPACITY_SCALE:
        parser.error(
            f"--capacity-scale must be above 0 and at most {MAX_CAPACITY_SCALE:g}, got "
            f"{args.capacity_scale:g}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.ray_mode:  # a child process of the run below
        points = ray_mode(args.ray_mode, args.systems, args.capacity, args)
        args.out.write_text(json.dumps({"points": points}))
        return 0
    path = _model(args.passes)
    measured = model_capacity(path)
    capacity = measured * args.capacity_scale
    print(
        f"capacity: {measured:.1f} rows/s, loads from {capacity:.1f}", file=sys.stderr, flush=True
    )
    rounds = []
    for k in range(args.rounds):
        points = []
        for name in (s for s in PEERS if s in args.systems):
            with peer(name, path, capacity, args.slo_ms) as url:
                points.append(asyncio.run(measure(name, url, capacity, args)))
        for mode, systems in RAY_MODES.items():
            if chosen := [s for s in systems if s in args.systems]:
                points += _child(mode, chosen, capacity, args)
        rounds.append(points)
        print(f"round {k + 1}:\n{table(points, args.slo_ms)}", file=sys.stderr, flush=True)
        medians = [median_point([r[i] for r in rounds]) for i in range(len(points))]
        command = ["python", "-m", "bench.peers", *(argv or sys.argv[1:])]
        report = {"command": command, "points": medians, "rounds": rounds}
        args.out.write_text(json.dumps(report) + "\n")  # after each round: a crash keeps them
    print(f"medians over {args.rounds} rounds:\n{table(medians, args.slo_ms)}")
    print(rounds_table(rounds))
    from bench.plots import peers_bars

    figure = peers_bars(medians, LOADS, args.slo_ms, Path("bench/figures/peers.png"), rounds)
    print(f"plot: {figure}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
