"""What the learning selection policies share: answers, losses, votes and exponential weights.

Clipper's policies learn from a loss ``L(y, ŷ) in [0, 1]`` of each prediction against the
feedback (Clipper, NSDI'17, §5.1). Two losses, chosen per app: ``zero_one`` for labels (1 when
the predicted label is not the feedback's) and ``squared`` for numbers (``(y - ŷ)^2 /
loss_scale``, capped at 1). A model's prediction is read as an answer the same way everywhere:

- a mapping (a model with several outputs, such as the digits models' ``label`` and
  ``probabilities``): its ``field`` entry, read as below;
- an array of more than one number: for labels, the index of its largest entry (class scores);
- anything else: the value itself (a one-element array counts as its element).

Feedback is read the same way, so ``3`` and ``{"label": 3}`` are the same feedback.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
from pydantic import Field

from raysrv.policies.base import SelectionParams

__all__ = [
    "FeedbackParams",
    "agreement",
    "answer",
    "check_label",
    "loss",
    "mix_weights",
    "shared_undo",
    "shared_update",
    "unshare",
    "vote",
]


class FeedbackParams(SelectionParams):
    """How predictions and feedback are read and scored (shared by the learning policies)."""

    loss: Literal["zero_one", "squared"] = Field(
        "zero_one", description="zero_one for labels, squared for numbers (clipper §5.1's L)."
    )
    loss_scale: float = Field(
        1.0, gt=0.0, description="squared: the squared error that counts as a whole loss of 1."
    )
    field: str = Field(
        "label", min_length=1, description="The output holding the answer, for models with several."
    )
    tolerance: float = Field(
        0.0,
        ge=0.0,
        description="squared: predictions within this of the combined answer agree with it.",
    )


def answer(value: Any, params: FeedbackParams) -> Any:
    """The answer ``value`` (a prediction or a feedback) stands for; raises ``ValueError``."""
    if isinstance(value, Mapping):
        if params.field not in value:
            raise ValueError(f"no {params.field!r} in {sorted(value)} (set the policy's field)")
        value = value[params.field]
    array = np.asarray(value)
    if array.dtype.kind in "US" and array.ndim == 0:
        return array.item()  # a string label
    if array.dtype.kind not in "biuf":
        raise ValueError(f"cannot read an answer from {value!r}")
    if array.size > 1:
        if params.loss == "squared":
            raise ValueError(f"a squared loss needs one number per prediction, got {value!r}")
        return int(np.argmax(array))
    item = array.reshape(-1)[0].item() if array.size == 1 else None
    if item is None:
        raise ValueError(f"cannot read an answer from an empty {value!r}")
    if params.loss == "zero_one" and float(item).is_integer():
        return int(item)
    return item


def check_label(
    feedback: Any, predictions: Mapping[str, Any], params: FeedbackParams | None
) -> None:
    """Raise ``ValueError`` unless ``feedback`` fits each prediction. With ``params`` (a policy
    that reads labels), it must read as an answer of the kind the prediction reads as: text
    for models that answer text, a number for models that answer numbers or class scores; a
    prediction that does not read as an answer sets no kind. Without (a policy that reads no
    labels), a label must be of the kind of one of the prediction's outputs, and a mapping
    label may only name its outputs, each with a value of that output's kind."""
    if params is None:
        for model, prediction in predictions.items():
            _fits_outputs(feedback, prediction, model)
        return
    truth = answer(feedback, params)
    for model, prediction in predictions.items():
        try:
            predicted = answer(prediction, params)
        except ValueError:
            continue
        if isinstance(predicted, str) != isinstance(truth, str):
            kind, answers = ("text", "numbers") if isinstance(truth, str) else ("number", "text")
            raise ValueError(f"a {kind} label for model {model!r}, which answers {answers}")


def _fits_outputs(feedback: Any, prediction: Any, model: str) -> None:
    outputs = prediction if isinstance(prediction, Mapping) else {"output": prediction}
    if isinstance(feedback, Mapping):
        unknown = sorted(set(feedback) - set(outputs))
        if unknown:
            raise ValueError(f"{unknown} are not outputs of model {model!r}: {sorted(outputs)}")
        pairs = [(feedback[name], [outputs[name]]) for name in feedback]
    else:
        pairs = [(feedback, list(outputs.values()))]
    for value, candidates in pairs:
        kind = _kind(value)
        if kind is None or not any(_fit(kind, _kind(c)) for c in candidates):
            raise ValueError(f"{value!r} is of no kind model {model!r} answers")


def _kind(value: Any) -> str | None:
    """``text``, ``number``, ``numbers`` (a flat list of them) or None for anything else."""
    if isinstance(value, Mapping):
        return None
    array = np.asarray(value)
    if array.dtype.kind in "US" and array.ndim == 0:
        return "text"
    if array.dtype.kind in "biuf":
        return "number" if array.ndim == 0 else "numbers"
    return None


def _fit(label: str, output: str | None) -> bool:
    """A label fits an output of its kind, and a number fits class scores (their index)."""
    return label == output or (label == "number" and output == "numbers")


def loss(prediction: Any, feedback: Any, params: FeedbackParams) -> float:
    """``L(y, ŷ)`` in [0, 1] of one prediction against the feedback."""
    predicted, truth = answer(prediction, params), answer(feedback, params)
    if params.loss == "zero_one":
        return 0.0 if predicted == truth else 1.0
    return min(1.0, (float(predicted) - float(truth)) ** 2 / params.loss_scale)


def vote(answers: Mapping[str, Any], weights: Mapping[str, float], params: FeedbackParams) -> Any:
    """The weighted combination of the answers that arrived: the label with the most weight, or
    the weighted mean of numbers. Missing models are left out, which for a vote is the same as
    clipper §5.2.2's "substitute missing predictions with their average value"."""
    if params.loss == "squared":
        w = np.array([weights[m] for m in answers])
        values = np.array([float(a) for a in answers.values()])
        return float(np.dot(w, values) / w.sum()) if w.sum() > 0 else float(values.mean())
    totals: dict[Any, float] = {}
    for model, label in answers.items():  # ties go to the label seen first
        totals[label] = totals.get(label, 0.0) + weights[model]
    return max(totals, key=totals.__getitem__)


def agreement(answers: Mapping[str, Any], combined: Any, of: int, params: FeedbackParams) -> float:
    """Confidence (clipper §5.2.1): the share of the ``of`` models asked whose answer agrees
    with ``combined``; a missing prediction counts as disagreeing (§5.2.2)."""
    if params.loss == "squared":
        agree = sum(abs(float(a) - combined) <= params.tolerance for a in answers.values())
    else:
        agree = sum(a == combined for a in answers.values())
    return agree / of


def shared_update(
    log_weights: Sequence[float], losses: Sequence[float], eta: float, share: float
) -> list[float]:
    """One exponential-weights step, ``s_i <- s_i exp(-eta L_i)`` (clipper §5.1, §5.2), then a
    fixed share: every model gets back ``share`` of the total weight, split evenly (Auer et al.'s
    Exp3.S, clipper's ref. [6] §8). The share keeps a failed model's weight from sinking so far
    that its recovery goes unnoticed. Log weights are kept, shifted so the largest is 0."""
    logw = np.asarray(log_weights, dtype=float) - eta * np.asarray(losses, dtype=float)
    if share > 0.0:
        w = mix_weights(logw, share)
        logw = np.log(w)
    return (logw - logw.max()).tolist()


def unshare(log_weights: Sequence[float], share: float) -> np.ndarray:
    """The log weights before :func:`shared_update`'s fixed share of ``share`` was handed back
    (the mix solved for the weights it mixed; a weight it cannot have come from is kept at a
    trillionth of the largest)."""
    w = mix_weights(log_weights, 0.0)
    if share > 0.0:
        w = (w - share / w.size) / (1.0 - share)
    return np.log(np.maximum(w, w.max() * 1e-12))


def shared_undo(
    log_weights: Sequence[float], losses: Sequence[float], eta: float, share: float
) -> list[float]:
    """The inverse of :func:`shared_update` with the same losses: the share taken back, then
    ``s_i <- s_i exp(eta L_i)``."""
    logw = unshare(log_weights, share) + eta * np.asarray(losses, dtype=float)
    return (logw - logw.max()).tolist()


def mix_weights(log_weights: Sequence[float] | np.ndarray, uniform: float) -> np.ndarray:
    """The normalised weights, mixed with ``uniform`` of the uniform distribution."""
    logw = np.asarray(log_weights, dtype=float)
    w = np.exp(logw - logw.max())
    return (1.0 - uniform) * w / w.sum() + uniform / w.size
