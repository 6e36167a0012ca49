"""bench.ingress_floor: the floor app answers each request with its own row, in batches cut
at the limit, inline or on its thread; raysrv with the floor's batching for its pools answers
through it; each thread's CPU; the summary's medians and ratios."""

from __future__ import annotations

import asyncio
import json
import math
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from bench.ingress_floor import (
    FIELDS,
    SYSTEMS,
    FloorApp,
    floor_pools,
    mean_batch,
    summary,
    thread_cpu_s,
)
from raysrv._http import create_http_app
from raysrv._server import Server
from raysrv._workers import ColocatedWorkers
from raysrv.app import prepare_spec
from raysrv.config import RaysrvSpec

WEIGHTS = np.arange(12, dtype=np.float32).reshape(4, 3) / 10


def _matmul(path: Path) -> str:
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 3])],
        [numpy_helper.from_array(WEIGHTS, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path)
    return str(path)


async def _post(app: FloorApp, body: bytes) -> tuple[int, Any]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app({"type": "http", "method": "POST", "path": "/"}, receive, send)
    start, answer = sent
    return start["status"], json.loads(answer["body"])


@pytest.mark.parametrize("inline", [True, False], ids=["inline", "thread"])
def test_each_request_gets_its_own_row_in_batches_cut_at_the_limit(
    tmp_path: Path, inline: bool
) -> None:
    app = FloorApp(_matmul(tmp_path / "m.onnx"), inline, max_batch_size=32)
    inputs = [np.full(4, k, dtype=np.float32) for k in range(40)]

    async def main() -> list[tuple[int, Any]]:
        bodies = [json.dumps({"input": x.tolist()}).encode() for x in inputs]
        return await asyncio.gather(*(_post(app, b) for b in bodies))

    answers = asyncio.run(main())
    for x, (status, answer) in zip(inputs, answers, strict=True):
        assert status == 200
        np.testing.assert_allclose(answer["output"], x @ WEIGHTS, rtol=1e-6)
    assert app.batches == 2  # 40 queued at once: 32, then the 8 left


def test_a_failed_batch_fails_its_requests_and_the_next_batch_runs(tmp_path: Path) -> None:
    app = FloorApp(_matmul(tmp_path / "m.onnx"), inline=True, max_batch_size=2)

    async def main() -> list[Any]:
        bad = json.dumps({"input": [1.0, 2.0, 3.0]}).encode()  # not the model's width
        good = json.dumps({"input": [1.0, 1.0, 1.0, 1.0]}).encode()
        posts = (_post(app, body) for body in (bad, good, good, good))
        gathered = asyncio.gather(*posts, return_exceptions=True)
        return await asyncio.wait_for(gathered, 30)  # a batch left unanswered fails, not hangs

    first, second, third, fourth = asyncio.run(main())
    assert isinstance(first, ValueError)  # the batch of both is not one array
    assert isinstance(second, ValueError)
    for status, answer in (third, fourth):
        assert status == 200
        np.testing.assert_allclose(answer["output"], np.ones(4) @ WEIGHTS, rtol=1e-6)
    assert app.batches == 1


def test_a_client_that_leaves_does_not_stop_the_batch_it_was_in(tmp_path: Path) -> None:
    app = FloorApp(_matmul(tmp_path / "m.onnx"), inline=True)
    good = json.dumps({"input": [1.0, 1.0, 1.0, 1.0]}).encode()

    async def main() -> list[tuple[int, Any]]:
        posts = [asyncio.create_task(_post(app, good)) for _ in range(3)]
        await asyncio.sleep(0)  # each queued, waiting for its answer; the batch not yet run
        posts[0].cancel()
        return await asyncio.wait_for(asyncio.gather(*posts[1:]), 30)

    for status, answer in asyncio.run(main()):
        assert status == 200
        np.testing.assert_allclose(answer["output"], np.ones(4) @ WEIGHTS, rtol=1e-6)
    assert app.batches == 1


def test_a_body_without_an_input_is_a_400(tmp_path: Path) -> None:
    app = FloorApp(_matmul(tmp_path / "m.onnx"), inline=True)
    assert asyncio.run(_post(app, b'{"inputs": [[1, 2, 3, 4]]}')) == (400, {})
    assert asyncio.run(_post(app, b"not json")) == (400, {})
    assert app.batches == 0


def _colocated(source: str) -> Server:
    model = {
        "name": "m",
        "runtime": "onnx",
        "source": source,
        "placement": "colocated",
        "batching": {"policy": "fixed", "params": {"max_batch_size": 32}},
        "input": {"shape": [4], "dtype": "float32"},
    }
    raw = {"models": [model], "apps": [{"name": "a", "models": ["m"], "cache_size": 0}]}
    spec = prepare_spec(RaysrvSpec.model_validate(raw))
    return Server(spec, {p.name: ColocatedWorkers(p, metrics=False) for p in spec.resolved_pools()})


async def _predict(app: Any, path: str, x: np.ndarray) -> tuple[int, Any]:
    body = json.dumps({"input": x.tolist()}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    scope = {"type": "http", "method": "POST", "path": path, "headers": headers}
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    start, answer = sent
    return start["status"], json.loads(answer["body"])


def test_floor_pools_answer_raysrv_queries_with_the_floor_batching_and_not_the_pool(
    tmp_path: Path,
) -> None:
    server = _colocated(_matmul(tmp_path / "m.onnx"))
    batchers = floor_pools(server)
    app = create_http_app(server, 1 << 20)
    inputs = [np.full(4, k, dtype=np.float32) for k in range(40)]

    async def main() -> list[tuple[int, Any]]:
        try:
            paths = ["/v1/a/predict", "/v1/models/m/predict"] * 20
            return await asyncio.gather(
                *(_predict(app, p, x) for p, x in zip(paths, inputs, strict=True))
            )
        finally:
            await server.close()

    answers = asyncio.run(main())
    for x, (status, answer) in zip(inputs, answers, strict=True):
        assert status == 200
        np.testing.assert_allclose(answer["output"], x @ WEIGHTS, rtol=1e-6)
    assert batchers["m"].batches == 2  # 40 queued at once: 32, then the 8 left
    assert not any(server.timeline("m").values())  # the pool itself ran nothing


def test_the_summary_takes_medians_and_ratios_to_the_baseline() -> None:
    rates = {system: [1000.0 * (k + 1), 1100.0 * (k + 1), 5.0] for k, system in enumerate(SYSTEMS)}
    points = [
        {"system": s, **{field: r * (k + 1) for k, field in enumerate(FIELDS)}}
        for s, rs in rates.items()
        for r in rs
    ]
    rows = summary(points)
    assert list(rows) == list(SYSTEMS)
    assert rows["baseline"]["inputs_per_s"] == 1000.0  # the median holds against one odd point
    assert rows["baseline"]["ratio"] == 1.0
    assert rows["floor-thread"]["inputs_per_s"] == 3000.0
    assert rows["floor-thread"]["ratio"] == pytest.approx(3.0)
    assert rows["floor-thread"]["loop_cpu_us"] == 3000.0 * (FIELDS.index("loop_cpu_us") + 1)


def test_the_mean_batch_counts_the_infers_of_a_timeline_alone() -> None:
    columns = {"kind": ["load", "infer", "infer", "unload", "infer"], "size": [0, 9, 4, 0, 11]}
    assert mean_batch(columns) == 8.0
    assert math.isnan(mean_batch({"kind": ["load"], "size": [0]}))


def test_thread_cpu_counts_each_thread_apart() -> None:
    spun: dict[str, int] = {}
    started, go, done = threading.Event(), threading.Event(), threading.Event()

    def spin() -> None:
        spun["tid"] = threading.get_native_id()
        started.set()
        go.wait()
        start = time.thread_time()
        while time.thread_time() - start < 0.3:  # CPU time, however busy the machine
            pass
        done.set()
        time.sleep(0.5)  # alive while it is read

    thread = threading.Thread(target=spin)
    thread.start()
    started.wait()
    before = thread_cpu_s(os.getpid())
    go.set()
    done.wait()
    used = {t: s - before.get(t, 0.0) for t, s in thread_cpu_s(os.getpid()).items()}
    thread.join()
    assert used[spun["tid"]] >= 0.28  # the spinning thread's own CPU, to the clock's tick
    assert used[threading.get_native_id()] < used[spun["tid"]]  # this one only waited
