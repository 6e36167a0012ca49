"""raysrv against plain Ray Serve ``@serve.batch`` on the digits MLP, over HTTP and handles, in
one of Serve's two modes, and raysrv's inputs per second with many inputs per request.

    python -m bench.fast_path [--serve-proxy] [--replicas 1] [--raysrv-replicas N]
                              [--seconds 10] [--rounds 3] [--systems S ...] [--points P ...]
                              [--out JSON]

One Ray instance, started with ``raysrv run``'s environment (:data:`raysrv.cli.FAST_PATH`:
HAProxy ingress, gRPC handles, user code on the replica's main thread), or with Serve's
defaults under ``--serve-proxy``. Three applications serve the digits example's MLP (ONNX, one
intra-op thread, batches of up to 32, no cache, every input distinct; raysrv's app keeps no
query for a feedback, as the baseline keeps none, unless ``--feedback``), each in ``--replicas``
replicas (raysrv's: ingress replicas, each with its own worker or worker thread, and
``--raysrv-replicas`` of them where given; Ray counts four logical CPUs a replica):

* ``baseline``: ``@serve.batch(max_batch_size=32, batch_wait_timeout_s=0.001)``, the pattern of
  Serve's batching guide (``bench.baseline``);
* ``raysrv``: the model on a worker actor (``placement: workers``), ``fixed`` batches cut as
  soon as the worker frees, or, while fewer queries wait than the ingress lately held
  requests at once, once that many wait or the oldest has waited 8 ms (:data:`BATCHING`);
* ``raysrv-colocated``: the same model with ``placement: auto``, as the digits example declares
  it, which puts a model this cheap on a worker thread of the ingress's process (the report's
  ``placements`` says where each raysrv system's pool went, and ``auto`` what it measured).

Each round measures every system in turn, in an order that alternates from round to round,
one system under load at a time: ``wrk`` (one thread) with 32 connections and with one, and the
driver's handle calls with 32 and with one in flight; for raysrv, ``wrk`` with 32 connections
on the model's own route (``/v1/models/mlp/predict``, no app's selection or cache), then on the
app's route with bodies of ``--per-request`` inputs, as JSON (``{"inputs": [...]}``) and as one
raw float32 tensor (``application/octet-stream``), and as the Open Inference Protocol's binary
tensor (``POST /v2/models/mlp/infer``, the model's route, the outputs asked as bytes too). An
input counts when its answer holds an output (wrk counts them in each 200 answer,
``wrk_saturation(count=...)``; an infer request answers all its rows or fails), so inputs
answered with an error do not count. Each point also records the machine's CPU time (every
process's, the client's too) per input answered. Prints a table of the medians over the rounds
and each system's ratios to the baseline, and the saturation ratio round by round; writes
every point to ``--out``.

``--systems`` and ``--points`` measure only those (the baseline always): with ``--points
http-32`` the systems' saturation points run one right after another, so that each round's
ratio compares the machine at nearly one moment, and more rounds fit in the time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.loadgen import (
    HandleClient,
    RunResult,
    closed_loop,
    make_inputs,
    require_wrk,
    wrk_saturation,
)
from raysrv.cli import FAST_PATH

__all__ = ["bodies", "main"]

HOST = "127.0.0.1"
APP = "digits"
OUTPUT = '"output"'  # one per answered input, in every system's answers
SYSTEMS = ("baseline", "raysrv", "raysrv-colocated")
MAX_BATCH = 32
# raysrv's batching: batches of up to 32, cut as soon as a worker frees, except that while
# fewer wait than the ingress lately held requests at once, the oldest waits up to 8 ms for
# the rest (``fixed``'s ``busy_timeout_ms``)
BATCHING = {"max_batch_size": MAX_BATCH, "timeout_ms": 0, "busy_timeout_ms": 8}
MANY = ("http-32-many", "http-32-raw", "http-32-oip")  # the points of many inputs a request
POINTS = ("http-32", "http-1", "handle-32", "handle-1", *MANY[:2], "http-32-model", MANY[2])


def spec(path: Path, placement: str, replicas: int = 1, feedback: bool = False) -> dict[str, Any]:
    """raysrv serving the MLP alone, in ``replicas`` ingress replicas: ``fixed`` batches of up
    to 32, no cache, and, unless ``feedback``, no query kept for a feedback (``feedback:
    false``): the baseline keeps none either."""
    model = {
        "name": "mlp",
        "runtime": "onnx",
        "source": str(path),
        "placement": placement,
        "resources": {"num_cpus": 1, "threads": 1},
        "batching": {"policy": "fixed", "params": BATCHING},
        "slo_ms": 1000,
        "input": {"shape": [64], "dtype": "float32"},
    }
    return {
        "models": [model],
        "apps": [{"name": APP, "models": ["mlp"], "cache_size": 0, "feedback": feedback}],
        "ingress": {"num_cpus": 0, "replicas": replicas},
    }


def bodies(inputs: list[np.ndarray], per_request: int) -> list[bytes]:
    """JSON bodies of ``per_request`` inputs each (``input`` for one, ``inputs`` for more)."""
    rounded = [np.round(x.astype(np.float64), 4).tolist() for x in inputs]
    if per_request == 1:
        return [json.dumps({"input": x}).encode() for x in rounded]
    count = len(rounded) // per_request
    groups = [rounded[k * per_request : (k + 1) * per_request] for k in range(count)]
    return [json.dumps({"inputs": g}).encode() for g in groups]


def raw_bodies(inputs: list[np.ndarray], per_request: int) -> list[bytes]:
    """Bodies of ``per_request`` inputs each as one raw float32 tensor (:data:`RAW_HEADERS`)."""
    count = len(inputs) // per_request
    stacked = np.stack(inputs[: count * per_request]).astype(np.float32)
    return [rows.tobytes() for rows in stacked.reshape(count, per_request, -1)]


def oip_bodies(inputs: list[np.ndarray], per_request: int) -> tuple[list[bytes], dict[str, str]]:
    """Infer requests of ``per_request`` rows each in the binary tensor data extension, and
    the headers they share (every header is the same length)."""
    tensor = {"name": "input", "shape": [per_request, 64], "datatype": "FP32"}
    tensor["parameters"] = {"binary_data_size": per_request * 64 * 4}
    header = json.dumps({"inputs": [tensor], "parameters": {"binary_data_output": True}}).encode()
    headers = {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(header)),
    }
    return [header + rows for rows in raw_bodies(inputs, per_request)], headers


def raw_headers(per_request: int) -> dict[str, str]:
    return {
        "Content-Type": "application/octet-stream",
        "X-Raysrv-Shape": f"{per_request},64",
        "X-Raysrv-Dtype": "float32",
    }


PLACEMENTS = {"raysrv": "workers", "raysrv-colocated": "auto"}  # raysrv's systems


def start(
    serve_proxy: bool,
    replicas: int = 1,
    systems: tuple[str, ...] = tuple(PLACEMENTS),
    raysrv_replicas: int | None = None,
    feedback: bool = False,
) -> tuple[int, Path]:
    """Ray and Serve in the chosen mode, the baseline in ``replicas`` replicas and raysrv's
    ``systems`` in ``raysrv_replicas`` (None: ``replicas``) each, their app keeping queries for
    feedback as ``feedback`` says (:func:`spec`); the HTTP port and model.
    Every bench that starts them measures with ``wrk``: it must be installed."""
    require_wrk()
    if not serve_proxy:
        os.environ.update(FAST_PATH)  # read as Serve is imported and as Ray starts
    os.environ["RAY_worker_niceness"] = "0"  # noqa: SIM112 - Ray's name; client and servers alike
    from ray import serve
    from ray.serve.schema import LoggingConfig

    from bench.baseline import build_baseline
    from bench.validate_live import start_ray
    from examples.digits.build import build_all
    from raysrv.app import build_app

    path = build_all(Path("examples/digits/models"))["mlp"]
    raysrv_replicas = raysrv_replicas or replicas
    port = start_ray(num_cpus=4 * max(replicas, raysrv_replicas))
    quiet = LoggingConfig(enable_access_log=False, log_level="WARNING")
    base = build_baseline(str(path), (64,), MAX_BATCH, 0.001, num_replicas=replicas)
    serve.run(base, name="baseline", route_prefix="/baseline", logging_config=quiet)
    for name in systems:
        app = build_app(spec(path, PLACEMENTS[name], raysrv_replicas, feedback))
        serve.run(app, name=name, route_prefix=f"/{name}", logging_config=quiet)
    return port, path


def targets(port: int) -> dict[str, tuple[str, Callable[[Any], Any]]]:
    """Each system's predict URL and handle call (inside the running event loop)."""
    from ray import serve

    base = serve.get_app_handle("baseline")
    out: dict[str, tuple[str, Callable[[Any], Any]]] = {
        "baseline": (f"http://{HOST}:{port}/baseline", base.predict.remote)
    }
    for name in SYSTEMS[1:]:
        handle = serve.get_app_handle(name)
        url = f"http://{HOST}:{port}/{name}/v1/{APP}/predict"
        out[name] = (url, lambda x, h=handle: h.predict.remote(APP, x))
    return out


async def placements() -> dict[str, dict[str, Any]]:
    """Where each raysrv system's pool runs, as one of its replicas resolved ``placement: auto``
    when it started, and for ``auto`` the batch of one it timed and the bound it colocates
    within."""
    from ray import serve

    out = {}
    for name in SYSTEMS[1:]:
        (pool,) = await serve.get_app_handle(name).pools.remote()
        out[name] = {"placement": pool["placement"], "auto": pool.get("auto")}
    return out


def _busy_s() -> float:
    """CPU seconds the machine's cores have been busy since it started, all processes': user,
    nice, system, irq and softirq of ``/proc/stat`` (a guest's time is within user; time the
    host stole is not this machine's work)."""
    ticks = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8]
    busy = sum(int(ticks[i]) for i in (0, 1, 2, 5, 6))
    return busy / os.sysconf("SC_CLK_TCK")


def _row(
    system: str, kind: str, k: int, result: RunResult, busy_s: float, per_request: int = 1
) -> dict:
    counted = result.extra.get("counted")
    inputs = counted if counted is not None else result.ok * per_request
    row = {
        "round": k,
        "system": system,
        "point": kind,
        "inputs_per_s": inputs / result.duration_s if result.duration_s else 0.0,
        "requests_per_s": result.throughput_rps,
        "p50_ms": result.p50_ms,
        "p99_ms": result.p99_ms,
        "refused": result.rejected,
        "errors": result.errors,
        "machine_cpu_us": busy_s / inputs * 1e6 if inputs else float("nan"),
    }
    print(
        f"  round {k} {system:<17} {kind:<12} {row['inputs_per_s']:7.0f} inputs/s  "
        f"p50 {row['p50_ms']:6.2f} ms  p99 {row['p99_ms']:6.1f} ms  "
        f"refused {row['refused']}  errors {row['errors']}  "
        f"machine CPU {row['machine_cpu_us']:.0f} us an input",
        file=sys.stderr,
        flush=True,
    )
    return row


class Rounds:
    """The points of one system in one round (see the module's docstring)."""

    def __init__(self, args: argparse.Namespace, port: int) -> None:
        self.args = args
        self.inputs = make_inputs(args.per_request * 64, (64,), seed=1)
        self.single = bodies(self.inputs, 1)
        self.many = bodies(self.inputs, args.per_request)
        self.raw = raw_bodies(self.inputs, args.per_request)
        self.oip, self.oip_headers = oip_bodies(self.inputs, args.per_request)
        self.targets = targets(port)

    def points(self, system: str) -> dict[str, Callable[[], Awaitable[RunResult]]]:
        url, call = self.targets[system]
        handle = HandleClient(call, self.inputs)
        s = self.args.seconds
        points = {
            "http-32": lambda: wrk_saturation(url, self.single, 32, s, count=OUTPUT),
            "http-1": lambda: wrk_saturation(url, self.single, 1, s, count=OUTPUT),
            "handle-32": lambda: closed_loop(handle, 32, s),
            "handle-1": lambda: closed_loop(handle, 1, s),
        }
        if system != "baseline":  # in the order of POINTS
            points["http-32-many"] = lambda: wrk_saturation(url, self.many, 32, s, count=OUTPUT)
            raw = raw_headers(self.args.per_request)
            points["http-32-raw"] = lambda: wrk_saturation(
                url, self.raw, 32, s, count=OUTPUT, headers=raw
            )
            base = url.split("/v1/")[0]
            points["http-32-model"] = lambda: wrk_saturation(
                base + "/v1/models/mlp/predict", self.single, 32, s, count=OUTPUT
            )
            infer = base + "/v2/models/mlp/infer"
            points["http-32-oip"] = lambda: wrk_saturation(
                infer, self.oip, 32, s, headers=self.oip_headers
            )
        return {kind: point for kind, point in points.items() if kind in self.args.points}

    async def run(self) -> list[dict[str, Any]]:
        measured = [system for system in SYSTEMS if system in self.args.systems]
        for system in measured:  # warm-up, discarded
            await wrk_saturation(self.targets[system][0], self.single, 32, 3.0)
            await closed_loop(HandleClient(self.targets[system][1], self.inputs), 32, 3.0)
        rows = []
        for k in range(self.args.rounds):
            order = measured if k % 2 == 0 else measured[::-1]
            for system in order:
                for kind, point in self.points(system).items():
                    per_request = self.args.per_request if kind in MANY else 1
                    before = _busy_s()
                    result = await point()
                    busy = _busy_s() - before
                    rows.append(_row(system, kind, k, result, busy, per_request))
                    await asyncio.sleep(0.5)
        return rows


async def _measure(
    args: argparse.Namespace, port: int
) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """Where raysrv's pools went, and the rows (handles made inside the loop that calls them)."""
    where = await placements()
    print(f"placements: {where}", file=sys.stderr, flush=True)
    return where, await Rounds(args, port).run()


def _median(rows: list[dict], system: str, point: str, field: str) -> float:
    values = [r[field] for r in rows if r["system"] == system and r["point"] == point]
    return statistics.median(values) if values else float("nan")


def table(rows: list[dict[str, Any]], per_request: int) -> str:
    """Medians over the rounds, each system's ratio to the baseline, the formats' ratio (blank
    or nan where a point was not measured), and the saturation ratio by round."""
    lines = [
        "| system | HTTP, 32 connections, inputs/s | HTTP, 1 connection, p50 ms | handles, 32 "
        f"in flight, inputs/s | handles, 1 in flight, p50 ms | HTTP, {per_request} inputs a "
        "request, inputs/s | the same, raw float32, inputs/s | the same, Open Inference "
        "Protocol binary, inputs/s | HTTP, 32 connections, the model's route, inputs/s | "
        "HTTP, 32 connections, the machine's CPU an input, us |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for system in SYSTEMS:
        cells = [
            _median(rows, system, "http-32", "inputs_per_s"),
            _median(rows, system, "http-1", "p50_ms"),
            _median(rows, system, "handle-32", "inputs_per_s"),
            _median(rows, system, "handle-1", "p50_ms"),
            _median(rows, system, "http-32-many", "inputs_per_s"),
            _median(rows, system, "http-32-raw", "inputs_per_s"),
            _median(rows, system, "http-32-oip", "inputs_per_s"),
            _median(rows, system, "http-32-model", "inputs_per_s"),
            _median(rows, system, "http-32", "machine_cpu_us"),
        ]
        shown = [f"{c:.2f}" if i in (1, 3) else f"{c:.0f}" for i, c in enumerate(cells)]
        lines.append(f"| {system} | " + " | ".join(s.replace("nan", "") for s in shown) + " |")
    lines.append("")
    measured = [system for system in SYSTEMS[1:] if any(r["system"] == system for r in rows)]
    for system in measured:
        ratios = {
            (point, field): _median(rows, system, point, field)
            / _median(rows, "baseline", point, field)
            for point, field in (
                ("http-32", "inputs_per_s"),
                ("http-1", "p50_ms"),
                ("handle-32", "inputs_per_s"),
                ("handle-1", "p50_ms"),
                ("http-32", "machine_cpu_us"),
            )
        }
        single = _median(rows, system, "http-32", "inputs_per_s")
        many = _median(rows, system, "http-32-many", "inputs_per_s") / single
        raw = _median(rows, system, "http-32-raw", "inputs_per_s") / single
        oip = _median(rows, system, "http-32-oip", "inputs_per_s") / single
        model = _median(rows, system, "http-32-oip", "inputs_per_s") / _median(
            rows, system, "http-32-model", "inputs_per_s"
        )
        lines.append(
            f"{system} over baseline: HTTP inputs/s {ratios['http-32', 'inputs_per_s']:.2f}x, "
            f"HTTP p50 {ratios['http-1', 'p50_ms']:.2f}x, handle inputs/s "
            f"{ratios['handle-32', 'inputs_per_s']:.2f}x, handle p50 "
            f"{ratios['handle-1', 'p50_ms']:.2f}x, the machine's CPU an HTTP input "
            f"{ratios['http-32', 'machine_cpu_us']:.2f}x; {per_request} inputs a request over "
            f"1: {many:.1f}x, raw float32 {raw:.1f}x, binary infer {oip:.1f}x ({model:.1f}x "
            "single inputs to the model's route)"
        )
    lines.append("")
    for system in measured:
        lines.append(
            f"{system}, HTTP inputs/s against the baseline's by round: {by_round(rows, system)}"
        )
    return "\n".join(lines)


def by_round(rows: list[dict[str, Any]], system: str, point: str = "http-32") -> str:
    """``system``'s inputs/s at ``point`` over the baseline's at ``http-32``, round by round."""
    rates: dict[tuple[str, int], float] = {
        (r["system"], r["round"]): r["inputs_per_s"]
        for r in rows
        if r["point"] == (point if r["system"] == system else "http-32")
    }
    rounds = sorted({k for name, k in rates if name == system})
    ratios = [
        f"{rates[system, k] / rates['baseline', k]:.2f}x"
        for k in rounds
        if rates.get(("baseline", k))
    ]
    return ", ".join(ratios) or "none"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve-proxy", action="store_true", help="Serve's default mode")
    parser.add_argument("--replicas", type=int, default=1, help="each system's replicas")
    parser.add_argument(
        "--raysrv-replicas", type=int, help="raysrv's ingress replicas (default: --replicas)"
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="per point")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--per-request", type=int, default=32, help="inputs in a many-body")
    parser.add_argument(
        "--feedback",
        action="store_true",
        help="raysrv's app keeps each query for a feedback (an app's default; off here)",
    )
    parser.add_argument(
        "--systems",
        nargs="+",
        choices=SYSTEMS[1:],
        default=list(SYSTEMS[1:]),
        help="raysrv's systems to measure beside the baseline",
    )
    parser.add_argument(
        "--points", nargs="+", choices=POINTS, default=list(POINTS), help="points to measure"
    )
    parser.add_argument("--out", type=Path, default=Path("bench/out/fast_path.json"))
    args = parser.parse_args(argv)
    args.systems = ["baseline", *args.systems]
    started = time.time()
    port, _ = start(
        args.serve_proxy,
        args.replicas,
        raysrv_replicas=args.raysrv_replicas,
        feedback=args.feedback,
    )
    try:
        where, rows = asyncio.run(_measure(args, port))
    finally:
        import ray

        ray.shutdown()  # a local cluster: its Serve goes with it (its handles' loop is closed)
    print(table(rows, args.per_request))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "command": ["python", "-m", "bench.fast_path", *(argv or sys.argv[1:])],
        "mode": "serve-proxy" if args.serve_proxy else "fast-path",
        "replicas": args.replicas,
        "raysrv_replicas": args.raysrv_replicas or args.replicas,
        "placements": where,
        "wall_s": round(time.time() - started, 1),
        "rows": rows,
    }
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
