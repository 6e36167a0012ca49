"""``single``: always the same model (the app's first model unless ``model`` names another)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import Field

from raysrv.policies.base import SelectionParams, SelectionPolicy, State

__all__ = ["SingleParams", "SinglePolicy"]


class SingleParams(SelectionParams):
    model: str | None = Field(None, description="The model to serve; default: the app's first.")


class SinglePolicy(SelectionPolicy):
    name = "single"
    Params = SingleParams
    params: SingleParams

    @classmethod
    def check(cls, models: Sequence[str], params: SingleParams) -> None:  # type: ignore[override]
        if params.model is not None and params.model not in models:
            raise ValueError(
                f"model {params.model!r} is not one of the app's models {list(models)}"
            )

    def select(self, state: State, x: Any) -> list[str]:
        return [self.params.model or self.models[0]]

    def fixed_model(self) -> str | None:
        """Its model, unless a subclass chooses or combines otherwise."""
        kind = type(self)
        if kind.select is not SinglePolicy.select or kind.combine is not SelectionPolicy.combine:
            return None
        return self.params.model or self.models[0]
