"""The peers benchmark's request bodies and figures from a request log."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import pytest

from bench import peers
from bench.loadgen import RequestLog
from bench.peers import (
    LOADS,
    goodput,
    latencies,
    main,
    median_point,
    new_reasons,
    request_body,
    rounds_table,
    table,
)


def test_each_system_gets_the_input_in_its_own_body() -> None:
    x = json.dumps([1.0, 2.0])
    assert json.loads(request_body("raysrv-proxy", 200.0)(x, 12.5)) == {
        "input": [1.0, 2.0],
        "slo_ms": 200,
        "sent_at": 12.5,
    }
    assert json.loads(request_body("bentoml", 200.0)(x, 12.5)) == {"input": [[1.0, 2.0]]}
    for system in ("litserve", "serve", "serve-proxy"):
        assert json.loads(request_body(system, 200.0)(x, 12.5)) == {"input": [1.0, 2.0]}


def _log() -> RequestLog:
    return RequestLog(
        scheduled=[0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7],
        done=[0.05, 0.35, 0.25, 0.31, 0.45, 30.6, 0.8, 0.9],
        status=[200, 200, 200, 429, 503, 0, 500, 504],
    )


def test_a_points_goodput_counts_answers_within_the_slo_only() -> None:
    figures = goodput(_log(), slo_s=0.2, seconds=2.0)
    assert figures["offered"] == 8
    assert figures["within_share"] == pytest.approx(2 / 8)  # 0.1's answer took 0.25 s
    assert figures["goodput_per_s"] == 1.0
    assert (figures["late"], figures["refused"], figures["no_answer"]) == (1, 2, 1)
    assert (figures["timed_out"], figures["other_errors"]) == (1, 1)


def test_latency_is_the_answers_only() -> None:
    figures = latencies(_log())
    assert figures["p50_ms"] == pytest.approx(50.0)  # of 50, 250 and 50 ms
    assert figures["statuses"] == {"0": 1, "200": 3, "429": 1, "500": 1, "503": 1, "504": 1}
    assert math.isnan(latencies(RequestLog(scheduled=[0.0], done=[1.0], status=[503]))["p50_ms"])


def _point(system: str = "raysrv", **shares: float) -> dict[str, Any]:
    """A system's point from :func:`_log`, with a load's share within the SLO set by name."""
    point: dict[str, Any] = {
        "system": system,
        "capacity_per_s": 130.0,
        "saturation_per_s": 120.4,
        "half_load": {"p50_ms": 55.0, "p99_ms": 134.0},
        **{name: goodput(_log(), 0.2, 2.0) for name in LOADS},
    }
    for key, share in shares.items():
        point[LOADS[int(key[-1])]]["within_share"] = share
    return point


def test_the_table_has_a_row_per_system_and_the_loads_columns() -> None:
    point = _point()
    lines = table([point, {**point, "system": "serve"}], 200.0).splitlines()
    assert lines[2].startswith("| raysrv | 120 | 55.0 | 134.0 | 25.00% | 1 | 2 / 1 |")
    assert lines[3].startswith("| serve |")
    assert lines[0].count("|") == lines[2].count("|")


def test_a_phases_reasons_are_those_of_its_own_errors() -> None:
    errors = [  # as TimedClient keeps them: reason, seconds, seconds in transit
        ("queue_full", 0.01, 0.001),
        ("cannot meet deadline", 0.02, 0.002),
        ("cannot meet deadline", 0.1, math.nan),
    ]
    assert new_reasons(errors, 0) == {"queue_full": 1, "cannot meet deadline": 2}
    assert new_reasons(errors, 1) == {"cannot meet deadline": 2}
    assert new_reasons(errors, 3) == {}


def test_the_median_point_takes_each_figure_over_the_rounds() -> None:
    rounds = [_point(load0=s) for s in (0.9, 0.5, 0.7)]
    rounds[1]["saturation_per_s"], rounds[2]["half_load"]["p99_ms"] = 200.0, 10.0
    rounds[0][LOADS[1]]["late"], rounds[1][LOADS[1]]["late"] = 7, 3
    mid = median_point(rounds)
    assert (mid["system"], mid["rounds"]) == ("raysrv", 3)
    assert mid[LOADS[0]]["within_share"] == 0.7
    assert mid["saturation_per_s"] == 120.4
    assert mid["half_load"] == {"p50_ms": 55.0, "p99_ms": 134.0}
    assert mid[LOADS[1]]["late"] == 3
    row = table([mid], 200.0).splitlines()[2]
    assert row.startswith("| raysrv | 120 | 55.0 | 134.0 | 70.00% | 1 | 2 / 1 | 25.00% | 3 |")


def test_raysrv_is_ahead_in_a_round_only_above_every_other_system_and_none_late() -> None:
    def round_of(mine: float, best_peer: float, late: int = 0) -> list[dict[str, Any]]:
        raysrv = _point(load0=mine, load1=mine)
        raysrv[LOADS[0]]["late"], raysrv[LOADS[1]]["late"] = 0, late
        peers = [_point("litserve", load0=best_peer, load1=0.1), _point("serve", load0=0.2)]
        return [*peers, raysrv, _point("raysrv-proxy", load0=1.0, load1=1.0)]

    rounds = [round_of(0.9, 0.8), round_of(0.9, 0.95), round_of(0.9, 0.8, late=1)]
    text = rounds_table(rounds)
    rows = text.splitlines()
    assert rows[0].count("round 3") == len(LOADS)
    assert rows[2].startswith("| litserve | 80.00% (1) | 95.00% (1) | 80.00% (1) | 10.00% (1) |")
    # the proxy's raysrv is not a peer; round 2 a peer led the first load, round 3 one late
    assert text.endswith(f"none late: {LOADS[0]} 2 of 3, {LOADS[1]} 2 of 3")


@pytest.mark.parametrize("scale", ["0", "-0.5", "90"])
def test_a_capacity_scale_outside_its_range_is_refused_before_anything_runs(
    scale: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--capacity-scale", scale, "--out", "/nonexistent/peers.json"])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "--capacity-scale must be above 0 and at most 2" in error
    assert f"got {float(scale):g}" in error


@pytest.mark.parametrize("trace", [False, True])
def test_a_ray_modes_child_traces_raysrv_when_asked(
    trace: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Ray modes measure in a child process: ``--trace`` must reach it, or raysrv's loads
    run untraced there."""
    commands: list[list[str]] = []

    def run(command: list[str], check: bool) -> None:
        commands.append(command)
        out = Path(command[command.index("--out") + 1])
        out.write_text(json.dumps({"points": [{"system": "raysrv"}]}))

    monkeypatch.setattr(peers.subprocess, "run", run)
    args = argparse.Namespace(
        seconds=20.0, slo_ms=200.0, passes=10, raysrv=[], raysrv_ingress=[], trace=trace
    )
    points = peers._child("fast-path", ["raysrv"], 100.0, args)
    assert points == [{"system": "raysrv"}]
    (command,) = commands
    assert ("--trace" in command) is trace
    assert command[command.index("--ray-mode") + 1] == "fast-path"
