"""Partitioned models on Ray (Gillis, ICDCS'21, §III-B): a leader and its shard actors in one
placement group. The leader is the worker of the model's dedicated pool, in bundle 0; the
plan's other shards run on shard actors, shard ``i`` in bundle ``i + 1``.

The model is planned once, before its group exists (:func:`plan_on_ray`, a Ray task the pool
runs as it makes a new leader): the machine is profiled (:func:`raysrv.partitioning.profile.
profile`), and since a round on Ray pays a call to an actor and back where the profile's
threads did not, calls to a probe actor are timed for the transfers' delay, bandwidth and
object-store cost (:func:`ray_transfers`) before :func:`raysrv.partitioning.planner.plan`
runs; with them, how much a leader's own run holds up its calls (:func:`overlap`) and what a
shard's run costs with its session and weights cold (:func:`cold_runs`). Then the calls are
timed again, each after as long a rest as the plan's shard actors will have between their
calls (a batch's latency less a stage's), this process calling another probe actor meanwhile
as a leader calls its other shards; the plan runs here as its leader will run it
(:func:`amid_plan`), whose rounds time the delay and the leader's hold-up again amid the
plan's own traffic, and the model is planned again with those. While it runs, the planning
task holds about 72 MiB more and the model, and each of the plan's actors its shard.

The pool then reserves a detached placement group of the leader's resources and one bundle of
``partition.num_cpus`` CPUs per worker shard (:func:`group_bundles`) and starts the leader in
bundle 0 with the plan. The leader cuts every shard from the model file once
(:class:`raysrv.partitioning.local.Sharder`), keeps its own shards as onnxruntime sessions and
starts a shard actor in each other bundle, handing each only its own shard's bytes: a shard
actor never sees the rest of the model, and loads its weights once. A batch runs the plan's
stages in turn: each stage's worker shards get their input rows at once, the leader runs its
own shard meanwhile, and the outputs are joined in order. Arrays travel to and from a shard
actor as plain bytes behind a short header (:func:`to_bytes`): Ray's own serialization of a
NumPy array costs about 0.1 ms more each way (bench/RESULTS_ARCHIVE.md, "Partitioned models:
the detail as summarized on fl7's day").

Lifecycle: the group lives as long as its leader. Ray restarts a crashed leader in its bundle
with the same plan; the shard actors it owned die with it and it starts new ones in the same
bundles. The pool removes the group when it ends its workers, and a leader that ends itself
for want of an owner removes it first. A shard actor that dies fails the batches it was running
(the leader raises, the batch gets a 500); Ray starts it again in its bundle, from the same
shard bytes, and the batches after it are answered. A shard that does not answer within
``partition.timeout_s`` fails its batch too: nothing waits for ever. A leader made outside a
placement group (a driver's, in tests and benchmarks) plans the model itself and makes a group
of its shards' bundles alone, which Ray removes with it; an UNLOAD ends its shard actors
(:meth:`PartitionedRuntime.close`).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from raysrv._workers import WORKERS_NAMESPACE
from raysrv.analytics.forkjoin import EMG, fit_emg
from raysrv.config import ModelSpec
from raysrv.partitioning.latency import Plan
from raysrv.partitioning.local import rows_of
from raysrv.partitioning.perf import PerfModel
from raysrv.runtimes import Runtime, rows

__all__ = [
    "SHARD_PREFIX",
    "PartitionedRuntime",
    "Probe",
    "ShardActor",
    "TimedRuntime",
    "TimedShard",
    "amid_plan",
    "calls_s",
    "cold_runs",
    "from_bytes",
    "group_bundles",
    "overlap",
    "plan_on_ray",
    "ray_transfers",
    "rest_s",
    "timed_for",
    "to_bytes",
    "typical_delay",
]

SHARD_PREFIX = "raysrv-shard:"  # of the shard actors' names
READY_TIMEOUT_S = 120.0  # for the placement group and every shard actor to start
HOP_ROUNDS = 100  # calls to a probe actor timed for each size of transfer on Ray
IDLE_S = 0.002  # before each, at first: a shard actor is called once a batch, and waits
OVERLAP_BYTES = 8 * 1024 * 1024  # the weights of the shard the leader and a probe both run
FLUSH_BYTES = 64 * 1024 * 1024  # read between runs to take a shard's weights out of the caches
SMALL_BYTES = 64 * 1024  # the weights of a shard whose cold run is nearly all its session's
# Ray passes an argument or result of up to this many bytes inside the call, larger ones
# through its object store (its max_direct_call_object_size).
INLINE_BYTES = int(os.environ.get("RAY_max_direct_call_object_size", 100 * 1024))  # noqa: SIM112


def to_bytes(x: np.ndarray) -> bytes:
    """``x`` as bytes a shard actor is sent or answers with: its dtype, rank and shape in a
    header of 8-byte fields, then its elements in C order (:func:`from_bytes`)."""
    x = np.asarray(x)
    header = np.array([x.ndim, *x.shape], np.int64).tobytes()
    return x.dtype.str.encode().ljust(_DTYPE_BYTES) + header + x.tobytes()


def from_bytes(data: bytes) -> np.ndarray:
    """The array :func:`to_bytes` wrote, read in place (read-only)."""
    dtype = np.dtype(data[:_DTYPE_BYTES].rstrip().decode())
    ndim = int(np.frombuffer(data, np.int64, 1, _DTYPE_BYTES)[0])
    shape = np.frombuffer(data, np.int64, ndim, _DTYPE_BYTES + 8).tolist()
    offset = _DTYPE_BYTES + 8 * (1 + ndim)
    return np.frombuffer(data, dtype, offset=offset).reshape(shape)


_DTYPE_BYTES = 8  # the header's field for the dtype's name (``<f4``)
_TINY = to_bytes(np.zeros(1, np.uint8))  # what a probe is sent when only the call counts


class ShardActor:
    """One worker shard: an onnxruntime session of its bytes, run on the rows it is sent
    (:func:`to_bytes` both ways)."""

    def __init__(self, model: bytes) -> None:
        from raysrv.partitioning.local import shard_session

        self._session = shard_session(model)
        self._input = self._session.get_inputs()[0].name
        self._bytes = len(model)

    def run(self, x: bytes) -> bytes:
        return to_bytes(self._session.run(None, {self._input: from_bytes(x)})[0])

    def ready(self) -> dict[str, Any]:
        """Its process, the bytes of its shard's model (its weights, nearly all) and the id of
        the placement group it runs in."""
        import ray

        group = ray.get_runtime_context().get_placement_group_id()
        return {"pid": os.getpid(), "model_bytes": self._bytes, "placement_group": group}


class TimedShard(ShardActor):
    """A shard actor that keeps how long each of its runs took inside (:meth:`runs`)."""

    def __init__(self, model: bytes) -> None:
        super().__init__(model)
        self._runs: list[float] = []

    def run(self, x: bytes) -> bytes:
        start = time.perf_counter()
        y = super().run(x)
        self._runs.append(time.perf_counter() - start)
        return y

    def runs(self) -> list[float]:
        """Its runs' seconds since the last call, in order."""
        found, self._runs = self._runs, []
        return found


class Probe:
    """An actor whose call does no work: what a round pays to reach a shard and back. Made
    with ``weight_bytes``, it also runs a shard of about that many bytes of weights
    (:func:`_matmul_shard`)."""

    def __init__(self, weight_bytes: int = 0) -> None:
        self._shard = _MatMul(weight_bytes) if weight_bytes else None

    def echo(self, x: bytes) -> bytes:
        """The first element of the array in ``x``, both as a shard actor's run has them."""
        return to_bytes(from_bytes(x).reshape(-1)[:1])

    def run(self) -> bytes:
        assert self._shard is not None  # made with weight_bytes
        return to_bytes(self._shard.run())


class _MatMul:
    """An onnxruntime session of :func:`_matmul_shard`, run on a vector of ones."""

    def __init__(self, weight_bytes: int) -> None:
        from raysrv.partitioning.local import shard_session

        self._session = shard_session(_matmul_shard(weight_bytes))
        self._x = np.ones((1, self._session.get_inputs()[0].shape[1]), np.float32)

    def run(self) -> np.ndarray:
        return self._session.run(None, {"x": self._x})[0][:, :1]


def _matmul_shard(weight_bytes: int) -> bytes:
    """An ONNX model of ``x @ w``, ``w`` square and of about ``weight_bytes`` bytes: a shard
    whose run reads its weights once, as a fully connected layer's does."""
    from onnx import TensorProto, helper, numpy_helper

    n = max(1, math.isqrt(weight_bytes // 4))
    w = numpy_helper.from_array(np.full((n, n), 1e-3, np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
        [w],
    )
    return helper.make_model(graph).SerializeToString()


def plan_on_ray(spec: ModelSpec, threads: PerfModel | None = None) -> Plan:
    """``spec``'s plan as its leader will run it on Ray (see the module docstring): the
    machine profiled here (or ``threads``, a profile already taken), its transfers as Ray's
    calls make them (:func:`ray_transfers`)."""
    import onnx

    from raysrv.partitioning.planner import plan
    from raysrv.partitioning.profile import profile

    part = spec.partition
    assert part is not None  # partitioned models only
    if threads is None:
        threads = profile(onnx.load(spec.source), workers=part.workers)
    args = (part.workers, part.memory_limit_mb, part.objective, part.slo_ms)
    cold = cold_runs()  # which does not depend on the rest
    perf = ray_transfers(threads, part.timeout_s, IDLE_S, cold)
    found = plan(spec.source, *args, perf=perf, threads=threads)
    perf = timed_for(threads, found, part.timeout_s, cold)
    return plan(spec.source, *args, perf=perf, threads=threads)


def timed_for(
    perf: PerfModel, plan: Plan, timeout_s: float, cold: tuple[float, float] | None = None
) -> PerfModel:
    """``perf`` with Ray's transfers timed for ``plan``: each call after its shard actors'
    rest between rounds (:func:`ray_transfers`), then amid its own traffic (:func:`amid_plan`)."""
    return amid_plan(ray_transfers(perf, timeout_s, rest_s(plan), cold), plan, timeout_s)


def rest_s(plan: Plan) -> float:
    """How long a shard actor of ``plan`` waits between its calls when batches follow one
    another: the batch less a stage, on average."""
    return plan.predicted_latency_s * (1.0 - 1.0 / len(plan.stages))


def ray_transfers(
    perf: PerfModel,
    timeout_s: float,
    idle_s: float = IDLE_S,
    cold: tuple[float, float] | None = None,
) -> PerfModel:
    """``perf`` with its transfers timed as calls to a probe actor, each after ``idle_s`` in
    which this process calls another probe actor (:func:`calls_s`):

    * ``HOP_ROUNDS`` calls of each of three sizes: a small one, for the delay
      (:func:`typical_delay`), and two over ``INLINE_BYTES``, whose line gives the bandwidth
      and the larger objects' extra cost (``large_s``);
    * the ``overlap`` of a leader's run and its calls (:func:`overlap`);
    * what a shard's run pays cold, once and a byte of its weights (:func:`cold_runs`),
      unless given as ``cold``.
    """
    import ray

    cold_s, cold_s_per_byte = cold_runs() if cold is None else cold
    sizes = (1024, 2 * INLINE_BYTES, 16 * INLINE_BYTES)
    probe = ray.remote(Probe).options(num_cpus=0).remote(OVERLAP_BYTES)
    keeper = ray.remote(Probe).options(num_cpus=0).remote()
    try:
        started = [a.echo.remote(_TINY) for a in (probe, keeper)]
        ray.get(started, timeout=READY_TIMEOUT_S)
        timed = {
            n: calls_s(probe, np.zeros(n, np.uint8), timeout_s, idle_s, keeper=keeper)
            for n in sizes
        }
        held = overlap(probe, keeper, timeout_s, idle_s)
    finally:
        ray.kill(probe)
        ray.kill(keeper)
    small, big = sizes[0], sizes[1:]
    (n1, t1), (n2, t2) = ((n, float(np.median(timed[n]))) for n in big)
    bandwidth = (n2 - n1) / (t2 - t1) if t2 > t1 else perf.bandwidth
    delays = [max(1e-7, t - small / bandwidth) for t in timed[small]]
    large_s = max(0.0, t1 - n1 / bandwidth - float(np.median(delays)))
    return replace(
        perf,
        bandwidth=bandwidth,
        delay=typical_delay(delays),
        large_bytes=INLINE_BYTES,
        large_s=large_s,
        overlap=held,
        cold_s=cold_s,
        cold_s_per_byte=cold_s_per_byte,
        _max_delay={},
    )


def amid_plan(
    perf: PerfModel, plan: Plan, timeout_s: float, batches: int = HOP_ROUNDS
) -> PerfModel:
    """``perf`` with its calls' ``delay`` and ``overlap`` timed amid ``plan``'s own traffic:
    ``batches`` batches of one, one after another, of ``plan`` run as its leader will run it,
    here, with its worker shards on actors that take no CPU of Ray's (:class:`_Rehearsal`), so
    that it runs before the plan's group exists. What a round of one worker shard takes beyond
    the shard's run (timed inside its actor) and the transfer of its bytes is a sample of the
    delay, where the leader is idle; where it runs a shard too, the median's excess over the
    delay's, over the leader's run, is ``overlap``.

    The shards' runs take the call's own code and data out of the caches, the leader's and its
    workers', and a call costs more so than between idle actors (bench/RESULTS_ARCHIVE.md,
    "partitioned models on Ray with a spinning stand-in of the plan").
    Each term is left as it was where no round of ``plan`` times it. While it runs, this
    process holds the model and the leader's shards, and each actor its shard."""
    timed: dict[int, tuple[bool, float]] = {}  # stage: beside the leader's run, bytes' time
    for i, stage in enumerate(plan.stages):
        if len(stage.shards) - stage.leader != 1:
            continue
        group, worker = plan.layers[stage.first : stage.last + 1], stage.shards[-1]
        if stage.leader:  # timed where the worker's answer comes after the leader's own run
            here = perf.run_s(group, stage.shards[0]) * perf.slowed(len(stage.shards))
            if here >= perf.latency_s(group, [worker], False):
                continue
        moved = perf.transfer_s(worker.in_bytes) + perf.transfer_s(worker.out_bytes)
        timed[i] = (stage.leader, moved)
    if all(leader for leader, _ in timed.values()):
        return perf
    rehearsal = _Rehearsal(plan, timeout_s)
    try:
        x = np.zeros((1, *plan.layers[0].in_shape), np.float32)
        for _ in range(batches + 1):  # the first warms up
            rehearsal.predict_batch(x)
        taken = rehearsal.taken()
    finally:
        rehearsal.close()
    alone, beside, local = [], [], []
    for i, (leader, moved) in timed.items():
        rounds, runs = taken[i]["rounds"][1:], taken[i]["workers"][0][1:]
        took = [r - w - moved for r, w in zip(rounds, runs, strict=True)]
        (beside if leader else alone).extend(took)
        if leader:
            local += taken[i]["here"][1:]
    delay = typical_delay(alone)
    held = perf.overlap
    if beside:
        held = max(0.0, (float(np.median(beside)) - delay.mean) / float(np.median(local)))
    return replace(perf, delay=delay, overlap=held, _max_delay={})


def typical_delay(samples: Sequence[float]) -> EMG:
    """An EMG fitted to delays ``samples`` (seconds), moved so that its mean is their median:
    a plan's latency is predicted for its typical batch, as the profile's runs are medians,
    and a shared machine's rare stalls, which the fit's tail takes in, do not move that."""
    fitted = fit_emg([max(1e-7, t) for t in samples])
    return replace(fitted, mu=fitted.mu - fitted.mean + float(np.median(samples)))


def overlap(probe: Any, keeper: Any, timeout_s: float, idle_s: float) -> float:
    """How much later a call comes back for each second its caller runs a shard of its own
    meanwhile, as a leader does beside its workers: ``HOP_ROUNDS`` rounds, each after
    ``idle_s`` of calls to ``keeper``, of a call to ``probe.run`` alone, the same shard run
    here alone, and both at once; the medians' excess of both over the call, over the run
    here. ``probe``: a :class:`Probe` made with ``OVERLAP_BYTES``."""
    import ray

    here = _MatMul(OVERLAP_BYTES)

    def call() -> None:
        ray.get(probe.run.remote(), timeout=timeout_s)

    def both() -> None:
        sent = probe.run.remote()
        here.run()
        ray.get(sent, timeout=timeout_s)

    timed: dict[Any, list[float]] = {call: [], here.run: [], both: []}
    for _ in range(HOP_ROUNDS):
        for run, times in timed.items():
            _rest(keeper, idle_s, timeout_s)
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
    alone, local, together = (float(np.median(times)) for times in timed.values())
    return max(0.0, (together - alone) / local)


def cold_runs(rounds: int = HOP_ROUNDS // 2) -> tuple[float, float]:
    """``(cold_s, cold_s_per_byte)``: what a shard's run takes beyond a warm run, once and a
    byte of its weights, when other work has taken its session and weights out of the caches
    since its last run, as the other stages of a plan do. Runs of two matrix products here, of
    ``SMALL_BYTES`` and ``OVERLAP_BYTES``, one after another and each after reading
    ``FLUSH_BYTES``: the line through the medians' differences. A shard runs 0.05-0.12 ms
    slower so here, and up to 0.018 ms more a MiB of its weights (bench/RESULTS_ARCHIVE.md,
    "Partitioned models: the detail as summarized on fl7's day")."""
    flush = np.ones(FLUSH_BYTES // 4, np.float32)

    def excess(shard: _MatMul) -> float:
        def timed() -> float:
            start = time.perf_counter()
            shard.run()
            return time.perf_counter() - start

        shard.run()
        warm = [timed() for _ in range(rounds)]
        cold = []
        for _ in range(rounds):
            flush.sum()
            cold.append(timed())
        return float(np.median(cold) - np.median(warm))

    small, big = excess(_MatMul(SMALL_BYTES)), excess(_MatMul(OVERLAP_BYTES))
    per_byte = max(0.0, (big - small) / (OVERLAP_BYTES - SMALL_BYTES))
    return max(0.0, small - per_byte * SMALL_BYTES), per_byte


def calls_s(
    probe: Any,
    x: np.ndarray,
    timeout_s: float,
    idle_s: float,
    rounds: int = HOP_ROUNDS,
    keeper: Any = None,
) -> list[float]:
    """Seconds of each of ``rounds`` calls of ``probe.echo`` with ``x``, each after ``idle_s``
    of rest for ``probe``, in which this process calls ``keeper.echo`` over and over, as a
    leader calls its other shards while one rests (``keeper`` None: it sleeps instead).
    ``probe`` and ``keeper``: Ray actors of :class:`Probe`.

    A call from a caller that slept costs more than one from a caller that kept calling, the
    more the longer the rest and by how much varying from minute to minute (``python -m
    bench.partition_ray`` times both; docs/partitioning.md); a leader keeps calling."""
    import ray

    found = []
    for _ in range(rounds):
        _rest(keeper, idle_s, timeout_s)
        start = time.perf_counter()
        ray.get(probe.echo.remote(to_bytes(x)), timeout=timeout_s)
        found.append(time.perf_counter() - start)
    return found


def _rest(keeper: Any, idle_s: float, timeout_s: float) -> None:
    """``idle_s`` of calls to ``keeper.echo``, one after another (``keeper`` None: a sleep)."""
    import ray

    if keeper is None:
        time.sleep(idle_s)
        return
    start = time.perf_counter()
    while time.perf_counter() - start < idle_s:
        ray.get(keeper.echo.remote(_TINY), timeout=timeout_s)


def group_bundles(spec: ModelSpec, plan: Plan) -> list[dict[str, float]]:
    """The bundles of a leader's placement group: the leader's resources, then one per
    worker shard of ``plan``."""
    part = spec.partition
    assert part is not None  # partitioned models only
    leader = {"CPU": spec.resources.num_cpus}
    if spec.resources.memory_mb is not None:
        leader["memory"] = spec.resources.memory_mb * 1024 * 1024
    leader.update(spec.resources.custom)
    return [leader] + [{"CPU": part.num_cpus}] * len(plan.worker_shards())


@dataclass(frozen=True)
class _Piece:
    """One shard of a stage: on the leader (``session``) or on a shard actor (``actor``),
    with the input rows it reads (None: all of them)."""

    rows: tuple[int, int] | None
    session: Any = None
    actor: Any = None


class PartitionedRuntime(Runtime):
    """A partitioned model as its leader runs it (see the module docstring)."""

    shard_actor: type = ShardActor  # the class of its shard actors

    def __init__(self, spec: ModelSpec, plan: Plan | None = None) -> None:
        """``plan``: the one to run (the pool's, planned as its group was made), instead of
        planning the model as ``spec.partition`` says (:func:`plan_on_ray`)."""
        part = spec.partition
        assert part is not None  # the runtime of partitioned models only
        plan = plan or plan_on_ray(spec)
        self._deploy(spec.name, spec.source, plan, part.timeout_s, part.num_cpus)

    def _deploy(self, name: str, model: Any, plan: Plan, timeout_s: float, num_cpus: float) -> None:
        """Cut ``plan``'s shards from ``model`` (a path or an ``onnx.ModelProto``), keep the
        leader's and start the others' actors."""
        import onnx

        from raysrv.partitioning.local import Sharder, join_axis, shard_session

        self._timeout_s = timeout_s
        self._actors: list[Any] = []
        self.placement_group: Any = None
        self._own_group = False
        proto = model if isinstance(model, onnx.ModelProto) else onnx.load(model)
        self.output_names = [o.name for o in proto.graph.output]
        sharder = Sharder(proto)
        self.plan = plan
        cut = [sharder.shard_models(plan, stage) for stage in plan.stages]
        remote = [
            model.SerializeToString()
            for stage, models in zip(plan.stages, cut, strict=True)
            for model, _ in models[stage.leader :]
        ]
        self._actors = self._start(name, remote, num_cpus) if remote else []
        actors = iter(self._actors)
        self._stages: list[tuple[list[_Piece], int]] = []
        self._leader_bytes = 0
        for stage, models in zip(plan.stages, cut, strict=True):
            pieces = [_Piece(rows_, actor=next(actors)) for _, rows_ in models[stage.leader :]]
            if stage.leader:
                model, rows_ = models[0]
                self._leader_bytes += model.ByteSize()
                pieces.insert(0, _Piece(rows_, session=shard_session(model.SerializeToString())))
            self._stages.append((pieces, join_axis(plan, stage)))

    def _start(self, model: str, shards: list[bytes], num_cpus: float) -> list[Any]:
        """A shard actor per shard, started: in bundles 1 to n of the leader's placement group
        (a pool's leader), else in a group of its own of a bundle each. Each is named
        ``raysrv-shard:{model}:{group}:{i}:{pid}`` in the workers' namespace (``group``: the
        placement group's id; ``pid``: the leader's process, whose shards die with it)."""
        import ray
        from ray.util.placement_group import get_current_placement_group, placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        current = get_current_placement_group()
        if current is None:
            current = placement_group([{"CPU": num_cpus}] * len(shards), strategy="PACK")
            self._own_group, first = True, 0
        elif len(current.bundle_specs) != len(shards) + 1:
            raise RuntimeError(
                f"the leader's placement group has {len(current.bundle_specs)} bundles; its "
                f"plan needs 1 + {len(shards)}"
            )
        else:
            first = 1
        self.placement_group = current
        remote = ray.remote(self.shard_actor)
        group = current.id.hex()[:12]
        actors = []
        self._shard_models = [ray.put(model) for model in shards]  # kept for actor restarts
        try:
            ray.get(current.ready(), timeout=READY_TIMEOUT_S)
            for i, shard in enumerate(self._shard_models):
                strategy = PlacementGroupSchedulingStrategy(
                    current, placement_group_bundle_index=first + i
                )
                name = f"{SHARD_PREFIX}{model}:{group}:{i}:{os.getpid()}"
                options = {"num_cpus": num_cpus, "scheduling_strategy": strategy}
                options |= {"name": name, "namespace": WORKERS_NAMESPACE}
                options |= {"max_restarts": -1, "max_task_retries": 0}
                actors.append(remote.options(**options).remote(shard))
        except Exception:
            self._actors = actors
            self.close()
            raise
        return self._ready(actors)

    def _ready(self, actors: list[Any]) -> list[Any]:
        """``actors`` once each has started; if one does not, all of them ended and the error
        raised."""
        import ray

        try:
            ray.get([a.ready.remote() for a in actors], timeout=READY_TIMEOUT_S)
        except Exception:
            self._actors = actors
            self.close()
            raise
        return actors

    def weight_bytes(self) -> int:
        """The bytes of the leader's own shards (the shard actors hold the rest)."""
        return self._leader_bytes

    @property
    def shard_actors(self) -> list[Any]:
        return list(self._actors)

    def predict_batch(self, inputs: Sequence[Any]) -> list[Any]:
        x = np.asarray(inputs, dtype=np.float32)
        for i in range(len(self._stages)):
            x = self._round(i, x)
        return rows(self.output_names, [x])

    def _round(self, i: int, x: np.ndarray) -> np.ndarray:
        """Stage ``i``'s fork-join round on its input ``x``: its output."""
        import ray

        pieces, axis = self._stages[i]
        sent = [
            p.actor.run.remote(to_bytes(rows_of(x, p.rows))) for p in pieces if p.actor is not None
        ]
        here = [p for p in pieces if p.session is not None]
        local = [self._run_here(p.session, rows_of(x, p.rows)) for p in here]
        try:
            outputs = local + [from_bytes(y) for y in ray.get(sent, timeout=self._timeout_s)]
        except (ray.exceptions.RayError, TimeoutError) as exc:
            raise RuntimeError(
                f"a shard worker of the partitioned model failed ({type(exc).__name__}); "
                "Ray starts it again"
            ) from None
        return outputs[0] if len(outputs) == 1 else np.concatenate(outputs, axis=axis)

    def _run_here(self, session: Any, x: np.ndarray) -> np.ndarray:
        """One of the leader's own shards run on ``x``."""
        return session.run(None, {session.get_inputs()[0].name: x})[0]

    def close(self) -> None:
        """End the shard actors, and give their placement group back if it is their own (a
        pool's leader's group is the pool's to remove)."""
        import ray
        from ray.util.placement_group import remove_placement_group

        for actor in self._actors:
            ray.kill(actor, no_restart=True)
        self._actors = []
        if self._own_group and self.placement_group is not None:
            remove_placement_group(self.placement_group)
        self.placement_group = None


class TimedRuntime(PartitionedRuntime):
    """A leader that keeps how long each stage's rounds and its own runs took, and whose shard
    actors keep their runs (:class:`TimedShard`): :meth:`taken`."""

    shard_actor = TimedShard

    def _deploy(self, *args: Any) -> None:
        super()._deploy(*args)
        self._rounds: list[list[float]] = [[] for _ in self._stages]
        self._here: list[list[float]] = [[] for _ in self._stages]
        self._stage = 0

    def _round(self, i: int, x: np.ndarray) -> np.ndarray:
        self._stage = i
        start = time.perf_counter()
        y = super()._round(i, x)
        self._rounds[i].append(time.perf_counter() - start)
        return y

    def _run_here(self, session: Any, x: np.ndarray) -> np.ndarray:
        start = time.perf_counter()
        y = super()._run_here(session, x)
        self._here[self._stage].append(time.perf_counter() - start)
        return y

    def taken(self) -> list[dict[str, Any]]:
        """Each stage's seconds since the last call, batch by batch: its rounds (``rounds``),
        the leader's own runs (``here``; none where it runs no shard) and each worker shard's
        runs (``workers``, a list a shard actor)."""
        import ray

        actors = iter(ray.get([a.runs.remote() for a in self._actors], timeout=self._timeout_s))
        found = []
        for (pieces, _), rounds, here in zip(self._stages, self._rounds, self._here, strict=True):
            workers = [next(actors) for p in pieces if p.actor is not None]
            found.append({"rounds": list(rounds), "here": list(here), "workers": workers})
            rounds.clear()
            here.clear()
        return found


class _Rehearsal(TimedRuntime):
    """``plan`` run as its leader will run it, in this process, its shard actors taking no CPU
    of Ray's and in no placement group: what :func:`amid_plan` times before the plan's group
    exists."""

    def __init__(self, plan: Plan, timeout_s: float) -> None:
        if plan.model is None:
            raise ValueError("the plan has no model to run; plan() gives plans one")
        self._deploy("rehearsal", plan.model, plan, timeout_s, 0.0)

    def _start(self, model: str, shards: list[bytes], num_cpus: float) -> list[Any]:
        import ray

        remote = ray.remote(self.shard_actor).options(num_cpus=0)
        return self._ready([remote.remote(shard) for shard in shards])
