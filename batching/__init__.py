"""Batching policies behind one interface (:mod:`raysrv.batching.base`), found by name.

``policy: fixed`` / ``aimd`` / ``quantile`` / ``delayed`` / ``deadline`` / ``ctmc`` in the
config, or an import path ``"pkg.mod:MyPolicy"`` to a :class:`BatchingPolicy` subclass.
The policies that plan with scipy (``quantile``, ``delayed``, ``ctmc``) are imported when first
named, so that a process that uses none of them, such as a starting ingress replica, does not
pay for scipy's import (about 0.7 s here).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from raysrv._plugins import LazyClasses, import_object, resolve
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

_LATER = {  # module attributes imported when first read
    name: f"raysrv.batching.{module}:{name}"
    for module, names in {
        "ctmc": ("CTMCParams", "CTMCPolicy"),
        "clipper": ("DelayedParams", "DelayedPolicy", "QuantileParams", "QuantilePolicy"),
    }.items()
    for name in names
}
POLICIES = LazyClasses(
    {
        FixedPolicy.name: FixedPolicy,
        AIMDPolicy.name: AIMDPolicy,
        DeadlinePolicy.name: DeadlinePolicy,
        "ctmc": _LATER["CTMCPolicy"],
        "delayed": _LATER["DelayedPolicy"],
        "quantile": _LATER["QuantilePolicy"],
    }
)


def __getattr__(name: str) -> Any:
    if name in _LATER:
        return import_object(_LATER[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def policy_class(name: str) -> type[BatchingPolicy]:
    """The batching policy class registered as ``name`` or imported from an import path."""
    return resolve("batching policy", name, POLICIES, BatchingPolicy)


def make_policy(name: str, params: Mapping[str, Any], slo_s: float) -> BatchingPolicy:
    """Build a policy from its config: ``name``, raw ``params`` (validated here) and the SLO."""
    cls = policy_class(name)
    return cls(cls.Params.model_validate(dict(params)), slo_s)
