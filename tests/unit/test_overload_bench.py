"""The overload benchmark's figures from a request log: goodput, refusals and the time until
the answers are normal again."""

from __future__ import annotations

import asyncio
import json
import math
import os
import time

import numpy as np
import pytest

from bench.loadgen import RequestLog
from bench.overload import (
    MAX_BATCH,
    Trace,
    _by_reason,
    _reason,
    check,
    parser,
    policy_params,
    recovery_s,
    stall,
    summarize,
)


def test_answers_are_normal_again_from_the_first_window_after_which_all_are_good() -> None:
    scheduled = np.arange(0.0, 4.0, 0.05)  # 20 requests a second from 0 to 4 s
    good = np.ones(scheduled.size, bool)
    good[(scheduled >= 1.0) & (scheduled < 1.1)] = False  # bad just after the overload
    good[(scheduled >= 1.6) & (scheduled < 1.65)] = False  # and once more, later
    assert recovery_s(scheduled, good, 1.0, 4.0) == pytest.approx(0.75)  # from 1.75 s on
    assert recovery_s(scheduled, np.ones(scheduled.size, bool), 1.0, 4.0) == 0.0
    never = good.copy()
    never[-1] = False
    assert recovery_s(scheduled, never, 1.0, 4.0) == pytest.approx(3.0)


def test_the_overloads_figures_count_its_own_requests_only() -> None:
    log = RequestLog(
        scheduled=[0.5, 1.0, 1.2, 1.4, 1.6, 2.5],
        done=[0.6, 1.05, 1.6, 1.41, 1.62, 2.55],
        status=[200, 200, 200, 429, 503, 200],
    )
    figures = summarize(log, slo_s=0.2, capacity=2.0, over=(1.0, 2.0), end=3.0)
    assert figures["offered_per_s"] == 4.0  # four scheduled within [1, 2)
    assert figures["goodput_per_s"] == 1.0  # 1.2's answer took 0.4 s: late
    assert figures["goodput_share"] == 0.5
    assert (figures["late"], figures["refused"], figures["no_answer"]) == (1, 2, 0)
    assert figures["refusal_p50_ms"] == pytest.approx(15.0)
    assert figures["statuses"] == {"200": 4, "429": 1, "503": 1}


def test_param_sets_the_deadline_policys_parameters_of_raysrv_only_when_given() -> None:
    args = parser().parse_args(["--param", "plan_arrivals=0", "refuse_behind_queue=false"])
    model = policy_params(args.param)
    assert model == {
        "batching": {
            "policy": "deadline",
            "params": {
                "max_batch_size": MAX_BATCH,
                "plan_arrivals": 0,
                "refuse_behind_queue": False,
            },
        }
    }
    assert policy_params(parser().parse_args([]).param) is None  # the model's own defaults


def test_ingress_sets_raysrvs_ingress_fields_as_json_or_as_text() -> None:
    args = parser().parse_args(["--ingress", "max_ongoing_requests=auto", "max_queued_requests=1"])
    assert dict(args.ingress) == {"max_ongoing_requests": "auto", "max_queued_requests": 1}


def test_a_stall_runs_busy_loops_from_its_time_for_its_length_and_reaps_them() -> None:
    """Their CPU time counts as this process's children's only once they were waited for."""
    before, start = os.times(), time.monotonic()
    asyncio.run(stall(0.2, 0.4, 2))
    elapsed, after = time.monotonic() - start, os.times()
    burned = (after.children_user + after.children_system) - (
        before.children_user + before.children_system
    )
    assert elapsed >= 0.6
    assert burned > 0.2  # two busy loops for 0.4 s: up to 0.8 s of CPU on two free cores


@pytest.mark.parametrize(
    "argv", [["--stall", "-1"], ["--stall", "1", "--stall-at", "21"], ["--stall-at", "-0.5"]]
)
def test_a_stall_outside_the_overload_is_refused(argv: list[str]) -> None:
    options = parser()
    args = options.parse_args(argv)
    with pytest.raises(SystemExit):
        check(options, args)
    assert check(options, options.parse_args(["--stall", "1.5"])).stall_at == 5.0


def test_errors_by_reason_split_off_the_time_before_raysrv_where_the_refusal_told_it() -> None:
    message = "model 'zoo': cannot meet deadline"
    told = json.dumps({"error": "rejected", "message": message, "transit_ms": 40}).encode()
    assert _reason(told) == ("cannot meet deadline", pytest.approx(0.04))
    reason, transit = _reason(b"Service Unavailable")  # Serve's own refusal tells nothing
    assert reason == "Service Unavailable"
    assert math.isnan(transit)
    errors = [("cannot meet deadline", s, s - 0.002) for s in (0.01, 0.02, 0.05)]
    errors.append(("Service Unavailable", 0.003, math.nan))
    figures = _by_reason(errors)
    refused = figures["cannot meet deadline"]
    assert (refused["count"], refused["p50_ms"]) == (3, pytest.approx(20.0))
    assert refused["transit_p50_ms"] == pytest.approx(18.0)
    assert math.isnan(figures["Service Unavailable"]["transit_p99_ms"])


def test_a_trace_counts_its_times_from_the_start_of_the_schedule_not_its_own() -> None:
    """The trace began 1 s ago and sampled the plan 0.5 s in; the requests' schedule, whose
    times the request log counts from, began 0.1 s after the trace (the client's collector pass
    in between): rebased, the sample is 0.4 s into the schedule, where the log puts a request
    sent with it."""
    trace = Trace("http://127.0.0.1:1/raysrv")
    trace.t0 = time.time() - 1.0
    trace.policy = [(0.5, {"admit_spare_ms": 1.0})]
    log = RequestLog()
    log.start = time.perf_counter() - 0.9
    trace.rebase(log)
    ((at, plan),) = trace.policy
    assert at == pytest.approx(0.4, abs=0.01)
    assert plan == {"admit_spare_ms": 1.0}
    assert trace.t0 == pytest.approx(time.time() - 0.9, abs=0.01)
