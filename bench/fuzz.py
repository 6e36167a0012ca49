"""Schema fuzzing at length: every operation of raysrv's OpenAPI schema, many cases each.

    python -m bench.fuzz [--cases 400] [--seed 0] [--keyed] [--out JSON]

The server of the unit test ``tests/unit/test_schema.py`` (:func:`fuzz_server`: models of
numbers and of text, an app that learns from feedback, the Open Inference Protocol routes) on a
real socket, and schemathesis's cases for each operation: ``--cases`` generated from the schema
(positive) and as many that break it (negative), seeded, split between random names in the
path and each name the server serves (apps, models, pools). Each answer goes through every check
schemathesis has but ``positive_data_acceptance`` (why: the test's docstring). ``--keyed``: the
ingress has an API key, sent with every request. Prints, per operation and in all, the cases
sent, the answers with a 5xx status and each failed check's count: the target is zero of
either.

Results: bench/RESULTS.md, "Schema fuzzing".
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["fuzz", "fuzz_server", "main"]

KEY = "fuzz-key-0123456789abcdef"
TEXT_MODEL = "raysrv.testing:TextModel"
SERVED = {"app": ("one", "ab", "text"), "model": ("a", "b", "t"), "pool": ("a", "b", "t")}


def fuzz_server(api_keys: tuple[str, ...] = ()) -> Any:
    """The server the fuzzing talks to (call on its event loop): models of numbers (``a``,
    ``b``) and of text (``t``), apps over one, over two learning from feedback (``exp3``, on
    the answers' ``sum``) and over the text model; with ``api_keys``, the ingress's keys."""
    from raysrv._server import Server
    from raysrv.config import RaysrvSpec
    from raysrv.runtimes import PythonRuntime
    from raysrv.testing import EchoModel, fake_workers, model_spec, spec

    text = {"dtype": "string", "max_length": 64, "example": "a text"}
    raw = spec(
        [model_spec("a"), model_spec("b"), model_spec("t", source=TEXT_MODEL, input=text)],
        [
            {"name": "one", "models": ["a"], "cache_size": 16},
            {
                "name": "ab",
                "models": ["a", "b"],
                "selection": {"policy": "exp3", "params": {"field": "sum"}},
            },
            {"name": "text", "models": ["t"]},
        ],
        ingress={"api_keys": list(api_keys)},
    )
    workers: dict[str, Any] = {m: fake_workers(EchoModel()) for m in ("a", "b")}
    workers["t"] = fake_workers(PythonRuntime(TEXT_MODEL))
    return Server(RaysrvSpec.model_validate(raw), workers)


def fuzz(base_url: str, cases: int, seed: int, headers: dict[str, str]) -> dict[str, Any]:
    """Each operation's count of cases, 5xx answers and failed checks, and their sums."""
    import requests
    import schemathesis

    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json", headers=headers)
    session = requests.Session()
    found = {}
    for result in schema.get_all_operations():
        operation = result.ok()
        found[operation.label] = _operation(operation, cases, seed, session, headers)
    total: collections.Counter[str] = collections.Counter()
    for counts in found.values():
        total.update(counts)
    return {"operations": {k: dict(v) for k, v in found.items()}, "total": dict(total)}


def _operation(
    operation: Any, cases: int, seed: int, session: Any, headers: dict[str, str]
) -> collections.Counter[str]:
    """``cases`` positive and as many negative cases of one operation, split between random
    names in its path and each served one, checked."""
    from hypothesis.errors import Unsatisfiable
    from schemathesis import GenerationMode
    from schemathesis.core.failures import FailureGroup
    from schemathesis.specs.openapi.checks import positive_data_acceptance

    counts: collections.Counter[str] = collections.Counter()

    def check(case: Any) -> None:
        response = case.call(session=session, headers=headers)
        counts["cases"] += 1
        counts["5xx"] += response.status_code >= 500
        try:
            case.validate_response(
                response, excluded_checks=[positive_data_acceptance], headers=headers
            )
        except FailureGroup as group:
            for failure in group.exceptions:
                counts[f"failed: {failure.title}"] += 1

    names = [p.name for p in operation.path_parameters]
    served = [{}] + [{name: value} for name in names for value in SERVED.get(name, ())]
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
        for path in served:  # random names (mostly 404), then each served one
            strategy = operation.as_strategy(generation_mode=mode, path_parameters=path)
            try:
                _cases(strategy, max(1, cases // len(served)), seed, check)()
            except Unsatisfiable:  # nothing of it to break: no parameter but its path
                counts[f"no {mode.value} cases"] += 1
    return counts


def _cases(strategy: Any, cases: int, seed: int, check: Any) -> Any:
    """A function that runs ``check`` on ``cases`` cases drawn from ``strategy``, seeded."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as fixed_seed

    return fixed_seed(seed)(
        settings(
            max_examples=cases,
            deadline=None,
            database=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )(given(strategy)(check))
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=400, help="per operation and mode")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keyed", action="store_true", help="an API key on the ingress")
    parser.add_argument("--out", type=Path, help="write the counts here as JSON")
    args = parser.parse_args(argv)

    from raysrv.testing import serve_http

    headers = {"Authorization": f"Bearer {KEY}"} if args.keyed else {}
    keys = (KEY,) if args.keyed else ()
    started = time.monotonic()
    with serve_http(lambda: fuzz_server(keys)) as url:
        found = fuzz(url, args.cases, args.seed, headers)
    found["seconds"] = round(time.monotonic() - started, 1)
    found["command"] = " ".join(["python -m bench.fuzz", *(argv or sys.argv[1:])])
    for label, counts in found["operations"].items():
        print(f"{label:40s} {json.dumps(counts)}")
    print(f"{'all':40s} {json.dumps(found['total'])}  ({found['seconds']} s)")
    if args.out is not None:
        args.out.write_text(json.dumps(found, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
