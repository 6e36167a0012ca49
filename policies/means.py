"""``epsilon_greedy`` and ``ucb1``: the classic bandits, for comparison with Exp3 (clipper §5.1
casts model selection as a multi-armed bandit; these are the textbook answers to it).

Both keep, per model, a count of its scored predictions and the sum of their losses, each
multiplied by ``decay`` at every feedback (1: plain means; below 1: means over roughly the last
``1 / (1 - decay)`` feedbacks, so that a model that degrades or recovers is noticed: the
discounted means of Garivier and Moulines). A model not yet scored is tried first.

- ``epsilon_greedy``: with probability ``epsilon`` a model drawn evenly, else the one with the
  lowest mean loss.
- ``ucb1`` (Auer, Cesa-Bianchi and Fischer, 2002): the model with the highest
  ``1 - mean loss + c sqrt(2 ln n / n_i)``, ``n`` the (discounted) count of all feedback and
  ``n_i`` the model's.

Cost: O(k) per call. Only the model that answered learns (bandit feedback). ``unobserve``
takes the model's count and loss back, then the decay.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Mapping
from typing import Any

from pydantic import Field

from raysrv.policies.base import SelectionPolicy, State
from raysrv.policies.feedback import FeedbackParams, loss

__all__ = [
    "EpsilonGreedyParams",
    "EpsilonGreedyPolicy",
    "MeanLossPolicy",
    "Ucb1Params",
    "Ucb1Policy",
]


class _MeanParams(FeedbackParams):
    decay: float = Field(
        0.999, gt=0.0, le=1.0, description="Weight kept by past feedback at every new one."
    )


class EpsilonGreedyParams(_MeanParams):
    epsilon: float = Field(0.05, ge=0.0, le=1.0, description="Share of queries drawn evenly.")


class Ucb1Params(_MeanParams):
    c: float = Field(0.5, ge=0.0, le=10.0, description="Weight of the exploration bonus.")


class MeanLossPolicy(SelectionPolicy):
    """Keeps discounted loss sums and counts per model; subclasses choose from them."""

    params: _MeanParams

    def init(self) -> State:
        return {"counts": [0.0] * len(self.models), "losses": [0.0] * len(self.models)}

    def select(self, state: State, x: Any) -> list[str]:
        untried = [i for i, n in enumerate(state["counts"]) if n == 0.0]
        return [self.models[untried[0] if untried else self._choose(state)]]

    @abstractmethod
    def _choose(self, state: State) -> int:
        """The index of the model to ask, once every model has been scored."""

    def mean_losses(self, state: State) -> list[float]:
        return [s / n if n else 0.0 for s, n in zip(state["losses"], state["counts"], strict=True)]

    def observe(self, state: State, x: Any, feedback: Any, predictions: Mapping[str, Any]) -> State:
        decay = self.params.decay
        counts = [n * decay for n in state["counts"]]
        losses = [s * decay for s in state["losses"]]
        for i, model in enumerate(self.models):
            if model in predictions:
                counts[i] += 1.0
                losses[i] += loss(predictions[model], feedback, self.params)
        return {**state, "counts": counts, "losses": losses}

    def unobserve(
        self, state: State, x: Any, feedback: Any, predictions: Mapping[str, Any]
    ) -> State:
        counts, losses = list(state["counts"]), list(state["losses"])
        for i, model in enumerate(self.models):
            if model in predictions:
                counts[i] = max(0.0, counts[i] - 1.0)
                losses[i] = max(0.0, losses[i] - loss(predictions[model], feedback, self.params))
        decay = self.params.decay
        return {
            **state,
            "counts": [n / decay for n in counts],
            "losses": [s / decay for s in losses],
        }


class EpsilonGreedyPolicy(MeanLossPolicy):
    name = "epsilon_greedy"
    Params = EpsilonGreedyParams
    params: EpsilonGreedyParams

    def _choose(self, state: State) -> int:
        if self.rng.random() < self.params.epsilon:
            return int(self.rng.integers(len(self.models)))
        means = self.mean_losses(state)
        return means.index(min(means))


class Ucb1Policy(MeanLossPolicy):
    name = "ucb1"
    Params = Ucb1Params
    params: Ucb1Params

    def _choose(self, state: State) -> int:
        total = sum(state["counts"])
        scores = [
            1.0 - mean + self.params.c * math.sqrt(2.0 * math.log(max(total, 1.0)) / n)
            for mean, n in zip(self.mean_losses(state), state["counts"], strict=True)
        ]
        return scores.index(max(scores))
