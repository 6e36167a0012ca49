"""The entry point: an ONNX model file planned for ``workers`` workers of ``memory_limit_mb``
each, on the performance model of the machine at hand (:func:`.profile.profile`, about a
second for a small model) unless one is given.

* ``objective="latency"``: the DP's plan (gillis §IV-B); with ``slo_ms``, refused if even it
  misses the SLO.
* ``objective="cost"``: the cheapest plan within ``slo_ms`` (gillis §IV-C, eq. 3) of those the
  REINFORCE planner learns (:func:`.slo.slo_aware`) and the DP's, which is within the SLO
  wherever any plan is. The model errs most where shards run side by side, sharing the
  machine's memory system, which a shard timed alone does not show; so the learned plans
  cheaper than the DP's are measured, cheapest first (``CHECK_ROUNDS`` times ``check_runs``
  runs each in one process, :class:`.local.LocalPlan`), and the first whose slowest median is
  within the SLO less ``CHECK_MARGIN`` is chosen, else the DP's plan. A plan whose shards run
  side by side on every core can move by a quarter between medians of the same plan here, as
  its threads find free cores or not; the others, by a few percent. Where ``perf`` is not the
  profile's (Ray's calls and cold weights, with ``threads`` the profile's), a plan's measured
  latency counts what ``perf`` predicts beyond ``threads``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal

import numpy as np

from raysrv.analytics.forkjoin import EMG
from raysrv.partitioning.graph import layers
from raysrv.partitioning.latency import Plan, latency_optimal
from raysrv.partitioning.perf import PerfModel
from raysrv.partitioning.slo import slo_aware

__all__ = ["MIB", "Objective", "check_fits", "plan"]

MIB = 1 << 20
CHECK_RUNS = 30  # runs of each candidate plan of the cost objective timed in one process ...
CHECK_ROUNDS = 3  # ... this many times, the slowest median counted
CHECK_MARGIN = 0.05  # of the SLO a candidate's measured median leaves for the machine's drift
Objective = Literal["latency", "cost"]


def plan(
    model_path: str | Path,
    workers: int,
    memory_limit_mb: float,
    objective: Objective = "latency",
    slo_ms: float | None = None,
    perf: PerfModel | None = None,
    seed: int = 0,
    check_runs: int = CHECK_RUNS,
    threads: PerfModel | None = None,
) -> Plan:
    """The plan of ``model_path`` for ``objective`` (see the module docstring); ValueError,
    saying why, where no plan fits the memory or meets the SLO. ``check_runs`` 0: the cost
    objective's plan as predicted, unmeasured."""
    if objective not in ("latency", "cost"):
        raise ValueError(f"objective must be 'latency' or 'cost', got {objective!r}")
    if objective == "cost" and slo_ms is None:
        raise ValueError("objective 'cost' needs slo_ms: the latency the cheapest plan must meet")
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    if perf is None:
        from raysrv.partitioning.profile import profile

        perf = profile(model_path, workers=workers)
    threads = threads or perf
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
        learned = slo_aware(found, perf, workers, limit, slo_ms / 1e3, seed=seed).candidates
        for candidate in (p for p in learned if p.cost_s < fastest.cost_s):
            if check_runs == 0:
                chosen = candidate
                break
            beyond = candidate.predicted_latency_s - candidate.predicted_s(threads)
            measured = _measured_s(model_path, candidate, check_runs) + beyond
            if measured <= (1.0 - CHECK_MARGIN) * slo_ms / 1e3:
                chosen = candidate
                break
    return dataclasses.replace(chosen, model=str(model_path))


def _measured_s(model_path: str | Path, plan: Plan, runs: int) -> float:
    """The slowest of ``CHECK_ROUNDS`` medians of ``runs`` runs of ``plan`` in one process on
    a batch of one."""
    from raysrv.partitioning.local import LocalPlan
    from raysrv.partitioning.profile import measure_s

    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, *plan.layers[0].in_shape)).astype(np.float32)
    with LocalPlan(model_path, plan) as local:
        return max(measure_s(lambda: local.run(x), runs) for _ in range(CHECK_ROUNDS))


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
