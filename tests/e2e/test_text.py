"""The text example through `raysrv run examples/text/config.yaml`, as the README serves it:
a string-input python model, over real HTTP, one text and many."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import httpx
import yaml

from tests.conftest import free_port
from tests.e2e.serving import served

ROOT = Path(__file__).parents[2]
CONFIG = ROOT / "examples" / "text" / "config.yaml"


def test_the_text_example_embeds_one_text_and_many(tmp_path: Path) -> None:
    config = yaml.safe_load(CONFIG.read_text())
    port = free_port()
    config["http_options"]["port"] = port
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    with served([str(Path(sys.executable).with_name("raysrv")), "run", str(path)], port) as url:
        one = httpx.post(f"{url}/v1/embed/predict", json={"input": "some text"}, timeout=30)
        texts = ["some text", "quite another text", "some text"]
        many = httpx.post(f"{url}/v1/embed/predict", json={"inputs": texts}, timeout=30)
    assert one.status_code == 200, one.text
    output = one.json()["output"]
    assert len(output["embedding"]) == 64
    assert math.isclose(math.hypot(*output["embedding"]), 1.0, rel_tol=1e-6)
    assert output["words"] == 2
    results = [r["output"] for r in many.json()["results"]]
    assert [r["words"] for r in results] == [2, 3, 2]
    assert results[0]["embedding"] == results[2]["embedding"] == output["embedding"]
    assert results[1]["embedding"] != output["embedding"]
