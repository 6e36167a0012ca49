"""What a call on the ingress's event loop costs when it lets go of the interpreter's lock while
another thread wants it, as a pool's worker thread does on a busy ingress.

    python -m bench.gil_release [--seconds 0.5]

Each candidate is called in a loop for ``--seconds``, first alone, then beside a thread that
runs Python without pause; prints the calls a second of each, and the other thread's loop
iterations a second meanwhile. A call that keeps the lock is slowed only by the share of the
CPU the other thread takes; one that lets it go waits, each time, for the other thread to give
it back. The candidates: the two ways of checking an input's finiteness (a dot product with
zeros, which numpy hands to BLAS without the lock; a float64 sum, which keeps it), and a Ray
histogram's observation against a counter summed in a dict, the two ways of counting a
request's latency (``raysrv.metrics``; Ray is started for it).

Results: bench/RESULTS_ARCHIVE.md, "Calls that let go of the GIL".
"""

from __future__ import annotations

import argparse
import math
import sys
import threading
import time
from collections.abc import Callable

import numpy as np

__all__ = ["calls_per_s", "main"]


def calls_per_s(call: Callable[[], object], seconds: float, contended: bool) -> tuple[float, float]:
    """``call``'s calls a second over ``seconds``, and, if ``contended``, the iterations a
    second of a thread that runs Python beside it the while (else 0)."""
    stop = threading.Event()
    spins = [0]

    def spin() -> None:
        while not stop.is_set():
            spins[0] += 1

    other = threading.Thread(target=spin, daemon=True)
    if contended:
        other.start()
        time.sleep(0.05)
    before, start, calls = spins[0], time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        for _ in range(100):
            call()
        calls += 100
    elapsed = time.perf_counter() - start
    spun = spins[0] - before
    stop.set()
    if contended:
        other.join()
    return calls / elapsed, spun / elapsed if contended else 0.0


def _candidates() -> dict[str, Callable[[], object]]:
    import ray
    from ray.util import metrics

    x = np.random.default_rng(0).random(64, dtype=np.float32)  # one digits input
    zeros = np.zeros(64, np.float32)
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    histogram = metrics.Histogram("gil_release_ms", "", [1, 2, 5, 10], tag_keys=("app",))
    summed: dict[str, float] = {}
    tags = {"app": "digits"}

    def add() -> None:
        summed["digits"] = summed.get("digits", 0.0) + 1.0

    return {
        "finite: dot with zeros": lambda: math.isfinite(x.dot(zeros)),
        "finite: float64 sum": lambda: math.isfinite(np.add.reduce(x, dtype=np.float64)),
        "Ray histogram observe": lambda: histogram.observe(3.0, tags=tags),
        "count summed in a dict": add,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=0.5)
    args = parser.parse_args(argv)
    print("| call | alone, calls/s | beside a Python thread, calls/s | that thread, loops/s |")
    print("|---|---:|---:|---:|")
    try:
        for name, call in _candidates().items():
            alone, _ = calls_per_s(call, args.seconds, contended=False)
            beside, spun = calls_per_s(call, args.seconds, contended=True)
            print(f"| {name} | {alone:,.0f} | {beside:,.0f} | {spun:,.0f} |", flush=True)
    finally:
        import ray

        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
