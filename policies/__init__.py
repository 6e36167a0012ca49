"""Model selection policies (clipper §5) behind one interface, found by name or import path."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from raysrv._plugins import resolve
from raysrv.policies.base import SelectionParams, SelectionPolicy, State
from raysrv.policies.exp3 import Exp3Params, Exp3Policy
from raysrv.policies.exp4 import Exp4Params, Exp4Policy
from raysrv.policies.feedback import FeedbackParams
from raysrv.policies.means import (
    EpsilonGreedyParams,
    EpsilonGreedyPolicy,
    Ucb1Params,
    Ucb1Policy,
)
from raysrv.policies.single import SingleParams, SinglePolicy
from raysrv.policies.split import SplitParams, SplitPolicy

__all__ = [
    "POLICIES",
    "EpsilonGreedyParams",
    "EpsilonGreedyPolicy",
    "Exp3Params",
    "Exp3Policy",
    "Exp4Params",
    "Exp4Policy",
    "FeedbackParams",
    "SelectionParams",
    "SelectionPolicy",
    "SingleParams",
    "SinglePolicy",
    "SplitParams",
    "SplitPolicy",
    "State",
    "Ucb1Params",
    "Ucb1Policy",
    "make_policy",
    "policy_class",
]

POLICIES: dict[str, type[SelectionPolicy]] = {
    SinglePolicy.name: SinglePolicy,
    SplitPolicy.name: SplitPolicy,
    Exp3Policy.name: Exp3Policy,
    Exp4Policy.name: Exp4Policy,
    EpsilonGreedyPolicy.name: EpsilonGreedyPolicy,
    Ucb1Policy.name: Ucb1Policy,
}


def policy_class(name: str) -> type[SelectionPolicy]:
    """The selection policy class registered as ``name`` or imported from an import path."""
    return resolve("selection policy", name, POLICIES, SelectionPolicy)


def make_policy(
    name: str, models: Sequence[str], params: Mapping[str, Any], rng: np.random.Generator
) -> SelectionPolicy:
    """Build a selection policy from its config, validating ``params`` against the models."""
    cls = policy_class(name)
    validated = cls.Params.model_validate(dict(params))
    cls.check(models, validated)
    return cls(models, validated, rng)
