"""Replaying invocation traces in the Azure Functions trace's format, and the traces shipped here.

clockwork §6.5 replays the Microsoft Azure Functions (MAF) trace: for each function, the
number of its invocations in every minute. A row is ``HashOwner,HashApp,HashFunction,Trigger``
followed by one count per minute (columns ``1`` to ``1440`` for a day). :func:`read_counts`
reads such a file (a real MAF day file works as is) and sums the chosen rows;
:func:`replay_times` turns minutes of counts into arrival times, a minute lasting
``minute_s`` seconds and the counts scaled to a mean rate: within each minute, Poisson
arrivals at that minute's rate (the trace says how many, not when). :func:`read_functions`
keeps the rows apart, and :func:`replay_functions` replays them all at once: arrival times and
each arrival's function, so that function ``i`` can stand for model ``i`` (Clockwork §6.5 maps
the trace's functions onto model instances). :func:`zipf_arrivals` is the plainer alternative:
Poisson arrivals, each query's model drawn from a Zipf popularity.

The MAF trace is not shipped here. :data:`PERIODIC_SPIKES` is a day in its format whose shape
follows §6.5's description of it: "periodic latency spikes occur every 60 minutes (and to a
lesser extent every 15 minutes) due to the presence of periodic hourly workloads". One row runs
steadily (about 7% around its mean from minute to minute, Poisson counts); one fires every 15
minutes (+40% of the steady rate for a minute); one every hour (+80%, then +40% the minute
after). The hourly spike is about 2.1x the mean of any window of a whole hour: at a mean load
of 50% of capacity it offers about 105-110%.

:data:`MANY_FUNCTIONS` (:func:`many_functions`) is 120 minutes of 1,000 functions, ``f0000``
the most invoked and on down, shaped after what Shahrad et al. (ATC'20, "Serverless in the
Wild") §3 report of the MAF trace and §6.5 of Clockwork:

- Popularity: the mean rates are the quantiles of a log-normal through two of its points (45%
  of applications invoked at most once an hour on average, 81% at most once a minute), so they
  span orders of magnitude. The top function takes 36% of the invocations, the top 10 82%, the
  top 5% 96%, the top 18.6% 99.6% (the paper: "the most popular 18.6% of applications" take
  99.6%); 279 functions are never invoked in the 120 minutes. Counts are Poisson at each
  function's rate of the minute.
- Timers: 16% of the functions, as in the paper, drawn from those invoked at most once a
  minute; each fires once every 1, 5, 15 or 60 minutes (the period nearest its mean gap), 3 in
  4 at the top of the period as cron does. They carry 0.1% of the invocations (2% in the
  paper) but make the functions active at the top of an hour about 1.5x those of other minutes.
  Their ``Trigger`` is ``timer``, everyone else's ``http``.
- Of the others, 75% run steadily (AR(1) in log, about 15% around their mean), 20% are bursty
  (on a fifth of the minutes, in bursts of 3 on average, at 5x their mean rate) and 5% periodic
  (x4 at the top of each hour, x2.5 the minute after, x2 on the other quarter hours: Clockwork's
  "periodic hourly workloads"). The 8 most invoked get fixed kinds (periodic, steady, steady,
  periodic, steady, bursty, steady, bursty): so few cannot be left to chance, and they make the
  total. Its top-of-the-hour minutes are about 2.2x its median minute, quarter hours 1.4-1.6x,
  and 99% of the other minutes below 1.2x.

Replayed at a total rate ``rate``, a function's share of the queries is its share of the
window's invocations: at a low rate the tail is hardly invoked at all.
``python -m bench.traces`` writes both files again (same seeds, same bytes).
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from scipy.special import ndtri

__all__ = [
    "MANY_FUNCTIONS",
    "PERIODIC_SPIKES",
    "main",
    "many_function_rows",
    "many_functions",
    "periodic_spikes",
    "read_counts",
    "read_functions",
    "replay_functions",
    "replay_times",
    "write_counts",
    "zipf_arrivals",
]

PERIODIC_SPIKES = Path(__file__).parent / "data" / "periodic_spikes.csv"
KEYS = ("HashOwner", "HashApp", "HashFunction", "Trigger")
STEADY = 600  # invocations a minute of the steady row

MANY_FUNCTIONS = Path(__file__).parent / "data" / "many_functions.csv"
MANY_SEED = 2027
# Per-function mean rates, log-normal through two points of Shahrad et al. (ATC'20) §3: 45% of
# applications are invoked at most once an hour on average and 81% at most once a minute.
LOG10_RATE_SD = float(np.log10(60.0) / (ndtri(0.81) - ndtri(0.45)))  # about 1.77 decades
LOG10_RATE_MEAN = float(-ndtri(0.81) * LOG10_RATE_SD)  # about -1.56: 0.03 a minute
TIMER_SHARE = 0.16  # of the functions (Shahrad et al. §3: 16% of functions, 2% of invocations)
TIMER_PERIODS = (1, 5, 15, 60)  # minutes
KINDS, KIND_SHARES = ("steady", "bursty", "periodic"), (0.75, 0.2, 0.05)  # of the non-timers
# The head is too few functions for those shares to come out by chance: fixed kinds instead
HEAD_KINDS = ("periodic", "steady", "steady", "periodic", "steady", "bursty", "steady", "bursty")
BURST_ON, BURST_MINUTES = 0.2, 3.0  # bursty functions: on a fifth of the minutes, 3 at a time


def _rows(path: Path, functions: set[str] | None) -> Iterator[tuple[int, str, np.ndarray]]:
    """Line number, function and counts of each row of ``functions`` (every row if None), the
    header and every row's length checked."""
    with path.open(newline="") as f:
        rows = csv.reader(f)
        header = next(rows, None)
        if header is None or tuple(header[: len(KEYS)]) != KEYS:
            raise ValueError(f"{path}: the header must start with {','.join(KEYS)}")
        for line, row in enumerate(rows, start=2):
            if len(row) != len(header):
                raise ValueError(f"{path}:{line}: {len(row)} fields, the header has {len(header)}")
            if functions is not None and row[2] not in functions:
                continue
            try:
                yield line, row[2], np.array(row[len(KEYS) :], dtype=float)
            except ValueError as e:
                raise ValueError(f"{path}:{line}: a count is not a number ({e})") from None


def read_counts(path: Path, functions: set[str] | None = None) -> np.ndarray:
    """Invocations per minute, summed over the rows of ``functions`` (every row if None)."""
    rows = [counts for _, _, counts in _rows(path, functions)]
    total = np.sum(rows, axis=0) if rows else np.zeros(0)
    if total.size == 0 or total.sum() <= 0:
        raise ValueError(f"{path}: no invocations in the rows read")
    return total


def read_functions(path: Path) -> dict[str, np.ndarray]:
    """Invocations per minute of each function (column ``HashFunction``), in the file's order."""
    functions: dict[str, np.ndarray] = {}
    lines: dict[str, int] = {}
    for line, name, counts in _rows(path, None):
        if name in lines:
            raise ValueError(f"{path}:{line}: function {name!r} is also on line {lines[name]}")
        functions[name], lines[name] = counts, line
    if not functions or sum(c.sum() for c in functions.values()) <= 0:
        raise ValueError(f"{path}: no invocations in the rows read")
    return functions


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


def _matrix(counts: dict[str, np.ndarray] | np.ndarray) -> np.ndarray:
    """Functions x minutes, from rows by name (in their order) or an array."""
    matrix = np.vstack(list(counts.values())) if isinstance(counts, dict) else np.asarray(counts)
    if matrix.ndim != 2 or matrix.size == 0:
        raise ValueError(f"counts must be functions x minutes, got shape {matrix.shape}")
    if np.any(matrix < 0):
        raise ValueError("counts must not be negative")
    return matrix.astype(float)


def replay_functions(
    counts: dict[str, np.ndarray] | np.ndarray,
    rate: float,
    seconds: float,
    rng: np.random.Generator,
    minute_s: float = 1.0,
    start: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Arrival times (sorted) over ``seconds`` from minute ``start`` on, and each arrival's
    function: its row in ``counts`` (a dict's order, or an array's first axis). Each minute lasts
    ``minute_s`` seconds; the counts of the replayed minutes are scaled so that the total mean
    rate is ``rate`` queries/s, then each function's arrivals in a minute are Poisson at its
    scaled count, at uniform times within the minute (as :func:`replay_times` does for one)."""
    matrix = _matrix(counts)
    minutes = int(np.ceil(seconds / minute_s))
    window = matrix[:, start : start + minutes]
    if window.shape[1] < minutes:
        raise ValueError(f"{seconds} s from minute {start} needs {minutes} minutes of trace")
    if window.sum() <= 0:
        raise ValueError(f"no invocations in minutes {start}-{start + minutes}")
    drawn = rng.poisson(window * (rate * minute_s * minutes / window.sum())).ravel()
    cell = np.repeat(np.arange(drawn.size), drawn)  # one entry per arrival: function * minutes + m
    times = (cell % minutes + rng.random(cell.size)) * minute_s
    order = np.argsort(times, kind="stable")
    keep = order[times[order] < seconds]
    return times[keep], cell[keep] // minutes


def zipf_arrivals(
    rate: float, seconds: float, n_models: int, s: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Poisson arrivals at ``rate`` queries/s over ``seconds`` (sorted times), and each query's
    model, drawn with probability proportional to 1 / (k + 1) ** s: model 0 the most popular."""
    if rate <= 0 or seconds <= 0 or n_models < 1 or s < 0:
        raise ValueError(
            f"need rate > 0, seconds > 0, n_models >= 1 and s >= 0; got {rate}, {seconds}, "
            f"{n_models}, {s}"
        )
    times = np.sort(rng.random(rng.poisson(rate * seconds)) * seconds)
    weights = 1.0 / np.arange(1, n_models + 1) ** s
    return times, rng.choice(n_models, size=times.size, p=weights / weights.sum())


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


def _mean_rates(n: int) -> np.ndarray:
    """Invocations a minute of ``n`` functions, most first: the log-normal's quantiles at
    (n - i) / (n + 1), not draws (from so wide a tail, one draw could take most of the trace)."""
    quantiles = (n - np.arange(n)) / (n + 1)
    return 10 ** (LOG10_RATE_MEAN + LOG10_RATE_SD * ndtri(quantiles))


def _kinds(rng: np.random.Generator, rates: np.ndarray) -> np.ndarray:
    """Each function's behaviour, ``rates`` sorted from the most invoked down."""
    n = rates.size
    kinds = rng.choice(np.array(KINDS), size=n, p=KIND_SHARES)
    head = min(n, len(HEAD_KINDS))
    kinds[:head] = HEAD_KINDS[:head]
    # timers run at most once a minute: they are drawn from the rarely invoked functions
    rare = np.flatnonzero((rates <= 1.0) & (np.arange(n) >= head))
    kinds[rng.choice(rare, size=min(rare.size, round(TIMER_SHARE * n)), replace=False)] = "timer"
    return kinds


def _wander(rng: np.random.Generator, n: int, minutes: int) -> np.ndarray:
    """Rates of ``n`` steady functions, each minute: mean 1, AR(1) in log, sd about 15%."""
    walk = np.zeros((n, minutes))
    steps = rng.normal(0.0, 0.05, (n, minutes))
    walk[:, 0] = rng.normal(0.0, 0.15, n)
    for m in range(1, minutes):
        walk[:, m] = 0.95 * walk[:, m - 1] + steps[:, m]
    return np.exp(walk - 0.15**2 / 2)


def _on_off(rng: np.random.Generator, n: int, minutes: int) -> np.ndarray:
    """Rates of ``n`` bursty functions: 1/BURST_ON while on (BURST_ON of the minutes, bursts of
    BURST_MINUTES on average), 0 while off: a two-state Markov chain per function."""
    leave = 1.0 / BURST_MINUTES
    enter = leave * BURST_ON / (1.0 - BURST_ON)
    on = np.zeros((n, minutes), bool)
    on[:, 0] = rng.random(n) < BURST_ON
    draws = rng.random((n, minutes))
    for m in range(1, minutes):
        on[:, m] = np.where(on[:, m - 1], draws[:, m] >= leave, draws[:, m] < enter)
    return on / BURST_ON


def _hourly(minutes: int) -> np.ndarray:
    """Rates of a periodic function: x4 at the top of each hour and x2.5 the minute after, x2
    on the other quarter hours, mean 1 over each hour."""
    m = np.arange(minutes)
    shape = 1.0 + np.select([m % 60 == 0, m % 60 == 1, m % 15 == 0], [3.0, 1.5, 1.0], 0.0)
    return shape / 1.125


def _timers(rng: np.random.Generator, rates: np.ndarray, minutes: int) -> np.ndarray:
    """One invocation every period (1, 5, 15 or 60 minutes: the one nearest the function's mean
    gap), at the top of the period (as cron does) for 3 timers in 4, else at a random phase."""
    periods = np.array(TIMER_PERIODS)
    gaps = np.log(1.0 / rates)[:, None]
    period = periods[np.argmin(np.abs(gaps - np.log(periods)), axis=1)]
    phase = np.where(rng.random(rates.size) < 0.75, 0, rng.integers(0, period))
    return ((np.arange(minutes) - phase[:, None]) % period[:, None] == 0).astype(float)


def many_function_rows(
    rng: np.random.Generator, functions: int = 1000, minutes: int = 120
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """:func:`many_functions`'s rows and each function's trigger (``timer`` or ``http``)."""
    rates = _mean_rates(functions)
    kinds = _kinds(rng, rates)
    mean = np.zeros((functions, minutes))
    for kind, shape in (("steady", _wander), ("bursty", _on_off)):
        mean[kinds == kind] = shape(rng, int(np.sum(kinds == kind)), minutes)
    mean[kinds == "periodic"] = _hourly(minutes)
    counts = rng.poisson(mean * rates[:, None]).astype(float)
    timer = kinds == "timer"
    counts[timer] = _timers(rng, rates[timer], minutes)
    order = np.argsort(-counts.mean(axis=1), kind="stable")  # f0000: the most invoked
    names = [f"f{i:04d}" for i in range(functions)]
    triggers = np.where(timer[order], "timer", "http").tolist()
    return dict(zip(names, counts[order], strict=True)), dict(zip(names, triggers, strict=True))


def many_functions(
    rng: np.random.Generator, functions: int = 1000, minutes: int = 120
) -> dict[str, np.ndarray]:
    """A synthetic many-function trace: function name -> invocations per minute, ``f0000`` the
    most invoked and on down (see the module docstring for its shape and sources)."""
    return many_function_rows(rng, functions, minutes)[0]


def write_counts(
    path: Path, rows: dict[str, np.ndarray], triggers: dict[str, str] | None = None
) -> None:
    """Write ``rows`` in the MAF format, one row per function; ``Trigger`` from ``triggers``
    (``http`` for a function it leaves out)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    minutes = len(next(iter(rows.values())))
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow([*KEYS, *range(1, minutes + 1)])
        for name, counts in rows.items():
            trigger = (triggers or {}).get(name, "http")
            out.writerow(["raysrv", "bench", name, trigger, *counts.astype(int)])


def main() -> int:
    """Write the shipped traces again: :data:`PERIODIC_SPIKES` and :data:`MANY_FUNCTIONS`."""
    write_counts(PERIODIC_SPIKES, periodic_spikes(np.random.default_rng(2026)))
    write_counts(MANY_FUNCTIONS, *many_function_rows(np.random.default_rng(MANY_SEED)))
    for path in (PERIODIC_SPIKES, MANY_FUNCTIONS):
        print(f"{path.name}: {path.stat().st_size:,} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
