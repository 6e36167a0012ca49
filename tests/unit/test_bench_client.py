"""The many-model benchmark's client and saved runs: a request's ``sent_at`` is when it was
scheduled, a point's lead-in is not counted, the replayed simulator takes the live replies in
their order, a saved run draws its plots again without being run again, and the hot model's
loops are compared pair by pair."""

from __future__ import annotations

import asyncio
import collections
import gc
import json
import math
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
from aiohttp import web

from bench.loadgen import STALL_S, RequestLog, refusal_reason, replay, scheduled_at
from bench.many_models import (
    ALONE,
    MUX_HTTP,
    REGISTERED,
    HttpCalls,
    TallyClient,
    _counted,
    _gather_timeline,
    _in_schedule,
    _replayed_replies,
    _within,
    hot_table,
    late_answers,
    paired_ratios,
    popularity_table,
    replot,
    resampled_median,
)
from bench.run_bench import free_port
from raysrv.batching.actions import COLD_DOOMED

ROOT = Path(__file__).parents[2]


def test_a_saved_run_draws_its_plots_again_from_its_request_logs(tmp_path: Path) -> None:
    log = RequestLog(scheduled=[0.0, 0.1, 0.2], sent=[0.0, 0.1, 0.2], done=[0.05, 0.3, 0.21])
    log.status.extend([200, 504, 429])
    saved = {
        "args": {"slo_ms": 100.0},
        "capacities": {"trace": 10.0},
        "logs": {"trace": {"raysrv": asdict(log), "multiplexed": asdict(log)}},
    }
    path = tmp_path / "run.json"
    path.write_text(json.dumps(saved))
    replot(path, tmp_path / "figures")
    for name in ("many_models_cdf.png", "many_models_goodput.png"):
        assert (tmp_path / "figures" / name).stat().st_size > 0
    del saved["logs"]
    path.write_text(json.dumps(saved))
    with pytest.raises(SystemExit, match="no request logs"):
        replot(path, tmp_path / "older")


def test_a_request_says_it_was_sent_when_the_load_generator_scheduled_it() -> None:
    """``sent_at`` is the scheduled time, so a server counts the SLO from where the client counts
    the latency, the client's own lag in sending included."""

    class Recorder:
        kind = "handle"

        def __init__(self) -> None:
            self.sent_at: list[float] = []

        async def send(self, i: int) -> int:
            self.sent_at.append(scheduled_at())
            return 200

    client, log = Recorder(), RequestLog()
    t0 = time.perf_counter()
    wall = time.time()
    asyncio.run(log.timed(client, 0, -0.050, t0))  # due 50 ms before the run's start
    assert client.sent_at[0] == pytest.approx(wall - 0.050, abs=0.01)
    assert scheduled_at() == pytest.approx(time.time(), abs=0.01)  # outside a request: now


def test_the_hot_models_loops_are_compared_within_each_pair() -> None:
    rows = [
        {"config": "dedicated pool", "repeat": 0, "goodput": 120.0},
        {"config": ALONE, "repeat": 0, "goodput": 100.0},
        {"config": REGISTERED, "repeat": 0, "goodput": 95.0},
        {"config": REGISTERED, "repeat": 1, "goodput": 80.0},  # a slow spell: both slower
        {"config": ALONE, "repeat": 1, "goodput": 80.0},
        {"config": ALONE, "repeat": 2, "goodput": 110.0},  # its pair never ran
    ]
    assert paired_ratios(rows) == [pytest.approx(0.95), pytest.approx(1.0)]
    table = hot_table(rows)
    assert "| dedicated pool | 120.0 | 120.0 | 1.200 |" in table  # over the median alone, 100
    assert "pair by pair: median 0.975 (0.950, 1.000); 95% of 5,000 resampled" in table
    assert resampled_median([1.0] * 5) == (1.0, 1.0)
    low, high = resampled_median([0.9, 1.0, 1.1, 1.0, 0.95, 1.05])
    assert 0.9 <= low < 1.0 < high <= 1.1


def test_a_points_lead_in_is_not_counted_and_its_clock_starts_after_it() -> None:
    log = RequestLog(scheduled=[4.9, 5.0, 7.5], sent=[4.9, 5.1, 7.5], done=[5.0, 5.2, 7.6])
    log.status.extend([429, 200, 504])
    counted = _counted(log, 5.0)
    assert counted.scheduled == [0.0, 2.5]
    assert counted.sent == [pytest.approx(0.1), 2.5]
    assert counted.done == [pytest.approx(0.2), pytest.approx(2.6)]
    assert counted.status == [200, 504]


def test_a_logs_queries_are_put_back_in_the_order_they_were_sent() -> None:
    """A log lists queries as they ended; a point's query i is its i-th arrival, which the
    simulator's answers are indexed by."""
    log = RequestLog(scheduled=[0.3, 0.1, 0.2], sent=[0.3, 0.1, 0.2], done=[0.35, 0.5, 0.6])
    log.status.extend([200, 200, 429])  # the first sent ended second, 0.4 s after it
    within = _within(log, 0.1)
    assert within.tolist() == [True, False, False]
    assert _in_schedule(log, within).tolist() == [False, False, True]


def test_the_replayed_replies_are_the_live_ones_in_the_order_the_ingress_took_them_up() -> None:
    nan = float("nan")
    timeline = {
        "kind": ["infer", "load", "infer", "infer"],
        "ended": [100.010, 100.050, nan, 100.020],  # the third did not run
        "back": [100.013, 100.060, 100.030, 100.021],
    }
    replies = _replayed_replies(timeline, 100.0)
    assert replies(0.015) == [pytest.approx(0.003)]
    assert replies(0.015) == []  # each reply once
    assert replies(1.0) == [pytest.approx(0.001)]


class _KeepsLast:
    """A pool's timeline as its ingress's handle serves it: of the last ``keep`` actions, those
    sent at or after ``since`` and numbered past ``after``. A stand-in for a Ray handle;
    ``fetched`` holds how many actions each call returned."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.rows: list[tuple[int, str, int, str, int, float]] = []
        self.fetched: list[int] = []
        self.timeline = self  # handle.timeline.remote(pool, since, after)

    def end(self, i: int) -> None:
        """Action ``i``, sent at ``i`` seconds, is kept."""
        self.rows.append((len(self.rows), "infer", i % 2, f"m{i % 7}", 1, float(i)))

    async def remote(self, pool: str, since: float, after: int) -> dict[str, list[object]]:
        assert pool == "zoo"
        kept = [r for r in self.rows[-self.keep :] if r[0] > after and r[5] >= since]
        self.fetched.append(len(kept))
        names = ("seq", "kind", "worker", "model", "size", "sent")
        return {name: [row[i] for row in kept] for i, name in enumerate(names)}


def test_a_points_timeline_is_gathered_whole_though_the_pool_keeps_only_its_last_actions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Fetched while the point runs, every action appears once and in the pool's order, though
    the pool keeps only its last 10 of the 60, and each fetch carries only the new ones."""
    monkeypatch.setattr("bench.many_models.TIMELINE_EVERY_S", 0.01)
    handle = _KeepsLast(keep=10)

    async def run() -> dict[str, list[object]]:
        done = asyncio.Event()
        gathered = asyncio.create_task(_gather_timeline(handle, 0.0, done))
        for i in range(60):
            handle.end(i)
            if i % 8 == 7:
                await asyncio.sleep(0.02)  # a fetch comes before 10 more actions end
        done.set()
        return await gathered

    columns = asyncio.run(run())
    assert columns["sent"] == [float(i) for i in range(60)]
    assert columns["model"] == [f"m{i % 7}" for i in range(60)]
    assert len(handle.fetched) >= 60 // 8
    assert max(handle.fetched) <= 8


def test_gathering_a_timeline_fails_if_the_pool_dropped_actions_between_fetches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("bench.many_models.TIMELINE_EVERY_S", 0.01)
    handle = _KeepsLast(keep=10)

    async def run() -> None:
        done = asyncio.Event()
        gathered = asyncio.create_task(_gather_timeline(handle, 0.0, done))
        handle.end(0)
        await asyncio.sleep(0.02)
        for i in range(1, 30):  # 29 actions end before the next fetch: 19 are gone
            handle.end(i)
        await asyncio.sleep(0.02)
        done.set()
        await gathered

    with pytest.raises(RuntimeError, match="dropped actions 1-19"):
        asyncio.run(run())


class _Slow:
    """Answers request i after ``delays[i]`` seconds; raises for a request numbered ``fails``."""

    kind = "handle"

    def __init__(self, delays: list[float], fails: int | None = None) -> None:
        self.delays = delays
        self.fails = fails

    async def send(self, i: int) -> int:
        await asyncio.sleep(self.delays[i])
        if i == self.fails:
            raise RuntimeError(f"request {i} failed")
        return 200


def test_a_replay_waits_for_the_answers_still_in_flight_and_surfaces_a_clients_error() -> None:
    """Every request is logged, the slow first one included (answered after the last was sent),
    each no earlier than its offset; a client that raises fails the replay once all are in."""
    log = asyncio.run(replay(_Slow([0.05, 0.0, 0.0]), [0.0, 0.01, 0.02], first=0))
    assert sorted(log.scheduled) == [0.0, 0.01, 0.02]
    assert log.status == [200, 200, 200]
    first = log.scheduled.index(0.0)
    assert log.done[first] >= 0.05
    assert all(sent >= scheduled for sent, scheduled in zip(log.sent, log.scheduled, strict=True))
    with pytest.raises(RuntimeError, match="request 1 failed"):
        asyncio.run(replay(_Slow([0.02, 0.0], fails=1), [0.0, 0.0]))


class _Clocked(_Slow):
    """Notes ``time.perf_counter()`` as each request is sent."""

    def __init__(self, delays: list[float]) -> None:
        super().__init__(delays)
        self.at: list[float] = []

    async def send(self, i: int) -> int:
        self.at.append(time.perf_counter())
        return await super().send(i)


def test_a_replays_start_puts_its_times_on_the_callers_clock() -> None:
    """``log.start + log.sent[i]`` is when request i went out by ``time.perf_counter()``, even
    though the replay settles the heap before it starts: what an event timed outside the
    replay is compared with (``bench.recovery``)."""
    client = _Clocked([0.0, 0.0])
    before = time.perf_counter()
    log = asyncio.run(replay(client, [0.0, 0.02]))
    assert log.start >= before
    for k, at in enumerate(sorted(client.at)):
        assert abs(log.start + sorted(log.sent)[k] - at) < 5e-3


class _Watching(_Slow):
    """Notes, at each request, whether the client's collector could run."""

    def __init__(self, delays: list[float]) -> None:
        super().__init__(delays)
        self.collecting: list[bool] = []

    async def send(self, i: int) -> int:
        self.collecting.append(gc.isenabled())
        return await super().send(i)


def test_the_clients_collector_is_off_during_a_replay_and_as_it_was_after() -> None:
    """Its full passes would hold the client's loop while answers arrive; after the run the
    collector is back on, or stays off if it was off before."""
    assert gc.isenabled()
    client = _Watching([0.0, 0.01])
    asyncio.run(replay(client, [0.0, 0.005]))
    assert client.collecting == [False, False]
    assert gc.isenabled()
    gc.disable()
    try:
        asyncio.run(replay(_Watching([0.0]), [0.0]))
        assert not gc.isenabled()
    finally:
        gc.enable()


class _Blocking(_Slow):
    """Holds the event loop for ``hold_s`` when request 1 is sent: asleep, or with ``spin``
    running."""

    def __init__(self, delays: list[float], hold_s: float, spin: bool = False) -> None:
        super().__init__(delays)
        self.hold_s = hold_s
        self.spin = spin

    async def send(self, i: int) -> int:
        if i == 1 and self.spin:
            until = time.perf_counter() + self.hold_s
            while time.perf_counter() < until:
                pass
        elif i == 1:
            time.sleep(self.hold_s)
        return await super().send(i)


def test_a_replay_notes_when_the_clients_own_loop_was_held() -> None:
    """A request that blocks the client's loop for 60 ms shows as one stall of about that long
    (less the watcher's own sleep), ending once the loop ran again; a request that holds it
    with work of its own (a busy loop of 60 ms) shows as a stall in which the thread ran."""
    log = asyncio.run(replay(_Blocking([0.0, 0.0, 0.0], hold_s=0.060), [0.0, 0.02, 0.1]))
    (ended, held, ran) = max(log.stalls, key=lambda stall: stall[1])
    assert 0.060 - STALL_S <= held < 0.060 + 0.030
    assert 0.02 + 0.060 <= ended < 0.1 + 0.030
    assert [h for _, h, _ in log.stalls if h >= 0.040] == [held]  # the one hold, once
    assert ran < 0.020  # asleep, not running
    busy = asyncio.run(replay(_Blocking([0.0, 0.0, 0.0], hold_s=0.060, spin=True), [0.0, 0.02]))
    (_, held, ran) = max(busy.stalls, key=lambda stall: stall[1])
    assert held >= 0.060 - STALL_S
    assert ran >= 0.030  # of the 60 ms its own, less what the machine took from it


def test_a_late_answer_says_when_it_left_the_ingress_and_how_long_the_client_was_held() -> None:
    """Answers past the SLO (100 ms) are listed with how late they came, how long before the
    SLO they left the ingress, the stall of the client's loop they were seen in or right
    after, and how late they were as they reached the client's machine; answers within it
    and refusals are not."""
    log = RequestLog(
        scheduled=[0.0, 1.0, 2.0, 3.0, 4.0],
        sent=[0.0, 1.0, 2.0, 3.0, 4.0],
        done=[0.05, 1.104, 2.130, 3.5, 4.120],
        status=[200, 200, 200, 429, 200],
        # the second ended before the 5th was seen
        stalls=[(1.105, 0.030, 0.004), (4.050, 0.010, 0.010)],
    )
    left = {1.0: 0.090, 2.0: 0.125}  # seconds from the scheduled time; 4.0's not known
    # seconds from reaching this machine to being seen: the first arrived 26 ms before
    unseen = {0.0: 0.0, 1.0: 0.030, 2.0: 0.001}
    late = late_answers(log, 0.100, left, unseen)
    assert [row[:2] for row in late] == [(1.0, 4.0), (2.0, 30.0), (4.0, 20.0)]
    assert [row[2] for row in late[:2]] == [10.0, -25.0]  # ms before the SLO: -25 left late
    assert math.isnan(late[2][2])
    assert [row[3:5] for row in late] == [(30.0, 4.0), (0.0, 0.0), (0.0, 0.0)]
    assert [row[5] for row in late[:2]] == [-26.0, 29.0]  # in time as it arrived; late
    assert math.isnan(late[2][5])
    log.stalls = [(1.105, 0.030)]  # as logs saved before the thread's run was read
    assert late_answers(log, 0.100)[0][3] == 30.0
    assert math.isnan(late_answers(log, 0.100)[0][4])


def test_favouring_the_client_sets_every_thread_of_its_process() -> None:
    """Linux keeps a niceness per thread: the client's event loop and the threads that hand
    it answers (a handle's, Ray's) all change, not only the caller's. Run in a child process,
    with a niceness any user may set, so that the test's own threads keep theirs."""
    script = (
        "import os, threading\n"
        "from bench.loadgen import favour_client\n"
        "stop = threading.Event()\n"
        "threading.Thread(target=stop.wait).start()\n"
        "ok = favour_client(7)\n"
        "tids = os.listdir('/proc/self/task')\n"
        "print(ok, len(tids), sorted({os.getpriority(os.PRIO_PROCESS, int(t)) for t in tids}))\n"
        "stop.set()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=ROOT
    )
    ok, threads, niceness = done.stdout.split(maxsplit=2)
    assert ok == "True"
    assert int(threads) >= 2  # the main thread, the one started and any an import started
    assert niceness.strip() == "[7]"


def test_a_reason_not_to_answer_is_counted_once_over_the_models_it_names() -> None:
    """The point's reasons keep the most common few: one reason per model would push the rest
    out (a run's 504s were missing from them)."""
    dropped = "had no answer by the query's deadline; it was dropped"
    messages = [f"model 'm{i:04d}': {COLD_DOOMED}" for i in range(3)]
    messages += [f"model 'm{i:04d}' {dropped}" for i in range(2)]
    messages.append("pool 'zoo' is shutting down")
    assert collections.Counter(refusal_reason(m) for m in messages) == {
        COLD_DOOMED: 3,
        dropped: 2,
        "pool 'zoo' is shutting down": 1,
    }


def test_live_and_simulated_are_compared_by_the_popularity_of_the_queries_models() -> None:
    """Models 1 and 2 have 2 queries each, model 0 one: model 1 (the tie goes to the lower
    name) is the most popular, alone in the first row; the next two share the second."""
    models = np.array([2, 1, 1, 2, 0])
    live = np.array([True, True, False, False, True])
    simulated = np.array([False, True, True, True, True])
    rows = popularity_table(models, live, simulated).splitlines()[2:]
    assert rows == [
        "| 1 | 2 | 50.0% | 100.0% | 0 | 1 |",
        "| 2-3 | 3 | 66.7% | 66.7% | 1 | 1 |",
    ]


async def _over_http(
    queries: list[tuple[str, np.ndarray]], system: str
) -> tuple[list[tuple[str, dict, str | None]], list[int], TallyClient]:
    """Sends ``queries`` as ``system``'s over HTTP to a local server that answers as raysrv's
    ingress and Serve would; what it received and the statuses the client counted."""
    received: list[tuple[str, dict, str | None]] = []

    async def answer(request: web.Request) -> web.Response:
        body = await request.json()
        model = request.headers.get("serve_multiplexed_model_id")
        received.append((request.path, body, model))
        name = request.match_info.get("model", model)
        if name == "refused":
            error = {"error": "rejected", "message": "model 'refused': cannot meet deadline"}
            return web.json_response({**error, "status": 429}, status=429)
        if name == "unavailable":  # Serve's own error pages are not JSON
            return web.Response(text="Service Unavailable", status=503)
        return web.json_response({"output": [1.0], "latency_ms": 1.0, "transit_ms": 2.0})

    app = web.Application()
    app.router.add_post("/raysrv/v1/models/{model}/predict", answer)
    app.router.add_post(f"/{MUX_HTTP}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    calls = HttpCalls()
    calls.start(port)
    call = calls.raysrv(100.0) if system == "raysrv" else calls.multiplexed()
    client = TallyClient(call, queries)
    try:
        statuses = [await client.send(i) for i in range(len(queries))]
    finally:
        await calls.close()
        await runner.cleanup()
    return received, statuses, client


def test_raysrvs_queries_over_http_carry_the_slo_and_when_they_were_sent() -> None:
    """Each query is POSTed to its model's path with its input, SLO and ``sent_at``; an error
    raysrv answers counts under its status and reason, as over a handle."""
    x = np.arange(64, dtype=np.float32)
    queries = [("m0001", x), ("refused", x)]
    before = time.time()
    received, statuses, client = asyncio.run(_over_http(queries, "raysrv"))
    assert [path for path, _, _ in received] == [
        "/raysrv/v1/models/m0001/predict",
        "/raysrv/v1/models/refused/predict",
    ]
    body = received[0][1]
    assert body["input"] == x.tolist()
    assert body["slo_ms"] == 100.0
    assert before <= body["sent_at"] <= time.time()
    assert statuses == [200, 429]
    assert client.reasons == {"cannot meet deadline": 1}
    assert client.transits == {0: 0.002}
    (unseen,) = client.unseen.values()  # the answer's, from its arrival to being seen
    assert 0.0 <= unseen < 1.0


def test_multiplexeds_queries_over_http_name_their_model_in_serves_header() -> None:
    """The model goes in ``serve_multiplexed_model_id``; a reply that is not JSON (Serve's
    own 503) counts under its status."""
    x = np.zeros(64, dtype=np.float32)
    received, statuses, _ = asyncio.run(_over_http([("m0002", x), ("unavailable", x)], MUX_HTTP))
    assert [(path, model) for path, _, model in received] == [
        (f"/{MUX_HTTP}", "m0002"),
        (f"/{MUX_HTTP}", "unavailable"),
    ]
    assert received[0][1] == {"input": x.tolist()}
    assert statuses == [200, 503]


def test_the_ingress_profile_sorts_samples_by_where_their_innermost_frame_runs() -> None:
    from bench.ingress_profile import shares

    collapsed = [
        "run (raysrv/_http.py:300);predict (raysrv/_server.py:421) 3",
        "run (raysrv/_http.py:300);observe (/x/site-packages/ray/util/metrics.py:299) 1",
        "t (threading.py:1002);run (/x/site-packages/onnxruntime/capi/session.py:406) 4",
        "t (threading.py:1002);_worker (/usr/lib/concurrent/futures/thread.py:81) 1",
        "h (/x/site-packages/ray/serve/_private/replica.py:3267) 1",
        "submit (batching/scheduler.py:236) 2",
        "",
    ]
    assert shares(collapsed) == {
        "onnxruntime (the model's runs)": 4 / 12,
        "raysrv: _server": 3 / 12,
        "raysrv.batching: scheduler": 2 / 12,
        "Ray's metrics": 1 / 12,
        "threads waiting for work": 1 / 12,
        "Ray Serve": 1 / 12,
    }


def test_wrk_scripts_carry_json_as_it_is_and_binary_bodies_byte_by_byte() -> None:
    from bench.loadgen import wrk_script

    script = wrk_script([b'{"input": [1]}', b"\x00\n\xff]"], headers={"X-A": "b"})
    assert '[==[{"input": [1]}]==]' in script
    assert '"\\0\\10\\255\\93"' in script
    assert 'wrk.headers["X-A"] = "b"' in script
    assert "application/json" in wrk_script([b"{}"])
