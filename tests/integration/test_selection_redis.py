"""Per-context selection state in a real Redis (clipper §5.3): it outlives the ingress that
learned it, and each context keeps its own."""

from __future__ import annotations

import asyncio
from typing import Any

from raysrv._server import Server
from raysrv.config import RaysrvSpec
from raysrv.state import make_store
from raysrv.testing import LabelModel, fake_workers, model_spec, spec

LABELS = {"one": 1, "two": 2, "three": 3}


def _server(redis_url: str) -> Server:
    models = [model_spec(m, source="raysrv.testing:LabelModel") for m in LABELS]
    app = {"name": "pick", "models": list(LABELS), "selection": {"policy": "exp4"}}
    parsed = RaysrvSpec.model_validate(spec(models, [{**app, "cache_size": 0}], state=redis_url))
    execute = {m: fake_workers(LabelModel(label)) for m, label in LABELS.items()}
    return Server(parsed, execute, store=make_store(redis_url))


def test_learned_state_survives_an_ingress_restart_per_context(redis_url: str) -> None:
    async def scenario() -> list[Any]:
        first = _server(redis_url)
        try:
            for i in range(8):  # user-3 is always right with model "three", user-2 with "two"
                for user, label in (("user-3", 3), ("user-2", 2)):
                    answer = await first.predict("pick", [i, 0, 0, 0], context=user)
                    await first.feedback("pick", answer["query_id"], label)
        finally:
            await first.close()
        restarted = _server(redis_url)  # a new ingress: nothing in its memory
        try:
            return [
                (await restarted.predict("pick", [0, 0, 0, 1], context=user))["output"]
                for user in ("user-3", "user-2", "newcomer")
            ]
        finally:
            await restarted.close()

    assert asyncio.run(scenario()) == [{"label": 3}, {"label": 2}, {"label": 1}]
