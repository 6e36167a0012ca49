"""The partitioned example through `raysrv run`, as the README serves it, over real HTTP: a
model of 17.5 MiB whose shards may hold 8 MiB each (its worker holds only its own shards, the
others run on shard actors) answers as the whole model does, on the digits test split."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest
import yaml

from examples.digits import build as digits
from examples.partitioned.build import MODEL_FILE
from tests.conftest import free_port
from tests.e2e.serving import served

ROOT = Path(__file__).parents[2]
CONFIG = ROOT / "examples" / "partitioned" / "config.yaml"
QUERIES = 60


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    config = yaml.safe_load(CONFIG.read_text())
    port = free_port()
    config["http_options"]["port"] = port
    path = tmp_path_factory.mktemp("e2e-partitioned") / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    models = CONFIG.parent / "models"  # built here on the first start, kept for the next
    models.mkdir(exist_ok=True)
    (path.parent / "models").symlink_to(models, target_is_directory=True)
    with served([str(Path(sys.executable).with_name("raysrv")), "run", str(path)], port) as url:
        yield url


async def _predict(url: str, images: np.ndarray) -> list[list[float]]:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:

        async def one(image: np.ndarray) -> list[float]:
            body = {"input": image.tolist(), "slo_ms": 30_000}
            response = await client.post("/v1/models/wide-cnn/predict", json=body)
            assert response.status_code == 200, response.text
            return response.json()["output"]

        return await asyncio.gather(*(one(image) for image in images))


def test_a_model_twice_a_shards_limit_answers_as_the_whole_model(server: str) -> None:
    x, y = digits.test_split()
    images = x[:QUERIES].reshape(-1, 1, 8, 8)
    model = CONFIG.parent / "models" / MODEL_FILE
    assert model.stat().st_size > 2 * 8 * 2**20
    expected = ort.InferenceSession(str(model)).run(None, {"input": images})[0]
    served = np.array(asyncio.run(_predict(server, images)), dtype=np.float32)
    np.testing.assert_allclose(served, expected, rtol=1e-4, atol=1e-6)
    assert np.mean(served.argmax(axis=1) == y[:QUERIES]) > 0.9
