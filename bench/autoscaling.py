"""Elastic capacity on a trace with a ramp and spikes: raysrv's analytic autoscaler, its reactive
one, and Ray Serve's own autoscaling of a plain deployment, one after another on one Ray.

    python -m bench.autoscaling [--systems analytic reactive serve fixed] [--scale 1.0]
        [--slo-ms 250] [--targets 2 4 8] [--headrooms 0.1] [--workers 1 2 3 4 5 6]
        [--out JSON] [--plot PNG]

The model is an **emulated accelerator**: a python model whose batch of k sleeps 40 ms + 5 ms
per query (:class:`raysrv.testing.EchoModel`), releasing the interpreter as a GPU kernel does,
so that six workers fit on the two cores and the workers, not the CPUs, set the capacity (about
100 queries a second per worker in batches of 8). Every figure of this benchmark comes from it.

* ``analytic`` and ``reactive``: raysrv with the model on its own workers (Ray actors),
  batches of at most ``MAX_BATCH`` cut as a worker frees (``fixed``), ``autoscaling`` between
  ``MIN`` and ``MAX`` workers, a decision every 0.5 s; each request carries its SLO and
  ``sent_at``. ``reactive`` aims at a number of queries in flight per worker, each of
  ``--targets`` in a run of its own; ``analytic`` runs once per ``--headrooms``.
* ``fixed``: raysrv with as many workers as each of ``--workers``, a run each, no autoscaling.
  They measure the workers the trace needs: per ``WINDOW_S`` window, the fewest that answered
  99% of its queries within the SLO (:func:`needs`), beside what the analytic scaler asked for.
* ``serve``: the same model behind ``@serve.batch(MAX_BATCH, 5 ms)`` in a plain deployment with
  Serve's autoscaling, tuned the way a user would for a bursty load (each of ``--targets``
  ongoing requests per replica in a run of its own, a look-back of 2 s, scale-up after 1 s and
  down after 5 s, not Serve's defaults of 30 s and 600 s), between ``MIN`` and ``MAX``
  replicas. The batch runs inline on the replica's loop, as a GPU call usually does: run in a
  thread instead, the replica fell behind at 40 queries/s (p99 2.3 s) where inline it kept
  up with 80/s (p99 266 ms).

The trace (:func:`rates`, stretched by ``--scale``): 20 s at 20 queries/s, a ramp to 160/s over
40 s, 30 s at 160/s with a spike to 260/s for 3 s every 10 s, a ramp back down over 20 s and
30 s at 20/s, Poisson within (about 13,000 queries). Every query is its own input; requests go
over HTTP through Serve's HAProxy ingress (:data:`raysrv.cli.FAST_PATH`). Each run starts
with a 3 s warm-up at two requests in flight and 16 s without any, so that the trace starts
with every scaler at rest and the warm-up out of its window.

Reported per system, from the client's side (latency from each request's scheduled time):
answered within the SLO over offered, late answers, refusals (429/503), failures and requests
without an answer, worker-seconds (the workers in service, sampled every ``SAMPLE_S``, over the
trace), the p99 of each ``WINDOW_S`` window, and the late answers and failures of the
``AFTER_DOWN_S`` after each scale-down (a query lost or late because a worker went). For
``analytic``, the workers its model asked for at each sample beside those in service.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from ray import serve

from bench.loadgen import REJECTED, closed_loop, replay
from bench.overload import TimedClient, raysrv_body, start

__all__ = ["main", "rates"]

EMULATED = {"delay_s": 0.04, "per_item_s": 0.005}
MAX_BATCH = 8
MIN, MAX = 1, 6
SAMPLE_S = 0.5
WINDOW_S = 5.0
AFTER_DOWN_S = 3.0
SYSTEMS = ("analytic", "reactive", "serve", "fixed")
PHASES = ((20.0, 20.0, 20.0), (40.0, 20.0, 160.0), (30.0, 160.0, 160.0), (20.0, 160.0, 20.0),
          (30.0, 20.0, 20.0))  # fmt: skip  # (seconds, rate at its start, rate at its end)
SPIKE = (60.0, 90.0, 10.0, 3.0, 100.0)  # from, to, every, lasting, queries/s on top


def rates(t: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """The trace's rate (queries/s) at ``t`` seconds, its phases ``scale`` times as long."""
    out = np.zeros_like(t, dtype=float)
    start = 0.0
    for seconds, a, b in PHASES:
        span = seconds * scale
        inside = (t >= start) & (t < start + span)
        out[inside] = a + (b - a) * (t[inside] - start) / span
        start += span
    first, last, every, lasting, extra = SPIKE
    into = t - first * scale
    spiking = (into >= 0) & (t < last * scale) & (np.mod(into, every * scale) < lasting)
    out[spiking] += extra
    return out


def trace_seconds(scale: float) -> float:
    return sum(p[0] for p in PHASES) * scale


def arrivals(scale: float, rng: np.random.Generator) -> np.ndarray:
    """Poisson arrivals at :func:`rates` (thinned from the highest rate)."""
    duration = trace_seconds(scale)
    top = float(rates(np.linspace(0, duration, 10_000), scale).max())
    candidates = np.cumsum(rng.exponential(1.0 / top, int(top * duration * 1.2) + 100))
    candidates = candidates[candidates < duration]
    keep = rng.random(candidates.size) < rates(candidates, scale) / top
    return candidates[keep]


@serve.deployment
class EmulatedServe:
    """The emulated model behind ``@serve.batch``, as a Serve user writes it; young objects
    collected at the threshold ``RAYSRV_GC_YOUNG_OBJECTS`` sets (``raysrv._heap``), as raysrv's."""

    def __init__(self) -> None:
        from raysrv._heap import set_young_threshold
        from raysrv.testing import EchoModel

        self._model = EchoModel(**EMULATED)
        set_young_threshold()

    @serve.batch(max_batch_size=MAX_BATCH, batch_wait_timeout_s=0.005)
    async def _batch(self, inputs: list[Any]) -> list[Any]:
        return self._model.predict_batch(inputs)  # inline, as a GPU call usually is

    async def __call__(self, request: Any) -> dict[str, Any]:
        body = await request.json()
        return {"output": await self._batch(body["input"])}


def _raysrv_spec(policy: str, slo_ms: float, target: float) -> dict[str, Any]:
    model = {
        "name": "gpu",
        "runtime": "python",
        "source": "raysrv.testing:EchoModel",
        "init_kwargs": EMULATED,
        "resources": {"num_cpus": 0.1},
        "batching": {"policy": "fixed", "params": {"max_batch_size": MAX_BATCH}},
        "slo_ms": slo_ms,
        "input": {"shape": [4], "dtype": "float32"},
        "replicas": int(target) if policy == "fixed" else 1,
        "autoscaling": None
        if policy == "fixed"
        else {
            "policy": policy,
            "min": MIN,
            "max": MAX,
            "target_ongoing": target if policy == "reactive" else 2.0,
            "headroom": target if policy == "analytic" else 0.1,
            "look_back_s": 2.0,
            "every_s": 0.5,
            "up_after_s": 0.0,
            "down_after_s": 5.0,
        },
    }
    return {
        "models": [model],
        "apps": [{"name": "gpu", "models": ["gpu"], "cache_size": 0}],
        "ingress": {"num_cpus": 0.1},
    }


def deploy(system: str, slo_ms: float, target: float) -> str:
    """Deploy ``system``; the path its requests go to."""
    from ray.serve.schema import LoggingConfig

    from raysrv.app import build_app

    quiet = LoggingConfig(enable_access_log=False, log_level="WARNING")
    if system == "serve":
        scaling = {
            "min_replicas": MIN,
            "max_replicas": MAX,
            "target_ongoing_requests": target,
            "metrics_interval_s": 0.5,
            "look_back_period_s": 2.0,
            "upscale_delay_s": 1.0,
            "downscale_delay_s": 5.0,
        }
        app = EmulatedServe.options(
            name="emulated",
            autoscaling_config=scaling,
            max_ongoing_requests=4 * MAX_BATCH,
            ray_actor_options={"num_cpus": 0.1},
        ).bind()
        serve.run(app, name=system, route_prefix=f"/{system}", logging_config=quiet)
        return f"/{system}"
    spec = _raysrv_spec(system, slo_ms, target)
    serve.run(build_app(spec), name=system, route_prefix=f"/{system}", logging_config=quiet)
    return f"/{system}/v1/gpu/predict"


async def _workers(system: str, base: str, session: aiohttp.ClientSession) -> tuple[int, int, str]:
    """Workers in service now, how many the scaler last asked for, and why (raysrv's)."""
    if system == "serve":
        status = await asyncio.to_thread(serve.status)
        states = status.applications[system].deployments["emulated"].replica_states
        running = int(states.get("RUNNING", 0))
        return running, running, ""
    async with session.get(f"{base}/{system}/v1/pools") as response:
        pools = (await response.json())["pools"]
    (pool,) = [p for p in pools if p["name"] == "gpu"]
    if "autoscaling" not in pool:  # fixed
        return len(pool["workers"]), len(pool["workers"]), ""
    scaling = pool["autoscaling"]
    last = scaling["last"] or {}
    needed = int(last.get("needed", scaling["in_service"]))
    return scaling["in_service"], needed, str(last.get("reason", ""))


async def _sample(system: str, base: str, out: list[tuple[Any, ...]]) -> None:
    """Samples of the workers, each at ``time.perf_counter()``."""
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                workers, needed, reason = await _workers(system, base, session)
                out.append((time.perf_counter(), workers, needed, reason))
            except Exception as exc:  # a sample missed is not a run lost
                print(f"{system}: sampling failed: {exc}", file=sys.stderr)
            await asyncio.sleep(SAMPLE_S)


async def run_system(
    system: str, target: float, port: int, args: argparse.Namespace
) -> dict[str, Any]:
    base = f"http://127.0.0.1:{port}"
    url = base + deploy(system, args.slo_ms, target)
    rng = np.random.default_rng(5)
    inputs = rng.integers(0, 100, size=(4096, 4)).astype(float).tolist()
    body = raysrv_body(args.slo_ms) if system != "serve" else (
        lambda x, t: f'{{"input":{x}}}'.encode()
    )  # fmt: skip
    offsets = arrivals(args.scale, np.random.default_rng(11))
    async with TimedClient(url, inputs, args.slo_ms, body=body) as client:
        await closed_loop(client, 2, 3.0)  # warm-up, within one worker's reach
        await asyncio.sleep(16.0)  # out of the scalers' windows (10 s): back to the fewest workers
        samples: list[tuple[Any, ...]] = []
        sampler = asyncio.create_task(_sample(system, base, samples))
        try:
            log = await replay(client, offsets)
        finally:
            sampler.cancel()
        samples = [(t - log.start, *rest) for t, *rest in samples]  # on the log's clock
    figures = summarize(log, samples, args.slo_ms / 1000.0, trace_seconds(args.scale))
    figures["system"] = (
        f"analytic, headroom {target:g}"
        if system == "analytic"
        else f"fixed, {target:g} workers"
        if system == "fixed"
        else f"{system}, target {target:g}"
    )
    print(f"{system}: { {k: v for k, v in figures.items() if k != 'log'} }", file=sys.stderr)
    serve.delete(system)
    return figures


def summarize(
    log: Any, samples: list[tuple[Any, ...]], slo_s: float, duration: float
) -> dict[str, Any]:
    scheduled = np.asarray(log.scheduled)
    latency = np.asarray(log.done) - scheduled
    status = np.asarray(log.status)
    answered = status == 200
    late = answered & (latency > slo_s)
    refused = np.isin(status, list(REJECTED))
    failed = ~answered & ~refused
    times = np.array([s[0] for s in samples])
    workers = np.array([s[1] for s in samples], dtype=float)
    inside = times <= duration
    downs = times[1:][np.diff(workers) < 0]
    near_down = np.zeros(scheduled.size, dtype=bool)
    for t in downs:
        near_down |= (scheduled >= t - SAMPLE_S) & (scheduled < t + AFTER_DOWN_S)
    p99 = _window_p99(scheduled, latency, answered, duration)
    return {
        "offered": int(status.size),
        "within_slo": float((answered & ~late).sum() / status.size),
        "late": int(late.sum()),
        "refused": int(refused.sum()),
        "failed": int(failed.sum()),
        "worker_seconds": float(np.trapezoid(workers[inside], times[inside])),
        "mean_workers": float(workers[inside].mean()),
        "max_workers": int(workers.max()),
        "scale_downs": int(downs.size),
        "late_or_failed_after_down": int((near_down & (late | failed)).sum()),
        "p99_ms_by_window": [v * 1e3 for v in p99],
        "samples": samples,
        "log": {"scheduled": log.scheduled, "latency": latency.tolist(), "status": log.status},
    }


def _window_p99(
    scheduled: np.ndarray, latency: np.ndarray, answered: np.ndarray, duration: float
) -> list[float]:
    """The p99 latency of the answers of each ``WINDOW_S`` of scheduled times (NaN: none)."""
    out = []
    for opens in np.arange(0.0, duration, WINDOW_S):
        mine = answered & (scheduled >= opens) & (scheduled < opens + WINDOW_S)
        out.append(float(np.percentile(latency[mine], 99)) if mine.any() else math.nan)
    return out


def plot(results: list[dict[str, Any]], scale: float, slo_s: float, path: Path) -> Path:
    from bench.plots import _pyplot, _save

    plt = _pyplot()
    fig, axes = plt.subplots(3, 1, figsize=(8, 7.5), sharex=True)
    t = np.linspace(0, trace_seconds(scale), 2000)
    axes[0].plot(t, rates(t, scale), color="black")
    axes[0].set_ylabel("offered, queries/s")
    shown = [r for r in results if not r["system"].startswith("fixed")]
    for i, r in enumerate(shown):
        color = f"C{i}"  # one colour per system in both panels
        times = [s[0] for s in r["samples"]]
        workers = [s[1] for s in r["samples"]]
        axes[1].step(times, workers, where="post", label=r["system"], color=color)
        if r["system"].startswith("analytic"):
            needed = [s[2] for s in r["samples"]]
            label = r["system"] + ": asked"
            axes[1].step(times, needed, where="post", linestyle=":", label=label, color=color)
        edges = np.arange(len(r["p99_ms_by_window"])) * WINDOW_S + WINDOW_S / 2
        axes[2].plot(edges, r["p99_ms_by_window"], marker=".", label=r["system"], color=color)
    axes[1].set_ylabel("workers in service")
    axes[1].legend(fontsize=7)
    axes[2].axhline(slo_s * 1e3, color="grey", linestyle="--", linewidth=0.8)
    axes[2].set_ylabel(f"p99 ms, {WINDOW_S:g} s windows")
    axes[2].set_yscale("log")
    axes[2].set_xlabel("seconds into the trace")
    axes[2].legend(fontsize=7)
    return _save(fig, path)


def table(results: list[dict[str, Any]]) -> str:
    head = ("| system | offered | within SLO | late | refused | failed | worker-s | mean "
            "workers | max | scale-downs | late or failed after one |")  # fmt: skip
    rows = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        rows.append(
            f"| {r['system']} | {r['offered']:,} | {r['within_slo']:.2%} | {r['late']:,} | "
            f"{r['refused']:,} | {r['failed']:,} | {r['worker_seconds']:.0f} | "
            f"{r['mean_workers']:.2f} | {r['max_workers']} | {r['scale_downs']} | "
            f"{r['late_or_failed_after_down']} |"
        )
    return "\n".join(rows)


def needs(results: list[dict[str, Any]], slo_s: float) -> list[dict[str, Any]]:
    """Per ``WINDOW_S`` of the trace, the workers needed, measured: the fewest of the ``fixed``
    runs that answered at least 99% of the window's queries within the SLO (None: more than
    any run had); beside them the most the analytic scaler asked for over the window and the
    mean it had in service. Empty without both."""
    fixed = sorted(
        (int(r["system"].split(", ")[1].split()[0]), r)
        for r in results
        if r["system"].startswith("fixed")
    )
    analytic = next((r for r in results if r["system"].startswith("analytic")), None)
    if not fixed or analytic is None:
        return []
    rows = []
    for opens in np.arange(0.0, len(analytic["p99_ms_by_window"]) * WINDOW_S, WINDOW_S):
        inside = [s for s in analytic["samples"] if opens <= s[0] < opens + WINDOW_S]
        rows.append({
            "opens": float(opens),
            "measured": next((c for c, r in fixed if _met(r, opens, slo_s)), None),
            "asked": max((s[2] for s in inside), default=None),
            "in_service": float(np.mean([s[1] for s in inside])) if inside else None,
        })  # fmt: skip
    return rows


def _met(run: dict[str, Any], opens: float, slo_s: float) -> bool:
    scheduled = np.asarray(run["log"]["scheduled"])
    latency = np.asarray(run["log"]["latency"])
    ok = np.asarray(run["log"]["status"]) == 200
    mine = (scheduled >= opens) & (scheduled < opens + WINDOW_S)
    return bool(np.mean(ok[mine] & (latency[mine] <= slo_s)) >= 0.99) if mine.any() else True


def needs_table(rows: list[dict[str, Any]], scale: float) -> str:
    lines = ["| seconds | offered, queries/s | workers needed, measured | analytic asked, most | "
             "analytic in service, mean |", "|---|---:|---:|---:|---:|"]  # fmt: skip
    for r in rows:
        t = np.linspace(r["opens"], r["opens"] + WINDOW_S, 50)
        needed = ">" + str(MAX) if r["measured"] is None else str(r["measured"])
        lines.append(
            f"| {r['opens']:.0f}-{r['opens'] + WINDOW_S:.0f} | {rates(t, scale).mean():.0f} | "
            f"{needed} | {r['asked']} | {r['in_service']:.1f} |"
        )
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    p.add_argument("--scale", type=float, default=1.0, help="stretch the trace's phases")
    p.add_argument("--slo-ms", type=float, default=250.0)
    p.add_argument(
        "--targets",
        nargs="+",
        type=float,
        default=[2.0, 4.0, 8.0],
        help="ongoing requests per worker aimed at by reactive and serve, a run each",
    )
    p.add_argument(
        "--headrooms",
        nargs="+",
        type=float,
        default=[0.1],
        help="analytic: the headroom of each run, a run each",
    )
    p.add_argument(
        "--workers",
        nargs="+",
        type=int,
        default=list(range(MIN, MAX + 1)),
        help="fixed: the workers of each run, a run each (the workers the trace needs)",
    )
    p.add_argument("--out", type=Path, default=Path("bench/out/autoscaling.json"))
    p.add_argument("--plot", type=Path, default=Path("bench/figures/autoscaling.png"))
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    port = start(serve_proxy=False)
    each = {"analytic": args.headrooms, "fixed": args.workers}
    runs = [(s, t) for s in args.systems for t in each.get(s, args.targets)]
    results = [asyncio.run(run_system(s, t, port, args)) for s, t in runs]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    need_rows = needs(results, args.slo_ms / 1000.0)
    args.out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out),
                                                          "plot": str(args.plot)},
                                    "results": results, "needs": need_rows}))  # fmt: skip
    plot(results, args.scale, args.slo_ms / 1000.0, args.plot)
    print(table(results))
    if need_rows:
        print(needs_table(need_rows, args.scale))
    return 0


if __name__ == "__main__":
    sys.exit(main())
