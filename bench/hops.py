"""What one call between actors costs: a Serve handle call against a direct Ray actor call.

    python -m bench.hops [--calls 300]

From inside a Serve replica (where raysrv's ingress sits), sequential calls carrying one
3x32x32 float32 input to (a) a Serve deployment through a ``DeploymentHandle`` and (b) a plain
Ray actor; prints the mean milliseconds per call of each, twice, alternating. raysrv's ingress
calls its pools' workers the second way (``raysrv/_workers.py``).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["main"]


def _deploy(calls: int) -> Any:
    import ray
    from ray import serve

    @ray.remote(num_cpus=0.1)
    class Actor:
        def run(self, x: np.ndarray) -> tuple[list[float], float]:
            return x.reshape(len(x), -1).sum(axis=1).tolist(), 0.0

    @serve.deployment(ray_actor_options={"num_cpus": 0.1}, max_ongoing_requests=1)
    class Target:
        def run(self, x: np.ndarray) -> tuple[list[float], float]:
            return x.reshape(len(x), -1).sum(axis=1).tolist(), 0.0

    @serve.deployment(ray_actor_options={"num_cpus": 0.1})
    class Caller:
        def __init__(self, target: Any) -> None:
            self._serve = target.options(method_name="run")
            self._actor = Actor.remote()

        async def mean_ms(self, kind: str) -> float:
            x = np.random.default_rng(0).random((1, 3, 32, 32), dtype=np.float32)
            call = self._actor.run.remote if kind == "actor" else self._serve.remote
            for _ in range(20):
                await call(x)
            start = time.perf_counter()
            for _ in range(calls):
                await call(x)
            return (time.perf_counter() - start) / calls * 1000.0

    return serve.run(Caller.bind(Target.bind()), name="hops", route_prefix="/hops")


def main(argv: Sequence[str] | None = None) -> int:
    import ray
    from ray import serve

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="sequential calls per measurement")
    args = parser.parse_args(argv)
    ray.init(num_cpus=4, include_dashboard=False, logging_level="error", log_to_driver=False)
    try:
        caller = _deploy(args.calls)
        for kind in ("actor", "serve handle", "actor", "serve handle"):
            ms = caller.mean_ms.remote(kind.split()[0]).result(timeout_s=120)
            print(f"{kind:>12}: {ms:.2f} ms per sequential call")
    finally:
        serve.shutdown()
        ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
