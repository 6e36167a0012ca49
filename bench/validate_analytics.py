"""How well do the analytic models predict? Each against its simulator, and the live system.

    python -m bench.validate_analytics [--quick] [--live] [--out bench/out/analytics]

1. Batch buffer (BATCH §IV): a grid of Poisson and bursty MMPP(2) arrivals, batch sizes,
   timeouts and loads through ``BatchBufferModel`` (exact and ``method="paper"``) and through
   :func:`raysrv.analytics.simulate` with the ``fixed`` policy on unbounded replicas; p95 and
   mean errors. Then the same arrivals fitted with ``fit_map2`` from the trace alone.
2. Finite servers: the bounds of ``latency_bounds`` against the simulator's FCFS replicas.
3. SERF (serf §IV-C): ``serf_latency`` against the M/D_interf/c simulator.
4. ``fit_map2`` on bursty traces; the fork-join EMG's expected maximum against Monte Carlo;
   the optimizer's run time on a typical grid.
5. ``--live``: the spine serving a convnet, calibrated (:mod:`bench.validate_live`).

Prints Markdown tables, writes ``results.json`` and CDF plots (PNG) under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.plots import Panel, cdf_panels
from raysrv.analytics import (
    EMG,
    MMPP2,
    BatchBufferModel,
    Poisson,
    fit_emg,
    fit_map2,
    optimize_batching,
    simulate,
)
from raysrv.analytics.interference import serf_validation_grid
from raysrv.batching import FixedParams, FixedPolicy

__all__ = ["BufferCase", "buffer_grid", "main"]

ARRIVALS: dict[str, Poisson | MMPP2] = {
    "poisson-50": Poisson(50.0),
    "poisson-200": Poisson(200.0),
    "poisson-800": Poisson(800.0),
    "mmpp-160": MMPP2(rate1=400.0, rate2=40.0, switch1=2.0, switch2=1.0),
    "mmpp-52": MMPP2(rate1=100.0, rate2=5.0, switch1=0.5, switch2=0.5),
}
BATCHES = (4, 16, 32)
TIMEOUTS = (0.005, 0.02, 0.1)


def service_times(B: int) -> np.ndarray:
    """A convnet-like affine batch cost: 4 ms plus 1.5 ms per query."""
    return 0.004 + 0.0015 * np.arange(1, B + 1)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def rel(predicted: float, observed: float) -> float:
    return (predicted - observed) / observed


@dataclass(frozen=True)
class BufferCase:
    arrival: str
    B: int
    T: float
    sim_p95: float
    exact_p95: float
    paper_p95: float
    fitted_p95: float
    sim_mean: float
    exact_mean: float
    paper_mean: float


def buffer_case(name: str, B: int, T: float, n: int, seed: int) -> BufferCase:
    arrival = ARRIVALS[name]
    times = arrival.arrival_times(n, np.random.default_rng(seed))
    S = service_times(B)
    policy = FixedPolicy(FixedParams(max_batch_size=B, timeout_ms=T * 1000), slo_s=60.0)
    sim = simulate(times, S, policy)
    exact = BatchBufferModel(arrival, S, B, T)
    paper = BatchBufferModel(arrival, S, B, T, method="paper")
    fitted = BatchBufferModel(fit_map2(np.diff(times)), S, B, T)  # from the trace alone
    return BufferCase(
        name,
        B,
        T,
        sim.percentile(0.95),
        exact.latency_percentile(0.95),
        paper.latency_percentile(0.95),
        fitted.latency_percentile(0.95),
        float(sim.answered.mean()),
        exact.mean_latency(),
        paper.mean_latency(),
    )


def buffer_grid(quick: bool) -> list[BufferCase]:
    """Bursty traces need more queries: their phases last seconds, and p95 moves with how
    many bursts a run happens to hold."""
    names = ["poisson-200", "mmpp-160"] if quick else list(ARRIVALS)
    cases = []
    for k, name in enumerate(names):
        n = (40_000 if quick else 200_000) * (5 if name.startswith("mmpp") else 1)
        for B in BATCHES:
            for T in TIMEOUTS:
                cases.append(buffer_case(name, B, T, n, seed=100 + k))
        log(f"  buffer grid: {name} done")
    return cases


def error_summary(errors: list[float]) -> dict[str, float]:
    a = np.abs(np.asarray(errors))
    return {"mean_abs": float(a.mean()), "max_abs": float(a.max())}


def buffer_table(cases: list[BufferCase]) -> str:
    lines = [
        "| arrivals | B | T ms | sim p95 ms | p95: exact | paper | fit_map2 + exact "
        "| mean: exact | paper |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cases:
        lines.append(
            f"| {c.arrival} | {c.B} | {c.T * 1e3:g} | {c.sim_p95 * 1e3:.2f} "
            f"| {rel(c.exact_p95, c.sim_p95):+.2%} | {rel(c.paper_p95, c.sim_p95):+.2%} "
            f"| {rel(c.fitted_p95, c.sim_p95):+.2%} | {rel(c.exact_mean, c.sim_mean):+.2%} "
            f"| {rel(c.paper_mean, c.sim_mean):+.2%} |"
        )
    return "\n".join(lines)


def bounds_check(quick: bool) -> list[dict[str, float]]:
    """Finite servers: lower <= simulated p95 <= upper, literal batches-wait-for-a-server."""
    n = 40_000 if quick else 200_000
    rows = []
    for lam, B, T, c in [
        (100.0, 8, 0.02, 1),
        (300.0, 8, 0.02, 2),
        (400.0, 16, 0.05, 2),
        (600.0, 8, 0.01, 4),
    ]:
        S = 0.01 + 0.003 * np.arange(1, B + 1)
        times = Poisson(lam).arrival_times(n, np.random.default_rng(int(lam)))
        policy = FixedPolicy(FixedParams(max_batch_size=B, timeout_ms=T * 1000), slo_s=60.0)
        sim = simulate(times, S, policy, replicas=c, queue_batches=True)
        ours = simulate(times, S, policy, replicas=c)  # raysrv's batcher: cut only when free
        b = BatchBufferModel(Poisson(lam), S, B, T).latency_bounds(0.95, c)
        rows.append(
            {
                "rate": lam,
                "B": B,
                "T": T,
                "replicas": c,
                "lower": b.lower,
                "sim_p95": sim.percentile(0.95),
                "upper": b.upper,
                "raysrv_policy_p95": ours.percentile(0.95),
            }
        )
    return rows


def serf_check(quick: bool) -> dict[str, Any]:
    cases = serf_validation_grid(
        servers=(1, 2, 4, 8) if quick else (1, 2, 3, 4, 6, 8),
        utilisations=(0.3, 0.7) if quick else (0.1, 0.3, 0.5, 0.7, 0.9),
        n_requests=200_000 if quick else 1_000_000,
    )
    errors = [c.relative_error for c in cases]
    worst = max(cases, key=lambda c: abs(c.relative_error))
    return {
        "cases": len(cases),
        **error_summary(errors),
        "worst": {
            "servers": worst.servers,
            "utilisation": worst.utilisation,
            "slowdown": worst.slowdown,
            "error": worst.relative_error,
            "stderr": worst.simulated_stderr / worst.simulated,
        },
    }


def fit_check(quick: bool) -> list[dict[str, Any]]:
    n = 50_000 if quick else 200_000
    rows = []
    for name in ("mmpp-160", "mmpp-52"):
        gaps = np.diff(ARRIVALS[name].arrival_times(n + 1, np.random.default_rng(7)))
        fit = fit_map2(gaps)
        scv = float(gaps.var() / gaps.mean() ** 2)
        acf = float(np.corrcoef(gaps[:-1], gaps[1:])[0, 1])
        rows.append(
            {
                "trace": name,
                "mean": rel(fit.mean_interarrival, float(gaps.mean())),
                "scv": rel(fit.scv, scv),
                "lag1": rel(fit.lag1_autocorrelation, acf),
            }
        )
    return rows


def emg_check() -> list[dict[str, float]]:
    truth = EMG(mu=0.002, sigma=0.0004, tau=0.001)
    rng = np.random.default_rng(11)
    fitted = fit_emg(truth.sample(5_000, rng))
    rows = []
    for n in (1, 2, 4, 8, 16):
        maxima = truth.sample(200_000 * n, rng).reshape(-1, n).max(axis=1)
        rows.append(
            {
                "n": n,
                "predicted": fitted.expected_max(n),
                "monte_carlo": float(maxima.mean()),
                "error": rel(fitted.expected_max(n), float(maxima.mean())),
            }
        )
    return rows


def optimizer_timing() -> dict[str, Any]:
    def S(threads: float) -> np.ndarray:
        return (0.004 + 0.0015 * np.arange(1, 65)) / threads**0.9 + 0.002

    kwargs: dict[str, Any] = {
        "batch_sizes": [1, 2, 4, 8, 16, 32, 64],
        "knobs": [1, 2, 4, 8],
        "timeouts": [0.0, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1],
        "slo": 0.03,
    }
    times = []
    for seed in range(5):
        arrival = MMPP2(rate1=200.0 + seed, rate2=20.0, switch1=2.0, switch2=1.0)  # no cache hits
        start = time.perf_counter()
        plan = optimize_batching(arrival, S, **kwargs)
        times.append(time.perf_counter() - start)
    return {
        "configurations": plan.searched,
        "median_s": float(np.median(times)),
        "max_s": float(max(times)),
        "plan": asdict(plan),
    }


def plot_buffer(quick: bool, out: Path) -> Path:
    picks = [
        ("poisson-200", 16, 0.02),
        ("poisson-200", 4, 0.1),
        ("mmpp-160", 32, 0.1),
        ("mmpp-160", 16, 0.02),
    ]
    n = 40_000 if quick else 200_000
    panels = []
    for name, B, T in picks:
        arrival = ARRIVALS[name]
        times = arrival.arrival_times(n, np.random.default_rng(3))
        S = service_times(B)
        policy = FixedPolicy(FixedParams(max_batch_size=B, timeout_ms=T * 1000), slo_s=60.0)
        lat = simulate(times, S, policy).answered
        exact = BatchBufferModel(arrival, S, B, T)
        paper = BatchBufferModel(arrival, S, B, T, method="paper")
        curves = [("exact", "--", exact.latency_cdf), ("paper", ":", paper.latency_cdf)]
        title = f"{name}, B={B}, T={T * 1e3:g} ms"
        panels.append(Panel(title, lat, "simulated", float(lat.max()) * 1.05, curves))
    return cdf_panels(panels, out / "buffer_cdfs.png")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smaller grid, shorter runs")
    parser.add_argument("--live", action="store_true", help="also measure the live system")
    parser.add_argument("--out", type=Path, default=Path("bench/out/analytics"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    log("batch buffer grid ...")
    cases = buffer_grid(args.quick)
    results["buffer"] = [asdict(c) for c in cases]
    summary = {
        key: error_summary([rel(getattr(c, f"{key}_p95"), c.sim_p95) for c in cases])
        for key in ("exact", "paper", "fitted")
    }
    results["buffer_summary"] = summary
    print("## Batch buffer: p95 and mean, model vs simulation\n\n" + buffer_table(cases))
    print(f"\np95 error summary: {json.dumps(summary)}\n")
    log("finite-server bounds ...")
    results["bounds"] = bounds_check(args.quick)
    print("## Finite servers\n\n" + json.dumps(results["bounds"], indent=1))
    log("serf grid ...")
    results["serf"] = serf_check(args.quick)
    print("## SERF mean latency vs simulation\n\n" + json.dumps(results["serf"], indent=1))
    results["fit_map2"] = fit_check(args.quick)
    results["emg"] = emg_check()
    results["optimizer"] = optimizer_timing()
    for key in ("fit_map2", "emg", "optimizer"):
        print(f"## {key}\n\n" + json.dumps(results[key], indent=1))
    results["plots"] = [str(plot_buffer(args.quick, args.out))]
    if args.live:
        from bench.validate_live import run_live

        results["live"] = run_live(args.out, args.quick)
        print("## Live\n\n" + json.dumps(results["live"]["cases"], indent=1))
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    log(f"wrote {args.out / 'results.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
