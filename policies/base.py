"""The model selection interface of Clipper (NSDI'17, §5, Listing 2).

``init() -> S``, ``select(S, x) -> models``, ``combine(S, x, predictions) -> (y, confidence)``,
``observe(S, x, feedback, predictions) -> S``. The state ``S`` is kept outside the policy (one per
application and context key, clipper §5.3) so that one policy object serves many contexts and the
state can live in a shared store; states must therefore be JSON-serialisable. Policies are pure:
randomness comes from the ``numpy.random.Generator`` they are given.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict

__all__ = ["SelectionParams", "SelectionPolicy", "State"]

State = dict[str, Any]


class SelectionParams(BaseModel):
    """Base of every selection policy's parameters: immutable, validated, no unknown keys."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class SelectionPolicy(ABC):
    """Chooses which of an application's models answer a query and how to merge their answers."""

    name: ClassVar[str] = ""
    Params: ClassVar[type[SelectionParams]] = SelectionParams

    def __init__(
        self, models: Sequence[str], params: SelectionParams, rng: np.random.Generator
    ) -> None:
        if not models:
            raise ValueError("a selection policy needs at least one model")
        self.models = tuple(models)
        self.params = params
        self.rng = rng

    @classmethod
    def check(cls, models: Sequence[str], params: SelectionParams) -> None:
        """Raise ``ValueError`` if ``params`` do not fit ``models`` (called at config time)."""
        del models, params  # every fit by default

    def init(self) -> State:
        """The initial state of one context."""
        return {}

    @abstractmethod
    def select(self, state: State, x: Any) -> list[str]:
        """The models to query for ``x`` (a non-empty subset of ``self.models``)."""

    def combine(self, state: State, x: Any, predictions: Mapping[str, Any]) -> tuple[Any, float]:
        """Merge the selected models' predictions into one answer and a confidence in [0, 1].

        The default suits single-model policies: the one prediction, confidence 1.
        """
        (y,) = predictions.values()
        return y, 1.0

    def observe(self, state: State, x: Any, feedback: Any, predictions: Mapping[str, Any]) -> State:
        """The state after learning that the right answer for ``x`` was ``feedback``."""
        return state

    def unobserve(
        self, state: State, x: Any, feedback: Any, predictions: Mapping[str, Any]
    ) -> State:
        """The state with an earlier ``observe`` of the same arguments taken back (a relabelled
        feedback): its exact inverse when no other feedback of the context came between, else
        that inverse taken on the state as it is now. A policy that learns must define it for
        its apps to allow ``relabel``; one that does not learn has nothing to take back."""
        if type(self).observe is not SelectionPolicy.observe:
            raise NotImplementedError(f"selection policy {self.name!r} cannot undo a feedback")
        return state

    def fixed_model(self) -> str | None:
        """The one model :meth:`select` chooses for every query whatever its state and input,
        where :meth:`combine` answers with its prediction and confidence 1 (the default); None
        where the choice varies. The ingress then answers the app's queries as it answers the
        model's own route, with no state, selection or combination a query."""
        return None

    @classmethod
    def learns(cls) -> bool:
        """Whether feedback changes the policy's state (it defines :meth:`observe`). One that
        does not keeps its :meth:`init` state for every context, and the ingress asks no store
        for it."""
        return cls.observe is not SelectionPolicy.observe

    @classmethod
    def can_unobserve(cls) -> bool:
        """Whether the policy can take a feedback back (see :meth:`unobserve`)."""
        return not cls.learns() or cls.unobserve is not SelectionPolicy.unobserve
