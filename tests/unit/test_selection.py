"""Learning selection policies (clipper §5): the contract every policy owes, then each policy."""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
import pytest

from raysrv import policies
from raysrv.policies.feedback import FeedbackParams, answer, loss

MODELS = ["a", "b", "c"]


def _policy(name: str, seed: int = 0, **params: object) -> policies.SelectionPolicy:
    return policies.make_policy(name, MODELS, params, np.random.default_rng(seed))


def _feedback_loop(
    policy: policies.SelectionPolicy, n: int, right: Callable[[int, str], bool]
) -> np.ndarray:
    """``n`` queries with true label 1, each model answering 1 when ``right(t, model)`` else 0,
    feedback after each; returns the policy's errors (0/1)."""
    state = policy.init()
    errors = np.zeros(n)
    for t in range(n):
        chosen = policy.select(state, None)
        predictions = {m: {"label": int(right(t, m)), "probabilities": [0.5, 0.5]} for m in chosen}
        output, _ = policy.combine(state, None, predictions)
        errors[t] = answer(output, FeedbackParams()) != 1
        state = policy.observe(state, None, {"label": 1}, predictions)
    return errors


@pytest.mark.parametrize("name", sorted(policies.POLICIES))
def test_every_policy_keeps_the_contract(name: str) -> None:
    """Select a non-empty subset, confidence in [0, 1], a JSON state the policy does not mutate,
    and the same choices from the same seed; a policy with a fixed model chooses it alone
    every time and answers with its prediction."""
    policy, twin = _policy(name), _policy(name)
    state = policy.init()
    fixed = policy.fixed_model()
    rng = np.random.default_rng(1)
    for t in range(200):
        chosen = policy.select(state, None)
        assert chosen, "nothing selected"
        assert set(chosen) <= set(MODELS)
        assert twin.select(json.loads(json.dumps(state)), None) == chosen
        predictions = {m: {"label": int(rng.integers(3))} for m in chosen}
        output, confidence = policy.combine(state, None, predictions)
        assert 0.0 <= confidence <= 1.0
        if fixed is not None:
            assert (chosen, output, confidence) == ([fixed], predictions[fixed], 1.0)
        before = json.dumps(state)
        new = policy.observe(state, None, {"label": t % 3}, predictions)
        assert json.dumps(state) == before, "observe changed the state it was given"
        state = json.loads(json.dumps(new))
    if name == "exp3":
        p = policy.probabilities(state)  # type: ignore[attr-defined]
        assert sum(p) == pytest.approx(1.0)
        assert min(p) >= 0.01 / len(MODELS) - 1e-12


@pytest.mark.parametrize("name", ["exp3", "exp4", "epsilon_greedy", "ucb1"])
def test_learning_policies_move_to_the_right_model_and_away_when_it_fails(name: str) -> None:
    """Model b is right 95% of the time and the others 60%, until b fails at query 1,500 (right
    10%); after 500 more queries the policy is within 5 points of c, now the best."""
    noise = np.random.default_rng(3).random((3000, len(MODELS)))
    rate = {"a": 0.6, "b": 0.95, "c": 0.6}

    def right(t: int, model: str) -> bool:
        if t >= 1500:
            rate.update(b=0.1, c=0.9)
        return bool(noise[t, MODELS.index(model)] < rate[model])

    errors = _feedback_loop(_policy(name, seed=2), 3000, right)
    assert errors[1000:1500].mean() < 0.15  # found b (40% for a uniform pick)
    assert errors[2500:3000].mean() < 0.10 + 0.05  # moved to c


@pytest.mark.parametrize("name", ["exp3", "exp4", "epsilon_greedy", "ucb1"])
def test_unobserve_takes_the_last_feedback_back_exactly(name: str) -> None:
    """After 40 feedbacks, one more and then its ``unobserve``: the state before it, weights
    (normalised) or counts and losses, to rounding; the feedback had moved it."""
    policy, rng = _policy(name), np.random.default_rng(4)
    state = policy.init()
    for _ in range(40):
        chosen = policy.select(state, None)
        predictions = {m: {"label": int(rng.integers(3))} for m in chosen}
        state = policy.observe(state, None, {"label": int(rng.integers(3))}, predictions)
    predictions = {m: {"label": 1} for m in policy.select(state, None)}
    moved = policy.observe(state, None, 2, predictions)
    back = policy.unobserve(moved, None, 2, predictions)

    def seen(s: dict[str, list[float]]) -> list[float]:
        if "log_weights" in s:
            w = np.exp(np.asarray(s["log_weights"]))
            return list(w / w.sum())
        return s["counts"] + s["losses"]

    assert seen(back) == pytest.approx(seen(state), abs=1e-12)
    assert seen(moved) != pytest.approx(seen(state), abs=1e-6)


def test_exp3_draws_by_weight_and_charges_the_model_that_answered() -> None:
    policy = _policy("exp3", eta=0.5, gamma=0.0, share=0.0)
    state = policy.init()
    assert policy.probabilities(state) == pytest.approx([1 / 3] * 3)  # type: ignore[attr-defined]
    state = policy.observe(state, None, 1, {"a": 0})
    p = policy.probabilities(state)  # type: ignore[attr-defined]
    # s_a <- exp(-eta * 1 / (1/3)) = exp(-1.5), the others keep 1
    assert p[0] == pytest.approx(np.exp(-1.5) / (np.exp(-1.5) + 2))
    assert p[1] == p[2]
    counts = np.bincount(
        [MODELS.index(policy.select(state, None)[0]) for _ in range(4000)], minlength=3
    )
    assert counts[0] / 4000 == pytest.approx(p[0], abs=0.02)


def test_exp4_votes_by_weight_and_reports_agreement_as_confidence() -> None:
    policy = _policy("exp4", eta=1.0, share=0.0)
    state = policy.init()
    assert policy.select(state, None) == MODELS
    assert policy.combine(state, None, {"a": 2, "b": 2, "c": 5}) == (2, pytest.approx(2 / 3))
    for _ in range(3):  # a and b keep being wrong
        state = policy.observe(state, None, 5, {"a": 2, "b": 2, "c": 5})
    assert policy.combine(state, None, {"a": 2, "b": 2, "c": 5}) == (5, pytest.approx(1 / 3))
    # a missing prediction counts as disagreeing (clipper §5.2.2), answers keep their shape
    output, confidence = policy.combine(state, None, {"a": {"label": 7}, "b": {"label": 7}})
    assert output == {"label": 7}
    assert confidence == pytest.approx(2 / 3)


def test_exp4_does_not_charge_a_model_that_did_not_answer() -> None:
    policy = _policy("exp4", share=0.0)
    state = policy.observe(policy.init(), None, 1, {"a": 1, "b": 0})
    w = policy.weights(state)  # type: ignore[attr-defined]
    assert w["a"] == pytest.approx(w["c"])
    assert w["b"] < w["a"]


def test_numbers_combine_by_weighted_mean_and_agree_within_the_tolerance() -> None:
    policy = _policy("exp4", loss="squared", loss_scale=4.0, tolerance=0.5)
    output, confidence = policy.combine(policy.init(), None, {"a": 1.0, "b": 1.2, "c": 2.3})
    assert output == pytest.approx(1.5)
    assert confidence == pytest.approx(2 / 3)  # 1.0 and 1.2 within 0.5 of 1.5


def test_losses_read_labels_scores_and_numbers() -> None:
    labels = FeedbackParams()
    assert loss({"label": 3, "probabilities": [0.1]}, 3, labels) == 0.0
    assert loss([0.1, 0.7, 0.2], {"label": 1}, labels) == 0.0  # class scores: the argmax
    assert loss(np.int64(2), 2.0, labels) == 0.0
    assert loss("cat", "dog", labels) == 1.0
    numbers = FeedbackParams(loss="squared", loss_scale=4.0)
    assert loss(1.0, 2.0, numbers) == pytest.approx(0.25)
    assert loss([5.0], 0.0, numbers) == 1.0  # capped
    with pytest.raises(ValueError, match="'score' in \\['label'\\]"):
        loss({"label": 1}, 1, FeedbackParams(field="score"))
    with pytest.raises(ValueError, match="one number"):
        loss([1.0, 2.0], 1.0, numbers)


def test_mean_loss_bandits_try_every_model_first() -> None:
    for name in ("epsilon_greedy", "ucb1"):
        policy = _policy(name)
        state = policy.init()
        seen = []
        for _ in MODELS:
            (model,) = policy.select(state, None)
            seen.append(model)
            state = policy.observe(state, None, 1, {model: 1})
        assert seen == MODELS, name


def test_bad_parameters_name_the_field_and_value() -> None:
    with pytest.raises(ValueError, match="gamma"):
        _policy("exp3", gamma=1.5)
    with pytest.raises(ValueError, match="loss"):
        _policy("exp4", loss="hinge")


def test_only_a_policy_that_always_chooses_one_model_has_a_fixed_model() -> None:
    assert _policy("single").fixed_model() == "a"
    assert _policy("single", model="c").fixed_model() == "c"
    fixed = {name for name in policies.POLICIES if _policy(name).fixed_model() is not None}
    assert fixed == {"single"}

    class Rotating(policies.SinglePolicy):  # a plugin that chooses otherwise
        def select(self, state: policies.State, x: object) -> list[str]:
            return [self.models[len(state) % len(self.models)]]

    rotating = Rotating(MODELS, policies.SinglePolicy.Params(), np.random.default_rng(0))
    assert rotating.fixed_model() is None
