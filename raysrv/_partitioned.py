"""Partitioned models on Ray (Gillis, ICDCS'21, §III-B): the worker of a model's dedicated pool
is the leader, and the plan's other shards run on shard actors in a placement group.

As the leader loads the model (a LOAD, or its worker starting) it plans it
(:func:`raysrv.partitioning.planner.plan`, the machine profiled then), cuts every shard from
the model file once (:class:`raysrv.partitioning.local.Sharder`) and keeps its own shards as
onnxruntime sessions. It then reserves a placement group of one bundle of
``partition.num_cpus`` CPUs per worker shard and starts one shard actor in each, bundle ``i``
for shard ``i``, handing each only its own shard's bytes: a shard actor never sees the rest of
the model, and loads its weights once. The profile holds rounds on threads; a round on Ray
pays a call to an actor and back, so the leader then times such calls to its shard actors,
fits their delay as the planner's exponentially modified Gaussian and plans again with it:
the same shards are kept with the new prediction, other ones replace them. A batch runs the
plan's stages in turn: each stage's worker shards get their input rows at once, the leader
runs its own shard meanwhile, and the outputs are joined in order.

Lifecycle: the placement group and its shard actors belong to the leader. Ray removes them
when the leader's actor ends (a placement group made by a detached actor lives as long as it
does), and an UNLOAD removes them at once (:meth:`PartitionedRuntime.close`). A shard actor
that dies fails the batches it was running (the leader raises, the batch gets a 500); Ray
starts it again in the same bundle, from the same shard bytes, and the batches after it are
answered. A shard that does not answer within ``partition.timeout_s`` fails its batch too:
nothing waits for ever.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from raysrv._workers import WORKERS_NAMESPACE
from raysrv.analytics.forkjoin import EMG
from raysrv.config import ModelSpec
from raysrv.partitioning.latency import Plan
from raysrv.partitioning.local import rows_of
from raysrv.runtimes import Runtime, rows

__all__ = ["SHARD_PREFIX", "PartitionedRuntime", "ShardActor"]

SHARD_PREFIX = "raysrv-shard:"  # of the shard actors' names
READY_TIMEOUT_S = 120.0  # for the placement group and every shard actor to start
HOP_ROUNDS = 20  # calls timed to each shard actor for the delay of a round on Ray


class ShardActor:
    """One worker shard: an onnxruntime session of its bytes, run on the rows it is sent."""

    def __init__(self, model: bytes) -> None:
        from raysrv.partitioning.local import shard_session

        self._session = shard_session(model)
        self._input = self._session.get_inputs()[0].name
        self._bytes = len(model)

    def run(self, x: np.ndarray) -> np.ndarray:
        return self._session.run(None, {self._input: x})[0]

    def echo(self, x: np.ndarray) -> np.ndarray:
        """A call that does no work: what a round pays to reach the actor and back."""
        return x.reshape(-1)[:1]

    def ready(self) -> dict[str, Any]:
        """Its process, the bytes of its shard's model (its weights, nearly all) and the id of
        the placement group it runs in."""
        import ray

        group = ray.get_runtime_context().get_placement_group_id()
        return {"pid": os.getpid(), "model_bytes": self._bytes, "placement_group": group}


@dataclass(frozen=True)
class _Piece:
    """One shard of a stage: on the leader (``session``) or on a shard actor (``actor``),
    with the input rows it reads (None: all of them)."""

    rows: tuple[int, int] | None
    session: Any = None
    actor: Any = None


class PartitionedRuntime(Runtime):
    """A partitioned model as its leader runs it (see the module docstring)."""

    def __init__(self, spec: ModelSpec, plan: Plan | None = None) -> None:
        """``plan``: the one to run, instead of planning the model as ``spec.partition`` says
        (see the module docstring)."""
        import onnx

        from raysrv.partitioning.local import Sharder
        from raysrv.partitioning.planner import plan as make_plan
        from raysrv.partitioning.profile import profile

        part = spec.partition
        assert part is not None  # the runtime of partitioned models only
        self._timeout_s = part.timeout_s
        self._actors: list[Any] = []
        self.placement_group: Any = None
        proto = onnx.load(spec.source)
        self.output_names = [o.name for o in proto.graph.output]
        sharder = Sharder(proto)
        if plan is not None:
            self._deploy(spec.name, sharder, plan, part.num_cpus)
            return
        perf = profile(proto, workers=part.workers)
        args = (part.workers, part.memory_limit_mb, part.objective, part.slo_ms)
        threads = make_plan(spec.source, *args, perf=perf)
        self._deploy(spec.name, sharder, threads, part.num_cpus)
        if not self._actors:
            return
        x = np.zeros((1, *threads.layers[0].in_shape), dtype=np.float32)
        delay = self._hop_delay(x, perf.bandwidth)
        on_ray = make_plan(spec.source, *args, perf=replace(perf, delay=delay, _max_delay={}))
        if _shape(on_ray) == _shape(threads):
            self.plan = on_ray  # the same shards, predicted with Ray's calls
            return
        self.close()
        self._deploy(spec.name, sharder, on_ray, part.num_cpus)

    def _deploy(self, name: str, sharder: Any, plan: Plan, num_cpus: float) -> None:
        """Cut ``plan``'s shards, keep the leader's and start the others' actors."""
        from raysrv.partitioning.local import join_axis, shard_session

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

    def _hop_delay(self, x: np.ndarray, bandwidth: float) -> EMG:
        """The delay of a call to a shard actor and back beyond its bytes, ``HOP_ROUNDS`` calls
        to each sending the model's input, fitted as the planner's exponentially modified
        Gaussian."""
        import ray

        from raysrv.analytics.forkjoin import fit_emg

        moved = x.nbytes / bandwidth
        found = []
        for actor in self._actors:
            ray.get(actor.echo.remote(x))
            for _ in range(HOP_ROUNDS):
                start = time.perf_counter()
                ray.get(actor.echo.remote(x), timeout=self._timeout_s)
                found.append(max(1e-7, time.perf_counter() - start - moved))
        return fit_emg(found)

    def _start(self, model: str, shards: list[bytes], num_cpus: float) -> list[Any]:
        """A placement group of a bundle per shard, and a shard actor in each, started; each
        named ``raysrv-shard:{model}:{group}:{i}`` in the workers' namespace (``group``: the
        placement group's id)."""
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.placement_group = placement_group([{"CPU": num_cpus}] * len(shards), strategy="PACK")
        remote = ray.remote(ShardActor)
        group = self.placement_group.id.hex()[:12]
        actors = []
        self._shard_models = [ray.put(model) for model in shards]  # kept for actor restarts
        try:
            ray.get(self.placement_group.ready(), timeout=READY_TIMEOUT_S)
            for i, shard in enumerate(self._shard_models):
                strategy = PlacementGroupSchedulingStrategy(
                    self.placement_group, placement_group_bundle_index=i
                )
                name = f"{SHARD_PREFIX}{model}:{group}:{i}"
                options = {"num_cpus": num_cpus, "scheduling_strategy": strategy}
                options |= {"name": name, "namespace": WORKERS_NAMESPACE}
                options |= {"max_restarts": -1, "max_task_retries": 0}
                actors.append(remote.options(**options).remote(shard))
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
        import ray

        x = np.asarray(inputs, dtype=np.float32)
        for pieces, axis in self._stages:
            sent = [p.actor.run.remote(rows_of(x, p.rows)) for p in pieces if p.actor is not None]
            local = [_run(p.session, rows_of(x, p.rows)) for p in pieces if p.session is not None]
            try:
                outputs = local + list(ray.get(sent, timeout=self._timeout_s))
            except (ray.exceptions.RayError, TimeoutError) as exc:
                raise RuntimeError(
                    f"a shard worker of the partitioned model failed ({type(exc).__name__}); "
                    "Ray starts it again"
                ) from None
            x = outputs[0] if len(outputs) == 1 else np.concatenate(outputs, axis=axis)
        return rows(self.output_names, [x])

    def close(self) -> None:
        """End the shard actors and give their placement group back."""
        import ray
        from ray.util.placement_group import remove_placement_group

        for actor in self._actors:
            ray.kill(actor, no_restart=True)
        self._actors = []
        if self.placement_group is not None:
            remove_placement_group(self.placement_group)
            self.placement_group = None


def _shape(plan: Plan) -> list[tuple[int, int, str, int, bool]]:
    """What a plan's shards are, apart from what it predicts."""
    return [(s.first, s.last, s.option, s.parts, s.leader) for s in plan.stages]


def _run(session: Any, x: np.ndarray) -> np.ndarray:
    return session.run(None, {session.get_inputs()[0].name: x})[0]
