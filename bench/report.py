"""Markdown tables and the issue's pass/fail checks over a ``run_bench`` JSON report.

    python -m bench.report bench/out/results.json    # re-print the tables of a finished run

Targets (the issue's): saturation throughput of raysrv at least 0.8x the baseline's, over HTTP
and over handles; p50 latency at 50% load at most 1.5x the baseline's.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

__all__ = ["MAX_P50_RATIO", "MIN_THROUGHPUT_RATIO", "criteria", "main", "markdown", "ratio"]

MIN_THROUGHPUT_RATIO = 0.8
MAX_P50_RATIO = 1.5
SYSTEMS = ("raysrv", "baseline")
CLIENT_NAMES = {
    "http": "HTTP, aiohttp",
    "handle": "handle",
    "wrk": "HTTP, wrk",
}


def ratio(a: float | None, b: float | None) -> float:
    """``a / b``, NaN when either is missing or ``b`` is zero."""
    if a is None or b is None or b == 0 or math.isnan(a) or math.isnan(b):
        return math.nan
    return a / b


def _f(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def _failures(r: dict[str, Any]) -> str:
    return f"{r['rejected']}/{r['errors']}"


def _batch(r: dict[str, Any]) -> str:
    return _f(r.get("extra", {}).get("mean_batch"), 2)


def _saturation_table(report: dict[str, Any]) -> list[str]:
    lines = [
        "| client | raysrv req/s | baseline req/s | ratio | raysrv p50 / p99 ms "
        "| baseline p50 / p99 ms | mean batch r / b | rejected/errors r / b |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for kind, pair in report["saturation"].items():
        ours, base = pair["raysrv"], pair["baseline"]
        lines.append(
            f"| {CLIENT_NAMES.get(kind, kind)} | {_f(ours['throughput_rps'])} "
            f"| {_f(base['throughput_rps'])} "
            f"| {_f(ratio(ours['throughput_rps'], base['throughput_rps']), 2)} "
            f"| {_f(ours['p50_ms'])} / {_f(ours['p99_ms'])} "
            f"| {_f(base['p50_ms'])} / {_f(base['p99_ms'])} "
            f"| {_batch(ours)} / {_batch(base)} | {_failures(ours)} / {_failures(base)} |"
        )
    return lines


def _open_table(report: dict[str, Any]) -> list[str]:
    lines = [
        "| client | load | offered req/s | req/s r / b | p50 ms r / b | p50 ratio "
        "| p99 ms r / b | p99 ratio | mean batch r / b | rejected/errors r / b |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in report["open"]:
        ours, base = p["raysrv"], p["baseline"]
        lines.append(
            f"| {CLIENT_NAMES.get(p['client'], p['client'])} | {p['load']:.0%} "
            f"| {_f(p['rate_rps'])} "
            f"| {_f(ours['throughput_rps'])} / {_f(base['throughput_rps'])} "
            f"| {_f(ours['p50_ms'])} / {_f(base['p50_ms'])} "
            f"| {_f(ratio(ours['p50_ms'], base['p50_ms']), 2)} "
            f"| {_f(ours['p99_ms'])} / {_f(base['p99_ms'])} "
            f"| {_f(ratio(ours['p99_ms'], base['p99_ms']), 2)} "
            f"| {_batch(ours)} / {_batch(base)} | {_failures(ours)} / {_failures(base)} |"
        )
    return lines


def criteria(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One entry per target: what was compared, the measured ratio, the bound, pass or not."""
    checks = []
    for kind, pair in report["saturation"].items():
        value = ratio(pair["raysrv"]["throughput_rps"], pair["baseline"]["throughput_rps"])
        checks.append(
            {
                "check": f"saturation throughput ratio, {CLIENT_NAMES.get(kind, kind)}",
                "value": value,
                "bound": f">= {MIN_THROUGHPUT_RATIO}",
                "passed": bool(value >= MIN_THROUGHPUT_RATIO),
            }
        )
    for p in report["open"]:
        if p["load"] != 0.5:
            continue
        value = ratio(p["raysrv"]["p50_ms"], p["baseline"]["p50_ms"])
        checks.append(
            {
                "check": f"p50 ratio at 50% load, {CLIENT_NAMES.get(p['client'], p['client'])}",
                "value": value,
                "bound": f"<= {MAX_P50_RATIO}",
                "passed": bool(value <= MAX_P50_RATIO),
            }
        )
    return checks


def markdown(report: dict[str, Any]) -> str:
    """The whole report as Markdown: saturation, open loop, checks."""
    concurrency = report.get("args", {}).get("concurrency", "?")
    loads = ", ".join(f"{p:.0%}" for p in report.get("plan", {}).get("loads", ()))
    lines = [
        f"### Saturation (closed loop, {concurrency} requests in flight)",
        "",
        *_saturation_table(report),
        "",
        f"### Open loop, Poisson arrivals at {loads} of the baseline's saturation rate",
        "",
        *_open_table(report),
        "",
        "### Targets",
        "",
    ]
    for c in report.get("criteria") or criteria(report):
        mark = "PASS" if c["passed"] else "FAIL"
        lines.append(f"- {mark}: {c['check']} = {_f(c['value'], 2)} ({c['bound']})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    paths = argv if argv is not None else sys.argv[1:]
    for path in paths or ["bench/out/results.json"]:
        print(markdown(json.loads(Path(path).read_text())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
