"""``exp3``: one model per query, chosen by Exp3 from feedback (Clipper, NSDI'17, §5.1).

State: one log weight per model (``s_i = 1`` at first). ``select`` draws model ``i`` with
probability ``p_i = (1 - gamma) s_i / sum_j s_j + gamma / k``; ``observe`` charges the model that
answered its importance-weighted loss, ``s_i <- s_i exp(-eta L(y, ŷ) / p_i)``, then hands every
model back ``share`` of the total weight (Exp3.S, clipper's ref. [6] §8).

Choices beyond clipper's text, each a parameter:
- ``gamma`` (Auer et al.'s exploration) keeps every ``p_i >= gamma / k``, which bounds the
  ``1 / p_i`` in the update and keeps a few queries on models that may have recovered
  (clipper Fig. 8, after 10k queries);
- ``share`` bounds how far a model's weight can fall behind, so a model that recovers is
  noticed. It must stay tiny: the ``1 / p_i`` of the update knocks a rarely drawn model down by
  ``eta / p_i`` per wrong answer, and a share of 0.001 per feedback already kept the weak models
  at a weight that cost a point of cumulative error and three after the failure;
- ``p_i`` is recomputed from the state at feedback time: with feedback for other queries in
  between, it is the current probability, not the one the query was drawn with. ``unobserve``
  takes the share back and solves for the weight the model had before its charge.

Cost: O(k) per select and observe. The defaults were chosen on the failure run of
``python -m bench.selection`` (eta 0.2-0.5, gamma 0.01-0.02, share 0-0.01 tried).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from pydantic import Field

from raysrv.policies.base import SelectionPolicy, State
from raysrv.policies.feedback import FeedbackParams, loss, mix_weights, shared_update, unshare

__all__ = ["Exp3Params", "Exp3Policy"]


class Exp3Params(FeedbackParams):
    eta: float = Field(0.3, gt=0.0, le=10.0, description="Learning rate η of the weights.")
    gamma: float = Field(
        0.01, ge=0.0, lt=1.0, description="Share of queries spread evenly over the models."
    )
    share: float = Field(
        1e-5, ge=0.0, lt=1.0, description="Weight handed back to every model per feedback."
    )


class Exp3Policy(SelectionPolicy):
    name = "exp3"
    Params = Exp3Params
    params: Exp3Params

    def init(self) -> State:
        return {"log_weights": [0.0] * len(self.models)}

    def probabilities(self, state: State) -> list[float]:
        """``p_i`` of every model, in the order of ``self.models``."""
        return mix_weights(state["log_weights"], self.params.gamma).tolist()

    def select(self, state: State, x: Any) -> list[str]:
        index = self.rng.choice(len(self.models), p=self.probabilities(state))
        return [self.models[int(index)]]

    def observe(self, state: State, x: Any, feedback: Any, predictions: Mapping[str, Any]) -> State:
        p = self.probabilities(state)
        losses = [0.0] * len(self.models)
        for i, model in enumerate(self.models):
            if model in predictions:
                losses[i] = loss(predictions[model], feedback, self.params) / p[i]
        logw = shared_update(state["log_weights"], losses, self.params.eta, self.params.share)
        return {**state, "log_weights": logw}

    def unobserve(
        self, state: State, x: Any, feedback: Any, predictions: Mapping[str, Any]
    ) -> State:
        logw = unshare(state["log_weights"], self.params.share)
        for i, model in enumerate(self.models):
            if model in predictions:
                logw[i] = self._before(logw, i, loss(predictions[model], feedback, self.params))
        return {**state, "log_weights": (logw - logw.max()).tolist()}

    def _before(self, logw: np.ndarray, i: int, charged: float) -> float:
        """Model ``i``'s log weight ``w`` before it was charged ``eta charged / p_i``: the one
        with ``w - eta charged / p_i(w) = logw[i]``, ``p_i(w)`` its probability at that weight
        (bisection: the left side grows with ``w``)."""
        target = float(logw[i])
        if charged == 0.0:
            return target
        eta, gamma, k = self.params.eta, self.params.gamma, len(self.models)
        rest = np.delete(logw, i)
        others = float(rest.max() + np.log(np.exp(rest - rest.max()).sum()))

        def probability(w: float) -> float:
            return (1.0 - gamma) / (1.0 + math.exp(min(others - w, 700.0))) + gamma / k

        low, high = target, target + eta * charged / probability(target)
        for _ in range(100):
            middle = (low + high) / 2.0
            if middle - eta * charged / probability(middle) < target:
                low = middle
            else:
                high = middle
        return (low + high) / 2.0
