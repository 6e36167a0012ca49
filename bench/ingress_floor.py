"""The least a colocated ingress can cost on Serve's fast path: raysrv against a floor of its
own design with none of its per-query work.

    python -m bench.ingress_floor [--rounds 5] [--seconds 10] [--out JSON]

:mod:`bench.fast_path`'s Ray (Serve's fast path), its baseline (plain Serve
``@serve.batch(32, 1 ms)``) and raysrv with the digits MLP in its ingress (``colocated``), and
two floors beside them: each an ASGI app in a Serve ingress replica, as raysrv's is, that
reads the body (orjson, as raysrv reads it), queues the input, cuts batches of up to 32 as the
model frees (``fixed`` with no wait), runs them on raysrv's ONNX runtime and writes each output
as JSON. raysrv itself batches as :mod:`bench.fast_path` has it (:data:`bench.fast_path.BATCHING`:
a batch held for the ingress's concurrency), so at saturation its batches are larger than the
floors' and ``pool-floor``'s. ``floor-thread`` runs each batch on a thread of its
own, off the event loop, as raysrv must; ``floor-inline`` runs it on the event loop, as the
baseline does. A floor checks nothing, keeps no deadline, selects nothing, records nothing for
feedback and counts no metrics: it is not a server, only the cost of the path every raysrv
prediction shares with it. raysrv is measured on its model's route (``/v1/models/mlp/predict``,
no app's selection) and on its app's, and so is ``pool-floor``: the same raysrv with
``floor-thread``'s batching in place of its pool (:func:`floor_pools`), all its per-query work
kept. With batches cut alike, its gain over raysrv was the most any cut to the pool (queue,
scheduler, the worker's calls and reports, the timeline) could buy, and its gap to
``floor-thread`` raysrv's per-query work alone.

Each round measures every system in turn, in an order that alternates from round to round:
``wrk`` with 32 connections, one JSON input a request, every input distinct. Prints each
system's median inputs per second, its ratio to the baseline, and CPU an input: the machine's
(every process's, the client's too), the serving replica process's, and that of the process's
busiest thread, the one that runs the event loop (Serve's, uvicorn's and the app's Python; the
model's thread is the next). For raysrv's own two rows also the mean size of the model's
batches, read from its pool's timeline: at saturation the loop, not the model, is busy, so
batches stay small and what the pool pays a batch is paid often.

Results: bench/RESULTS.md, "The fast path".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson
from ray import serve
from ray.serve import Application

from bench import fast_path
from bench.loadgen import make_inputs, wrk_saturation
from raysrv._deployments import Ingress
from raysrv._server import Server
from raysrv.app import ingress_options, prepare_spec
from raysrv.config import RaysrvSpec
from raysrv.runtimes import OnnxRuntime

__all__ = [
    "FloorApp",
    "FloorBatcher",
    "PoolFloorIngress",
    "floor_pools",
    "main",
    "mean_batch",
    "pool_mean_batch",
    "summary",
    "thread_cpu_s",
]

SYSTEMS = (
    "baseline",
    "floor-inline",
    "floor-thread",
    "raysrv-model",
    "raysrv-colocated",
    "pool-floor-model",
    "pool-floor",
)
FLOORS = {"floor-inline": True, "floor-thread": False}  # name: runs its batches inline
FIELDS = (
    "inputs_per_s",
    "p50_ms",
    "machine_cpu_us",
    "process_cpu_us",
    "loop_cpu_us",
    "mean_batch",
)
POOLED = ("raysrv-model", "raysrv-colocated")  # their batches in the pool's timeline
MODEL = "mlp"  # bench.fast_path's model, and its pool's name
CONNECTIONS = 32
WARM_S = 3.0


class FloorBatcher:
    """Inputs queued and cut into batches of up to ``max_batch_size`` as the model frees, run by
    raysrv's ONNX runtime (one thread: the same runs as raysrv's) on the event loop
    (``inline``) or on a thread of their own; a batch that fails raises its exception in each
    of its answers, and one whose callers all left still runs."""

    def __init__(self, path: str, inline: bool, max_batch_size: int = fast_path.MAX_BATCH):
        self._runtime = OnnxRuntime(path)
        self._inline = inline
        self._max = max_batch_size
        self._queue: list[tuple[Any, asyncio.Future[Any]]] = []
        self._drainer: asyncio.Task[None] | None = None
        self._thread = ThreadPoolExecutor(1, "floor")
        self.batches = 0

    def put(self, x: Any) -> asyncio.Future[Any]:
        """Queue ``x``; the future holds its output."""
        answer = asyncio.get_running_loop().create_future()
        self._queue.append((x, answer))
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain())
        return answer

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while self._queue:
            batch, self._queue = self._queue[: self._max], self._queue[self._max :]
            inputs = [x for x, _ in batch]
            try:
                if self._inline:
                    outputs = self._runtime.predict_batch(inputs)
                else:
                    run = self._runtime.predict_batch
                    outputs = await loop.run_in_executor(self._thread, run, inputs)
            except Exception as exc:
                for _, answer in batch:
                    if not answer.done():  # not cancelled by a client that left
                        answer.set_exception(exc)
                continue
            self.batches += 1
            for (_, answer), output in zip(batch, outputs, strict=True):
                if not answer.done():
                    answer.set_result(output)


class FloorApp:
    """An ASGI app that answers ``POST {"input": [...]}`` with ``{"output": ...}``, its inputs
    batched by a :class:`FloorBatcher`; any other body is a bare 400."""

    def __init__(self, path: str, inline: bool, max_batch_size: int = fast_path.MAX_BATCH):
        self._batcher = FloorBatcher(path, inline, max_batch_size)

    @property
    def batches(self) -> int:
        return self._batcher.batches

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        try:
            x = np.asarray(orjson.loads(body)["input"], dtype=np.float32)
        except (ValueError, KeyError, TypeError):
            await _send(send, 400, b"{}")
            return
        output = await self._batcher.put(x)
        await _send(send, 200, orjson.dumps({"output": output}))


def floor_pools(server: Server) -> dict[str, FloorBatcher]:
    """Each model of ``server`` answered by a :class:`FloorBatcher` on a thread, in place of
    its pool's queue, scheduler and worker: what raysrv would cost if its pools cost no more
    than the floor's batching, all its per-query work kept (parsing, checks, selection, the
    wait to the deadline, the feedback record, the answer). The pools take no query and plan
    nothing; a query whose caller leaves stays queued, and its batch runs without it. The
    batchers, by model."""
    sources = {m.name: m.source for m in server.spec.models}
    batchers = {}
    for pool in server.pools.values():
        mine = {m: FloorBatcher(sources[m], False) for m in pool.models()}

        def submit(model: str, x: Any, *_: Any, mine: dict[str, FloorBatcher] = mine) -> Any:
            return mine[model].put(x)

        pool.submit = submit  # type: ignore[method-assign]
        pool.withdraw = lambda model, future: False  # type: ignore[method-assign]
        batchers.update(mine)
    return batchers


class PoolFloorIngress(Ingress.func_or_class):  # type: ignore[name-defined,misc]
    """raysrv's ingress with :func:`floor_pools` in place of its pools."""

    async def __init__(self, spec: dict[str, Any], root: str | None = None) -> None:
        await super().__init__(spec, root)
        floor_pools(self._server)


async def _send(send: Any, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@serve.deployment(max_ongoing_requests=128, ray_actor_options={"num_cpus": 1})
@serve.ingress()
class Floor:
    """A :class:`FloorApp` as a Serve ingress replica."""

    def __init__(self, path: str, inline: bool) -> None:
        self._floor = FloorApp(path, inline)

    def __serve_build_asgi_app__(self) -> FloorApp:
        return self._floor


REPLICAS = {  # each system's Serve replica, as its process names it
    "baseline": "baseline:baseline",
    **{name: f"{name}:{name}" for name in FLOORS},
    "raysrv-model": "raysrv-colocated:ingress",
    "raysrv-colocated": "raysrv-colocated:ingress",
    "pool-floor-model": "pool-floor:ingress",
    "pool-floor": "pool-floor:ingress",
}


def _replica_pid(replica: str) -> int:
    found = subprocess.run(["pgrep", "-f", f"ServeReplica:{replica}"], capture_output=True)
    return int(found.stdout.split()[0])


def thread_cpu_s(pid: int) -> dict[int, float]:
    """CPU seconds (user and system) each thread of the process ``pid`` has used so far."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rpartition(")")[2].split()
        except FileNotFoundError:  # the thread ended
            continue
        out[int(task.name)] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def mean_batch(columns: dict[str, list[Any]]) -> float:
    """The mean number of queries in the INFERs of a pool's timeline (NaN if it has none)."""
    kinds, sizes = columns["kind"], columns["size"]
    batches = [size for kind, size in zip(kinds, sizes, strict=True) if kind == "infer"]
    return statistics.fmean(batches) if batches else math.nan


async def pool_mean_batch(app_url: str, since: float) -> float:
    """:func:`mean_batch` of the INFERs that the pool of :data:`MODEL` in the raysrv app at
    ``app_url`` sent from the wall time ``since``."""
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{app_url}/v1/pools/{MODEL}/timeline", params={"since": str(since)}) as got,
    ):
        got.raise_for_status()
        return mean_batch(await got.json())


async def _mean_batch(port: int, since: float) -> float:
    return await pool_mean_batch(f"http://{fast_path.HOST}:{port}/raysrv-colocated", since)


def _urls(port: int) -> dict[str, str]:
    base = f"http://{fast_path.HOST}:{port}"
    raysrv, pool_floor = f"{base}/raysrv-colocated", f"{base}/pool-floor"
    return {
        "baseline": f"{base}/baseline",
        **{name: f"{base}/{name}" for name in FLOORS},
        "raysrv-model": f"{raysrv}/v1/models/{MODEL}/predict",
        "raysrv-colocated": f"{raysrv}/v1/{fast_path.APP}/predict",
        "pool-floor-model": f"{pool_floor}/v1/models/{MODEL}/predict",
        "pool-floor": f"{pool_floor}/v1/{fast_path.APP}/predict",
    }


async def _points(port: int, rounds: int, seconds: float) -> list[dict[str, Any]]:
    bodies = fast_path.bodies(make_inputs(2048, (64,), seed=1), 1)
    urls = _urls(port)
    pids = {system: _replica_pid(replica) for system, replica in REPLICAS.items()}
    for url in urls.values():
        await wrk_saturation(url, bodies, CONNECTIONS, WARM_S)
    points = []
    for k in range(rounds):
        for system in SYSTEMS if k % 2 == 0 else SYSTEMS[::-1]:
            before, threads = fast_path._busy_s(), thread_cpu_s(pids[system])
            since = time.time()
            result = await wrk_saturation(
                urls[system], bodies, CONNECTIONS, seconds, count=fast_path.OUTPUT
            )
            busy = fast_path._busy_s() - before
            used = [s - threads.get(t, 0.0) for t, s in thread_cpu_s(pids[system]).items()]
            inputs = result.extra["counted"]
            batch = await _mean_batch(port, since) if system in POOLED else math.nan
            point = {
                "round": k,
                "system": system,
                "inputs_per_s": inputs / result.duration_s,
                "p50_ms": result.p50_ms,
                # not 2xx, broken, or answered without an output
                "errors": result.rejected + result.errors + result.ok - inputs,
                "machine_cpu_us": busy / inputs * 1e6 if inputs else float("nan"),
                "process_cpu_us": sum(used) / inputs * 1e6 if inputs else float("nan"),
                "loop_cpu_us": max(used) / inputs * 1e6 if inputs else float("nan"),
                "mean_batch": batch,
            }
            print(
                f"  round {k} {system:<17} {point['inputs_per_s']:7.0f} inputs/s  "
                f"p50 {point['p50_ms']:6.2f} ms  errors {point['errors']}  CPU an input: "
                f"machine {point['machine_cpu_us']:.0f} us, process "
                f"{point['process_cpu_us']:.0f}, busiest thread {point['loop_cpu_us']:.0f}, "
                f"mean batch {batch:.1f}",
                file=sys.stderr,
                flush=True,
            )
            points.append(point)
    return points


def summary(points: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per system, the medians of each of :data:`FIELDS`, and its inputs per second over the
    baseline's (``ratio``)."""
    out: dict[str, dict[str, float]] = {}
    for system in SYSTEMS:
        mine = [p for p in points if p["system"] == system]
        out[system] = {field: statistics.median(p[field] for p in mine) for field in FIELDS}
    for row in out.values():
        row["ratio"] = row["inputs_per_s"] / out["baseline"]["inputs_per_s"]
    return out


def _pool_floor(path: Path) -> Application:
    """raysrv colocated, as ``bench.fast_path`` serves it, in a :class:`PoolFloorIngress`."""
    spec = prepare_spec(RaysrvSpec.model_validate(fast_path.spec(path, "colocated")))
    options = ingress_options(spec)
    # Ray's logical CPUs are the other systems' already: this one's are on the same cores
    options["ray_actor_options"] = {**options["ray_actor_options"], "num_cpus": 0}
    deployment = Ingress.options(func_or_class=PoolFloorIngress, **options)
    return deployment.bind(spec.model_dump(mode="json"), str(spec.base_dir()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=10.0, help="per point")
    parser.add_argument("--out", type=Path, help="every point, as JSON")
    args = parser.parse_args(argv)
    from ray.serve.schema import LoggingConfig

    port, path = fast_path.start(False, systems=("raysrv-colocated",))
    try:
        quiet = LoggingConfig(enable_access_log=False, log_level="WARNING")
        for name, inline in FLOORS.items():
            app = Floor.options(name=name).bind(str(path), inline)
            serve.run(app, name=name, route_prefix=f"/{name}", logging_config=quiet)
        serve.run(
            _pool_floor(path), name="pool-floor", route_prefix="/pool-floor", logging_config=quiet
        )
        points = asyncio.run(_points(port, args.rounds, args.seconds))
    finally:
        import ray

        ray.shutdown()  # a local cluster: its Serve goes with it
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(points, indent=1))
    print(
        "| system | inputs/s | over the baseline | p50 ms | CPU an input, us: the machine's | "
        "the replica process's | its busiest thread's | mean batch |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for system, row in summary(points).items():
        print(
            f"| {system} | {row['inputs_per_s']:,.0f} | {row['ratio']:.2f}x | "
            f"{row['p50_ms']:.2f} | {row['machine_cpu_us']:.0f} | {row['process_cpu_us']:.0f} | "
            f"{row['loop_cpu_us']:.0f} | {_shown(row['mean_batch'])} |"
        )
    return 0


def _shown(batch: float) -> str:
    return "" if math.isnan(batch) else f"{batch:.1f}"


if __name__ == "__main__":
    sys.exit(main())
