"""Batching policies behind one interface (:mod:`raysrv.batching.base`), found by name.

``policy: fixed`` / ``aimd`` / ``quantile`` / ``delayed`` / ``deadline`` / ``ctmc`` in the
config, or an import path ``"pkg.mod:MyPolicy"`` to a :class:`BatchingPolicy` subclass.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from raysrv._plugins import resolve
from raysrv.batching.aimd import AIMDParams, AIMDPolicy
from raysrv.batching.base import (
    BatcherView,
    BatchingPolicy,
    BatchOutcome,
    Decision,
    Dispatch,
    PolicyParams,
    QueuedQuery,
    Reject,
    ReplicaSlot,
    Wait,
)
from raysrv.batching.clipper import DelayedParams, DelayedPolicy, QuantileParams, QuantilePolicy
from raysrv.batching.ctmc import CTMCParams, CTMCPolicy
from raysrv.batching.deadline import DeadlineParams, DeadlinePolicy
from raysrv.batching.fixed import FixedParams, FixedPolicy

__all__ = [
    "POLICIES",
    "AIMDParams",
    "AIMDPolicy",
    "BatchOutcome",
    "BatcherView",
    "CTMCParams",
    "CTMCPolicy",
    "BatchingPolicy",
    "DeadlineParams",
    "DeadlinePolicy",
    "DelayedParams",
    "DelayedPolicy",
    "Decision",
    "Dispatch",
    "FixedParams",
    "FixedPolicy",
    "PolicyParams",
    "QuantileParams",
    "QuantilePolicy",
    "QueuedQuery",
    "Reject",
    "ReplicaSlot",
    "Wait",
    "make_policy",
    "policy_class",
]

POLICIES: dict[str, type[BatchingPolicy]] = {
    FixedPolicy.name: FixedPolicy,
    AIMDPolicy.name: AIMDPolicy,
    CTMCPolicy.name: CTMCPolicy,
    DeadlinePolicy.name: DeadlinePolicy,
    DelayedPolicy.name: DelayedPolicy,
    QuantilePolicy.name: QuantilePolicy,
}


def policy_class(name: str) -> type[BatchingPolicy]:
    """The batching policy class registered as ``name`` or imported from an import path."""
    return resolve("batching policy", name, POLICIES, BatchingPolicy)


def make_policy(name: str, params: Mapping[str, Any], slo_s: float) -> BatchingPolicy:
    """Build a policy from its config: ``name``, raw ``params`` (validated here) and the SLO."""
    cls = policy_class(name)
    return cls(cls.Params.model_validate(dict(params)), slo_s)
