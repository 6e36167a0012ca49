"""Test doubles that ship with raysrv: a fake clock, scripted models, workers, spec builders.

``EchoModel`` is a real ``python``-runtime model (it implements ``predict_batch``) whose answers
say which batch they came from, so a test can see batching from the outside; ``LocalWorkers``
(and :func:`fake_workers` for a dedicated pool) stand in for a pool's Ray actors in Ray-free
tests: each worker has two executors, as a live one (INFERs; LOADs and UNLOADs), each running
its actions one at a time in the order they were submitted.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from raysrv._pool import Pool
from raysrv._workers import Call, Report, Workers
from raysrv.batching import (
    BatcherView,
    BatchingPolicy,
    BatchOutcome,
    Dispatch,
    QueuedQuery,
    ReplicaSlot,
)

__all__ = [
    "CurveModel",
    "EchoModel",
    "FakeClock",
    "LabelModel",
    "LocalWorkers",
    "fake_workers",
    "model_spec",
    "one_model_pool",
    "saturated_batch_sizes",
    "serve_http",
    "spec",
    "teach",
    "UnloadableModel",
    "torch_linear",
]


class FakeClock:
    """A clock that moves only when told: ``clock()`` reads it, ``advance(dt)`` moves it."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("time does not run backwards")
        self.now += seconds


class EchoModel:
    """Answers ``{"sum", "batch_size", "batch", "pid"}`` per input after ``delay_s`` per batch.

    ``batch`` counts the batches this instance has run, so equal values mean one batch.
    """

    def __init__(self, delay_s: float = 0.0, per_item_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.per_item_s = per_item_s
        self.batches = 0

    def predict_batch(self, inputs: Sequence[Any]) -> list[dict[str, Any]]:
        batch = np.asarray(inputs)
        time.sleep(self.delay_s + self.per_item_s * len(batch))
        self.batches += 1
        sums = batch.reshape(len(batch), -1).sum(axis=1).tolist()
        return [
            {"sum": s, "batch_size": len(batch), "batch": self.batches, "pid": os.getpid()}
            for s in sums
        ]


class CurveModel:
    """An emulated accelerator whose service curve is given: a batch of k sleeps ``(base_s +
    per_query_s * k) / threads ** scaling``, stretched by ``1 + interference`` for each other
    CurveModel batch running in this process when it starts (shared cores and memory).

    For scaling experiments on a small host: the sleeps leave the CPUs free, so many workers
    run at once, and their threads and contention follow the curve instead of the host.
    """

    _running = 0
    _lock = threading.Lock()

    def __init__(
        self,
        base_s: float = 0.004,
        per_query_s: float = 0.0,
        threads: int = 1,
        scaling: float = 0.6,
        interference: float = 0.15,
    ) -> None:
        self.speedup = threads**scaling
        self.base_s, self.per_query_s, self.interference = base_s, per_query_s, interference

    def predict_batch(self, inputs: Sequence[Any]) -> list[float]:
        with CurveModel._lock:
            others = CurveModel._running
            CurveModel._running += 1
        try:
            work = (self.base_s + self.per_query_s * len(inputs)) / self.speedup
            time.sleep(work * (1.0 + self.interference * others))
        finally:
            with CurveModel._lock:
                CurveModel._running -= 1
        return [float(np.sum(x)) for x in inputs]


class UnloadableModel:
    """A python model whose weights cannot be read: it raises as it is made."""

    def __init__(self) -> None:
        raise OSError("weights.bin: truncated\nat byte 512")

    def predict_batch(self, inputs: Sequence[Any]) -> list[Any]:
        return list(inputs)


class TextModel:
    """Answers ``{"length", "words", "first", "batch_size", "batch"}`` per input, a ``str`` or
    ``bytes``: its length, its whitespace-separated words and its first character or byte,
    the numbers as numpy's, as a model built on numpy returns them."""

    def __init__(self) -> None:
        self.batches = 0

    def predict_batch(self, inputs: Sequence[str | bytes]) -> list[dict[str, Any]]:
        if not isinstance(inputs, list) or not all(isinstance(x, str | bytes) for x in inputs):
            raise TypeError(f"expected a list of str or bytes, got {type(inputs).__name__}")
        self.batches += 1
        lengths = np.array([len(x) for x in inputs])
        return [
            {
                "length": length,
                "words": len(x.split()),
                "first": x[:1] if isinstance(x, str) else list(x[:1]),
                "batch_size": np.int64(len(inputs)),
                "batch": self.batches,
            }
            for x, length in zip(inputs, lengths, strict=True)
        ]


class LabelModel:
    """Answers ``{"label": label}`` for every input after ``delay_s`` per batch: a classifier
    whose answer (and speed) a test chooses."""

    def __init__(self, label: int = 0, delay_s: float = 0.0) -> None:
        self.label = label
        self.delay_s = delay_s

    def predict_batch(self, inputs: Sequence[Any]) -> list[dict[str, Any]]:
        time.sleep(self.delay_s)
        return [{"label": self.label} for _ in inputs]


def teach(policy: BatchingPolicy, outcome: BatchOutcome) -> None:
    """Hand ``policy`` a finished batch as the scheduler does: ``observe``, then its run time
    into the model's run times (``policy.runs``)."""
    policy.observe(outcome)
    if outcome.ok:
        policy.runs.observe(outcome.size, outcome.duration)


def saturated_batch_sizes(
    policy: BatchingPolicy, rounds: int, duration: Callable[[int], float], backlog: int = 300
) -> list[int]:
    """Sizes ``policy`` cuts when ``backlog`` queries always wait for one free replica, on a fake
    clock, a batch of k taking ``duration(k)`` seconds (and reported to ``observe``)."""
    clock = FakeClock()
    sizes = []
    for _ in range(rounds):
        queue = [QueuedQuery(i, clock()) for i in range(backlog)]
        decision = policy.decide(BatcherView(clock(), queue, [ReplicaSlot(0)]))
        if not isinstance(decision, Dispatch):
            raise AssertionError(f"a saturated policy must dispatch, got {decision}")
        size = len(decision.query_ids)
        clock.advance(duration(size))
        teach(policy, BatchOutcome(size, 0, clock() - duration(size), clock(), duration(size)))
        sizes.append(size)
    return sizes


class LocalWorkers(Workers):
    """A pool's workers in this process, for tests (see the module docstring).

    ``models`` maps a model name to the object (with ``predict_batch``) a LOAD of it brings in;
    ``dedicated``, if given, is every worker's one model, whatever name it is asked by.
    ``delay_s`` / ``load_s``: simulated run time of each INFER / LOAD (asyncio sleeps);
    ``delay_s`` may be a function of the batch size. ``run``, if given, replaces the model:
    each INFER awaits ``run(inputs)`` for its outputs and the run time to report.
    ``weight_bytes``: what each model takes against ``capacity_bytes``. Each INFER's batch size
    is appended to ``log``, and every action to ``actions`` as (worker, kind, model). With
    ``reply_s``, each INFER's and LOAD's report says when it started and ended (wall clock), as
    a live worker's does, with its end ``reply_s`` before the report is handed back: an answer
    that took that long to come back."""

    def __init__(
        self,
        count: int,
        models: Mapping[str, Any] | None = None,
        *,
        dedicated: Any = None,
        capacity_bytes: int | None = None,
        weight_bytes: int = 0,
        delay_s: float | Callable[[int], float] = 0.0,
        load_s: float = 0.0,
        log: list[int] | None = None,
        run: Callable[[np.ndarray], Awaitable[tuple[list[Any], float]]] | None = None,
        reply_s: float | None = None,
    ) -> None:
        self._models = dict(models or {})
        self._reply_s = reply_s
        self._run = run
        self._dedicated = dedicated
        self._capacity = capacity_bytes
        self._weight = weight_bytes
        self.delay_s, self.load_s = delay_s, load_s
        self.log = log if log is not None else []
        self.actions: list[tuple[int, str, str]] = []
        self.held: list[dict[str, int]] = [{} for _ in range(count)]
        self.peak_bytes = [0] * count
        # each worker's two executors (INFER; LOAD and UNLOAD), as a live worker has
        self._queues: dict[tuple[int, bool], asyncio.Queue[Any]] = {}
        self._pending: list[dict[str, asyncio.Future[Report]]] = [{} for _ in range(count)]
        self.removed: set[int] = set()  # workers ended (:meth:`remove`)
        self.start_s = 0.0  # how long :meth:`add` takes, as a worker's start would
        self.threads: dict[int, int | None] = {}  # what :meth:`add` was given, by worker
        self.lanes_given: dict[int, int | None] = {}

    def indices(self) -> list[int]:
        return [i for i in range(len(self.held)) if i not in self.removed]

    async def add(self, index: int, threads: int | None = None, lanes: int | None = None) -> None:
        if self.start_s:
            await asyncio.sleep(self.start_s)
        self.threads[index], self.lanes_given[index] = threads, lanes
        if index == len(self.held):
            self.held.append({})
            self.peak_bytes.append(0)
            self._pending.append({})
        elif index in self.removed:
            self.removed.discard(index)
            self.held[index], self.peak_bytes[index] = {}, 0
        else:
            raise ValueError(f"worker {index} is running")

    def remove(self, index: int) -> None:
        if index in self.removed or index >= len(self.held):
            raise ValueError(f"worker {index} is not running")
        self.removed.add(index)

    def run(self, worker: int, calls: list[Call]) -> Awaitable[list[Report]]:
        if worker in self.removed:
            raise RuntimeError(f"worker {worker} was removed")
        loop = asyncio.get_running_loop()
        pending = self._pending[worker]
        reports = []
        for call in calls:
            report: asyncio.Future[Report] = loop.create_future()
            infer = call.kind == "infer"
            after = pending.get(call.model) if infer else None
            self._queue(worker, infer).put_nowait((call, report, after))
            if call.kind == "load":
                pending[call.model] = report
                report.add_done_callback(
                    lambda f, m=call.model: pending.pop(m) if pending.get(m) is f else None
                )
            reports.append(report)
        return asyncio.gather(*reports)

    def _queue(self, worker: int, infer: bool) -> asyncio.Queue[Any]:
        queue = self._queues.get((worker, infer))
        if queue is None:
            queue = self._queues[worker, infer] = asyncio.Queue()
            asyncio.get_running_loop().create_task(self._serve(worker, queue))
        return queue

    async def _serve(self, worker: int, queue: asyncio.Queue[Any]) -> None:
        """One executor: its actions one at a time, an INFER after the LOAD sent before it."""
        while True:
            call, report, after = await queue.get()
            try:
                if after is not None and (await asyncio.shield(after)).status == "late":
                    result = Report("late")
                else:
                    result = await self._carry_out(worker, call)
            except Exception as exc:
                if not report.done():
                    report.set_exception(exc)
                continue
            if not report.done():
                report.set_result(result)

    async def _carry_out(self, worker: int, call: Call) -> Report:
        self.actions.append((worker, call.kind, call.model))
        if call.kind == "unload":
            self.held[worker].pop(call.model, None)
            return Report("ok", 0.0)
        if call.kind == "load":
            return await self._load(worker, call)
        return await self._infer(worker, call)

    def _model(self, worker: int, name: str) -> Any:
        if self._dedicated is not None or self._run is not None:
            return self._dedicated
        return self._models[name] if name in self.held[worker] else None

    async def _infer(self, worker: int, call: Call) -> Report:
        report = await self._run_infer(worker, call)
        if self._reply_s is None or report.status != "ok":
            return report
        ended = time.time() - self._reply_s
        return replace(report, started=ended - report.duration, ended=ended)

    async def _run_infer(self, worker: int, call: Call) -> Report:
        inputs = call.inputs
        assert inputs is not None
        target = self._model(worker, call.model)
        if target is None and self._run is None:
            return Report("not_loaded", error=f"{call.model!r} is not loaded")
        if time.time() > call.latest:
            return Report("late")
        self.log.append(len(inputs))
        if self._run is not None:
            outputs, seconds = await self._run(inputs)
            return Report("ok", seconds, outputs)
        start = time.perf_counter()
        delay = self.delay_s(len(inputs)) if callable(self.delay_s) else self.delay_s
        if delay:
            await asyncio.sleep(delay)
        return Report("ok", time.perf_counter() - start, target.predict_batch(inputs))

    async def _load(self, worker: int, call: Call) -> Report:
        name = call.model
        if time.time() > call.latest:
            return Report("late")
        if self._dedicated is None and name not in self._models:
            return Report("failed", error=f"no model {name!r}")
        held = self.held[worker]
        if self._capacity is not None and sum(held.values()) + self._weight > self._capacity:
            return Report("no_room", error=f"{name!r} does not fit")
        start = time.perf_counter()
        if self.load_s:
            await asyncio.sleep(self.load_s)
        held[name] = self._weight
        self.peak_bytes[worker] = max(self.peak_bytes[worker], sum(held.values()))
        report = Report("ok", time.perf_counter() - start, weight_bytes=self._weight)
        if self._reply_s is None:
            return report
        ended = time.time() - self._reply_s
        return replace(report, started=ended - report.duration, ended=ended)

    async def ready(self) -> list[dict[str, Any]]:
        return [{"models": dict(self.held[i])} for i in self.indices()]


def fake_workers(
    model: Any, delay_s: float = 0.0, log: list[int] | None = None, replicas: int = 1
) -> LocalWorkers:
    """A dedicated pool of ``replicas`` in-process workers over one model object, each INFER
    sleeping ``delay_s`` (asyncio); batch sizes are appended to ``log`` when one is given."""
    return LocalWorkers(replicas, dedicated=model, delay_s=delay_s, log=log)


def one_model_pool(
    policy: BatchingPolicy,
    workers: Workers,
    *,
    name: str = "echo",
    max_queue: int = 1000,
    depth: int = 1,
    clock: Callable[[], float] = time.monotonic,
) -> Pool:
    """A dedicated pool of ``workers`` serving one model ``name`` (a :func:`model_spec`) with
    ``policy``: what a model without ``pool:`` gets."""
    from raysrv.config import ModelSpec, resolve_pools

    overrides = {"replicas": len(workers), "max_queue": max_queue, "pipeline_depth": depth}
    model = ModelSpec.model_validate(model_spec(name, **overrides))
    pool = Pool(resolve_pools([], [model])[0], workers, clock)
    pool.add_model(model, policy)
    return pool


def model_spec(name: str, **overrides: Any) -> dict[str, Any]:
    """A ``python``-runtime :class:`EchoModel` spec of input shape [4], for tests (with
    ``pool``, without resources of its own)."""
    spec: dict[str, Any] = {
        "name": name,
        "runtime": "python",
        "source": "raysrv.testing:EchoModel",
        "resources": {"num_cpus": 0.1},
        "batching": {"policy": "fixed", "params": {"max_batch_size": 8}},
        "slo_ms": 10_000,  # generous: tests check behaviour, not a noisy machine's speed
        "input": {"shape": [4], "dtype": "float32"},
    }
    if overrides.get("pool") is not None:  # a pool's model runs on the pool's workers
        del spec["resources"]
    spec.update(overrides)
    return spec


def spec(
    models: Sequence[dict[str, Any]], apps: Sequence[dict[str, Any]], **extra: Any
) -> dict[str, Any]:
    """A raw raysrv spec from model and app dicts."""
    return {"models": list(models), "apps": list(apps), **extra}


def torch_linear(in_features: int = 4, out_features: int = 2) -> Any:
    """A torch ``nn.Linear`` with weights 0, 1, 2, ... and no bias (a torch-runtime factory)."""
    import torch

    layer = torch.nn.Linear(in_features, out_features, bias=False)
    with torch.no_grad():
        layer.weight.copy_(
            torch.arange(in_features * out_features, dtype=torch.float32).reshape(out_features, -1)
        )
    return layer


@contextlib.contextmanager
def serve_http(make_server: Callable[[], Any], max_body_bytes: int = 1 << 20) -> Iterator[str]:
    """raysrv's HTTP API over a real socket, without Ray: uvicorn in a thread of this process
    serving :func:`raysrv._http.create_http_app` of ``make_server()`` (a :class:`Server`,
    made on the server's own event loop, as its pools need); yields the base URL."""
    import socket
    import threading

    import uvicorn

    from raysrv._http import create_http_app

    class Lifespan:
        def __init__(self) -> None:
            self.app: Any = None

        async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] != "lifespan":
                await self.app(scope, receive, send)
                return
            while (await receive())["type"] == "lifespan.startup":
                server = make_server()
                self.app = create_http_app(server, max_body_bytes)
                await send({"type": "lifespan.startup.complete"})
            await server.close()
            await send({"type": "lifespan.shutdown.complete"})

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = uvicorn.Config(Lifespan(), host="127.0.0.1", port=port, log_level="warning")
    served = uvicorn.Server(config)
    thread = threading.Thread(target=served.run, name="raysrv-http", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30.0
    while not served.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the HTTP server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        served.should_exit = True
        thread.join(timeout=30.0)
