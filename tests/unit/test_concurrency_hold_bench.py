"""bench.concurrency_hold's table: medians over the rounds per number of connections, each
system's ratio to the baseline at the same number."""

from __future__ import annotations

import math

from bench.concurrency_hold import SYSTEMS, table


def _point(k: int, n: int, system: str, rate: float, batch: float = math.nan) -> dict:
    return {
        "round": k,
        "connections": n,
        "system": system,
        "inputs_per_s": rate,
        "p50_ms": 1.0 + k,
        "p99_ms": 5.0,
        "errors": 0,
        "mean_batch": batch,
    }


def test_the_table_takes_medians_and_ratios_at_each_number_of_connections() -> None:
    points = []
    for k, spread in enumerate((0.0, 10.0, 500.0)):  # one wild round: the median holds
        points.append(_point(k, 1, "baseline", 500.0 + spread))
        points.append(_point(k, 1, "raysrv-held", 1000.0 + spread, 1.0))
        points.append(_point(k, 1, "raysrv-unheld", 990.0 + spread, 1.0))
        points.append(_point(k, 32, "baseline", 4000.0 + spread))
        points.append(_point(k, 32, "raysrv-held", 3600.0 + spread, 29.0 + k))
        points.append(_point(k, 32, "raysrv-unheld", 2800.0 + spread, 9.0))
    rows = {
        tuple(cells[1:3]): cells[3:]
        for line in table(points).splitlines()[2:]
        if (cells := [c.strip() for c in line.split("|")])
    }
    assert set(rows) == {(str(n), s) for n in (1, 32) for s in SYSTEMS}
    assert rows[("1", "raysrv-held")][:2] == ["1,010", "1.98x"]  # 1010 / 510
    assert rows[("32", "raysrv-held")][:2] == ["3,610", "0.90x"]  # 3610 / 4010
    assert rows[("32", "raysrv-held")][2] == "2.00"  # p50: the median of 1, 2 and 3
    assert rows[("32", "raysrv-held")][4] == "30.0"  # the mean batch's median
    assert rows[("32", "baseline")][4] == ""  # no batch the bench can read
