"""Partitioned models (gillis §III-IV): layer grouping, parallelization options, the performance
model and the latency-optimal planner, and plans run fork-join in one process. No Ray import.

* An ONNX model as a linear sequence of layers with shapes, FLOPs, weights and the options each
  allows (gillis §III-C): :mod:`.graph`; what each shard of a group computes and holds:
  :mod:`.shards`.
* The performance model (gillis §IV-A): :mod:`.perf`; measuring it on this machine:
  :mod:`.profile`.
* The latency-optimal dynamic program (gillis §IV-B, eq. 1-2, Algorithm 1) and a brute force to
  check it: :mod:`.latency`.
* A plan's shards as ONNX models of their own, run fork-join on threads: :mod:`.local`.

* The SLO-aware planner (gillis §IV-C, eq. 3-4: REINFORCE, a partitioner and a placer) and a
  random search to compare it with: :mod:`.slo`.
* The entry point, :func:`plan`, and the memory check of ``raysrv validate``: :mod:`.planner`.

Serving a plan on Ray (the leader a model's worker, the other shards actors in its placement
group) is :mod:`raysrv._partitioned`. Measured: bench/RESULTS.md, "Partitioned models".
"""

from raysrv.partitioning.graph import Layer, Rows, layers, options, weight_bytes
from raysrv.partitioning.latency import Plan, Stage, brute_force, latency_optimal
from raysrv.partitioning.perf import PerfModel, fit_kind
from raysrv.partitioning.planner import check_fits, plan
from raysrv.partitioning.shards import Shard, shards
from raysrv.partitioning.slo import Search, random_search, slo_aware

__all__ = [
    "Layer",
    "PerfModel",
    "Plan",
    "Search",
    "Rows",
    "Shard",
    "Stage",
    "brute_force",
    "check_fits",
    "fit_kind",
    "latency_optimal",
    "layers",
    "options",
    "plan",
    "random_search",
    "shards",
    "slo_aware",
    "weight_bytes",
]
