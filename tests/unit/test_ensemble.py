"""Ensembles in the ingress: straggler mitigation at the deadline (clipper §5.2.2), the default
answer below the confidence threshold (§5.2.1), and feedback reaching the policy (§4.2)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from raysrv._server import Server
from raysrv.config import RaysrvSpec
from raysrv.errors import BadRequest, DeadlineExpired
from raysrv.state import MemoryStore
from raysrv.testing import LabelModel, fake_workers, model_spec, spec

LABELS = {"fast-a": 1, "fast-b": 1, "slow": 2}


def _server(slow_s: float, **app: Any) -> Server:
    models = [
        model_spec(m, source="raysrv.testing:LabelModel", init_kwargs={"label": label})
        for m, label in LABELS.items()
    ]
    ensemble = {
        "name": "vote",
        "models": list(LABELS),
        "selection": {"policy": "exp4"},
        "cache_size": 0,
        **app,
    }
    parsed = RaysrvSpec.model_validate(spec(models, [ensemble]))
    execute = {
        m: fake_workers(LabelModel(label), slow_s if m == "slow" else 0.0)
        for m, label in LABELS.items()
    }
    return Server(parsed, execute)


def test_the_ensemble_answers_at_the_deadline_without_the_straggler() -> None:
    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        server = _server(slow_s=0.5)
        try:
            mitigated = await server.predict("vote", [0, 0, 0, 0], slo_ms=50)
            waited = await server.predict("vote", [1, 0, 0, 0], best_effort=True)
        finally:
            await server.close()
        return mitigated, waited

    mitigated, waited = asyncio.run(scenario())
    assert mitigated["missing"] == ["slow"]
    assert mitigated["output"] == {"label": 1}
    assert mitigated["confidence"] == pytest.approx(2 / 3)  # the missing model disagrees
    assert waited["missing"] == []  # a caller who waits gets every model
    assert waited["confidence"] == pytest.approx(2 / 3)  # slow answered 2


def test_an_ensemble_with_no_prediction_by_the_deadline_fails_with_504() -> None:
    async def scenario() -> None:
        models = [model_spec(m, source="raysrv.testing:LabelModel") for m in ("x", "y")]
        app = {"name": "both", "models": ["x", "y"], "selection": {"policy": "exp4"}}
        parsed = RaysrvSpec.model_validate(spec(models, [app]))
        server = Server(parsed, {m: fake_workers(LabelModel(), 0.3) for m in ("x", "y")})
        try:
            with pytest.raises(DeadlineExpired):
                await server.predict("both", [0, 0, 0, 0], slo_ms=30)
        finally:
            await server.close()

    asyncio.run(scenario())


def test_below_the_threshold_the_app_answers_its_default_flagged() -> None:
    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        server = _server(0.0, confidence_threshold=0.9, default_output={"label": -1})
        try:
            split = await server.predict("vote", [0, 0, 0, 0])  # 2 of 3 agree
        finally:
            await server.close()
        server = _server(0.0, confidence_threshold=0.5, default_output={"label": -1})
        try:
            agreed = await server.predict("vote", [0, 0, 0, 0])
        finally:
            await server.close()
        return split, agreed

    split, agreed = asyncio.run(scenario())
    assert split["default"] is True
    assert split["output"] == {"label": -1}
    assert split["confidence"] == pytest.approx(2 / 3)
    assert agreed["default"] is False
    assert agreed["output"] == {"label": 1}


def test_a_threshold_without_a_default_answer_is_a_config_error() -> None:
    models = [model_spec("x")]
    app = {"name": "x", "models": ["x"], "confidence_threshold": 0.5}
    with pytest.raises(ValueError, match="confidence_threshold 0.5 needs a default_output"):
        RaysrvSpec.model_validate(spec(models, [app]))


def test_feedback_moves_the_ensemble_to_the_models_that_were_right() -> None:
    async def scenario() -> list[dict[str, Any]]:
        server = _server(slow_s=0.0)
        answers = []
        try:
            for i in range(6):
                answer = await server.predict("vote", [i, 0, 0, 0], context="u1")
                answers.append(answer)
                await server.feedback("vote", answer["query_id"], {"label": 2})
            answers.append(await server.predict("vote", [9, 0, 0, 0], context="other"))
        finally:
            await server.close()
        return answers

    answers = asyncio.run(scenario())
    assert answers[0]["output"] == {"label": 1}  # two models against one, equal weights
    assert answers[5]["output"] == {"label": 2}  # only "slow" was right: it carries the vote
    assert answers[6]["output"] == {"label": 1}  # another context learned nothing yet


def test_a_label_the_policy_cannot_read_is_a_400_and_learning_goes_on() -> None:
    async def scenario() -> None:
        server = _server(slow_s=0.0)
        try:
            answer = await server.predict("vote", [0, 0, 0, 0])
            with pytest.raises(BadRequest, match="'name'"):
                await server.feedback("vote", answer["query_id"], {"name": "two"})
            ack = await server.feedback("vote", answer["query_id"], {"label": 2})
            assert ack["accepted"] is True
        finally:
            await server.close()

    asyncio.run(scenario())


class _CountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.state_reads = 0

    async def get_state(self, app: str, context: str) -> Any:
        self.state_reads += 1
        return await super().get_state(app, context)


def test_only_a_policy_that_learns_has_its_state_read_for_each_query() -> None:
    models = [model_spec("x"), model_spec("y")]
    apps = [
        {"name": "one", "models": ["x"]},  # single: feedback changes nothing
        {"name": "both", "models": ["x", "y"], "selection": {"policy": "exp4"}},
    ]
    store = _CountingStore()

    async def scenario() -> None:
        parsed = RaysrvSpec.model_validate(spec(models, apps))
        server = Server(parsed, {m: fake_workers(LabelModel()) for m in ("x", "y")}, store)
        try:
            for app in ("one", "one", "both"):
                await server.predict(app, [1, 0, 0, 0])
            single = await server.predict("one", [1, 0, 0, 0])
            await server.feedback("one", single["query_id"], {"label": 1})  # still taken
        finally:
            await server.close()

    asyncio.run(scenario())
    assert store.state_reads == 1
