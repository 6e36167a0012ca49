"""Selection policies: single and split, and the registry."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from pydantic import ValidationError

from raysrv import policies


def _rng() -> np.random.Generator:
    return np.random.default_rng(7)


def test_single_serves_its_model_and_combines_to_it() -> None:
    policy = policies.make_policy("single", ["a", "b"], {"model": "b"}, _rng())
    state = policy.init()
    assert policy.select(state, None) == ["b"]
    assert policy.combine(state, None, {"b": 3}) == (3, 1.0)
    assert policies.make_policy("single", ["a", "b"], {}, _rng()).select(state, None) == ["a"]
    with pytest.raises(ValueError, match="'c' is not one of"):
        policies.make_policy("single", ["a", "b"], {"model": "c"}, _rng())


def test_split_follows_the_weights() -> None:
    policy = policies.make_policy("split", ["a", "b", "c"], {"weights": {"a": 3, "b": 1}}, _rng())
    counts = Counter(policy.select({}, None)[0] for _ in range(4000))
    assert counts["c"] == 0
    assert 0.72 < counts["a"] / 4000 < 0.78


def test_split_defaults_to_even_shares() -> None:
    policy = policies.make_policy("split", ["a", "b"], {}, _rng())
    counts = Counter(policy.select({}, None)[0] for _ in range(4000))
    assert 0.46 < counts["a"] / 4000 < 0.54


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"weights": {"a": -1, "b": 1}}, "must be >= 0"),
        ({"weights": {"a": 0, "b": 0}}, "must not all be zero"),
        ({"weights": {"z": 1}}, r"\['z'\]"),
        ({"weight": {"a": 1}}, "Extra inputs"),
    ],
)
def test_split_rejects_bad_weights(params: dict, message: str) -> None:
    with pytest.raises((ValueError, ValidationError), match=message):
        policies.make_policy("split", ["a", "b"], params, _rng())


def test_registry_and_feedback_default() -> None:
    with pytest.raises(ValueError, match="known: epsilon_greedy, exp3, exp4, single, split, ucb1"):
        policies.policy_class("exp5")
    policy = policies.make_policy("split", ["a", "b"], {}, _rng())
    state = policy.init()
    assert policy.observe(state, None, 1, {"a": 1}) == state
