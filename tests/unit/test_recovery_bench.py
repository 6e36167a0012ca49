"""``bench.recovery``'s account of a run: per event, the first answer after it and what failed
or hung of what it met, in flight at it or sent until the next; and its client's headers
(Serve's per-request timeout)."""

from __future__ import annotations

import asyncio
import math

from aiohttp import web

from bench.loadgen import HttpClient, RequestLog
from bench.recovery import summarize


def test_each_event_counts_what_was_sent_from_it_to_the_next() -> None:
    log = RequestLog(
        sent=[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
        done=[0.01, 1.01, 3.5, 3.2, 4.01, 7.0, 6.01],
        status=[200, 200, 503, 200, 200, 0, 200],
    )
    found = summarize(log, {"ingress": 2.0, "worker": 4.0}, slo_s=0.05)
    ingress, worker = found["events"]["ingress"], found["events"]["worker"]
    counts = {"sent": 2, "failed": {503: 1}, "hung": 1}
    assert ingress == {"at_s": 2.0, "first_answer_s": 1.2, "in_flight": 0, **counts}
    counts = {"sent": 3, "failed": {0: 1}, "hung": 1}
    assert worker == {"at_s": 4.0, "first_answer_s": 0.01, "in_flight": 0, **counts}
    assert found["before"] == {"sent": 2, "failed": {}, "hung": 0}
    assert (found["sent"], found["answered"], found["hung"]) == (7, 5, 2)
    assert found["statuses"] == {200: 5, 503: 1, 0: 1}


def test_a_request_in_flight_at_an_event_is_the_events() -> None:
    # sent just before the kill, answered 408 1.55 s later: the kill's, not the time before it
    log = RequestLog(sent=[0.0, 1.95, 2.1], done=[0.01, 3.5, 2.11], status=[200, 408, 200])
    found = summarize(log, {"ingress": 2.0}, slo_s=0.05)
    ingress = found["events"]["ingress"]
    assert (ingress["in_flight"], ingress["sent"], ingress["hung"]) == (1, 2, 1)
    assert ingress["failed"] == {408: 1}
    assert found["before"] == {"sent": 1, "failed": {}, "hung": 0}
    assert found["hung"] == 1


def test_an_event_never_followed_by_an_answer_says_so() -> None:
    log = RequestLog(sent=[0.0, 2.0], done=[0.01, 2.5], status=[200, 0])
    found = summarize(log, {"proxy": 1.0}, slo_s=0.05)
    assert math.isnan(found["events"]["proxy"]["first_answer_s"])
    assert found["events"]["proxy"]["failed"] == {0: 1}


def test_the_http_client_sends_its_headers_with_the_json_type() -> None:
    seen: list[dict[str, str]] = []

    async def record(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        return web.Response(status=408)

    async def scenario() -> int:
        app = web.Application()
        app.router.add_post("/p", record)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            headers = {"x-request-timeout-seconds": "0.55"}
            async with HttpClient(f"http://127.0.0.1:{port}/p", [b"{}"], headers=headers) as c:
                return await c.send(0)
        finally:
            await runner.cleanup()

    assert asyncio.run(scenario()) == 408
    assert seen[0]["x-request-timeout-seconds"] == "0.55"
    assert seen[0]["Content-Type"] == "application/json"
