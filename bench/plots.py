"""Latency CDF panels: observed samples as a step curve against model CDFs (PNG, no display)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = ["Panel", "cdf_panels"]

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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
