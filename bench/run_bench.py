"""raysrv against a plain Ray Serve ``@serve.batch`` deployment, in one Ray instance.

    python -m bench.run_bench [--quick] [--out bench/out/results.json] [--policy fixed|aimd]

Both serve the benchmark convnet (:mod:`bench.models`) from one replica with one onnxruntime
thread, side by side in the same Ray instance; only one of them is under load at any time. Per
system and client kind (HTTP through the Serve proxy, handle calls from this driver):

1. warm-up (closed loop, discarded);
2. saturation: closed loop with ``--concurrency`` workers, for HTTP also ``wrk``;
3. open loop, Poisson arrivals at 50% and 90% of the *baseline's* saturation rate of that client
   kind; both systems get the same arrival times and inputs.

The two systems alternate which goes first from one point to the next, so slow drifts of the
machine fall on both. Prints Markdown tables, the pass/fail lines of the issue's targets, and
writes everything (with per-point mean batch sizes) to ``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import platform
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from bench.loadgen import (
    Client,
    HandleClient,
    HttpClient,
    RunResult,
    closed_loop,
    encode_bodies,
    make_inputs,
    open_loop,
    wrk_saturation,
)
from bench.models import DEFAULT_PATH, INPUT_SHAPE, build_convnet
from bench.report import criteria, markdown

__all__ = ["FULL", "QUICK", "Plan", "System", "main", "raysrv_spec"]

HOST = "127.0.0.1"
DIGITS_DIR = Path("examples/digits/models")
APP = "bench"


@dataclass(frozen=True)
class Plan:
    """Seconds per measurement point."""

    warmup_s: float
    saturation_s: float
    open_s: float
    pause_s: float
    loads: tuple[float, ...] = (0.5, 0.9)


FULL = Plan(warmup_s=5.0, saturation_s=20.0, open_s=30.0, pause_s=2.0)
QUICK = Plan(warmup_s=1.5, saturation_s=3.0, open_s=4.0, pause_s=0.5)


@dataclass
class System:
    """One system under test: its HTTP URL, a handle call and a batch counter."""

    name: str
    url: str
    call: Callable[[Any], Any]
    batches: Callable[[], Awaitable[int]]


def model_file(name: str) -> tuple[Path, tuple[int, ...]]:
    """The ONNX file and input shape of a benchmark model, built if missing."""
    if name == "convnet":
        return build_convnet(DEFAULT_PATH), INPUT_SHAPE
    from examples.digits.build import build_all

    return build_all(DIGITS_DIR)[name.removeprefix("digits-")], (64,)


def raysrv_spec(
    path: str, shape: tuple[int, ...], policy: str, max_batch_size: int, timeout_ms: float
) -> dict[str, Any]:
    """The raysrv spec: one model, one app without a cache, a CPU-free ingress."""
    model = {
        "name": "convnet",
        "runtime": "onnx",
        "source": path,
        "resources": {"num_cpus": 1, "threads": 1},
        "batching": {
            "policy": policy,
            "params": {"max_batch_size": max_batch_size, "timeout_ms": timeout_ms},
        },
        "slo_ms": 200,
        "input": {"shape": list(shape), "dtype": "float32"},
    }
    return {
        "models": [model],
        "apps": [{"name": APP, "models": ["convnet"], "cache_size": 0}],
        "ingress": {"num_cpus": 0},
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def start(args: argparse.Namespace, model_path: Path, shape: tuple[int, ...]) -> int:
    """Start Ray and Serve, deploy both apps; return the HTTP port."""
    import ray
    from ray import serve
    from ray.serve.schema import LoggingConfig

    from bench.baseline import build_baseline
    from raysrv.app import build_app

    port = args.port or free_port()
    logging.getLogger("ray.serve").setLevel(logging.WARNING)  # no per-cancel INFO lines
    ray.init(
        address="local", num_cpus=args.num_cpus, include_dashboard=False, logging_level="WARNING"
    )
    quiet = LoggingConfig(enable_access_log=False, log_level="WARNING")
    serve.start(http_options={"host": HOST, "port": port}, logging_config=quiet)
    spec = raysrv_spec(str(model_path), shape, args.policy, args.max_batch_size, args.timeout_ms)
    serve.run(build_app(spec), name="raysrv", route_prefix="/raysrv", logging_config=quiet)
    baseline = build_baseline(
        str(model_path), shape, args.max_batch_size, args.baseline_wait_ms / 1000.0
    )
    serve.run(baseline, name="baseline", route_prefix="/baseline", logging_config=quiet)
    return port


def systems(port: int) -> list[System]:
    """Handles and URLs of both apps (call inside the running event loop)."""
    from ray import serve

    ours = serve.get_app_handle("raysrv")
    base = serve.get_app_handle("baseline")

    async def our_batches() -> int:
        return sum(m["batches"] for m in await ours.models.remote())

    async def base_batches() -> int:
        return int((await base.stats.remote())["batches"])

    return [
        System(
            "raysrv",
            f"http://{HOST}:{port}/raysrv/v1/{APP}/predict",
            lambda x: ours.predict.remote(APP, x),
            our_batches,
        ),
        System("baseline", f"http://{HOST}:{port}/baseline", base.predict.remote, base_batches),
    ]


def ordered(items: Sequence[System], k: int) -> list[System]:
    """Point ``k`` runs the systems in turn order, the next one in reverse."""
    return list(items) if k % 2 == 0 else list(items)[::-1]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class Bench:
    """The measurement sequence over two systems sharing one driver event loop."""

    def __init__(self, args: argparse.Namespace, plan: Plan, targets: list[System]) -> None:
        self.args = args
        self.plan = plan
        self.targets = targets
        self.inputs = make_inputs(args.inputs, args.shape, seed=args.seed)
        self.bodies = encode_bodies(self.inputs)
        self.clients: dict[tuple[str, str], Client] = {}

    async def point(
        self, system: System, label: str, run: Callable[[], Awaitable[RunResult]]
    ) -> RunResult:
        """One measured point, with the system's mean batch size over it."""
        before = await system.batches()
        result = await run()
        batches = await system.batches() - before
        mean = result.ok / batches if batches else math.nan
        result = replace(result, extra={**result.extra, "batches": batches, "mean_batch": mean})
        log(
            f"  {label:<22} {system.name:<8} {result.throughput_rps:7.1f} rps  "
            f"p50 {result.p50_ms:7.1f} ms  p99 {result.p99_ms:7.1f} ms  batch {mean:5.2f}  "
            f"rejected {result.rejected}  errors {result.errors}"
        )
        await asyncio.sleep(self.plan.pause_s)
        return result

    async def warm_up(self) -> None:
        log("warm-up")
        for system in self.targets:
            for kind in ("http", "handle"):
                client = self.clients[system.name, kind]
                await self.point(
                    system,
                    f"warm-up {kind}",
                    lambda c=client: closed_loop(c, self.args.concurrency, self.plan.warmup_s),
                )

    def _saturate(self, system: System, kind: str) -> Callable[[], Awaitable[RunResult]]:
        if kind == "wrk":
            return lambda: wrk_saturation(
                system.url,
                self.bodies[: self.args.wrk_bodies],
                self.args.concurrency,
                self.plan.saturation_s,
            )
        client = self.clients[system.name, kind]
        return lambda: closed_loop(client, self.args.concurrency, self.plan.saturation_s)

    async def saturation(self) -> dict[str, dict[str, RunResult]]:
        log(f"saturation (closed loop, {self.args.concurrency} in flight)")
        results: dict[str, dict[str, RunResult]] = {}
        for k, kind in enumerate(("http", "handle", "wrk")):
            results[kind] = {
                s.name: await self.point(s, f"saturation {kind}", self._saturate(s, kind))
                for s in ordered(self.targets, k)
            }
        return results

    async def open_loop(self, rates: dict[str, float]) -> list[dict[str, Any]]:
        log("open loop (Poisson)")
        points: list[dict[str, Any]] = []
        for kind, base_rate in rates.items():
            for load in self.plan.loads:
                k = len(points)
                rate = load * base_rate
                entry: dict[str, Any] = {"client": kind, "load": load, "rate_rps": rate}
                for s in ordered(self.targets, k + 1):
                    client = self.clients[s.name, kind]
                    entry[s.name] = await self.point(
                        s,
                        f"open {kind} {load:.0%} {rate:.0f}/s",
                        lambda c=client, r=rate, k=k: open_loop(
                            c, r, self.plan.open_s, seed=self.args.seed + k
                        ),
                    )
                points.append(entry)
        return points

    async def run(self) -> dict[str, Any]:
        async with contextlib.AsyncExitStack() as stack:
            for s in self.targets:
                http = HttpClient(s.url, self.bodies)
                self.clients[s.name, "http"] = await stack.enter_async_context(http)
                self.clients[s.name, "handle"] = HandleClient(s.call, self.inputs)
            await self.warm_up()
            saturation = await self.saturation()
            http_from = "http" if self.args.http_rate_from == "closed" else "wrk"
            rates = {
                "http": saturation[http_from]["baseline"].throughput_rps,
                "handle": saturation["handle"]["baseline"].throughput_rps,
            }
            points = await self.open_loop(rates)
        return {"saturation": saturation, "open": points}


def _jsonable(value: Any) -> Any:
    if isinstance(value, RunResult):
        return value.to_dict()
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.run_bench", description=__doc__.split("\n")[0]
    )
    p.add_argument("--quick", action="store_true", help="seconds per point: a smoke test only")
    p.add_argument("--saturation-s", type=float, help="override the plan's seconds per point")
    p.add_argument("--open-s", type=float, help="override the plan's open-loop seconds per point")
    p.add_argument("--out", type=Path, default=Path("bench/out/results.json"), help="JSON file")
    p.add_argument("--policy", default="fixed", help="raysrv batching policy (fixed, aimd, ...)")
    p.add_argument(
        "--model",
        default="convnet",
        choices=["convnet", "digits-logreg", "digits-mlp", "digits-cnn"],
        help="the benchmark convnet or one of the digits example models",
    )
    p.add_argument("--max-batch-size", type=int, default=16, help="both systems")
    p.add_argument("--timeout-ms", type=float, default=0.0, help="raysrv batching timeout")
    p.add_argument("--baseline-wait-ms", type=float, default=1.0, help="batch_wait_timeout_s")
    p.add_argument("--concurrency", type=int, default=32, help="closed-loop requests in flight")
    p.add_argument(
        "--http-rate-from",
        choices=("closed", "wrk"),
        default="closed",
        help="which baseline HTTP saturation the open-loop HTTP rates are fractions of",
    )
    p.add_argument("--inputs", type=int, default=512, help="distinct pre-built inputs")
    p.add_argument("--wrk-bodies", type=int, default=16, help="distinct bodies in the wrk script")
    p.add_argument("--num-cpus", type=int, default=4, help="logical CPUs given to Ray")
    p.add_argument("--port", type=int, default=0, help="Serve HTTP port (default: a free one)")
    p.add_argument("--seed", type=int, default=0, help="inputs and arrival times")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    plan = QUICK if args.quick else FULL
    if args.saturation_s is not None:
        plan = replace(plan, saturation_s=args.saturation_s)
    if args.open_s is not None:
        plan = replace(plan, open_s=args.open_s)
    model_path, args.shape = model_file(args.model)
    started = time.time()
    try:
        port = start(args, model_path, args.shape)

        async def measure() -> dict[str, Any]:
            return await Bench(args, plan, systems(port)).run()

        results = asyncio.run(measure())
    finally:
        import ray
        from ray import serve

        with contextlib.suppress(Exception):
            serve.shutdown()
        ray.shutdown()
    report = {
        "command": ["python", "-m", "bench.run_bench", *(argv or sys.argv[1:])],
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "plan": asdict(plan),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "wall_s": round(time.time() - started, 1),
        **_jsonable(results),
    }
    report["criteria"] = _jsonable(criteria(report))
    print(markdown(report))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
