"""Partitioned models on Ray (Gillis, ICDCS'21, §III-B): the worker of a model's dedicated pool
is the leader, and the plan's other shards run on shard actors in a placement group.

As the leader loads the model (a LOAD, or its worker starting) it plans it
(:func:`raysrv.partitioning.planner.plan`, the machine profiled then), cuts every shard from
the model file once (:class:`raysrv.partitioning.local.Sharder`) and keeps its own shards as
onnxruntime sessions. It then reserves a placement group of one bundle of
``partition.num_cpus`` CPUs per worker shard and starts one shard actor in each, bundle ``i``
for shard ``i``, handing each only its own shard's bytes: a shard actor never sees the rest of
the model, and loads its weights once. A batch runs the plan's stages in turn: each stage's
worker shards get their input rows at once, the leader runs its own shard meanwhile, and the
outputs are joined in order.

Lifecycle: the placement group and its shard actors belong to the leader. Ray removes them
when the leader's actor ends (a placement group made by a detached actor lives as long as it
does), and an UNLOAD removes them at once (:meth:`PartitionedRuntime.close`). A shard actor
that dies fails the batches it was running (the leader raises, the batch gets a 500); Ray
starts it again in the same bundle, from the same shard bytes, and the batches after it are
answered. A shard that does not answer within ``partition.timeout_s`` fails its batch too:
nothing waits for ever.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from raysrv._workers import WORKERS_NAMESPACE
from raysrv.config import ModelSpec
from raysrv.partitioning.latency import Plan
from raysrv.partitioning.local import rows_of
from raysrv.runtimes import Runtime, rows

logger = logging.getLogger(__name__)

__all__ = ["SHARD_PREFIX", "PartitionedRuntime", "ShardActor"]

SHARD_PREFIX = "raysrv-shard:"  # of the shard actors' names
READY_TIMEOUT_S = 120.0  # for the placement group and every shard actor to start


class ShardActor:
    """One worker shard: an onnxruntime session of its bytes, run on the rows it is sent."""

    def __init__(self, model: bytes) -> None:
        from raysrv.partitioning.local import shard_session

        self._session = shard_session(model)
        self._input = self._session.get_inputs()[0].name
        self._bytes = len(model)

    def run(self, x: np.ndarray) -> np.ndarray:
        return self._session.run(None, {self._input: x})[0]

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
        """``plan``: the one to run, instead of planning the model as ``spec.partition`` says."""
        import onnx

        from raysrv.partitioning.local import Sharder, join_axis, shard_session
        from raysrv.partitioning.planner import plan as make_plan

        part = spec.partition
        assert part is not None  # the runtime of partitioned models only
        if plan is None:
            args = (part.workers, part.memory_limit_mb, part.objective, part.slo_ms)
            plan = make_plan(spec.source, *args)
        self.plan = plan
        self._timeout_s = part.timeout_s
        proto = onnx.load(spec.source)
        self.output_names = [o.name for o in proto.graph.output]
        sharder = Sharder(proto)
        cut = [sharder.shard_models(self.plan, stage) for stage in self.plan.stages]
        del proto, sharder  # the leader keeps only its own shards
        remote = [
            model.SerializeToString()
            for stage, models in zip(self.plan.stages, cut, strict=True)
            for model, _ in models[stage.leader :]
        ]
        self._actors = self._start(spec.name, remote, part.num_cpus)
        actors = iter(self._actors)
        self._stages: list[tuple[list[_Piece], int]] = []
        self._leader_bytes = 0
        for stage, models in zip(self.plan.stages, cut, strict=True):
            pieces = [_Piece(rows_, actor=next(actors)) for _, rows_ in models[stage.leader :]]
            if stage.leader:
                model, rows_ = models[0]
                self._leader_bytes += model.ByteSize()
                pieces.insert(0, _Piece(rows_, session=shard_session(model.SerializeToString())))
            self._stages.append((pieces, join_axis(self.plan, stage)))

    def _start(self, model: str, shards: list[bytes], num_cpus: float) -> list[Any]:
        """A placement group of a bundle per shard, and a shard actor in each, started; each
        named ``raysrv-shard:{model}:{group}:{i}`` in the workers' namespace (``group``: the
        placement group's id)."""
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.placement_group = placement_group(
            [{"CPU": num_cpus}] * max(1, len(shards)), strategy="PACK"
        )
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
        remove_placement_group(self.placement_group)


def _run(session: Any, x: np.ndarray) -> np.ndarray:
    return session.run(None, {session.get_inputs()[0].name: x})[0]
