"""Test doubles that ship with raysrv (STYLE §8): a fake clock, scripted models, spec builders.

``EchoModel`` is a real ``python``-runtime model (it implements ``predict_batch``) whose answers
say which batch they came from, so a test can see batching from the outside; ``fake_execute``
stands in for a replica group in Ray-free tests.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from raysrv._batcher import Execute
from raysrv.batching import (
    BatcherView,
    BatchingPolicy,
    BatchOutcome,
    Dispatch,
    QueuedQuery,
    ReplicaSlot,
)

__all__ = [
    "EchoModel",
    "FakeClock",
    "LabelModel",
    "fake_execute",
    "model_spec",
    "saturated_batch_sizes",
    "spec",
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


class LabelModel:
    """Answers ``{"label": label}`` for every input after ``delay_s`` per batch: a classifier
    whose answer (and speed) a test chooses."""

    def __init__(self, label: int = 0, delay_s: float = 0.0) -> None:
        self.label = label
        self.delay_s = delay_s

    def predict_batch(self, inputs: Sequence[Any]) -> list[dict[str, Any]]:
        time.sleep(self.delay_s)
        return [{"label": self.label} for _ in inputs]


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
        policy.observe(BatchOutcome(size, 0, clock() - duration(size), clock(), duration(size)))
        sizes.append(size)
    return sizes


def fake_execute(
    model: Any,
    delay_s: float = 0.0,
    log: list[int] | None = None,
) -> Execute:
    """An ``Execute`` over an in-process model, sleeping ``delay_s`` (asyncio) per batch.

    Batch sizes are appended to ``log`` when one is given.
    """
    predict: Callable[[Any], list[Any]] = model.predict_batch

    async def execute(
        inputs: np.ndarray, replica: int, latest_start: float = math.inf
    ) -> tuple[list[Any] | None, float]:
        if time.time() > latest_start:  # as ModelWorker.run_batch: too late to start
            return None, 0.0
        start = time.perf_counter()
        if log is not None:
            log.append(len(inputs))
        if delay_s:
            await asyncio.sleep(delay_s)
        return predict(inputs), time.perf_counter() - start

    return execute


def model_spec(name: str, **overrides: Any) -> dict[str, Any]:
    """A ``python``-runtime :class:`EchoModel` spec of input shape [4], for tests."""
    spec: dict[str, Any] = {
        "name": name,
        "runtime": "python",
        "source": "raysrv.testing:EchoModel",
        "resources": {"num_cpus": 0.1},
        "batching": {"policy": "fixed", "params": {"max_batch_size": 8}},
        "slo_ms": 10_000,  # generous: tests check behaviour, not a noisy machine's speed
        "input": {"shape": [4], "dtype": "float32"},
    }
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
