"""Schema fuzzing: every operation of the OpenAPI schema, driven over HTTP by schemathesis.

raysrv's app serves on a real socket (uvicorn in a thread, ``raysrv.testing.serve_http``) over
in-process workers (``bench.fuzz.fuzz_server``): models of numbers and of text, an app that
learns from feedback, and the Open Inference Protocol routes. Seeded and bounded here;
``python -m bench.fuzz`` runs the same checks over many more cases. Every check schemathesis
has runs but one: a request the schema allows may still be refused with a 4xx (an input of the
wrong shape for the model named in the path, an unknown query id), so
``positive_data_acceptance`` would count raysrv's documented refusals as failures. What holds:
no 5xx, every status, header, media type and body as the schema documents it, and what the
schema forbids refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from bench.fuzz import KEY, fuzz, fuzz_server
from raysrv.testing import serve_http


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with serve_http(fuzz_server) as url:
        yield url


schema = schemathesis.pytest.from_fixture("loaded")


@pytest.fixture(scope="module")
def loaded(base_url: str) -> Any:
    return schemathesis.openapi.from_url(f"{base_url}/openapi.json")


@schema.parametrize()
@settings(
    max_examples=25,
    derandomize=True,  # the same cases each run
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_every_operation_answers_as_its_schema_documents(case: Any) -> None:
    case.call_and_validate(excluded_checks=[positive_data_acceptance])


@pytest.mark.parametrize("keyed", [False, True])
def test_fuzzed_requests_to_served_and_unknown_names_get_documented_answers(keyed: bool) -> None:
    """``bench.fuzz``'s run in small: cases for random names in the path and for each app,
    model and pool served, that fit the schema and that break it; with ``keyed``, an ingress
    with an API key, sent with each request (the checks also send some without)."""
    headers = {"Authorization": f"Bearer {KEY}"} if keyed else {}
    with serve_http(lambda: fuzz_server((KEY,) if keyed else ())) as url:
        found = fuzz(url, 30, 0, headers)
    total = found["total"]
    assert total["cases"] > 250
    assert total["5xx"] == 0
    assert [k for k in total if k.startswith("failed")] == [], found
