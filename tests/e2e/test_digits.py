"""The digits example in a subprocess, over real HTTP, with real Redis, started both ways:
`serve run examples/digits/config.yaml` (Serve's Python proxy) and `raysrv run` on the same
file (Serve's HAProxy ingress and throughput-optimized mode).

The served predictions on the digits test split must equal the offline models' predictions,
bad input must get a 4xx with a message, and the server must keep serving after each.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import pytest
import redis
import yaml

from examples.digits import build as digits
from tests.conftest import free_port
from tests.e2e.serving import served
from tests.readme import blocks

ROOT = Path(__file__).parents[2]
CONFIG = ROOT / "examples" / "digits" / "config.yaml"
SLO_MS = 30_000  # per request: these tests check answers, not a noisy machine's latency


COMMANDS = {"serve-proxy": ("serve", "run"), "haproxy": ("raysrv", "run")}


@pytest.fixture(scope="module", params=list(COMMANDS))
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, redis_url: str
) -> Iterator[str]:
    """The shipped example config on a free port with state in Redis, run by `serve run` or by
    `raysrv run` (HAProxy in front) from the repository's root, the file in a directory of its
    own."""
    config = yaml.safe_load(CONFIG.read_text())
    port = free_port()
    config["http_options"]["port"] = port
    config["applications"][0]["args"]["state"] = redis_url
    path = tmp_path_factory.mktemp("e2e") / "config.yaml"
    script, command = COMMANDS[request.param]
    if script == "serve":  # Serve does not tell the builder where the file is: its root does
        config["applications"][0]["args"]["root"] = str(path.parent)
    path.write_text(yaml.safe_dump(config))
    # the relative sources (models/...) are read beside the file: the example's built models
    (path.parent / "models").symlink_to(CONFIG.parent / "models", target_is_directory=True)
    with served([str(Path(sys.executable).with_name(script)), command, str(path)], port) as url:
        yield url


def _offline(x: np.ndarray) -> dict[str, dict[str, np.ndarray]]:
    """Each model's labels and probabilities on ``x``, from its ONNX file, in one batch."""
    out = {}
    for name in digits.MODEL_NAMES:
        session = ort.InferenceSession(
            str(ROOT / "examples" / "digits" / "models" / f"{name}.onnx")
        )
        label, probabilities = session.run(["label", "probabilities"], {"input": x})
        out[name] = {"label": label, "probabilities": probabilities}
    return out


async def _predict_all(url: str, x: np.ndarray, concurrency: int = 16) -> list[dict[str, Any]]:
    limit = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:

        async def one(row: np.ndarray) -> dict[str, Any]:
            async with limit:
                body = {"input": row.tolist(), "slo_ms": SLO_MS}
                response = await client.post("/v1/digits/predict", json=body)
                assert response.status_code == 200, response.text
                return response.json()

        return await asyncio.gather(*(one(row) for row in x))


def test_served_predictions_equal_the_offline_models(server: str) -> None:
    x, _ = digits.test_split()
    answers = asyncio.run(_predict_all(server, x))
    offline = _offline(x)
    used = set()
    for i, answer in enumerate(answers):
        (model,) = answer["models"]
        used.add(model)
        assert answer["output"]["label"] == int(offline[model]["label"][i]), (i, model)
        np.testing.assert_allclose(
            answer["output"]["probabilities"], offline[model]["probabilities"][i], rtol=0, atol=1e-6
        )
    assert used == set(digits.MODEL_NAMES)  # the split policy spread the queries over all three
    models = httpx.get(f"{server}/v1/models", timeout=10).json()["models"]
    assert sum(m["batches"] for m in models) <= len(x)


JSON = {"content-type": "application/json"}
BAD_REQUESTS = [
    ("/v1/digits/predict", b'{"input": [1, 2', 400, "not valid JSON"),
    (
        "/v1/digits/predict",
        json.dumps({"input": [0.0] * 63}).encode(),
        400,
        "shape [63], expected [64]",
    ),
    ("/v1/digits/predict", json.dumps({"input": ["x"] * 64}).encode(), 400, "must hold numbers"),
    ("/v1/digits/predict", json.dumps({"input": [[0.0] * 8] * 8}).encode(), 400, "shape [8, 8]"),
    ("/v1/mnist/predict", json.dumps({"input": [0.0] * 64}).encode(), 404, "unknown app 'mnist'"),
    (
        "/v1/digits/predict",
        b'{"input": [' + b"0.0, " * 300_000 + b"0.0]}",
        413,
        "exceeds the limit",
    ),
    ("/v1/digits/predict", b'{"input": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400, "levels deep"),
    ("/v1/%C3%A9/predict", json.dumps({"input": [0.0] * 64}).encode(), 404, "unknown app"),
    (
        "/v1/digits/feedback",
        b'{"query_id": "q", "label": ' + b"[" * 990 + b"]" * 990 + b"}",
        400,
        "levels deep",
    ),
]


@pytest.mark.parametrize(("path", "body", "status", "fragment"), BAD_REQUESTS)
def test_bad_input_gets_a_4xx_with_a_message_and_serving_goes_on(
    server: str, path: str, body: bytes, status: int, fragment: str
) -> None:
    x, y = digits.test_split()
    bad = httpx.post(f"{server}{path}", content=body, headers=JSON, timeout=30)
    assert bad.status_code == status, bad.text
    assert fragment in bad.json()["message"]
    body = {"input": x[0].tolist(), "slo_ms": SLO_MS}
    good = httpx.post(f"{server}/v1/digits/predict", json=body, timeout=30)
    assert good.status_code == 200
    assert good.json()["output"]["label"] in range(10)


def test_a_body_a_web_page_could_send_unasked_is_a_415_and_costs_nothing(server: str) -> None:
    """A form or plain text (what a page may post to any address without a preflight) is
    refused before it is read, on predictions and on feedback."""
    x, _ = digits.test_split()
    body = json.dumps({"input": x[0].tolist()}).encode()
    for path in ("/v1/digits/predict", "/v1/digits/feedback"):
        for kind in ("text/plain", "application/x-www-form-urlencoded"):
            bad = httpx.post(f"{server}{path}", content=body, headers={"content-type": kind})
            assert bad.status_code == 415, bad.text
            assert bad.json()["error"] == "unsupported_media_type"


def test_feedback_is_stored_in_redis_and_docs_are_served(server: str, redis_url: str) -> None:
    x, y = digits.test_split()
    body = {"input": x[1].tolist(), "slo_ms": SLO_MS}
    answer = httpx.post(f"{server}/v1/digits/predict", json=body, timeout=30).json()
    ack = httpx.post(
        f"{server}/v1/digits/feedback",
        json={"query_id": answer["query_id"], "label": int(y[1])},
        timeout=30,
    )
    assert ack.status_code == 200
    stored = redis.Redis.from_url(redis_url).get(f"raysrv:feedback:{answer['query_id']}")
    assert json.loads(stored) == int(y[1])
    apps = httpx.get(f"{server}/v1/apps", timeout=10).json()["apps"]
    assert apps[0]["models"] == list(digits.MODEL_NAMES)
    schema = httpx.get(f"{server}/openapi.json", timeout=10).json()
    assert "/v1/{app}/predict" in schema["paths"]


def test_the_readmes_quickstart_queries_answer_as_it_shows(server: str) -> None:
    """The README's quickstart shell block, run as written but for the port: a prediction,
    then feedback that names the answer's own query id."""
    _, block = blocks("## Quickstart", "bash")
    script = block.replace("localhost:8000", server.removeprefix("http://"))
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], capture_output=True, timeout=120
    )
    assert done.returncode == 0, done.stderr.decode()
    answer, feedback = (json.loads(line) for line in done.stdout.decode().splitlines())
    shown = set(re.findall(r'"(\w+)":', block.split('echo "$answer"')[1].split("id=")[0]))
    assert set(answer) <= shown, f"the README's answer lacks {sorted(set(answer) - shown)}"
    assert answer["output"]["label"] == 0  # the README's digit is a 0
    assert answer["models"][0] in digits.MODEL_NAMES
    assert feedback == {
        "query_id": answer["query_id"],
        "app": "digits",
        "accepted": True,
        "relabelled": False,
    }
