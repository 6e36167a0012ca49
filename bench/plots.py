"""Benchmark plots (PNG, no display): latency CDFs against model CDFs, SLO attainment curves,
goodput over time and ratios run by run."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Panel", "attainment_panels", "cdf_panels", "goodput_panels", "ratio_runs"]

Cdf = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Panel:
    """One plot: ``samples`` (seconds) drawn as an empirical CDF, ``curves`` as (label, line
    style, CDF over seconds) up to ``t_max`` seconds."""

    title: str
    samples: np.ndarray
    sample_label: str
    t_max: float
    curves: Sequence[tuple[str, str, Cdf]] = field(default_factory=tuple)


def cdf_panels(panels: Sequence[Panel], path: Path) -> Path:
    """Draw the panels side by side into ``path``."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.2), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        xs = np.sort(panel.samples)
        ax.step(
            xs * 1e3, np.arange(1, xs.size + 1) / xs.size, where="post", label=panel.sample_label
        )
        t = np.linspace(0.0, panel.t_max, 600)
        for label, style, cdf in panel.curves:
            ax.plot(t * 1e3, cdf(t), style, label=label)
        ax.set_title(panel.title, fontsize=9)
        ax.set_xlabel("latency (ms)")
    axes[0][0].set_ylabel("CDF")
    axes[0][0].legend(fontsize=8)
    return _save(fig, path)


def _logs_arrays(log: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(latency s from the scheduled send, completion s, status) of a request log."""
    done = np.asarray(log.done)
    return done - np.asarray(log.scheduled), done, np.asarray(log.status)


def attainment_panels(logs: Mapping[str, Mapping[str, Any]], slo_s: float, path: Path) -> Path:
    """Per workload, per system: the fraction of offered queries answered within x ms.

    Refused and failed queries never count, so a curve tops out at the share answered, and its
    height at the SLO (dotted line) is the SLO attainment. ``logs``: workload -> system ->
    :class:`bench.loadgen.RequestLog`.
    """
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(logs), figsize=(4 * len(logs), 3.4), squeeze=False)
    for ax, (workload, per_system) in zip(axes[0], logs.items(), strict=True):
        for system, log in per_system.items():
            latency, _, status = _logs_arrays(log)
            xs = np.sort(latency[status == 200])
            ax.step(
                xs * 1e3,
                np.arange(1, xs.size + 1) / max(status.size, 1),
                where="post",
                label=system,
            )
        ax.axvline(slo_s * 1e3, color="k", linestyle=":", linewidth=1)
        ax.set_xlim(0, 2.5 * slo_s * 1e3)
        ax.set_ylim(0, 1.01)
        ax.set_title(workload, fontsize=9)
        ax.set_xlabel("latency (ms)")
    axes[0][0].set_ylabel("answered within x / offered")
    axes[0][0].legend(fontsize=7)
    return _save(fig, path)


def goodput_panels(
    logs: Mapping[str, Mapping[str, Any]],
    slo_s: float,
    capacities: Mapping[str, float],
    path: Path,
) -> Path:
    """Per workload, per system: answers within the SLO per second, by completion time, with the
    capacity measured for that workload as a dashed line."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(logs), figsize=(4 * len(logs), 3.4), squeeze=False)
    for ax, (workload, per_system) in zip(axes[0], logs.items(), strict=True):
        for system, log in per_system.items():
            latency, done, status = _logs_arrays(log)
            good = done[(status == 200) & (latency <= slo_s)]
            edges = np.arange(0.0, float(np.ceil(done.max())) + 1.0) if done.size else [0, 1]
            counts, _ = np.histogram(good, bins=edges)
            ax.step(edges[1:], counts, where="pre", label=system)
        ax.axhline(capacities[workload], color="k", linestyle="--", linewidth=1)
        ax.set_title(workload, fontsize=9)
        ax.set_xlabel("time (s)")
    axes[0][0].set_ylabel("goodput (answers within SLO / s)")
    axes[0][0].legend(fontsize=7)
    return _save(fig, path)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def peers_bars(
    points: Sequence[Mapping[str, Any]],
    loads: Sequence[str],
    slo_ms: float,
    path: Path,
    rounds: Sequence[Sequence[Mapping[str, Any]]] = (),
) -> Path:
    """Per system (one bar group each), the share of each load's queries answered within the
    SLO; with ``rounds`` (each a list of points in the order of ``points``), each round's share
    as a dot on its bar."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(1.3 * len(points) + 2, 3.4))
    width = 0.8 / len(loads)
    x = np.arange(len(points))
    for k, load in enumerate(loads):
        shares = [100.0 * p[load]["within_share"] for p in points]
        at = x + (k - (len(loads) - 1) / 2) * width
        bars = ax.bar(at, shares, width, label=load)
        ax.bar_label(bars, fmt="%.0f", fontsize=7)
        for points_of_round in rounds:
            each = [100.0 * p[load]["within_share"] for p in points_of_round]
            ax.plot(at, each, "o", color="black", ms=2.5, alpha=0.6)
    ax.set_xticks(x, [p["system"] for p in points], fontsize=8)
    ax.set_ylabel(f"% of queries within {slo_ms:g} ms")
    ax.set_ylim(0, 105)
    ax.legend(fontsize=7)
    return _save(fig, path)


def ratio_runs(
    series: Mapping[str, Sequence[float]],
    band: float,
    ylabel: str,
    path: Path,
    xlabel: str = "run",
    every: int = 0,
) -> Path:
    """Each of ``series``' ratios in order, with ``1 ± band`` shaded; with ``every``, in groups
    of ``every`` in a row, a tick a group, and each group's median as a bar across it."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.axhspan(1 - band, 1 + band, color="0.9", label=f"within {band:.0%}")
    longest = max(map(len, series.values()), default=0)
    for label, values in series.items():
        (line,) = ax.plot(range(1, len(values) + 1), values, marker="o", ms=3, lw=0.8, label=label)
        for start in range(0, len(values) - every + 1, every) if every else ():
            middle = float(np.median(values[start : start + every]))
            ax.hlines(middle, start + 0.7, start + every + 0.3, colors=line.get_color(), lw=2.5)
    if every:  # one tick a group, between lines that part the groups
        groups = range(longest // every)
        ax.set_xticks([g * every + (every + 1) / 2 for g in groups], [str(g + 1) for g in groups])
        for g in groups[1:]:
            ax.axvline(g * every + 0.5, color="0.8", lw=0.5)
    else:
        ax.set_xticks(range(1, longest + 1))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7, ncol=3, loc="lower center", bbox_to_anchor=(0.5, 1.0))
    return _save(fig, path)
