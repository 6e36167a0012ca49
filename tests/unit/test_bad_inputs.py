"""Every hand-made bad request of ``bench.bad_inputs`` gets the documented 4xx it names, with
its route's error body and without its long values echoed, and the query after it is answered
exactly (the server on a real socket, its models in-process)."""

from __future__ import annotations

from bench.bad_inputs import CATALOG, failures, probe
from bench.fuzz import fuzz_server
from raysrv.testing import serve_http


def test_each_bad_request_gets_its_documented_4xx_and_the_next_query_its_answer() -> None:
    with serve_http(fuzz_server) as url:
        found = probe(url)
    assert len(found) == len(CATALOG) >= 90
    assert failures(found) == []
    assert all(400 <= f["status"] < 500 for f in found)
