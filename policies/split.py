"""``split``: weighted A/B testing; each query goes to one model drawn with the given weights.

Weights need not sum to 1 (they are normalised); a model missing from ``weights`` gets none.
Without ``weights`` traffic is split evenly. Feedback does not move the split (bandits do that).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from pydantic import Field, field_validator

from raysrv.policies.base import SelectionParams, SelectionPolicy, State

__all__ = ["SplitParams", "SplitPolicy"]


class SplitParams(SelectionParams):
    weights: dict[str, float] | None = Field(
        None, description="Relative share of traffic per model; default: equal shares."
    )

    @field_validator("weights")
    @classmethod
    def _non_negative(cls, weights: dict[str, float] | None) -> dict[str, float] | None:
        if weights is None:
            return None
        bad = {m: w for m, w in weights.items() if not w >= 0}
        if bad:
            raise ValueError(f"weights must be >= 0, got {bad}")
        if sum(weights.values()) <= 0:
            raise ValueError(f"weights must not all be zero, got {weights}")
        return weights


class SplitPolicy(SelectionPolicy):
    name = "split"
    Params = SplitParams
    params: SplitParams

    def __init__(
        self, models: Sequence[str], params: SplitParams, rng: np.random.Generator
    ) -> None:
        super().__init__(models, params, rng)
        self.check(models, params)
        weights = params.weights or dict.fromkeys(models, 1.0)
        raw = np.array([weights.get(m, 0.0) for m in self.models], dtype=float)
        self._cumulative = np.cumsum(raw / raw.sum())

    @classmethod
    def check(cls, models: Sequence[str], params: SplitParams) -> None:  # type: ignore[override]
        unknown = sorted(set(params.weights or ()) - set(models))
        if unknown:
            raise ValueError(
                f"weights name models {unknown} that are not the app's models {list(models)}"
            )

    def select(self, state: State, x: Any) -> list[str]:
        index = int(np.searchsorted(self._cumulative, self.rng.random(), side="right"))
        return [self.models[min(index, len(self.models) - 1)]]
