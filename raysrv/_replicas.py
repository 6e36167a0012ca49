"""Replica groups: N plain Ray actors per model, each running exactly one batch at a time.

A model's replicas are Ray actors (not Serve deployments) that the ingress calls directly: a
direct actor call costs about 0.9 ms here against 3 to 6 ms for a Serve handle call (both
measured sequentially from inside a Serve replica by ``python -m bench.hops``; figures in
bench/RESULTS.md), and the batcher must pick the replica itself, which a Serve handle's router
does not allow. Each actor is a serial Ray actor, so batches execute one at a time in the order
they were sent, and every call returns the measured run time with the outputs.

Actors are named after the Serve application, the ingress replica, the model and a hash of its
spec, and created with ``get_if_exists`` (a restarted ingress finds its own). Every ingress
replica owns its group: Ray stops an actor with the process that created it, so a group shared
between ingress replicas would die under the others when its creator is replaced (a redeploy with
an unchanged model spec did exactly that). A crashed actor fails the batch it was running and is
restarted by Ray.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import time
from typing import Any

import numpy as np
import ray

from raysrv._batcher import Execute
from raysrv._heap import settle
from raysrv.config import ModelSpec
from raysrv.metrics import LATENCY_BOUNDARIES_MS
from raysrv.runtimes import load_runtime

__all__ = ["ModelWorker", "ReplicaGroup"]


class ModelWorker:
    """One replica of one model: loads its runtime, runs the batches it is handed."""

    def __init__(self, model: dict[str, Any]) -> None:
        from ray.util import metrics

        self._spec = ModelSpec.model_validate(model)
        self._runtime = load_runtime(self._spec)
        self._execution = metrics.Histogram(
            "raysrv_execution_ms", "Replica run time of a batch.", LATENCY_BOUNDARIES_MS, ("model",)
        )
        self._execution.set_default_tags({"model": self._spec.name})
        settle()  # the loaded model out of the collector's full passes

    def ready(self) -> int:
        """The worker's process id, once its model is loaded."""
        return os.getpid()

    def run_batch(
        self, inputs: np.ndarray, latest_start: float = math.inf
    ) -> tuple[list[Any] | None, float]:
        """Outputs for a stacked batch and the measured run time in seconds.

        ``latest_start`` (wall-clock seconds) is the batch's earliest deadline: a batch that
        waited in this actor's mailbox past it is not run at all (outputs None), so no work is
        spent on answers nobody waits for (clockwork §4.4, §5.2: "executors reject actions whose
        latest timestamp has passed").
        """
        if time.time() > latest_start:
            return None, 0.0
        start = time.perf_counter()
        outputs = self._runtime.predict_batch(inputs)
        duration = time.perf_counter() - start
        self._execution.observe(duration * 1000.0)
        return outputs, duration


def _actor_options(model: ModelSpec, name: str) -> dict[str, Any]:
    options: dict[str, Any] = {
        "name": name,
        "get_if_exists": True,
        "num_cpus": model.resources.num_cpus,
        "num_gpus": model.resources.num_gpus,
        "max_restarts": -1,
        "max_concurrency": 1,
    }
    if model.resources.memory_mb is not None:
        options["memory"] = model.resources.memory_mb * 1024 * 1024
    return options


class ReplicaGroup:
    """The ``replicas`` actors of one model, addressed by index."""

    def __init__(self, model: ModelSpec, scope: str) -> None:
        spec = model.model_dump(mode="json")
        digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
        self.model = model
        remote = ray.remote(ModelWorker)
        self.actors = [
            remote.options(
                **_actor_options(model, f"raysrv:{scope}:{model.name}:{digest}:{i}")
            ).remote(spec)
            for i in range(model.replicas)
        ]

    async def ready(self) -> list[int]:
        """Wait until every replica has loaded its model; raises the load error if one fails."""
        return list(await asyncio.gather(*(actor.ready.remote() for actor in self.actors)))

    def executor(self) -> Execute:
        """Run a batch on the replica the batcher chose."""
        actors = self.actors

        async def execute(
            inputs: np.ndarray, replica: int, latest_start: float = math.inf
        ) -> tuple[list[Any] | None, float]:
            return await actors[replica].run_batch.remote(inputs, latest_start)

        return execute
