"""The batch-buffer model against the live spine, calibrated from measurements.

Run through ``python -m bench.validate_analytics --live``. The benchmark convnet
(:mod:`bench.models`) is served by raysrv with the ``fixed`` policy on one replica (one CPU,
one onnxruntime thread) in a local Ray; a driver sends Poisson arrivals through a Serve handle.

Calibration from the live system itself: S_k is the median run time the replica measured for
batches of k during the run (``batch_seconds`` in ``GET /v1/models``, sizes never seen are
interpolated). The per-query cost outside the buffer and the replica (handle call, ingress, the
hop to the replica and back) is a distribution measured at low load with batches of one
(latency minus S_1); the prediction adds an independent draw of it to the model's latency.
The model knows nothing of the CPU the serving machinery itself needs: on this 2-core machine
that machinery, the replica and the load generator share two cores, and the cases at higher
rates show how far that carries the live system from the model. The offline profile
(onnxruntime alone in this process) is reported beside the live one for the same reason.

The overhead delays each answer but occupies no replica, so the model runs on S_k alone. One
replica is a finite server; at these loads it is rarely busy when a batch is cut, and the model
used is the infinite-server one.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np

from bench.loadgen import HandleClient, make_inputs, poisson_offsets, replay
from bench.models import DEFAULT_PATH, INPUT_SHAPE, build_convnet, profile
from bench.plots import Panel, cdf_panels
from bench.run_bench import free_port, raysrv_spec
from raysrv.analytics import BatchBufferModel, Poisson
from raysrv.analytics.profiles import interpolate_batches

__all__ = ["CASES", "run_live"]

APP = "bench"
CASES = (  # (B, T seconds, rate /s)
    (4, 0.05, 40.0),
    (8, 0.02, 60.0),
    (8, 0.02, 80.0),
    (16, 0.01, 120.0),
)
CALIBRATION_RATE = 10.0


def start_ray(num_cpus: int = 4) -> int:
    """Ray and Serve on this machine, with ``num_cpus`` logical CPUs; the port Serve's HTTP
    ingress listens on."""
    import logging

    import ray
    from ray import serve
    from ray.serve.schema import LoggingConfig

    logging.getLogger("ray.serve").setLevel(logging.WARNING)
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, logging_level="WARNING")
    quiet = LoggingConfig(enable_access_log=False, log_level="WARNING")
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port}, logging_config=quiet)
    return port


def deploy_spec(
    path: Path,
    policy: str,
    params: dict[str, Any],
    slo_ms: float,
    name: str = "validate",
    ingress: dict[str, Any] | None = None,
) -> Any:
    """(Re)deploy raysrv serving the convnet with ``policy(params)`` and the ingress settings
    ``ingress`` on top of the defaults; return its handle."""
    from ray import serve
    from ray.serve.schema import LoggingConfig

    from raysrv.app import build_app

    spec = raysrv_spec(str(path), INPUT_SHAPE, policy, 1, 0.0)
    spec["models"][0]["batching"] = {"policy": policy, "params": params}
    spec["models"][0]["slo_ms"] = slo_ms
    spec["ingress"] = {**spec.get("ingress", {}), **(ingress or {})}
    quiet = LoggingConfig(enable_access_log=False, log_level="WARNING")
    serve.run(build_app(spec), name=name, route_prefix=f"/{name}", logging_config=quiet)
    return serve.get_app_handle(name)


def deploy(path: Path, B: int, T: float) -> Any:
    """(Re)deploy with ``fixed(B, T)`` and an SLO far above any latency here (measure, do not
    reject); return its handle."""
    return deploy_spec(path, "fixed", {"max_batch_size": B, "timeout_ms": T * 1000}, 5000)


async def measure(handle: Any, rate: float, count: int, seed: int) -> np.ndarray:
    """Latencies (s, from each scheduled arrival to its answer) of ``count`` Poisson arrivals."""
    inputs = make_inputs(256, INPUT_SHAPE, seed=seed)
    client = HandleClient(lambda x: handle.predict.remote(APP, x), inputs)
    for i in range(20):  # warm-up, discarded
        await client.send(i)
    offsets = poisson_offsets(rate, np.random.default_rng(seed), count=count)
    log = await replay(client, offsets)
    ok = np.asarray(log.status) == 200
    return (np.asarray(log.done) - np.asarray(log.scheduled))[ok]


async def live_service(handle: Any, largest: int) -> np.ndarray:
    """Median replica-measured seconds per batch size, sizes not seen interpolated."""
    model = (await handle.models.remote())[0]
    table = {int(k): v for k, v in model["batch_seconds"]["p50"].items()}
    sizes = np.array(sorted(table))
    return interpolate_batches(sizes, [table[k] for k in sizes], np.arange(1, largest + 1))


def run_case(path: Path, B: int, T: float, rate: float, count: int, seed: int) -> tuple:
    handle = deploy(path, B, T)
    lat = asyncio.run(measure(handle, rate, count, seed))
    return lat, asyncio.run(live_service(handle, B))


def run_live(out: Path, quick: bool) -> dict[str, Any]:
    """Calibrate, measure every case, compare; writes ``live_cdfs.png`` under ``out``."""
    from ray import serve

    path = build_convnet(DEFAULT_PATH)
    largest = max(B for B, _, _ in CASES)
    profiled = profile(path, tuple(range(1, largest + 1)), repeats=30 if quick else 100)
    count = 600 if quick else 3000
    start_ray()
    try:
        calib, calib_service = run_case(path, 1, 0.0, CALIBRATION_RATE, count // 4, seed=1)
        overheads = np.sort(calib - calib_service[0])
        cases, curves = [], []
        for i, (B, T, rate) in enumerate(CASES):
            lat, service = run_case(path, B, T, rate, count, seed=10 + i)
            predicted = Calibrated(BatchBufferModel(Poisson(rate), service, B, T), overheads)
            row = compare(predicted, lat, B, T, rate)
            row["service_ms"] = (service * 1e3).round(3).tolist()
            cases.append(row)
            curves.append((predicted, lat, B, T, rate))
    finally:
        serve.shutdown()
    return {
        "offline_service_ms": [round(profiled[k] * 1e3, 3) for k in range(1, largest + 1)],
        "overhead_ms": {f"p{q}": float(np.percentile(overheads, q)) * 1e3 for q in (5, 50, 95)},
        "cases": cases,
        "plot": str(plot_live(curves, out)),
    }


class Calibrated:
    """The model's latency plus an independent overhead drawn from the calibration run."""

    def __init__(self, model: BatchBufferModel, overheads: np.ndarray) -> None:
        self.model, self.overheads = model, overheads

    def cdf(self, t: np.ndarray) -> np.ndarray:
        grid = np.asarray(t, dtype=float)[..., None] - self.overheads
        return np.asarray(self.model.latency_cdf(grid)).mean(axis=-1)

    def quantile(self, q: float) -> float:
        lo, hi = 0.0, float(self.overheads[-1]) + self.model.latency_percentile(0.9999)
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if self.cdf(np.array(mid)) >= q else (mid, hi)
        return hi

    def mean(self) -> float:
        return self.model.mean_latency() + float(self.overheads.mean())


def compare(predicted: Calibrated, lat: np.ndarray, B: int, T: float, rate: float) -> dict:
    """Measured against predicted end-to-end latency (buffer, replica and overhead)."""
    row: dict[str, Any] = {"B": B, "T_ms": T * 1e3, "rate": rate, "answered": int(lat.size)}
    pairs = [
        (f"p{round(q * 100)}", float(np.quantile(lat, q)), predicted.quantile(q))
        for q in (0.5, 0.95)
    ]
    pairs.append(("mean", float(lat.mean()), predicted.mean()))
    for name, measured, model in pairs:
        row[name] = {
            "measured_ms": measured * 1e3,
            "model_ms": model * 1e3,
            "error": (model - measured) / measured,
        }
    return row


def plot_live(curves: list[tuple[Calibrated, np.ndarray, int, float, float]], out: Path) -> Path:
    panels = [
        Panel(
            f"live: {rate:g}/s, B={B}, T={T * 1e3:g} ms",
            lat,
            "measured",
            float(np.quantile(lat, 0.995)) * 1.1,
            [("model + measured overhead", "--", predicted.cdf)],
        )
        for predicted, lat, B, T, rate in curves
    ]
    return cdf_panels(panels, out / "live_cdfs.png")
