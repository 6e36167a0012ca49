"""Hostile and malformed requests get a documented 4xx and leave the service as it was: JSON
nested past the depth limit, bodies of a content type a web page may send without asking, app
names nobody serves (the metrics' series stay bounded), and a defect inside raysrv, which is
answered as the documented JSON 500."""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

import httpx
import pytest

from raysrv._http import create_http_app
from raysrv._server import MAX_JSON_DEPTH, SHOWN_NAME, Server, json_depth
from raysrv.config import RaysrvSpec
from raysrv.errors import RaysrvError
from raysrv.metrics import UNKNOWN_APP, Metrics
from raysrv.testing import EchoModel, fake_workers, model_spec, spec

SPEC = RaysrvSpec.model_validate(spec([model_spec("a")], [{"name": "one", "models": ["a"]}]))
JSON = {"content-type": "application/json"}
INPUT = [1.0, 2.0, 3.0, 4.0]


class _Tags(Metrics):
    """The app tags requests were counted under."""

    def __init__(self) -> None:
        self.tags: list[str] = []

    def request(self, app: str, status: int, latency_s: float | None = None) -> None:
        self.tags.append(app)


async def _exchange(
    requests: list[tuple[str, bytes, dict[str, str]]],
    metrics: Metrics | None = None,
    server: Server | None = None,
) -> list[httpx.Response]:
    """POSTs each (path, body, headers) in turn to a fresh ingress, then one good prediction."""
    server = server or Server(SPEC, {"a": fake_workers(EchoModel())})
    app = create_http_app(server, 1 << 20, metrics)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://raysrv") as c:
        answers = [await c.post(path, content=body, headers=h) for path, body, h in requests]
        answers.append(await c.post("/v1/one/predict", json={"input": INPUT}))
    return answers


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_nesting_is_counted_outside_strings_and_exactly_past_the_limit() -> None:
    deep = MAX_JSON_DEPTH + 8
    assert json_depth(b'{"a": [1, [2]]}') <= MAX_JSON_DEPTH
    assert json_depth(_nested(deep).encode()) == deep
    in_string = json.dumps({"s": "[" * 100, "t": 'a\\"' + "{" * 100}).encode()
    assert json_depth(in_string) <= MAX_JSON_DEPTH
    both = json.dumps({"s": "[" * 100, "x": json.loads(_nested(deep))}).encode()
    assert json_depth(both) == deep + 1  # the body's own object too
    assert json_depth(b"[" * 100_000) == 100_000  # not JSON at all, and still counted


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 990, 100_000])
def test_json_nested_too_deep_is_a_400_on_every_route_that_reads_a_body(depth: int) -> None:
    """Python's parser meets its recursion limit near 1,000 levels; raysrv reads at most
    ``MAX_JSON_DEPTH`` and says so, and answers the next query as ever."""
    deep = _nested(depth)
    infer = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": "@"}]}
    requests = [
        ("/v1/one/predict", f'{{"input": {deep}}}', JSON),
        ("/v1/models/a/predict", f'{{"input": {deep}}}', JSON),
        ("/v1/one/feedback", f'{{"query_id": "q", "label": {deep}}}', JSON),
        ("/v2/models/a/infer", json.dumps(infer).replace('"@"', deep), JSON),
    ]
    *refused, after = asyncio.run(_exchange([(p, b.encode(), h) for p, b, h in requests]))
    for answer in refused:
        assert answer.status_code == 400
        assert "levels deep" in json.dumps(answer.json())
    assert after.status_code == 200


@pytest.mark.parametrize(
    "content_type",
    [None, "text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
     "multipart/form-data; boundary=x", "application/jsonx"],
)  # fmt: skip
def test_a_body_a_web_page_could_send_without_asking_is_a_415(content_type: str | None) -> None:
    """Browsers send a form, plain text or a body of no type to any address without a
    preflight: predictions and feedback read only JSON (predictions also raw tensors), so a
    page cannot spend the service or label its queries. An infer request of no type is read,
    as Triton's own client sends them so."""
    headers = {} if content_type is None else {"content-type": content_type}
    body = json.dumps({"input": INPUT}).encode()
    feedback = json.dumps({"query_id": "q", "label": 1}).encode()
    requests = [
        ("/v1/one/predict", body, headers),
        ("/v1/models/a/predict", body, headers),
        ("/v1/one/feedback", feedback, headers),
    ]
    if content_type is not None:
        requests.append(("/v2/models/a/infer", body, headers))
    *refused, after = asyncio.run(_exchange(requests))
    for answer in refused:
        assert answer.status_code == 415
        assert "content-type must be application/json" in json.dumps(answer.json())
    assert {a.json()["error"] for a in refused[:3]} == {"unsupported_media_type"}
    assert after.status_code == 200


def test_an_infer_request_of_no_content_type_is_read_as_tritons_client_sends_it() -> None:
    infer = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": INPUT}]}
    answer, _ = asyncio.run(_exchange([("/v2/models/a/infer", json.dumps(infer).encode(), {})]))
    assert answer.status_code == 200
    assert answer.json()["outputs"]


def test_json_types_are_read_and_raw_bytes_only_where_a_route_takes_tensors() -> None:
    body = json.dumps({"input": INPUT}).encode()
    raw = b"\x00" * 16
    binary = {"content-type": "application/octet-stream", "x-raysrv-shape": "4"}
    answers = asyncio.run(
        _exchange(
            [
                ("/v1/one/predict", body, {"content-type": "application/json; charset=utf-8"}),
                ("/v1/one/predict", body, {"content-type": "application/vnd.raysrv+json"}),
                ("/v1/one/predict", raw, binary),
                ("/v1/one/feedback", raw, binary),
            ]
        )
    )
    assert [a.status_code for a in answers] == [200, 200, 200, 415, 200]
    assert answers[3].json()["error"] == "unsupported_media_type"


def test_requests_to_names_nobody_serves_are_counted_under_one_tag() -> None:
    """The app's name in the path becomes the metrics' tag only if the app is served: a
    non-ASCII name (which Ray's metrics cannot encode) and thousands of made-up ones add one
    series, ``unknown``."""
    names = ["%C3%A9", "x" * 300] + [f"made-up-{i}" for i in range(200)]
    requests = [(f"/v1/{name}/predict", b'{"input": [1]}', JSON) for name in names]
    requests += [(f"/v1/{name}/feedback", b'{"query_id": "q", "label": 1}', JSON) for name in names]
    metrics = _Tags()
    answers = asyncio.run(_exchange(requests, metrics))
    assert {a.status_code for a in answers[:-1]} == {404}
    assert answers[-1].status_code == 200
    assert set(metrics.tags) == {UNKNOWN_APP, "one"}
    assert metrics.tags.count("one") == 1
    long = answers[1].json()["message"]  # an error repeats at most the name's start
    assert "'" + "x" * (SHOWN_NAME - 1) + "..." in long


def test_a_defect_inside_raysrv_is_answered_as_the_documented_json_500() -> None:
    """Whatever raysrv did not expect, on a predict route or any other, is answered as
    ``{"error", "message", "status"}`` with a 500, never Serve's plain-text page, and the
    service answers the next query."""
    server = Server(SPEC, {"a": fake_workers(EchoModel())})
    predict = server.predict_model

    async def broken_once(*args: Any, **kwargs: Any) -> Any:
        server.predict_model = predict  # type: ignore[method-assign]
        raise ZeroDivisionError("a defect")

    def broken_listing() -> Any:
        raise KeyError("a defect")

    server.predict_model = broken_once  # type: ignore[method-assign]
    server.describe_apps = broken_listing  # type: ignore[method-assign]

    async def scenario() -> list[httpx.Response]:
        transport = httpx.ASGITransport(
            app=create_http_app(server, 4096), raise_app_exceptions=False
        )
        async with httpx.AsyncClient(transport=transport, base_url="http://raysrv") as c:
            return [
                await c.post("/v1/models/a/predict", json={"input": INPUT}),
                await c.get("/v1/apps"),
                await c.post("/v1/models/a/predict", json={"input": INPUT}),
            ]

    broken, listing, after = asyncio.run(scenario())
    for answer in (broken, listing):
        assert answer.status_code == 500
        assert answer.headers["content-type"].startswith("application/json")
        body = answer.json()
        assert body["error"] == RaysrvError.reason
        assert body["status"] == 500
        assert "the server logged it" in body["message"]
    assert after.status_code == 200


def _sent_at_queries(bodies: list[bytes], then: int) -> tuple[list[int], list[int], Server]:
    """The statuses of ``bodies`` posted to the app's route, then of ``then`` well-formed
    queries sent 1 ms ago with an SLO of 1 s; and the server, to read what it keeps back."""
    server = Server(SPEC, {"a": fake_workers(EchoModel())})

    async def scenario() -> tuple[list[int], list[int]]:
        transport = httpx.ASGITransport(app=create_http_app(server, 4096))
        async with httpx.AsyncClient(transport=transport, base_url="http://raysrv") as c:
            first = [(await c.post("/v1/one/predict", content=b, headers=JSON)) for b in bodies]
            good = [
                await c.post(
                    "/v1/one/predict",
                    json={"input": INPUT, "slo_ms": 1000, "sent_at": time.time() - 0.001},
                )
                for _ in range(then)
            ]
        return [r.status_code for r in first], [r.status_code for r in good]

    first, good = asyncio.run(scenario())
    return first, good, server


@pytest.mark.parametrize(
    "sent_at", ["0", "-Infinity", "Infinity", "NaN", "1e308", str(time.time() + 3600)]
)
def test_a_sent_at_that_is_no_time_it_was_sent_is_a_400_and_moves_no_one_elses_deadline(
    sent_at: str,
) -> None:
    """Python's JSON reads ``Infinity`` and ``NaN``; a ``sent_at`` of the epoch, of no time or
    an hour ahead is refused, and the well-formed queries after three of them are answered."""
    body = f'{{"input": [1, 2, 3, 4], "slo_ms": 1000, "sent_at": {sent_at}}}'.encode()
    first, good, server = _sent_at_queries([body] * 3, 25)
    assert first == [400] * 3
    assert good == [200] * 25
    assert server.trip_back() < 0.5


def test_only_well_formed_queries_within_their_slo_count_towards_what_is_kept_back() -> None:
    """Malformed inputs and queries whose trip here already took their SLO (refused, 429) are
    not counted: 30 of them, sent with trips of 5 minutes, leave nothing kept back; the
    well-formed queries after them are counted and answered."""
    now = time.time()
    malformed = json.dumps({"input": [1, 2], "slo_ms": 1000, "sent_at": now - 300}).encode()
    dead = json.dumps({"input": INPUT, "slo_ms": 1000, "sent_at": now - 300}).encode()
    first, good, server = _sent_at_queries([malformed] * 30 + [dead] * 30, 25)
    assert first == [400] * 30 + [429] * 30
    assert good == [200] * 25
    assert 0.0 < server.trip_back() < 0.5  # 25 trips known, each of about a millisecond


def _learning(ingress: dict[str, Any], *apps: dict[str, Any], **learn_app: Any) -> RaysrvSpec:
    """Models ``a`` and ``b``; app ``learn`` over both, learning per ``user`` (exp3 on the
    answers' ``sum``; ``learn_app`` sets more of it); then ``apps``."""
    learn = {
        "name": "learn",
        "models": ["a", "b"],
        "context_field": "user",
        "selection": {"policy": "exp3", "params": {"field": "sum"}},
        **learn_app,
    }
    models = [model_spec("a"), model_spec("b")]
    return RaysrvSpec.model_validate(spec(models, [learn, *apps], ingress=ingress))


LEARNING = _learning({"max_context_chars": 16, "max_label_bytes": 64})


def _feedbacks(
    labels: list[Any], context: str = "u", learning: RaysrvSpec = LEARNING
) -> tuple[list[httpx.Response], Server]:
    """One query of the learning app, then each of ``labels`` as its feedback in turn."""
    server = Server(learning, {m: fake_workers(EchoModel()) for m in ("a", "b")})

    async def scenario() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=create_http_app(server, 4096))
        async with httpx.AsyncClient(transport=transport, base_url="http://raysrv") as c:
            answer = await c.post("/v1/learn/predict", json={"input": INPUT, "user": context})
            if answer.status_code != 200:
                return [answer]
            query_id = answer.json()["query_id"]
            return [
                answer,
                *[
                    await c.post("/v1/learn/feedback", json={"query_id": query_id, "label": x})
                    for x in labels
                ],
            ]

    return asyncio.run(scenario()), server


def test_a_query_takes_one_feedback_and_a_replay_is_a_409_that_teaches_nothing() -> None:
    """Replaying one query's feedback (the same label or another) would steer what every
    caller of its context gets; the first counts, the others get 409 and change nothing."""
    (answer, *feedback), server = _feedbacks([3, 3, 10, 3])  # the models answer 10: 3 is wrong
    assert [r.status_code for r in feedback] == [200, 409, 409, 409]
    assert feedback[1].json()["error"] == "conflict"
    assert asyncio.run(server._store.get_feedback(answer.json()["query_id"])) == 3
    _, once = _feedbacks([3])
    learned, learned_once = (_learned(s) for s in (server, once))
    assert learned == learned_once != server.apps["learn"].selection.init()


def test_an_app_without_feedback_keeps_no_query_and_answers_a_feedback_404() -> None:
    """``feedback: false``: the answer still names its query, but nothing is stored for it,
    and its feedback is refused as the route of an app that takes none."""
    quiet = _learning({}, {"name": "quiet", "models": ["a"], "feedback": False})
    server = Server(quiet, {m: fake_workers(EchoModel()) for m in ("a", "b")})
    apps = ("quiet", "learn")

    async def scenario() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=create_http_app(server, 4096))
        async with httpx.AsyncClient(transport=transport, base_url="http://raysrv") as c:
            answers = [await c.post(f"/v1/{a}/predict", json={"input": INPUT}) for a in apps]
            return answers + [
                await c.post(
                    f"/v1/{a}/feedback", json={"query_id": r.json()["query_id"], "label": 10}
                )
                for a, r in zip(apps, answers, strict=True)
            ]

    quiet_answer, learn_answer, quiet_feedback, learn_feedback = asyncio.run(scenario())
    assert quiet_answer.status_code == learn_answer.status_code == 200
    assert re.fullmatch("[0-9a-f]{32}", quiet_answer.json()["query_id"])
    stored = [
        asyncio.run(server._store.get_prediction(r.json()["query_id"]))
        for r in (quiet_answer, learn_answer)
    ]
    assert stored[0] is None
    assert stored[1] is not None
    assert stored[1]["app"] == "learn"
    assert quiet_feedback.status_code == 404
    assert "takes no feedback (feedback: false)" in quiet_feedback.json()["message"]
    assert learn_feedback.status_code == 200


def _learned(server: Server) -> Any:
    return asyncio.run(server._state(server.apps["learn"], server._context("u")))


RELABEL = _learning({}, relabel=True)


def test_with_relabel_a_second_label_replaces_the_first_and_teaches_as_if_alone() -> None:
    """The app allows relabelling: the wrong label 3 (the models answer 10), then the right
    one; the policy takes 3 back, so the state is what the right label alone teaches."""
    (answer, *feedback), server = _feedbacks([3, 10], learning=RELABEL)
    assert [r.status_code for r in feedback] == [200, 200]
    assert [r.json()["relabelled"] for r in feedback] == [False, True]
    assert asyncio.run(server._store.get_feedback(answer.json()["query_id"])) == 10
    _, right_once = _feedbacks([10], learning=RELABEL)
    _, wrong_once = _feedbacks([3], learning=RELABEL)
    learned = {
        name: _learned(s)["log_weights"]
        for name, s in [("relabelled", server), ("right", right_once), ("wrong", wrong_once)]
    }
    assert learned["relabelled"] == pytest.approx(learned["right"], abs=1e-9)
    assert learned["wrong"] != pytest.approx(learned["right"], abs=1e-3)


def test_a_label_the_policy_cannot_read_is_a_400_and_the_query_may_be_labelled_again() -> None:
    (_, *feedback), _ = _feedbacks([[], 10, 10])
    assert [r.status_code for r in feedback] == [400, 200, 409]
    assert "does not fit" in feedback[0].json()["message"]


@pytest.mark.parametrize("app", ["learn", "plain"])
def test_a_label_of_another_kind_than_the_answers_is_a_400(app: str) -> None:
    """The models answer numbers: a text label is refused whether the app's policy learns
    (``exp3``) or not (``single``, which would otherwise keep any label)."""
    learning = _learning({}, {"name": "plain", "models": ["a"]})
    server = Server(learning, {m: fake_workers(EchoModel()) for m in ("a", "b")})

    async def scenario() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=create_http_app(server, 4096))
        async with httpx.AsyncClient(transport=transport, base_url="http://raysrv") as c:
            answer = await c.post(f"/v1/{app}/predict", json={"input": INPUT})
            query_id = answer.json()["query_id"]
            return [
                await c.post(f"/v1/{app}/feedback", json={"query_id": query_id, "label": x})
                for x in ("ten", {"sum": "ten"}, None, {"total": 10}, {"sum": 10})
            ]

    refused = asyncio.run(scenario())
    assert [r.status_code for r in refused] == [400, 400, 400, 400, 200]
    if app == "learn":
        assert re.search(r"a text label for model '[ab]', which answers numbers", refused[0].text)
    else:
        assert "'ten' is of no kind model 'a' answers" in refused[0].json()["message"]
        assert "['total'] are not outputs of model 'a'" in refused[3].json()["message"]


def test_labels_and_contexts_past_their_limits_are_a_413_before_anything_is_kept() -> None:
    """``ingress.max_label_bytes`` (64 here) and ``max_context_chars`` (16): a long context
    would key a selection state of its own and a large label would be stored with the query."""
    (_, *feedback), _ = _feedbacks(["x" * 100, 10])
    assert [r.status_code for r in feedback] == [413, 200]
    assert "exceeds 64 bytes" in feedback[0].json()["message"]
    (refused,), _ = _feedbacks([10], context="u" * 17)
    assert refused.status_code == 413
    assert "context of 17 characters exceeds 16" in refused.json()["message"]


BUDGET_MB = 1.0
HOSTILE = _learning({"store_budget_mb": BUDGET_MB}, {"name": "plain", "models": ["a"]})


def test_hostile_traffic_grows_the_ingress_by_less_than_its_store_budget() -> None:
    """1,500 queries each with a context of its own at the longest allowed (each keys a
    selection state), 1,500 feedbacks with labels near the largest allowed (90 MB of labels
    kept as they came), and 1,500 requests to app names nobody serves: the Python heap of the
    ingress (``tracemalloc``'s count of live allocations) grows by less than its three stores'
    budgets of 1 MiB and a slack of 4 MiB, and the requests metric has one series for them
    all. Every well-formed request is still answered."""
    import tracemalloc

    tags = _Tags()
    server = Server(HOSTILE, {m: fake_workers(EchoModel()) for m in ("a", "b")}, metrics=tags)
    label = {"sum": 10.0, "pad": "x" * 60_000}  # within ingress.max_label_bytes (65,536)
    context = "c" * 250  # within ingress.max_context_chars (256)
    n = 1500

    async def scenario() -> tuple[int, list[int]]:
        transport = httpx.ASGITransport(app=create_http_app(server, 1 << 20, tags))
        statuses = []
        async with httpx.AsyncClient(transport=transport, base_url="http://raysrv") as c:

            async def round_of(k: int) -> None:
                learn = {"input": INPUT, "user": f"{k:06d}{context}"}
                answer = await c.post("/v1/learn/predict", json=learn)
                plain = await c.post("/v1/plain/predict", json={"input": INPUT})
                feedback = {"query_id": answer.json()["query_id"], "label": label}
                taught = await c.post("/v1/learn/feedback", json=feedback)
                statuses.extend(r.status_code for r in (answer, plain, taught))
                unknown = await c.post(f"/v1/nobody-{k}/predict", json={"input": INPUT})
                statuses.append(unknown.status_code)

            for k in range(50):  # warm-up: the allocator's and the client's own first costs
                await round_of(k)
            tracemalloc.start()
            before = tracemalloc.get_traced_memory()[0]
            for k in range(50, n):
                await round_of(k)
            grown = tracemalloc.get_traced_memory()[0] - before
            tracemalloc.stop()
        return grown, statuses

    grown, statuses = asyncio.run(scenario())
    assert statuses == [200, 200, 200, 404] * n
    budgets = 3 * BUDGET_MB * (1 << 20)
    assert grown < budgets + 4 * (1 << 20), f"grew {grown / (1 << 20):.1f} MiB"
    assert set(tags.tags) == {"learn", "plain", UNKNOWN_APP}


def test_selection_states_are_keyed_by_a_hash_of_the_context() -> None:
    """A context of any length or characters keys its state by 32 hex digits: distinct
    contexts stay apart (one containing Redis's separator too), and a lone surrogate, which
    JSON can carry, keys one as well."""
    server = Server(HOSTILE, {m: fake_workers(EchoModel()) for m in ("a", "b")})
    contexts = ["", "u", "u:v", "u" * 256, "\ud800", "é"]
    keys = [server._context(c) for c in contexts]
    assert len(set(keys)) == len(contexts)
    assert all(len(k) == 32 and int(k, 16) >= 0 for k in keys)
    assert server._context(None) == server._context("")
