"""CPU time per request of raysrv's own HTTP predict path, in one process, without Ray or Serve.

    python -m bench.ingress_cost [--requests 20000] [--rounds 3] [--clients 32] [--refused]
        [--feedback] [--model-route]

The digits example's MLP (:mod:`bench.fast_path`'s config, every input distinct) behind a
:class:`raysrv._server.Server` whose pool runs on threads of this process, its ASGI app
(:func:`raysrv._http.create_http_app`) called directly by 32 clients (``--clients``) in one
event loop, each sending one single-input JSON request after another: as many in flight, and
the model's batches that size. Prints, per round, the requests answered per second and this
process's CPU microseconds per request: what raysrv's parsing, selection, deadline, scheduler
and answer cost on top of what Serve and uvicorn cost in front of them
(``bench.ingress_profile`` measures those, live); with ``--feedback`` the app keeps each query
for a feedback too (an app's default, off in ``bench.fast_path``); with ``--model-route`` the
requests go to the model's own route (``/v1/models/mlp/predict``) rather than the app's.
``--refused``: the model batched by ``deadline`` and every request with an SLO
(``REFUSED_SLO_MS``) shorter than a batch of one, so that each is refused (429, "cannot meet
deadline") as it would be under overload: what a refusal costs the ingress.

Results: bench/RESULTS.md, "The fast path" (answers) and "Overload" (refusals).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from bench import fast_path
from bench.loadgen import make_inputs

__all__ = ["main", "measure"]

CLIENTS = 32
REFUSED_SLO_MS = 0.001
ROUTE = f"/v1/{fast_path.APP}/predict"
MODEL_ROUTE = "/v1/models/mlp/predict"


async def measure(
    requests: int,
    rounds: int,
    refused: bool = False,
    clients: int = CLIENTS,
    feedback: bool = False,
    route: str = ROUTE,
) -> list[tuple[float, float]]:
    """(requests per second, CPU microseconds per request) of each round, ``clients`` sending
    to ``route``; with ``refused``, of requests all refused; with ``feedback``, the app keeping
    each query."""
    from examples.digits.build import build_all
    from raysrv._http import create_http_app
    from raysrv._server import Server
    from raysrv._workers import ColocatedWorkers
    from raysrv.app import prepare_spec
    from raysrv.config import RaysrvSpec

    path = build_all(Path("examples/digits/models"))["mlp"]
    raw = fast_path.spec(path, "colocated", feedback=feedback)
    if refused:
        raw["models"][0]["batching"] = {"policy": "deadline", "params": {"max_batch_size": 32}}
    spec = prepare_spec(RaysrvSpec.model_validate(raw))
    workers = {p.name: ColocatedWorkers(p, metrics=False) for p in spec.resolved_pools()}
    server = Server(spec, workers)
    app = create_http_app(server, spec.ingress.max_body_bytes)
    bodies = fast_path.bodies(make_inputs(64, (64,), seed=1), 1)
    if refused:
        bodies = [b[:-1] + f',"slo_ms":{REFUSED_SLO_MS}}}'.encode() for b in bodies]
    expected = 429 if refused else 200

    async def one(body: bytes) -> None:
        sent: list[dict[str, Any]] = []
        length = str(len(body)).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", length)]
        scope = {"type": "http", "method": "POST", "path": route, "headers": headers}
        messages = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict[str, Any]:
            return messages.pop() if messages else {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await app(scope, receive, send)
        if sent[0]["status"] != expected:
            raise RuntimeError(f"answered {sent[0]['status']}: {sent[1]['body'][:200]!r}")

    async def client(k: int, n: int) -> None:
        for i in range(n):
            await one(bodies[(k + i) % len(bodies)])

    each = requests // clients
    out = []
    try:
        await server.profile()
        for _ in range(rounds):
            wall, cpu = time.perf_counter(), time.process_time()
            await asyncio.gather(*(client(k, each) for k in range(clients)))
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            out.append((clients * each / wall, 1e6 * cpu / (clients * each)))
    finally:
        await server.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20_000, help="a round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=CLIENTS, help="requests in flight")
    parser.add_argument("--refused", action="store_true", help="every request refused")
    parser.add_argument("--feedback", action="store_true", help="the app keeps each query")
    parser.add_argument(
        "--model-route", action="store_true", help="the model's route, not the app's"
    )
    args = parser.parse_args(argv)
    if args.clients < 1:
        parser.error(f"--clients must be at least 1, got {args.clients}")
    rounds = asyncio.run(
        measure(
            args.requests,
            args.rounds,
            args.refused,
            args.clients,
            args.feedback,
            MODEL_ROUTE if args.model_route else ROUTE,
        )
    )
    for k, (rate, cpu_us) in enumerate(rounds):
        print(f"round {k}: {rate:7.0f} requests/s, {cpu_us:6.1f} us of CPU a request")
    return 0


if __name__ == "__main__":
    sys.exit(main())
