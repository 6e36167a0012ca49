"""Pool workers: Ray actors that LOAD, UNLOAD and INFER as told.

Each worker of a pool is a plain Ray actor (not a Serve deployment) that the ingress calls
directly: a direct actor call costs about 0.9 ms here against 3 to 6 ms for a Serve handle call
(``python -m bench.hops``, figures in bench/RESULTS.md), and the scheduler must pick the worker
itself, which a Serve handle's router does not allow. A pool with ``placement: colocated``
has its workers in the ingress's process instead (:class:`ColocatedWorkers`): the same
executors, order, windows and capacity, without the call. With ``placement: auto`` the
ingress times a batch of one of each dedicated model as it starts and colocates the pool where
every one runs within ``AUTO_COLOCATE_MS`` (:func:`choose_placement`).

A worker has two executors, each one thread that runs its actions one at a time in the order
the ingress sent them (Clockwork, OSDI'20, §4.4: "a dedicated executor for each action type"):
one for INFERs, one for LOADs and UNLOADs. A LOAD thus runs while the worker's INFERs of other
models go on, as Clockwork's PCIe copies run beside its kernels. A dedicated pool's process may
hold several workers, its lanes (:class:`Lanes`): an INFER executor each over one copy of the
model, one LOAD executor, and each lane's calls numbered apart. An INFER of a model whose LOAD
was sent before it waits, in its executor, for that LOAD to end, and is refused (``late``) if
the LOAD was. The ingress numbers its calls to each worker and a worker takes them in that
order, waiting at most ``ORDER_WAIT_S`` for an earlier one that Ray delivers late.

Every action carries a window ``[earliest, latest]`` in wall-clock seconds, which the machines
of a cluster share: the worker waits until ``earliest`` if the action arrives before it and
refuses it, without running it, if it would start after ``latest`` (§4.4: "actions that cannot
start within the prescribed window are cancelled and never executed").

Memory: a LOAD counts the model's weights (the source file's size, a torch module's parameters
and buffers, or for other python models what the process grew by while loading) and refuses,
without keeping it, a model that would take the worker past its capacity. It also reports what
the process actually grew by, to check the weights against: its resident memory, and on a GPU
what torch's allocator holds on the device (:func:`device_bytes`; an onnxruntime CUDA session
allocates outside it and is not seen there). A LOAD ends with one batch of one run on zeros,
so that a model's first INFER costs what later ones do.

A pool's workers form a group, owned by one ingress replica at a time. They are detached actors
named after the Serve application, the pool, a hash of its spec, the group's number and their
own, so they outlive the replica that made them: an ingress replica, as it starts, takes over
the first group of its pool's spec whose owner is gone (:meth:`RayWorkers.start`), with its
dedicated models loaded, before it makes a new one. A worker asks Ray every
``ORPHAN_CHECK_S`` whether its owner's actor is alive, and exits once it has been without an
owner for the ingress's ``orphan_timeout_s``; a replica that stops in order ends its workers
at once (:meth:`RayWorkers.close`). A crashed worker fails the action it was running and is
restarted by Ray with its dedicated model loaded again and nothing else; an INFER for a model
it no longer holds answers ``not_loaded``. A worker of a partitioned model leads its shard
actors from bundle 0 of a placement group made with it and removed with it
(:mod:`raysrv._partitioned`).

The executors run at the worker's priority, or as many steps of niceness lower as the pool's
``resources.niceness`` (INFERs) and ``resources.load_niceness`` (LOADs, UNLOADs) say.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import json
import logging
import math
import os
import queue
import resource
import statistics
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache, partial
from typing import Any

import numpy as np

from raysrv._heap import settle
from raysrv._model_spec import Placement
from raysrv.config import ModelSpec, ResolvedPool
from raysrv.metrics import LATENCY_BOUNDARIES_MS
from raysrv.runtimes import Runtime, load_runtime

logger = logging.getLogger(__name__)

__all__ = [
    "Call",
    "ColocatedWorkers",
    "Lanes",
    "LoadFailed",
    "Owner",
    "PoolWorker",
    "RayWorkers",
    "Report",
    "Shape",
    "Workers",
    "device_bytes",
    "rss_bytes",
    "wall",
]

MAX_EARLY_WAIT_S = 1.0  # an action that arrives before its window waits at most this long
ORDER_WAIT_S = 0.05  # how long a call waits for the ingress's earlier call to the worker
MAX_CALLS = 256  # calls a worker accepts at once
ORPHAN_CHECK_S = 1.0  # how often a worker asks whether its owner is alive
MAX_GROUPS = 256  # groups of one pool's spec looked through for one to take over
WORKERS_NAMESPACE = "raysrv"  # the Ray namespace of every pool's worker actors
READY_TIMEOUT_S = 120.0  # for a worker to answer whether it runs in a placement group

Owner = tuple[str, str]  # an ingress replica's actor name and Ray namespace


@dataclass(frozen=True, slots=True)
class Report:
    """A worker's answer to one action. ``status``: ``ok``; ``late`` (not started: outside its
    window); ``not_loaded`` (an INFER for a model the worker does not hold); ``no_room`` (a LOAD
    that would exceed the capacity); ``failed`` (it ran and raised: ``error`` says why)."""

    status: str
    duration: float = 0.0
    outputs: list[Any] | None = None
    weight_bytes: int | None = None
    rss_growth: int | None = None
    device_growth: int | None = None  # on a GPU worker, what the device's memory grew by
    error: str = ""
    started: float = math.nan  # wall-clock seconds the action started and ended (Clockwork
    ended: float = math.nan  # §5.2's results carry "start and end times"); NaN if not run


@dataclass(frozen=True, slots=True)
class Call:
    """One action as a worker receives it: ``kind`` is ``infer`` (of ``inputs``), ``load`` (of
    the model ``spec``) or ``unload``; the window is in wall-clock seconds."""

    kind: str
    model: str
    earliest: float = 0.0
    latest: float = math.inf
    inputs: np.ndarray | list[Any] | None = None
    spec: dict[str, Any] | None = None


def rss_bytes() -> int:
    """The process's resident memory now (Linux), or its peak where that cannot be read."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return peak_rss_bytes()


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def device_bytes() -> int | None:
    """Bytes of GPU memory torch's allocator holds for this process's tensors, or None where
    torch has not started CUDA here (a CPU worker)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    return int(torch.cuda.memory_allocated())


def _growth(before: int | None, after: int | None) -> int | None:
    return None if after is None else after - (before or 0)


class LoadFailed(RuntimeError):
    """A worker's dedicated model could not be loaded (the message says which and why)."""


@dataclass(slots=True)
class _Loaded:
    runtime: Runtime
    weight_bytes: int
    rss_growth: int
    device_growth: int | None


def _weights(spec: ModelSpec, runtime: Runtime | None, grown: int) -> int:
    declared = spec.weight_bytes()
    if declared is not None:
        return declared
    counted = getattr(runtime, "weight_bytes", None)
    if callable(counted):
        return int(counted())
    return max(0, grown)


class PoolWorker:
    """One worker of a pool (see the module docstring); also usable in-process in tests."""

    def __init__(
        self,
        capacity_bytes: int | None,
        pinned: list[dict[str, Any]],
        niceness: tuple[int, int] = (0, 0),
        plans: dict[str, Any] | None = None,
        lanes: int = 1,
    ) -> None:
        """``niceness``: how much lower the INFER and the LOAD executors' priorities are
        (:func:`lower_priority`); ``plans``: the plan of each partitioned model, by name (one
        not given is planned as it loads); ``lanes``: INFER executors, each one of the pool's
        workers (see the module docstring)."""
        self._capacity = capacity_bytes
        self._plans = plans or {}
        self._models: dict[str, _Loaded] = {}
        self._peak = 0
        self._execution: Any = None
        infers, loads = (partial(lower_priority, steps) for steps in niceness)
        self._infers = [_Lane(f"infer{lane}", infers) for lane in range(lanes)]
        self._loads = ThreadPoolExecutor(1, "load", initializer=loads)
        self._pending: dict[str, Future[Report]] = {}  # model -> its last LOAD sent
        self._next: dict[int, int] = {}  # lane -> the number of the call expected next
        self._unloadable: str | None = None  # why a dedicated model could not be loaded
        for spec in pinned:
            try:
                report = self._load(ModelSpec.model_validate(spec))
                error = None if report.status == "ok" else report.error
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
            if error is not None:
                self._unloadable = f"model {spec['name']!r} cannot be loaded: {error}"
                break
        settle()  # the loaded models out of the collector's full passes

    def start_metrics(self) -> None:
        """Report run times as ``ray_raysrv_execution_ms`` (inside Ray only)."""
        self._execution = _execution_histogram()

    def stop(self) -> None:
        """End the executors' threads once their actions are done, and drop the models."""
        for executor in self._infers:
            executor.shutdown(wait=False)
        self._loads.shutdown(wait=False)
        self._models.clear()

    async def run(self, calls: list[Call], seq: int | None = None, lane: int = 0) -> list[Report]:
        """Carry out ``calls`` (the actions the scheduler sent this worker's ``lane`` in one
        step: one hop, not one per action), each on its executor in the order given; ``seq``
        numbers the ingress's calls to the lane. Returns when all are done."""
        await self._turn(seq, lane)
        reports = self.submit(calls, lane)
        if seq is not None:
            self._next[lane] = max(seq + 1, self._next.get(lane, 0))
        return await reports

    def submit(self, calls: list[Call], lane: int = 0) -> asyncio.Future[list[Report]]:
        """Hand ``calls`` to their executors now, in the order given (on the running loop),
        INFERs to ``lane``'s; the returned future holds their reports, in order."""
        if len(calls) == 1 and calls[0].kind == "infer":  # most calls: one batch, no gather
            after = self._pending.get(calls[0].model)
            return self._infers[lane].submit(self._infer_alone, after, calls[0])
        done: list[Awaitable[Report]] = []
        for call in calls:
            if call.kind == "infer":
                after = self._pending.get(call.model)
                done.append(self._infers[lane].submit(self._infer_after, after, call))
                continue
            future = self._loads.submit(self._carry_out, call)
            if call.kind == "load":
                self._pending[call.model] = future
                future.add_done_callback(partial(self._loaded, call.model))
            done.append(asyncio.wrap_future(future))
        return asyncio.gather(*done)

    async def _turn(self, seq: int | None, lane: int) -> None:
        """Wait, at most ``ORDER_WAIT_S``, until the lane's calls numbered before ``seq`` are
        in."""
        if seq is None or lane not in self._next:
            return
        loop = asyncio.get_running_loop()
        give_up = loop.time() + ORDER_WAIT_S
        while seq > self._next[lane] and loop.time() < give_up:
            await asyncio.sleep(0.001)

    def _loaded(self, name: str, future: Future[Report]) -> None:
        if self._pending.get(name) is future:
            del self._pending[name]

    def _infer_alone(self, load: Future[Report] | None, call: Call) -> list[Report]:
        return [self._infer_after(load, call)]

    def _infer_after(self, load: Future[Report] | None, call: Call) -> Report:
        """On the INFER executor: wait for the model's LOAD if one was sent before, then run."""
        if load is not None and load.result().status == "late":
            return Report("late")
        return self._carry_out(call)

    def _carry_out(self, call: Call) -> Report:
        if call.kind == "infer":
            assert call.inputs is not None
            return self.infer(call.model, call.inputs, call.earliest, call.latest)
        if call.kind == "load":
            assert call.spec is not None
            return self.load(call.spec, call.earliest, call.latest)
        return self.unload(call.model)

    def ready(self) -> dict[str, Any]:
        """What the worker holds: its process, its models' weights and its memory; raises
        :class:`LoadFailed` if a dedicated model could not be loaded. The worker itself stays
        up, so that Ray does not start it again and again on a model that cannot load."""
        if self._unloadable is not None:
            raise LoadFailed(self._unloadable)
        models = list(self._models.items())  # a LOAD may be adding to them meanwhile
        return {
            "pid": os.getpid(),
            "models": {name: m.weight_bytes for name, m in models},
            "rss_growth": {name: m.rss_growth for name, m in models},
            "device_growth": {name: m.device_growth for name, m in models},
            "resident_bytes": self.resident,
            "peak_bytes": self._peak,
            "rss_bytes": rss_bytes(),
            "peak_rss_bytes": peak_rss_bytes(),
            "device_bytes": device_bytes(),
        }

    @property
    def resident(self) -> int:
        return sum(m.weight_bytes for m in list(self._models.values()))  # LOADs run beside

    def load(self, spec: dict[str, Any], earliest: float, latest: float) -> Report:
        """LOAD: bring a model into memory (and run it once, with its ``warm_up``), within the
        window."""
        if not _in_window(earliest, latest):
            return Report("late")
        model = ModelSpec.model_validate(spec)
        try:
            return self._load(model)
        except Exception as exc:  # a model that cannot load must not take the worker down
            return Report("failed", error=f"{type(exc).__name__}: {exc}")

    def _load(self, model: ModelSpec) -> Report:
        if model.name in self._models:
            held = self._models[model.name]
            return Report(
                "ok",
                weight_bytes=held.weight_bytes,
                rss_growth=held.rss_growth,
                device_growth=held.device_growth,
            )
        declared = model.weight_bytes()
        if declared is not None and not self._fits(declared):
            return self._no_room(model, declared)
        before, on_device = rss_bytes(), device_bytes()
        started, start = time.time(), time.perf_counter()
        runtime = load_runtime(model, self._plans.get(model.name))
        weight = _weights(model, runtime, rss_bytes() - before)
        if not self._fits(weight):
            del runtime
            return self._no_room(model, weight)
        if model.warm_up:
            runtime.predict_batch(model.input.batch(1))
        duration = time.perf_counter() - start
        grown, grown_there = rss_bytes() - before, _growth(on_device, device_bytes())
        self._models[model.name] = _Loaded(runtime, weight, grown, grown_there)
        self._peak = max(self._peak, self.resident)
        return Report(
            "ok",
            duration,
            weight_bytes=weight,
            rss_growth=grown,
            device_growth=grown_there,
            started=started,
            ended=started + duration,
        )

    def _fits(self, weight: int) -> bool:
        return self._capacity is None or self.resident + weight <= self._capacity

    def _no_room(self, model: ModelSpec, weight: int) -> Report:
        message = (
            f"{model.name!r} needs {weight} bytes; the worker holds {self.resident} of "
            f"{self._capacity}"
        )
        return Report("no_room", weight_bytes=weight, error=message)

    def unload(self, name: str) -> Report:
        """UNLOAD: drop a model (nothing to do if it is not held)."""
        start = time.perf_counter()
        held = self._models.pop(name, None)
        if held is not None:
            held.runtime.close()
        return Report("ok", time.perf_counter() - start)

    def infer(
        self, name: str, inputs: np.ndarray | list[Any], earliest: float, latest: float
    ) -> Report:
        """INFER: one stacked batch of a held model, within the window; outputs and run time."""
        loaded = self._models.get(name)
        if loaded is None:
            return Report("not_loaded", error=f"model {name!r} is not loaded on this worker")
        if not _in_window(earliest, latest):
            return Report("late")
        started, start = time.time(), time.perf_counter()
        outputs = loaded.runtime.predict_batch(inputs)
        duration = time.perf_counter() - start
        if self._execution is not None:
            self._execution.observe(duration * 1000.0, tags={"model": name})
        return Report("ok", duration, outputs, started=started, ended=started + duration)


@cache
def _execution_histogram() -> Any:
    """The process's one histogram of run times, which every worker in it reports to."""
    from ray.util import metrics

    return metrics.Histogram(
        "raysrv_execution_ms", "Worker run time of a batch.", LATENCY_BOUNDARIES_MS, ("model",)
    )


class _Lane:
    """An INFER executor: one thread that runs the calls handed to it, in order, and settles
    each call's future on the loop that handed it over. A one-thread ``ThreadPoolExecutor``
    behind ``run_in_executor`` does the same with a second future, its locks and a callback
    chaining it to the loop's; without them a request costs 4-6% less CPU in the ingress
    (bench/RESULTS.md, "The fast path")."""

    def __init__(self, name: str, initializer: Callable[[], None]) -> None:
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(
            target=self._serve, args=(initializer,), name=name, daemon=True
        )
        self._thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """Run ``fn(*args)`` after the calls handed over before it; the future, on the
        running loop, holds what it returned or raised."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._calls.put((loop, future, fn, args))
        return future

    def shutdown(self, wait: bool = False) -> None:
        """End the thread once the calls handed over before this are done."""
        self._calls.put(None)
        if wait:
            self._thread.join()

    def _serve(self, initializer: Callable[[], None]) -> None:
        initializer()
        while (item := self._calls.get()) is not None:
            loop, future, fn, args = item
            try:
                outcome, failed = fn(*args), False
            except BaseException as exc:  # the caller's to see, as an executor passes it on
                outcome, failed = exc, True
            with contextlib.suppress(RuntimeError):  # the loop closed: no one is waiting
                loop.call_soon_threadsafe(_settle, future, outcome, failed)
            del item, loop, future, fn, args, outcome


def _settle(future: asyncio.Future[Any], outcome: Any, failed: bool) -> None:
    if future.done():  # its caller left
        return
    if failed:
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


def lower_priority(steps: int) -> None:
    """Raise the calling thread's niceness by ``steps``, to 19 at most (Linux: niceness is a
    thread's own; threads it starts inherit it). On a busy CPU an executor's actions then get
    a smaller share than the ingress's scheduling and replies and the worker's own hops. Off
    by default: on the benchmark's 2 cores the hops sped up and the batches overran more
    (docs/pools.md, "Choices to know"). Where a thread's priority cannot be set this does
    nothing."""
    if steps <= 0:
        return
    try:
        thread = threading.get_native_id()
        now = os.getpriority(os.PRIO_PROCESS, thread)
        os.setpriority(os.PRIO_PROCESS, thread, min(19, now + steps))
    except (AttributeError, OSError):
        pass


def _in_window(earliest: float, latest: float) -> bool:
    now = time.time()
    if now > latest:
        return False
    if now < earliest:
        time.sleep(min(earliest - now, MAX_EARLY_WAIT_S))
    return True


# ``placement: auto`` colocates a pool whose dedicated models run a batch of one within this:
# about the CPU one call to a worker actor and back costs at its two ends (a direct actor
# call 0.9 ms, bench.hops; one connection's p50 2.76 ms on a worker actor against 1.12 ms
# colocated, bench.fast_path's fp5), so that the call would at least double such a batch.
AUTO_COLOCATE_MS = 2.0
AUTO_RUNS = 7  # timed runs of a batch of one per model, after one untimed


def median_run_s(pool: ResolvedPool, model: ModelSpec, size: int, runs: int) -> float:
    """The median seconds of ``runs`` batches of ``size`` of ``model``, loaded as ``pool``'s
    workers load it and run in this process, after one untimed batch."""
    runtime = load_runtime(pool.worker_model(model))
    batch = model.input.batch(size)
    runtime.predict_batch(batch)
    return statistics.median(_at_once([runtime], batch, runs))


def concurrent_rates(
    pool: ResolvedPool,
    model: ModelSpec,
    threads: int,
    most: int,
    queries: int,
    size: int = 1,
    lanes: int = 1,
    seconds: float = 0.0,
) -> tuple[float, ...]:
    """SERF's profile of one thread count (serf §IV-B): mu_1 .. mu_most, the per-query service
    rate (per second) with i queries running at once, ``lanes`` to a runtime with ``threads``
    intra-op threads, as i workers of ``pool`` would load ``model`` in processes of ``lanes``
    lanes. Each of the i runs a batch of one untimed, then ``queries`` timed; mu_i is one over
    their mean. The queries run on threads of this process, which the runtimes' own threads
    leave free as they run (ONNX Runtime, torch, a sleeping python model), so i of them
    contend for the cores and caches as i workers on one host do. ``size``: the batch one
    query stands for. ``seconds``: each of the i runs more than ``queries`` where that many
    would take less, by the median of three runs alone (short runs are noisy:
    bench/RESULTS_ARCHIVE.md, "Elastic capacity: the detail as summarized on fl7's day")."""
    spec = with_threads(pool.worker_model(model), threads)
    runtimes = [load_runtime(spec) for _ in range(-(-most // lanes))]
    batch = model.input.batch(size)
    for runtime in runtimes:
        runtime.predict_batch(batch)
    alone = statistics.median(_at_once(runtimes[:1], batch, 3))
    queries = max(queries, math.ceil(seconds / alone) if alone > 0 else queries)
    rates = [
        1.0 / statistics.fmean(_at_once([runtimes[k // lanes] for k in range(i)], batch, queries))
        for i in range(1, most + 1)
    ]
    for runtime in runtimes:
        runtime.close()
    return tuple(rates)


def _at_once(runtimes: list[Runtime], batch: Any, queries: int) -> list[float]:
    """The seconds of each of ``queries`` batches run back to back on each of ``runtimes``
    (one may be listed more than once), all of them at once (each on a thread of its own,
    started together)."""
    times: list[float] = []
    start = threading.Barrier(len(runtimes))

    def serve(runtime: Runtime) -> None:
        start.wait()
        for _ in range(queries):
            began = time.perf_counter()
            runtime.predict_batch(batch)
            times.append(time.perf_counter() - began)

    threads = [threading.Thread(target=serve, args=(r,), daemon=True) for r in runtimes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return times


def with_threads(model: ModelSpec, threads: int | None) -> ModelSpec:
    """``model`` with ``threads`` intra-op threads (as it is when None)."""
    if threads is None or threads == model.resources.threads:
        return model
    resources = model.resources.model_copy(update={"threads": threads})
    return model.model_copy(update={"resources": resources})


def choose_placement(pool: ResolvedPool) -> tuple[Placement, dict[str, float]]:
    """Where an ``auto`` pool's workers run, and the median ms of a batch of one of each of
    its dedicated models timed here (none where the pool's kind decides): colocated if every
    one is within ``AUTO_COLOCATE_MS``; workers for a GPU pool, a shared pool (what it will
    load is not known yet) and python-runtime models, which hold the interpreter while they
    run."""
    models = pool.pinned
    if pool.device != "cpu" or not models or any(m.runtime == "python" for m in models):
        return "workers", {}
    medians = {m.name: median_run_s(pool, m, 1, AUTO_RUNS) * 1000.0 for m in models}
    cheap = max(medians.values()) <= AUTO_COLOCATE_MS
    return "colocated" if cheap else "workers", medians


Shape = tuple[int, int]  # a worker process's intra-op threads and lanes


class Lanes:
    """Which process, and which of its lanes, each of a pool's workers is. A process of
    ``lanes`` lanes runs that many workers (each the scheduler's, running one batch at a time)
    on one copy of the weights. A new worker takes the free lane of the lowest-numbered process
    of its shape, if one has a free lane, or opens a process numbered as the worker; a process
    ends with its last worker."""

    def __init__(self, workers: int, shape: Shape) -> None:
        """``workers`` numbered from 0, packed into processes of ``shape`` (the pool's, the
        default of a new one) in order."""
        self.default = shape
        lanes = shape[1]
        self.of = {w: (w // lanes, w % lanes) for w in range(workers)}
        self.shapes = dict.fromkeys(range(-(-workers // lanes)), shape)

    def processes(self) -> list[int]:
        return sorted(self.shapes)

    def place(self, worker: int, shape: Shape) -> tuple[int, int, bool]:
        """Worker ``worker``'s process, lane, and whether the process is new."""
        taken = collections.defaultdict(set)
        for process, lane in self.of.values():
            taken[process].add(lane)
        for process in self.processes():
            free = set(range(shape[1])) - taken[process]
            if self.shapes[process] == shape and free:
                self.of[worker] = (process, min(free))
                return process, min(free), False
        self.of[worker], self.shapes[worker] = (worker, 0), shape
        return worker, 0, True

    def free(self, worker: int) -> int | None:
        """Forget ``worker``; its process if no other worker runs in it (forgotten too)."""
        process, _ = self.of.pop(worker)
        if any(p == process for p, _ in self.of.values()):
            return None
        del self.shapes[process]
        return process


class Workers:
    """The workers of one pool as the scheduler's driver calls them: :meth:`run` submits a
    worker's calls at once (so they reach it in the order they were made) and returns an
    awaitable of their reports (:class:`Report`), in order. ``placement``: where they run
    (None: as the pool's spec says); ``auto``: what ``placement: auto`` measured, if it chose;
    ``start_s``: how long the first workers took to start, their models loaded (0: unknown),
    the cold start a pool plans for until its autoscaler has started one. A worker is a lane
    of a process (:class:`Lanes`); with the pool's ``lanes`` at 1, a process of its own."""

    placement: Placement | None = None
    auto: dict[str, Any] | None = None
    start_s: float = 0.0

    def __len__(self) -> int:
        return len(self.indices())

    def indices(self) -> list[int]:
        """The workers' numbers, ascending (not those whose process is starting)."""
        of = self.lanes.of
        return sorted(w for w, (process, _) in of.items() if process not in self._opening)

    def run(self, worker: int, calls: list[Call]) -> Awaitable[list[Report]]:
        raise NotImplementedError

    async def ready(self) -> list[dict[str, Any]]:
        """Each worker's :meth:`PoolWorker.ready` in the order of :meth:`indices`, once its
        dedicated models are loaded."""
        raise NotImplementedError

    lanes: Lanes
    _opening: dict[int, asyncio.Future[None]]  # process -> its start, while it starts

    async def add(self, index: int, threads: int | None = None, lanes: int | None = None) -> None:
        """Start worker ``index``, a number not running; returns once its dedicated models are
        loaded (raises :class:`LoadFailed` if one cannot be, the worker ended). ``threads``:
        its models' intra-op threads, and ``lanes``: its process's, if not the pool's. A free
        lane of a process of that shape is taken as soon as that process has started."""
        default = self.lanes.default
        shape = (threads or default[0], lanes or default[1])
        process, _, new = self.lanes.place(index, shape)
        if new:
            self._opening[process] = asyncio.ensure_future(self._open(process, shape))
        opening = self._opening.get(process)
        if opening is None:
            return
        try:
            await asyncio.shield(opening)
        except Exception:  # kept until its last worker goes, so that none is placed in it
            if self.lanes.free(index) is not None:
                del self._opening[process]
            raise
        self._opening.pop(process, None)

    async def _open(self, process: int, shape: Shape) -> None:
        """Start process ``process`` of ``shape``, kept once its models are loaded; a process
        that fails is ended before this raises."""
        raise NotImplementedError

    def remove(self, index: int) -> None:
        """End worker ``index`` (drained: nothing of it in flight), and its process with its
        last worker."""
        process = self.lanes.free(index)
        if process is not None:
            self._close(process)

    def _close(self, process: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """End the workers (their owner stops); nothing to do for threads of this process."""


def _worker_args(
    pool: ResolvedPool, threads: int | None = None
) -> tuple[list[dict[str, Any]], tuple[int, int]]:
    """What each worker of ``pool`` is made with, wherever it runs: its dedicated models (as
    a worker reads them, with ``threads`` intra-op threads if given) and the niceness of its
    batches and of its LOADs."""
    pinned = [
        with_threads(pool.worker_model(m), threads).model_dump(mode="json") for m in pool.pinned
    ]
    return pinned, (pool.resources.niceness, pool.resources.load_niceness)


def _actor_options(pool: ResolvedPool, name: str) -> dict[str, Any]:
    options: dict[str, Any] = {
        "name": name,
        "namespace": WORKERS_NAMESPACE,
        "get_if_exists": True,
        "num_cpus": pool.resources.num_cpus,
        "num_gpus": pool.resources.num_gpus,
        "lifetime": "detached",
        "max_restarts": -1,
        "max_concurrency": MAX_CALLS,
    }
    if pool.resources.memory_mb is not None:
        options["memory"] = pool.resources.memory_mb * 1024 * 1024
    if pool.resources.custom:
        options["resources"] = dict(pool.resources.custom)
    return options


class ColocatedWorkers(Workers):
    """A pool's workers inside the process that schedules them (``placement: colocated``).

    Each is a :class:`PoolWorker` whose executors are threads of this process: an action is
    handed to its executor without leaving the process, so a batch costs no call to another
    process and its inputs and outputs are not serialized. The runs stay off the event loop
    and keep a worker's order and windows. What it gives up: a model that crashes the process
    takes the ingress with it, and the pool's runs share the ingress's interpreter, which only
    runtimes that release it while they run (ONNX Runtime, torch) leave free; docs/pools.md,
    "Where workers run", says when it pays."""

    placement = "colocated"

    def __init__(self, pool: ResolvedPool, metrics: bool = True) -> None:
        self._pool = pool
        self._metrics = metrics
        self.lanes = Lanes(pool.workers, pool.shape)
        self._opening = {}
        self.processes = {p: self._make(pool.shape) for p in self.lanes.processes()}

    def _make(self, shape: Shape) -> PoolWorker:
        pinned, niceness = _worker_args(self._pool, shape[0])
        worker = PoolWorker(self._pool.capacity_bytes, pinned, niceness, lanes=shape[1])
        if self._metrics:
            worker.start_metrics()
        return worker

    def run(self, worker: int, calls: list[Call]) -> Awaitable[list[Report]]:
        process, lane = self.lanes.of[worker]
        return self.processes[process].submit(calls, lane)

    async def ready(self) -> list[dict[str, Any]]:
        return [self.processes[self.lanes.of[i][0]].ready() for i in self.indices()]

    async def _open(self, process: int, shape: Shape) -> None:
        worker = await asyncio.to_thread(self._make, shape)  # models load off the loop
        try:
            worker.ready()
        except LoadFailed:
            worker.stop()
            raise
        self.processes[process] = worker

    def _close(self, process: int) -> None:
        self.processes.pop(process).stop()


def alive(owner: Owner) -> bool:
    """Whether Ray knows a live actor of ``owner``'s name (a dead one's name is free again).
    Read from the list of named actors, not with a handle: a process's first handle to an
    actor imports the module of its class, for an ingress replica Serve's, some 0.35 s of CPU
    that a starting worker would take from the ingress and the workers beside it."""
    import ray

    named = ray.util.list_named_actors(all_namespaces=True)
    return {"name": owner[0], "namespace": owner[1]} in named


class _RayWorker(PoolWorker):
    def __init__(
        self,
        capacity_bytes: int | None,
        pinned: list[dict[str, Any]],
        niceness: tuple[int, int],
        orphan_timeout_s: float,
        plans: dict[str, Any] | None = None,
        lanes: int = 1,
    ) -> None:
        super().__init__(capacity_bytes, pinned, niceness, plans, lanes)
        self.start_metrics()
        self._dedicated = frozenset(spec["name"] for spec in pinned)
        self._owner: Owner | None = None
        self._claims = asyncio.Lock()
        watch = partial(self._watch_owner, orphan_timeout_s)
        threading.Thread(target=watch, name="owner", daemon=True).start()

    async def claim(self, owner: Owner) -> bool:
        """Take the worker for ``owner`` unless another owner that is alive holds it. A worker
        taken over keeps only its dedicated models (after the LOADs already sent) and numbers
        calls afresh."""
        owner = tuple(owner)  # type: ignore[assignment]  # a list, once it crossed Ray
        async with self._claims:
            held = self._owner
            if held == owner:
                return True
            if held is not None and await asyncio.to_thread(alive, held):
                return False
            await asyncio.wrap_future(self._loads.submit(self._keep_dedicated))
            self._owner, self._next = owner, {}
            return True

    async def release(self, owner: Owner) -> None:
        """Give the worker up if ``owner`` holds it (a group it could not take whole)."""
        async with self._claims:
            if self._owner == tuple(owner):
                self._owner = None

    def placement_group(self) -> Any:
        """The placement group it runs in, if any (a partitioned model's leader's)."""
        from ray.util.placement_group import get_current_placement_group

        return get_current_placement_group()

    def _keep_dedicated(self) -> None:
        for name in list(self._models):
            if name not in self._dedicated:
                del self._models[name]

    def _watch_owner(self, timeout_s: float) -> None:
        """On its own thread: end this actor, for good, once it has had no live owner for
        ``timeout_s``."""
        import ray

        seen = time.monotonic()  # made by its owner, which claims it next
        while True:
            time.sleep(ORPHAN_CHECK_S)
            owner = self._owner
            if owner is not None and alive(owner):
                seen = time.monotonic()
            elif time.monotonic() - seen >= timeout_s:
                group = self.placement_group()
                if self._plans and group is not None:  # its own (RayWorkers.start)
                    from ray.util.placement_group import remove_placement_group

                    remove_placement_group(group)
                ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
                return


class _Leaders:
    """The placement groups of a partitioned pool's new workers as :meth:`RayWorkers.start`
    makes them: the model planned once, on Ray, when the first is needed; a group per worker
    that does not exist yet; and, at the end, each group made that no worker runs in removed
    (an ingress replica that lost a race to make the same worker)."""

    def __init__(self, pool: ResolvedPool) -> None:
        partitioned = [pool.worker_model(m) for m in pool.pinned if m.partition is not None]
        self._model = partitioned[0] if partitioned else None
        self._plan: Any = None
        self._made: dict[str, Any] = {}

    async def place(self, name: str, options: dict[str, Any]) -> dict[str, Any] | None:
        """The plans a worker named ``name`` is made with, its placement set in ``options``
        if it is a new partitioned one; None for any other."""
        if self._model is None or await asyncio.to_thread(alive, (name, WORKERS_NAMESPACE)):
            return None
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from raysrv._partitioned import group_bundles, plan_on_ray

        if self._plan is None:
            task = ray.remote(plan_on_ray).options(num_cpus=self._model.resources.num_cpus)
            self._plan = await task.remote(self._model)
        bundles = group_bundles(self._model, self._plan)
        made = placement_group(bundles, strategy="PACK", lifetime="detached")
        self._made[name] = made
        options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(made, 0)
        return {self._model.name: self._plan}

    async def groups(self, actors: list[Any]) -> list[Any]:
        """The placement group each of ``actors`` runs in (none: not partitioned)."""
        if self._model is None:
            return []
        return list(await asyncio.gather(*(a.placement_group.remote() for a in actors)))

    def drop_unused(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        for name, made in self._made.items():
            try:
                worker = ray.get_actor(name, namespace=WORKERS_NAMESPACE)
                used = ray.get(worker.placement_group.remote(), timeout=READY_TIMEOUT_S)
            except ValueError:  # no such worker
                used = None
            except Exception as exc:  # a worker still starting: its group is kept
                logger.warning("worker %s: its placement group kept (%s)", name, exc)
                continue
            if used is None or used.id != made.id:
                remove_placement_group(made)


class RayWorkers(Workers):
    """A pool's workers as Ray actors (see the module docstring); made by :meth:`start`.
    ``groups``: the placement groups of a partitioned model's leaders, removed with them.
    An actor is a process of :class:`Lanes`."""

    placement = "workers"

    def __init__(
        self,
        actors: list[Any],
        owner: Owner,
        renew_s: float,
        groups: Sequence[Any] = (),
        make: Callable[[int, Shape], Awaitable[Any]] | None = None,
        lanes: Lanes | None = None,
    ) -> None:
        """``make``: a new actor of the group by its number and shape (:meth:`add`);
        ``lanes``: the workers each of ``actors`` runs (unset: one each)."""
        self.actors = dict(enumerate(actors))
        self.lanes = lanes or Lanes(len(actors), (1, 1))
        self._opening = {}
        self.groups = [g for g in groups if g is not None]
        self._calls = collections.Counter[int]()
        self._owner = owner
        self._make = make
        self._renewal = asyncio.create_task(self._renew(owner, renew_s))

    @classmethod
    async def start(
        cls, pool: ResolvedPool, app: str, owner: Owner, orphan_timeout_s: float
    ) -> RayWorkers:
        """The pool's workers for ``owner`` (an ingress replica): the first group of the pool's
        spec in ``app`` that has no live owner, else a new group. A new worker of a
        partitioned model starts in bundle 0 of a placement group of its own, made for the
        plan it is given (:mod:`raysrv._partitioned`)."""
        import ray

        pinned, niceness = _worker_args(pool)
        shape = {"pool": pool.name, "workers": pool.workers, "device": pool.device}
        shape |= {"lanes": pool.lanes}
        shape |= {"resources": pool.resources.model_dump(), "capacity": pool.capacity_bytes}
        key = json.dumps({**shape, "pinned": pinned}, sort_keys=True).encode()
        digest = hashlib.sha256(key).hexdigest()[:12]
        remote = ray.remote(_RayWorker)
        if not await asyncio.to_thread(alive, owner):
            raise RuntimeError(f"the owner {owner} of pool {pool.name!r} is not a live actor")
        leaders = _Leaders(pool)

        async def actor(group: int, i: int, shape: Shape = pool.shape) -> Any:
            name = f"raysrv:{app}:{pool.name}:{digest}:{group}:{i}"
            options = _actor_options(pool, name)
            plans = await leaders.place(name, options)
            models = _worker_args(pool, shape[0])[0]
            args = (pool.capacity_bytes, models, niceness, orphan_timeout_s)
            return remote.options(**options).remote(*args, plans, shape[1])

        lanes = Lanes(pool.workers, pool.shape)
        try:
            for group in range(MAX_GROUPS):
                leader = await actor(group, 0)  # the group's: whoever holds it holds the others
                if not await leader.claim.remote(owner):
                    continue
                actors = [leader] + [await actor(group, i) for i in lanes.processes()[1:]]
                taken = await asyncio.gather(*(a.claim.remote(owner) for a in actors[1:]))
                if all(taken):
                    groups = await leaders.groups(actors)
                    renew_s = min(orphan_timeout_s / 4.0, 5.0)
                    make = partial(actor, group)
                    return cls(actors, owner, renew_s, groups, make, lanes)
                await asyncio.gather(*(a.release.remote(owner) for a in actors))  # another's
        finally:
            await asyncio.to_thread(leaders.drop_unused)
        raise RuntimeError(f"pool {pool.name!r}: all {MAX_GROUPS} groups of workers are held")

    async def _renew(self, owner: Owner, every_s: float) -> None:
        """Claim the workers again every ``every_s``: one that Ray restarted after a crash has
        forgotten its owner and would end itself after ``orphan_timeout_s``."""
        while True:
            await asyncio.sleep(every_s)
            actors = dict(self.actors)  # workers may come and go meanwhile
            try:
                held = await asyncio.gather(*(a.claim.remote(owner) for a in actors.values()))
            except Exception as exc:  # a worker restarting: the next round claims it
                logger.warning("claiming workers again: %s", exc)
                continue
            if not all(held):
                lost = [i for i, ok in zip(actors, held, strict=True) if not ok]
                logger.error("workers %s of this replica are held by another ingress", lost)

    def close(self) -> None:
        """End the workers now (the owner stops in order), then their placement groups."""
        import ray
        from ray.util.placement_group import remove_placement_group

        self._renewal.cancel()
        for actor in self.actors.values():
            ray.kill(actor, no_restart=True)
        for group in self.groups:
            remove_placement_group(group)

    def run(self, worker: int, calls: list[Call]) -> Awaitable[list[Report]]:
        self._calls[worker] += 1
        process, lane = self.lanes.of[worker]
        return self.actors[process].run.remote(calls, self._calls[worker], lane)

    async def ready(self) -> list[dict[str, Any]]:
        workers = self.indices()
        processes = sorted({self.lanes.of[i][0] for i in workers})
        held = await asyncio.gather(*(self.actors[p].ready.remote() for p in processes))
        of = dict(zip(processes, held, strict=True))
        return [of[self.lanes.of[i][0]] for i in workers]

    async def add(self, index: int, threads: int | None = None, lanes: int | None = None) -> None:
        self._calls[index] = 0
        await super().add(index, threads, lanes)

    async def _open(self, process: int, shape: Shape) -> None:
        """A new actor of the group, claimed for its owner (an actor of that number that has
        outlived an earlier owner is taken over, its dedicated models loaded)."""
        import ray

        if self._make is None or self.groups:
            raise RuntimeError("this pool's workers cannot be added to")
        actor = await self._make(process, shape)
        try:
            if not await actor.claim.remote(self._owner):
                raise RuntimeError(f"worker {process} is held by another ingress")
            await actor.ready.remote()
        except Exception:
            ray.kill(actor, no_restart=True)
            raise
        self.actors[process] = actor

    def remove(self, index: int) -> None:
        super().remove(index)
        self._calls.pop(index, None)

    def _close(self, process: int) -> None:
        import ray

        ray.kill(self.actors.pop(process), no_restart=True)


def wall(clock_now: float, clock_t: float) -> float:
    """Clock time ``clock_t`` on the wall clock, given the clock reads ``clock_now`` now."""
    if not math.isfinite(clock_t):
        return clock_t
    return time.time() + (clock_t - clock_now)
