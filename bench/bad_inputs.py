"""Hand-made bad requests, each on every route that reads one, and a good query after each.

    python -m bench.bad_inputs [--out JSON]

The server of the schema fuzzing (:func:`bench.fuzz.fuzz_server`: models of numbers ``a``,
``b`` and of text ``t``, apps ``one``, ``ab`` learning from feedback and ``text``) on a real
socket. Each request of :data:`CATALOG` must get the status it names, a documented 4xx, with
the JSON error body of its route (``{"error", "message", "status"}``, or ``{"error"}`` on the
``/v2`` routes), and must not echo more than :data:`ECHO_CHARS` characters of what it sent;
right after it, a well-formed query must get its exact answer. Prints each that did not, and
the counts: the target is none.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["CATALOG", "Bad", "main", "probe"]

ECHO_CHARS = 200  # the most of a request's text an error may quote
INPUT = [1.0, 2.0, 3.0, 4.0]
JSON = "application/json"


@dataclass(frozen=True)
class Bad:
    """One bad request: what it is, the status it must get, and the request. ``body`` is
    bytes, or a JSON value to encode; a callable gets a fresh query id of app ``ab`` (to name
    a query that exists) and returns the body."""

    what: str
    status: int
    path: str
    body: Any = None
    content_type: str | None = JSON
    headers: dict[str, str] = field(default_factory=dict)
    method: str = "POST"


def _get(what: str, status: int, path: str) -> Bad:
    return Bad(what, status, path, content_type=None, method="GET")


def _nested(depth: int) -> str:
    """A JSON number ``depth`` arrays deep."""
    return "[" * depth + "1" + "]" * depth


def _raw_json(text: str) -> bytes:
    return text.encode()


def _infer_binary(size_declared: int, data: bytes) -> tuple[bytes, dict[str, str]]:
    header = {
        "inputs": [
            {
                "name": "input",
                "shape": [1, 4],
                "datatype": "FP32",
                "parameters": {"binary_data_size": size_declared},
            }
        ]
    }
    head = json.dumps(header).encode()
    return head + data, {"Inference-Header-Content-Length": str(len(head))}


def _labelled(label: Any) -> Any:
    """A feedback body for the fresh query id it is given."""
    return lambda query_id: {"query_id": query_id, "label": label}


def _raw_label(label: str) -> Any:
    """A feedback body whose label is the JSON text ``label``, for the query id it is given."""
    return lambda query_id: _raw_json(f'{{"query_id": "{query_id}", "label": {label}}}')


def _infer(**tensor: Any) -> dict[str, Any]:
    base = {"name": "input", "shape": [1, 4], "datatype": "FP32", "data": INPUT}
    return {"inputs": [{**base, **tensor}]}


FOUR_FLOATS = struct.pack("<4f", *INPUT)
BINARY_SHORT, BINARY_SHORT_HEADERS = _infer_binary(16, FOUR_FLOATS[:8])
BINARY_SIZE, BINARY_HEADERS = _infer_binary(12, FOUR_FLOATS)
BIG = 1 << 20  # the server's body limit
OCTET = "application/octet-stream"


def _catalog() -> list[Bad]:
    p, m, f = "/v1/one/predict", "/v1/models/a/predict", "/v1/ab/feedback"
    t, infer = "/v1/models/t/predict", "/v2/models/a/infer"
    ok = {"input": INPUT}
    return [
        # the predict route's body
        Bad("not JSON", 400, p, b"{"),
        Bad("a JSON array", 400, p, [1, 2]),
        Bad("a JSON string", 400, p, "input"),
        Bad("JSON null", 400, p, b"null"),
        Bad("an empty body", 400, p, b""),
        Bad("no input", 400, p, {}),
        Bad("an input of another shape", 400, p, {"input": [1.0, 2.0]}),
        Bad("an input of strings", 400, p, {"input": ["a", "b", "c", "d"]}),
        Bad("an input one level too deep", 400, p, {"input": [INPUT, INPUT]}),
        Bad("an input that is an object", 400, p, {"input": {"a": 1}}),
        Bad("an input holding NaN", 400, p, _raw_json('{"input": [NaN, 1, 2, 3]}')),
        Bad("an input holding Infinity", 400, p, _raw_json('{"input": [Infinity, 1, 2, 3]}')),
        Bad("a number past float", 400, p, _raw_json('{"input": [1e400, 1, 2, 3]}')),
        Bad("an integer of 400 digits", 400, p, _raw_json('{"input": [' + "9" * 400 + ",1,2,3]}")),
        Bad("JSON nested 1,000 deep", 400, p, _raw_json(f'{{"input": {_nested(1000)}}}')),
        Bad("JSON nested 100,000 deep", 400, p, _raw_json("[" * 100_000)),
        Bad("a body past the limit", 413, p, b'{"input": "' + b"x" * BIG + b'"}'),
        Bad("invalid UTF-8", 400, p, b'{"input": "\xff\xfe"}'),
        Bad("slo_ms negative", 400, p, {**ok, "slo_ms": -5}),
        Bad("slo_ms zero", 400, p, {**ok, "slo_ms": 0}),
        Bad("slo_ms a string", 400, p, {**ok, "slo_ms": "fast"}),
        Bad("slo_ms NaN", 400, p, _raw_json('{"input": [1,2,3,4], "slo_ms": NaN}')),
        Bad("priority a string", 400, p, {**ok, "priority": "high"}),
        Bad("priority fractional", 400, p, {**ok, "priority": 0.5}),
        Bad("best_effort a string", 400, p, {**ok, "best_effort": "yes"}),
        Bad("sent_at zero", 400, p, {**ok, "sent_at": 0}),
        Bad("sent_at -Infinity", 400, p, _raw_json('{"input": [1,2,3,4], "sent_at": -Infinity}')),
        Bad("sent_at an hour ahead", 400, p, {**ok, "sent_at": time.time() + 3600}),
        Bad("sent_at a string", 400, p, {**ok, "sent_at": "now"}),
        Bad("a context of 900 KB", 413, p, {**ok, "context": "c" * 900_000}),
        Bad("a context past the limit", 413, p, {**ok, "context": "c" * 257}),
        Bad("inputs empty", 400, p, {"inputs": []}),
        Bad("inputs not a list", 400, p, {"inputs": 5}),
        Bad("inputs past max_inputs", 413, p, {"inputs": [INPUT] * 1025}),
        Bad("input and inputs both", 400, p, {"input": INPUT, "inputs": [INPUT]}),
        # the predict route's request line and headers
        Bad("text/plain", 415, p, ok, content_type="text/plain"),
        Bad("no content type", 415, p, ok, content_type=None),
        Bad("a form", 415, p, b"input=1", content_type="application/x-www-form-urlencoded"),
        Bad("multipart", 415, p, b"--x--", content_type="multipart/form-data; boundary=x"),
        _get("GET", 405, p),
        Bad("PUT", 405, p, ok, method="PUT"),
        Bad("DELETE", 405, p, content_type=None, method="DELETE"),
        Bad("a non-ASCII app name", 404, "/v1/%C3%A9/predict", ok),
        Bad("an app name of 10,000 characters", 404, f"/v1/{'n' * 10_000}/predict", ok),
        Bad("an unknown app", 404, "/v1/nobody/predict", ok),
        Bad("an app name of percent-escapes", 404, "/v1/%00%0a%ff/predict", ok),
        # raw tensors on the predict routes
        Bad("raw bytes of the wrong length", 400, p, FOUR_FLOATS[:6], content_type=OCTET),
        Bad("a dtype nobody knows", 400, p, FOUR_FLOATS, OCTET, {"x-raysrv-dtype": "float7"}),
        Bad("a shape of letters", 400, p, FOUR_FLOATS, OCTET, {"x-raysrv-shape": "a,b"}),
        Bad("a negative shape", 400, p, FOUR_FLOATS, OCTET, {"x-raysrv-shape": "-4"}),
        Bad("a shape past the body", 400, p, FOUR_FLOATS, OCTET, {"x-raysrv-shape": "9999,4"}),
        Bad("a huge shape", 400, p, FOUR_FLOATS, OCTET, {"x-raysrv-shape": "99999999999,4"}),
        Bad("slo_ms a word in the query", 400, p + "?slo_ms=soon", FOUR_FLOATS, OCTET),
        # one model's route
        Bad("an unknown model", 404, "/v1/models/nope/predict", ok),
        Bad("a model input of another shape", 400, m, {"input": [1.0]}),
        Bad("a number for a text model", 400, t, {"input": 5}),
        Bad("text past max_length", 413, t, {"input": "w" * 65}),
        Bad("a list for a text model", 400, t, {"input": ["a", "b"]}),
        _get("GET on a model's predict", 405, m),
        # feedback
        Bad("feedback not JSON", 400, f, b"]"),
        Bad("feedback without query_id", 400, f, {"label": 1}),
        Bad("feedback without label", 400, f, lambda q: {"query_id": q}),
        Bad("feedback for an unknown query", 404, f, {"query_id": "0" * 32, "label": 1}),
        Bad("feedback with a query_id of 100 KB", 404, f, {"query_id": "q" * 100_000, "label": 1}),
        Bad("feedback with a numeric query_id", 400, f, {"query_id": 7, "label": 1}),
        Bad("a label nested 1,000 deep", 400, f, _raw_label(_nested(1000))),
        Bad("a label of 900 KB", 413, f, _labelled("y" * 900_000)),
        Bad("a text label for models of numbers", 400, f, _labelled("x")),
        Bad("a null label", 400, f, _labelled(None)),
        Bad("a label of NaN", 400, f, _raw_label("NaN")),
        Bad(
            "feedback to another app",
            404,
            "/v1/one/feedback",
            lambda q: {"query_id": q, "label": 1},
        ),
        Bad("feedback given twice", 409, f, "twice"),
        Bad("feedback as text/plain", 415, f, b"{}", content_type="text/plain"),
        _get("GET on feedback", 405, f),
        # the Open Inference Protocol
        Bad("infer of an unknown model", 404, "/v2/models/nope/infer", _infer()),
        Bad("infer not JSON", 400, infer, b"{"),
        Bad("infer without inputs", 400, infer, {"id": "x"}),
        Bad("infer of two inputs", 400, infer, {"inputs": _infer()["inputs"] * 2}),
        Bad("infer of another shape", 400, infer, _infer(shape=[1, 3], data=INPUT[:3])),
        Bad("infer data short of its shape", 400, infer, _infer(data=INPUT[:3])),
        Bad("infer of a negative shape", 400, infer, _infer(shape=[-1, 4])),
        Bad("infer of BYTES to a model of numbers", 400, infer, _infer(datatype="BYTES")),
        Bad("infer of a datatype nobody knows", 400, infer, _infer(datatype="FP7")),
        Bad("infer with slo_ms negative", 400, infer, {**_infer(), "parameters": {"slo_ms": -1}}),
        Bad("infer compressed", 400, infer, _infer(), headers={"Content-Encoding": "gzip"}),
        Bad("infer binary data cut short", 400, infer, BINARY_SHORT, OCTET, BINARY_SHORT_HEADERS),
        Bad("infer binary data of a wrong size", 400, infer, BINARY_SIZE, OCTET, BINARY_HEADERS),
        Bad(
            "infer whose JSON header is longer than the body",
            400,
            infer,
            b"{}",
            OCTET,
            {"Inference-Header-Content-Length": "999"},
        ),
        _get("an unknown model's metadata", 404, "/v2/models/nope"),
        _get("an unknown model's readiness", 404, "/v2/models/nope/ready"),
        # the other routes
        _get("an unknown pool's timeline", 404, "/v1/pools/nope/timeline"),
        _get("a timeline since a word", 400, "/v1/pools/a/timeline?since=abc"),
        _get("a timeline after a fraction", 400, "/v1/pools/a/timeline?after=1.5"),
        _get("an unknown model's plan", 404, "/v1/models/nope/plan"),
        _get("an unknown model", 404, "/v1/models/nope"),
        _get("a route nobody serves", 404, "/v1/nothing"),
        Bad("POST on the app list", 405, "/v1/apps", {}),
    ]


CATALOG = _catalog()


def _errors_body(path: str, body: Any, status: int) -> bool:
    if path.startswith("/v2/"):
        return isinstance(body, dict) and isinstance(body.get("error"), str)
    return (
        isinstance(body, dict)
        and body.get("status") == status
        and isinstance(body.get("error"), str)
        and isinstance(body.get("message"), str)
    )


def probe(base_url: str, catalog: list[Bad] = CATALOG) -> list[dict[str, Any]]:
    """Each request's outcome: its status, whether it is the one named, whether its body is
    its route's error body, how much of the request it echoed, and whether a good query
    right after got its answer."""
    import httpx

    found = []
    with httpx.Client(base_url=base_url, timeout=30) as client:

        def query_id() -> str:
            return client.post("/v1/ab/predict", json={"input": INPUT}).json()["query_id"]

        for bad in catalog:
            body = bad.body
            if body == "twice":
                first = {"query_id": query_id(), "label": 1}
                client.post(bad.path, json=first)
                body = first
            elif callable(body):
                body = body(query_id())
            content = body if isinstance(body, bytes) or body is None else json.dumps(body)
            headers = dict(bad.headers)
            if bad.content_type is not None:
                headers["content-type"] = bad.content_type
            if bad.method == "GET":
                response = client.get(bad.path, headers=headers)
            else:
                response = client.request(bad.method, bad.path, content=content, headers=headers)
            try:
                answer: Any = response.json()
            except ValueError:
                answer = None
            good = client.post("/v1/one/predict", json={"input": INPUT})
            found.append(
                {
                    "what": bad.what,
                    "wanted": bad.status,
                    "status": response.status_code,
                    "error_body": _errors_body(bad.path, answer, response.status_code),
                    "echoed": _echoed(response.text, content),
                    "then_good": good.status_code == 200
                    and good.json()["output"]["sum"] == sum(INPUT),
                }
            )
    return found


def _echoed(text: str, sent: Any) -> int:
    """The longest run of one character repeated that the answer holds and the request did
    too: how much of a long sent value came back."""
    if not isinstance(sent, bytes | str) or not text:
        return 0
    sent_text = sent.decode(errors="replace") if isinstance(sent, bytes) else sent
    longest = run = 0
    for i, char in enumerate(text):
        run = run + 1 if i and char == text[i - 1] else 1
        if run > longest and char * run in sent_text:
            longest = run
    return longest


def failures(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        f
        for f in found
        if f["status"] != f["wanted"]
        or not f["error_body"]
        or f["echoed"] > ECHO_CHARS
        or not f["then_good"]
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write each outcome here as JSON")
    args = parser.parse_args(argv)

    from bench.fuzz import fuzz_server
    from raysrv.testing import serve_http

    with serve_http(fuzz_server) as url:
        found = probe(url)
    wrong = failures(found)
    for f in wrong:
        print(json.dumps(f))
    statuses: dict[int, int] = {}
    for f in found:
        statuses[f["status"]] = statuses.get(f["status"], 0) + 1
    print(f"{len(found)} bad requests, {len(wrong)} not as documented; statuses {statuses}")
    if args.out is not None:
        args.out.write_text(json.dumps(found, indent=1))
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
