"""The entry point: an ONNX model file planned for ``workers`` workers of ``memory_limit_mb``
each, on the performance model of the machine at hand (:func:`.profile.profile`, about a
second for a small model) unless one is given.

* ``objective="latency"``: the DP's plan (gillis §IV-B); with ``slo_ms``, refused if even it
  misses the SLO.
* ``objective="cost"``: the cheapest plan within ``slo_ms`` (gillis §IV-C, eq. 3) of the one the
  REINFORCE planner learns (:func:`.slo.slo_aware`) and the DP's, which is within the SLO
  wherever any plan is: the learned plan is kept only where it is cheaper.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal

from raysrv.analytics.forkjoin import EMG
from raysrv.partitioning.graph import layers
from raysrv.partitioning.latency import Plan, latency_optimal
from raysrv.partitioning.perf import PerfModel
from raysrv.partitioning.slo import slo_aware

__all__ = ["MIB", "Objective", "check_fits", "plan"]

MIB = 1 << 20
Objective = Literal["latency", "cost"]


def plan(
    model_path: str | Path,
    workers: int,
    memory_limit_mb: float,
    objective: Objective = "latency",
    slo_ms: float | None = None,
    perf: PerfModel | None = None,
    seed: int = 0,
) -> Plan:
    """The plan of ``model_path`` for ``objective`` (see the module docstring); ValueError,
    saying why, where no plan fits the memory or meets the SLO."""
    if objective not in ("latency", "cost"):
        raise ValueError(f"objective must be 'latency' or 'cost', got {objective!r}")
    if objective == "cost" and slo_ms is None:
        raise ValueError("objective 'cost' needs slo_ms: the latency the cheapest plan must meet")
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    if perf is None:
        from raysrv.partitioning.profile import profile

        perf = profile(model_path, workers=workers)
    found = layers(model_path)
    limit = int(memory_limit_mb * MIB)
    fastest = latency_optimal(found, perf, workers, limit)
    chosen = fastest
    if slo_ms is not None and fastest.predicted_latency_s * 1e3 > slo_ms:
        raise ValueError(
            f"no plan meets slo_ms {slo_ms:g}: the fastest that fits {memory_limit_mb:g} MiB a "
            f"shard with {workers} workers is predicted at "
            f"{fastest.predicted_latency_s * 1e3:.3g} ms"
        )
    if objective == "cost":
        assert slo_ms is not None
        learned = slo_aware(found, perf, workers, limit, slo_ms / 1e3, seed=seed).plan
        if learned is not None and learned.cost_s < fastest.cost_s:
            chosen = learned
    return dataclasses.replace(chosen, model=str(model_path))


def check_fits(model_path: str | Path, workers: int, memory_limit_mb: float) -> Plan:
    """A plan of ``model_path`` whose every shard, and whose leader's shards together, fit
    ``memory_limit_mb`` with ``workers`` workers, found without profiling (on a nominal
    machine: whether one fits does not depend on run times); ValueError if none does."""
    nominal = PerfModel({"default": (1e-6, 1e9)}, 1e9, EMG(1e-4, 1e-5, 1e-5))
    try:
        return latency_optimal(layers(model_path), nominal, workers, int(memory_limit_mb * MIB))
    except ValueError:
        raise ValueError(
            f"no plan fits {memory_limit_mb:g} MiB a shard with {workers} workers: some layer "
            "cannot be split small enough (raise memory_limit_mb or workers)"
        ) from None
