"""Where an HTTP prediction's time goes in the serving process, by the code it runs in.

    python -m bench.ingress_profile [--system raysrv-colocated] [--per-request 1] [--seconds 15]
                                    [--gil] [--stacks FILE]

Starts :mod:`bench.fast_path`'s applications on Serve's fast path, holds ``wrk`` with 32
connections on one of them (bodies of ``--per-request`` inputs; ``baseline``: plain Serve's
replica, one input a request) and meanwhile samples its replica's process with ``py-spy record``
(200 times a second, every thread that is not idle; ``--gil``: only the thread holding the
GIL). Prints the inputs answered per second, the process's CPU time per input, and the share of
the samples whose innermost frame runs in each place: Ray Serve, uvicorn, FastAPI, Starlette,
asyncio, Ray's metrics, each raysrv module, the model's runs (onnxruntime), the threads that
wait for work. A thread counts while it holds the CPU or waits outside Python, so the shares
are of the process's busy threads' time, not of one core; with ``--gil`` they are of the time
the process ran Python, which one thread at a time can.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from bench import fast_path
from bench.loadgen import make_inputs, wrk_saturation

__all__ = ["main", "place", "shares"]

WAITING = ("concurrent/futures/thread.py", "threading.py", "ray/_private/worker.py")
PLACES = (  # (the place, a piece of the frame's file path), the first that matches
    ("onnxruntime (the model's runs)", "onnxruntime"),
    ("threads waiting for work", WAITING),
    ("Ray Serve", "ray/serve/"),
    ("Ray's metrics", "ray/util/metrics"),
    ("uvicorn", "uvicorn/"),
    ("FastAPI", "fastapi/"),
    ("Starlette", "starlette/"),
    ("asyncio", "asyncio/"),
    ("json", "json/"),
)
RATE_HZ = 200  # py-spy's samples a second
FRAME = re.compile(r"\((?P<path>[^:()]*):\d+\)$")


def place(frame: str) -> str:
    """Where a py-spy frame (``function (path/to/file.py:line)``) runs."""
    found = FRAME.search(frame)
    path = found.group("path") if found else frame
    for name, pieces in PLACES:
        if any(p in path for p in ((pieces,) if isinstance(pieces, str) else pieces)):
            return name
    for package in ("raysrv", "batching", "policies", "analytics"):
        if path.startswith(f"{package}/") or f"/{package}/" in path:
            prefix = "raysrv" if package == "raysrv" else f"raysrv.{package}"
            return f"{prefix}: {Path(path).stem}"
    return f"other: {Path(path).name}"


def shares(collapsed: Iterable[str]) -> dict[str, float]:
    """Each place's share of the samples of py-spy's raw (collapsed stacks) output."""
    counts: collections.Counter[str] = collections.Counter()
    for line in collapsed:
        stack, _, count = line.rstrip().rpartition(" ")
        if stack:
            counts[place(stack.split(";")[-1])] += int(count)
    total = sum(counts.values()) or 1
    return {name: n / total for name, n in counts.most_common()}


def _cpu_s(pid: str) -> float:
    """CPU seconds (user and system) the process ``pid`` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _sample(
    url: str, bodies: list[bytes], pid: str, seconds: float, out: Path, gil: bool
) -> tuple[float, float]:
    """Inputs answered per second under ``wrk``, the process's CPU microseconds per input, and
    the samples' time per input in microseconds (each sample ``1 / RATE_HZ`` s of a thread)."""
    await wrk_saturation(url, bodies, 32, 3.0)  # warm-up
    spy = subprocess.Popen(
        ["py-spy", "record", "-p", pid, "-d", str(round(seconds)), "-r", str(RATE_HZ)]
        + ["-f", "raw", "-o", str(out), "--nonblocking"]
        + (["--gil"] if gil else []),
        stdout=subprocess.DEVNULL,
    )
    before = _cpu_s(pid)
    result = await wrk_saturation(url, bodies, 32, seconds + 1, count=fast_path.OUTPUT)
    used = _cpu_s(pid) - before
    spy.wait()
    counted = max(result.extra["counted"], 1)
    sampled = sum(int(line.rpartition(" ")[2]) for line in out.read_text().splitlines())
    rate = counted / result.duration_s
    return rate, 1e6 * used / counted, 1e6 * sampled / RATE_HZ / (rate * seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--system", default="raysrv-colocated", choices=fast_path.SYSTEMS)
    parser.add_argument("--per-request", type=int, default=1, help="inputs in a body")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument(
        "--stacks", type=Path, help="also keep py-spy's samples (collapsed stacks) here"
    )
    parser.add_argument(
        "--gil",
        action="store_true",
        help="sample only the thread that holds the GIL: where the Python the process can run "
        "one thread at a time goes",
    )
    args = parser.parse_args(argv)
    port, _ = fast_path.start(serve_proxy=False)
    try:
        if args.system == "baseline":
            url, replica = f"http://{fast_path.HOST}:{port}/baseline", "baseline:baseline"
        else:
            url = f"http://{fast_path.HOST}:{port}/{args.system}/v1/{fast_path.APP}/predict"
            replica = f"{args.system}:ingress"
        found = subprocess.run(
            ["pgrep", "-f", f"ServeReplica:{replica}"], capture_output=True, text=True
        )
        pid = found.stdout.split()[0]
        bodies = fast_path.bodies(
            make_inputs(64 * args.per_request, (64,), seed=1), args.per_request
        )
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "stacks.txt"
            rate, cpu_us, sampled_us = asyncio.run(
                _sample(url, bodies, pid, args.seconds, out, args.gil)
            )
            found_shares = shares(out.read_text().splitlines())
            if args.stacks is not None:
                args.stacks.write_text(out.read_text())
    finally:
        import ray

        ray.shutdown()
    print(
        f"{args.system}, {args.per_request} input(s) a request: {rate:.0f} inputs/s, "
        f"the process's CPU {cpu_us:.0f} us an input, "
        + ("the GIL held" if args.gil else "the sampled threads busy")
        + f" {sampled_us:.0f} us an input"
    )
    for name, share in found_shares.items():
        if share >= 0.002:
            print(f"{share:6.1%}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
