"""``ingress.max_ongoing_requests: auto``: Serve's bound on the requests one ingress replica
holds, set from its models' capacity and SLOs where the application is built.

Per pool, as many full batches as its workers run one after another within the SLO behind the
ones running, at least one per worker: ``B * W * max(1, floor(SLO / t) - 1)`` for batches of
``B`` (the most its policy cuts) that take ``t`` (the median of ``RUNS`` runs timed here) on
each of ``W`` workers; for one worker, the rule by which the benchmarks tune plain Serve. The
replica's bound is the sum over its pools. Past it Serve holds a request in its own queue
(``max_queued_requests``) or refuses it (503) without the work of handing it to the replica,
which behind Serve's Python proxy, the bottleneck there, leaves it more time for the answers
within the SLO (``bench/RESULTS.md``, "Overload"). On Serve's fast path raysrv's own
admission binds first and the fixed default suits.

A pool whose run times cannot be measured in this process (on a GPU, a shared pool that loads
models on demand) leaves the bound at :data:`FALLBACK`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

from raysrv._model_spec import ModelSpec, ResolvedPool
from raysrv._workers import median_run_s

if TYPE_CHECKING:
    from raysrv.config import AppSpec

__all__ = ["FALLBACK", "RUNS", "admitted", "auto_bound", "longest_slo_ms"]

logger = logging.getLogger(__name__)

FALLBACK = 256  # as the field's default
RUNS = 5  # timed runs of a full batch per model, after one untimed


def admitted(batch: int, batch_s: float, workers: int, slo_s: float) -> int:
    """Requests a pool's workers answer within ``slo_s`` behind the batches they are running:
    full batches of ``batch`` that take ``batch_s`` each, at least one per worker."""
    behind = math.floor(slo_s / batch_s) - 1 if batch_s > 0 else 1
    return batch * workers * max(1, behind)


def longest_slo_ms(models: Iterable[ModelSpec], apps: Iterable[AppSpec]) -> dict[str, float]:
    """Each model's longest SLO as configured: its own, or that of an app serving it."""
    longest = {m.name: m.slo_ms for m in models}
    for app in apps:
        for name in app.models if app.slo_ms is not None else ():
            longest[name] = max(longest[name], app.slo_ms)
    return longest


def full_batch(model: ModelSpec) -> int:
    """The largest batch ``model``'s policy cuts (its cap's bound for a moving cap)."""
    from raysrv.batching import make_policy

    policy = make_policy(model.batching.policy, model.batching.params, model.slo_ms / 1000.0)
    return int(getattr(policy.params, "max_batch_size", policy.max_batch_size))


def auto_bound(pools: list[ResolvedPool], slo_ms: dict[str, float]) -> int:
    """The sum of :func:`admitted` over ``pools``, each model timed here at its full batch (the
    median of ``RUNS``), with the longest SLO it is served under (``slo_ms`` by model name);
    :data:`FALLBACK` if a pool cannot be timed here."""
    total = 0
    for pool in pools:
        if pool.device != "cpu" or pool.capacity_bytes is not None or not pool.pinned:
            logger.warning(
                "max_ongoing_requests: auto cannot time pool %s here (%s); using %d",
                pool.name,
                "shared" if pool.capacity_bytes is not None else pool.device,
                FALLBACK,
            )
            return FALLBACK
        for model in pool.pinned:
            size = full_batch(model)
            batch_s = median_run_s(pool, model, size, RUNS)
            total += admitted(size, batch_s, pool.workers, slo_ms[model.name] / 1000.0)
            logger.info("max_ongoing_requests: auto: %s, %d in %.2f s", model.name, size, batch_s)
    return max(1, total)
