"""The many-model baseline: what a Ray user would deploy instead, Ray Serve's model multiplexing.

Clockwork (OSDI'20) §6.2-6.5 serves thousands of models from workers whose memory holds a few
of them. A Ray user would reach for ``@serve.multiplexed``: each replica keeps up to
``models_per_replica`` models and evicts the least recently used one to load another; a
handle call names its model (``handle.options(multiplexed_model_id="m0042")``) and Serve's
router prefers replicas that already hold it. Here each replica loads ``{directory}/{id}.onnx``
(a :mod:`bench.zoo` model) into an onnxruntime session (CPU, one intra-op and one inter-op
thread) and runs ``@serve.batch`` on it; Ray 2.60 splits every batch by model before the
batched method sees it, so ``serve.get_multiplexed_model_id()`` names the batch's one model.

What Serve does not show, and how this deployment handles it:

- The loader runs under the multiplexer's lock, one load at a time per replica. Loads run in a
  thread (``asyncio.to_thread``) so that batches of models already loaded can run meanwhile
  (loading inline measured the same in the smoke check); inference runs inline, as in Serve's
  batching guide.
- ``@serve.batch`` runs the sub-batches of one batch (one per model) under one permit, so a
  batch whose model is loading holds it: ``max_concurrent_batches=2`` lets the next one run.
- ``max_num_models_per_replica`` is fixed where ``@serve.multiplexed`` decorates: to make it an
  argument, ``__init__`` wraps the loader (Ray 2.60 detects a loader wrapped there too).
- Serve calls an evicted model's ``__del__`` itself (in a thread), then Python calls it again
  when the object is collected; ``_Model.__del__`` counts the first call only.

``stats()`` reports a replica's loads, evictions, batches, items and resident models;
:func:`replica_stats` gathers every replica's. ``python -m bench.multiplexed`` is a smoke check
on a local Ray; ``bench/README.md`` has what it showed (replicas load the same models rather
than share them out, and batches split by model stay small).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import ray
from ray import serve
from ray.serve import Application
from ray.serve.handle import DeploymentHandle
from starlette.requests import Request

from bench.models import _session
from bench.traces import zipf_arrivals
from bench.zoo import DEFAULT_DIR, INPUT_DIM, build_zoo, digits_like, model_name
from raysrv._heap import set_young_threshold

__all__ = ["Multiplexed", "build_multiplexed", "main", "replica_stats"]

MODEL_ID = re.compile(r"[a-z][a-z0-9_-]{0,63}")  # a file stem in the zoo, never a path


class _Tally:
    """Counters and the models resident, shared by the replica's event loop and the threads
    that load and evict."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._resident: set[str] = set()

    def add(self, key: str, amount: float = 1.0) -> None:
        with self._lock:
            self._counts[key] += amount

    def loaded(self, model_id: str, seconds: float) -> None:
        with self._lock:
            self._counts.update({"loads": 1, "load_s": seconds})
            self._resident.add(model_id)

    def evicted(self, model_id: str) -> None:
        with self._lock:
            self._counts["evictions"] += 1
            self._resident.discard(model_id)

    def snapshot(self) -> tuple[dict[str, float], list[str]]:
        with self._lock:
            return dict(self._counts), sorted(self._resident)


class _Model:
    """One loaded model: an onnxruntime session that ``__del__`` releases (on eviction)."""

    def __init__(self, path: Path, tally: _Tally) -> None:
        start = time.perf_counter()
        self._session: Any = _session(path)
        self._tally, self._id = tally, path.stem
        tally.add("create_s", time.perf_counter() - start)

    def run(self, x: np.ndarray) -> np.ndarray:
        return self._session.run(None, {"input": x})[0]

    def __del__(self) -> None:
        # Serve calls this when it evicts the model; Python calls it again at collection.
        if getattr(self, "_session", None) is not None:
            self._session = None
            self._tally.evicted(self._id)


@serve.deployment
class Multiplexed:
    """Many ONNX models behind ``@serve.multiplexed`` and ``@serve.batch``, by handle or HTTP;
    young objects collected at the threshold ``RAYSRV_GC_YOUNG_OBJECTS`` sets, as raysrv's."""

    def __init__(
        self,
        directory: str,
        models_per_replica: int,
        max_batch_size: int,
        batch_wait_timeout_s: float,
    ) -> None:
        self._directory = Path(directory)
        self._tally = _Tally()
        set_young_threshold()
        self._replica = serve.get_replica_context().replica_id.unique_id

        @serve.multiplexed(max_num_models_per_replica=models_per_replica)
        async def load(model_id: str) -> _Model:
            return await self._open(model_id)

        self._load = load
        self._batch.set_max_batch_size(max_batch_size)
        self._batch.set_batch_wait_timeout_s(batch_wait_timeout_s)

    async def _open(self, model_id: str) -> _Model:
        """Load ``{directory}/{model_id}.onnx`` in a thread (the event loop keeps serving)."""
        if not MODEL_ID.fullmatch(model_id):
            raise ValueError(f"model id {model_id!r} is not a zoo model's name")
        start = time.perf_counter()
        model = await asyncio.to_thread(_Model, self._directory / f"{model_id}.onnx", self._tally)
        self._tally.loaded(model_id, time.perf_counter() - start)
        return model

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.001, max_concurrent_batches=2)
    async def _batch(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        model = await self._load(serve.get_multiplexed_model_id())  # one model per sub-batch
        logits = model.run(np.stack(inputs))
        self._tally.add("batches")
        self._tally.add("items", len(inputs))
        return list(logits)

    async def predict(self, input: Any) -> dict[str, Any]:
        """Logits of the call's model (``multiplexed_model_id``) for one [64] input."""
        model_id = serve.get_multiplexed_model_id()
        if not model_id:
            raise ValueError("call with handle.options(multiplexed_model_id=<model name>)")
        x = np.asarray(input, dtype=np.float32)
        if x.shape != (INPUT_DIM,):
            raise ValueError(f"input has shape {list(x.shape)}, expected [{INPUT_DIM}]")
        return {"output": await self._batch(x), "model": model_id}

    async def __call__(self, request: Request) -> dict[str, Any]:
        """HTTP: ``{"input": [...]}`` POSTed with the model in the ``serve_multiplexed_model_id``
        header; the answer of :meth:`predict`, its logits as a list."""
        body = await request.json()
        answer = await self.predict(body["input"])
        return {**answer, "output": answer["output"].tolist()}

    async def stats(self) -> dict[str, Any]:
        """This replica's counters: loads, seconds spent loading (``load_s``; ``create_s`` of
        it creating sessions), evictions, batches, items, and the models resident now."""
        counts, resident = self._tally.snapshot()
        names = ("loads", "load_s", "create_s", "evictions", "batches", "items")
        return {
            "replica": self._replica,
            **{k: counts.get(k, 0) for k in names},
            "models": resident,
        }


def build_multiplexed(
    directory: str | Path,
    replicas: int = 2,
    models_per_replica: int = 25,
    max_batch_size: int = 16,
    batch_wait_timeout_s: float = 0.001,
    max_ongoing_requests: int = 32,
    max_queued_requests: int = 64,
) -> Application:
    """The multiplexed baseline over the zoo in ``directory``, each replica ``num_cpus=1``.

    Defaults, tuned for the zoo on CPU rather than left at Serve's:

    - ``models_per_replica=25``: 1,000 models whose pool holds 5% of them, over 2 replicas
      (Serve's default is 3). A loaded zoo model adds about 3.5 MiB of resident memory.
    - ``max_batch_size=16``, ``batch_wait_timeout_s=0.001``: a zoo model runs a batch of 16 in
      about 0.2 ms against 0.05 ms for one input, so batches pay; but a batch only gathers
      queries of one model, so a long wait mostly delays the rarely used ones (Serve's 10 ms
      would be 200 batches of 1).
    - ``max_ongoing_requests=32``: two full batches per replica, as ``max_concurrent_batches``
      is 2 (Serve warns below ``max_batch_size x max_concurrent_batches``; its default is 5).
    - ``max_queued_requests=64``: each caller's handle holds at most 64 queries waiting for a
      replica and refuses more at once (``BackPressureError``) instead of queueing without
      bound (Serve's default, -1): a query then waits behind at most 2 x 32 + 64 others.
    """
    return Multiplexed.options(
        name="multiplexed",
        num_replicas=replicas,
        max_ongoing_requests=max_ongoing_requests,
        max_queued_requests=max_queued_requests,
        ray_actor_options={"num_cpus": 1},
    ).bind(str(directory), models_per_replica, max_batch_size, batch_wait_timeout_s)


async def replica_stats(
    handle: DeploymentHandle, replicas: int, rounds: int = 20
) -> list[dict[str, Any]]:
    """Every replica's ``stats()``: calls in parallel until each replica has answered (the
    router picks the replica, so a single call reaches one at random)."""
    seen: dict[str, dict[str, Any]] = {}
    for _ in range(rounds):
        for answer in await asyncio.gather(*(handle.stats.remote() for _ in range(4 * replicas))):
            seen[answer["replica"]] = answer
        if len(seen) >= replicas:
            break
    return sorted(seen.values(), key=lambda s: s["replica"])


async def _drive(
    handle: DeploymentHandle, ids: np.ndarray, concurrency: int
) -> tuple[float, Counter[str], list[float]]:
    """Closed loop: ``concurrency`` callers send one query per entry of ``ids`` in all; the
    seconds it took, the outcomes and the latency of each answer."""
    inputs = digits_like(np.random.default_rng(1), 64)
    handles = {i: handle.options(multiplexed_model_id=model_name(i)) for i in set(ids.tolist())}
    queue = list(enumerate(ids.tolist()))[::-1]
    outcomes: Counter[str] = Counter()
    latencies: list[float] = []

    async def caller() -> None:
        while queue:
            n, i = queue.pop()
            sent = time.perf_counter()
            try:
                answer = await handles[i].predict.remote(inputs[n % len(inputs)])
                outcomes["ok" if answer["model"] == model_name(i) else "wrong model"] += 1
                latencies.append(time.perf_counter() - sent)
            except Exception as e:  # a smoke check: count what failed and go on
                outcomes[type(e).__name__] += 1

    start = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    return time.perf_counter() - start, outcomes, latencies


def _print_replicas(stats: list[dict[str, Any]]) -> None:
    """Each replica's loads, evictions and batches, and the models held by more than one."""
    for s in stats:
        load, create = (1e3 * s[k] / max(s["loads"], 1) for k in ("load_s", "create_s"))
        print(
            f"  replica {s['replica']}: {s['loads']:.0f} loads ({load:.1f} ms each, {create:.1f} "
            f"ms of it creating the session), {s['evictions']:.0f} evictions, "
            f"{len(s['models'])} models resident, {s['batches']:.0f} batches of "
            f"{s['items'] / max(s['batches'], 1):.2f} on average"
        )
    held = Counter(m for s in stats for m in s["models"])
    print(f"  models resident on more than one replica: {sum(n > 1 for n in held.values())}")


def _smoke(args: argparse.Namespace) -> None:
    """Deploy on the running Ray, drive it, print the outcome and each replica's stats."""
    app = build_multiplexed(args.out, args.replicas, args.models_per_replica)
    handle = serve.run(app, name="multiplexed", route_prefix=None)
    _, ids = zipf_arrivals(2.0, float(args.calls), args.ids, 1.0, np.random.default_rng(0))
    ids = ids[: args.calls]  # about twice as many drawn: the first ``calls`` of them
    seconds, outcomes, latencies = asyncio.run(_drive(handle, ids, args.concurrency))
    calls = sum(outcomes.values())
    p50, p99 = np.percentile(latencies, [50, 99]) * 1e3 if latencies else (np.nan, np.nan)
    print(f"{calls} calls over {len(set(ids.tolist()))} models (Zipf, s = 1) in {seconds:.2f} s:")
    print(f"  {calls / seconds:.0f} calls/s, concurrency {args.concurrency}, {dict(outcomes)}")
    print(f"  latency p50 {p50:.1f} ms, p99 {p99:.1f} ms")
    _print_replicas(asyncio.run(replica_stats(handle, args.replicas)))


def main(argv: list[str] | None = None) -> int:
    """Smoke check: a local Ray, a small zoo, Zipf-popular calls over a few models."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_DIR, help="the zoo's folder")
    parser.add_argument("--models", type=int, default=50, help="zoo models to build")
    parser.add_argument("--ids", type=int, default=20, help="models the calls go to")
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--models-per-replica", type=int, default=5)
    args = parser.parse_args(argv)
    build_zoo(args.out, args.models)
    ray.init(num_cpus=4, include_dashboard=False)
    try:
        _smoke(args)
    finally:
        serve.shutdown()
        ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
