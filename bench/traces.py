"""Replaying invocation traces in the Azure Functions trace's format, and the trace shipped here.

clockwork §6.5 replays the Microsoft Azure Functions (MAF) trace: for each function, the
number of its invocations in every minute. A row is ``HashOwner,HashApp,HashFunction,Trigger``
followed by one count per minute (columns ``1`` to ``1440`` for a day). :func:`read_counts`
reads such a file (a real MAF day file works as is) and sums the chosen rows;
:func:`replay_times` turns minutes of counts into arrival times, a minute lasting
``minute_s`` seconds and the counts scaled to a mean rate: within each minute, Poisson
arrivals at that minute's rate (the trace says how many, not when).

The MAF trace is not shipped here. :data:`PERIODIC_SPIKES` is a day in its format whose shape
follows §6.5's description of it: "periodic latency spikes occur every 60 minutes (and to a
lesser extent every 15 minutes) due to the presence of periodic hourly workloads". One row runs
steadily (about 7% around its mean from minute to minute, Poisson counts); one fires every 15
minutes (+40% of the steady rate for a minute); one every hour (+80%, then +40% the minute
after). The hourly spike is about 2.1x the mean of any window of a whole hour: at a mean load
of 50% of capacity it offers about 105-110%. ``python -m bench.traces`` writes it again.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

__all__ = ["PERIODIC_SPIKES", "periodic_spikes", "read_counts", "replay_times", "write_counts"]

PERIODIC_SPIKES = Path(__file__).parent / "data" / "periodic_spikes.csv"
KEYS = ("HashOwner", "HashApp", "HashFunction", "Trigger")
STEADY = 600  # invocations a minute of the steady row


def read_counts(path: Path, functions: set[str] | None = None) -> np.ndarray:
    """Invocations per minute, summed over the rows of ``functions`` (every row if None)."""
    with path.open(newline="") as f:
        rows = csv.reader(f)
        header = next(rows, None)
        if header is None or tuple(header[: len(KEYS)]) != KEYS:
            raise ValueError(f"{path}: the header must start with {','.join(KEYS)}")
        total = np.zeros(len(header) - len(KEYS))
        for line, row in enumerate(rows, start=2):
            if len(row) != len(header):
                raise ValueError(f"{path}:{line}: {len(row)} fields, the header has {len(header)}")
            if functions is not None and row[2] not in functions:
                continue
            try:
                total += np.array(row[len(KEYS) :], dtype=float)
            except ValueError as e:
                raise ValueError(f"{path}:{line}: a count is not a number ({e})") from None
    if total.size == 0 or total.sum() <= 0:
        raise ValueError(f"{path}: no invocations in the rows read")
    return total


def replay_times(
    counts: np.ndarray,
    rate: float,
    seconds: float,
    rng: np.random.Generator,
    minute_s: float = 1.0,
    start: int = 0,
) -> np.ndarray:
    """Arrival times over ``seconds`` from minute ``start`` on, each minute ``minute_s`` long,
    the counts of those minutes scaled so that their mean is ``rate`` queries/s."""
    minutes = int(np.ceil(seconds / minute_s))
    window = counts[start : start + minutes]
    if window.size < minutes:
        raise ValueError(f"{seconds} s from minute {start} needs {minutes} minutes of trace")
    if window.sum() <= 0:
        raise ValueError(f"no invocations in minutes {start}-{start + minutes}")
    expected = window / window.mean() * rate * minute_s  # queries in each replayed minute
    counts_now = rng.poisson(expected)
    minute = np.repeat(np.arange(minutes), counts_now)
    times = np.sort((minute + rng.random(minute.size)) * minute_s)
    return times[times < seconds]


def periodic_spikes(rng: np.random.Generator, minutes: int = 1440) -> dict[str, np.ndarray]:
    """The rows of :data:`PERIODIC_SPIKES`: function name -> invocations per minute."""
    walk = np.zeros(minutes)  # the steady row wanders around its mean: AR(1), sd about 7%
    for i, step in enumerate(rng.normal(0.0, 0.03, minutes)):
        walk[i] = 0.9 * walk[i - 1] + step if i else step
    m = np.arange(minutes)
    quarter = np.where(m % 15 == 0, 0.4, 0.0)
    hourly = np.select([m % 60 == 0, m % 60 == 1], [0.8, 0.4], 0.0)
    return {
        "steady": rng.poisson(STEADY * np.exp(walk)),
        "every-15-min": rng.poisson(STEADY * quarter),
        "every-hour": rng.poisson(STEADY * hourly),
    }


def write_counts(path: Path, rows: dict[str, np.ndarray]) -> None:
    """Write ``rows`` in the MAF format, one row per function."""
    path.parent.mkdir(parents=True, exist_ok=True)
    minutes = len(next(iter(rows.values())))
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow([*KEYS, *range(1, minutes + 1)])
        for name, counts in rows.items():
            out.writerow(["raysrv", "bench", name, "http", *counts.astype(int)])


if __name__ == "__main__":
    write_counts(PERIODIC_SPIKES, periodic_spikes(np.random.default_rng(2026)))
