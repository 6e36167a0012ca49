"""The partitioned-model benchmark's stage by stage view: what it calls a stage's predicted
parts are the performance model's own, so that a measured part can be set beside them."""

from __future__ import annotations

import pytest

from bench.partition_ray import _medians, _predicted, _stage_cells, _stage_medians, verdict
from raysrv.analytics.forkjoin import EMG
from raysrv.partitioning.graph import Layer
from raysrv.partitioning.latency import latency_optimal
from raysrv.partitioning.perf import PerfModel


def _perf() -> PerfModel:
    return PerfModel(
        {"default": (1e-5, 1e9)}, 1e8, EMG(1e-4, 1e-5, 2e-5), side_by_side=0.2, overlap=0.5
    )


def test_a_stages_predicted_parts_are_the_models_round_and_runs(
    models: dict[str, list[Layer]],
) -> None:
    perf = _perf()
    found = models["resnet"]
    total = sum(layer.weight_bytes for layer in found)
    plan = latency_optimal(found, perf, workers=2, memory_limit=total // 2)
    parts = _predicted(perf, plan)
    assert sum(p["round"] for p in parts) == pytest.approx(plan.predicted_latency_s)
    assert any(s.parts > 1 for s in plan.stages)  # some shards run side by side
    for stage, part in zip(plan.stages, parts, strict=True):
        group = found[stage.first : stage.last + 1]
        remote = stage.shards[1:] if stage.leader else stage.shards
        slow = 1.2 if len(stage.shards) > 1 else 1.0  # side_by_side 0.2
        runs = [perf.run_s(group, p) * slow for p in remote]
        assert part["workers_run"] == pytest.approx(max(runs, default=0.0))
        here = perf.run_s(group, stage.shards[0]) * slow if stage.leader else 0.0
        assert part["leader_run"] == pytest.approx(here)
        assert part["round"] >= max(part["workers_run"], part["leader_run"])


def test_stage_medians_are_each_parts_median_over_rounds_in_ms() -> None:
    rounds = [
        (
            [{"round": r, "workers_run": w, "leader_run": 0.0}],
            [{"round": 2 * r, "workers_run": w, "leader_run": 1e-3}],
        )
        for r, w in ((1e-3, 5e-4), (3e-3, 1e-4), (2e-3, 2e-4))
    ]
    (stage,) = _stage_medians(rounds)
    assert stage["predicted"]["round"] == pytest.approx(2.0)
    assert stage["measured"]["round"] == pytest.approx(4.0)
    assert stage["predicted"]["workers_run"] == pytest.approx(0.2)
    assert stage["measured"]["leader_run"] == pytest.approx(1.0)
    assert stage["predicted"]["leader_run"] == 0.0


def test_a_stages_measured_parts_are_its_medians_with_the_slowest_worker() -> None:
    taken = [
        {"rounds": [3.0, 1.0, 2.0], "here": [], "workers": [[0.1, 0.3, 0.2], [0.5, 0.4, 0.6]]},
        {"rounds": [4.0, 5.0, 6.0], "here": [0.7, 0.9, 0.8], "workers": []},
    ]
    first, second = _medians(taken)
    assert first == {"round": 2.0, "workers_run": 0.5, "leader_run": 0.0}
    assert second == {"round": 5.0, "workers_run": 0.0, "leader_run": 0.8}


def test_a_models_verdict_is_the_median_of_its_plans_ratios() -> None:
    plans = [
        {"ray_ms": 6.6, "predicted_ms": 6.0, "ray_over_beside": 1.02},
        {"ray_ms": 5.0, "predicted_ms": 5.0, "ray_over_beside": 0.97},
        {"ray_ms": 4.0, "predicted_ms": 5.0, "ray_over_beside": 0.85},
    ]
    judged = verdict(plans)
    assert judged["at_planning"] == pytest.approx([1.1, 1.0, 0.8])
    assert judged["beside"] == [1.02, 0.97, 0.85]
    assert judged["median_at_planning"] == pytest.approx(1.0)
    assert judged["median_beside"] == 0.97


def test_a_stages_cells_leave_out_the_parts_it_does_not_have() -> None:
    parts = {
        "predicted": {"round": 2.0, "workers_run": 0.0, "leader_run": 1.5},
        "measured": {"round": 2.25, "workers_run": 0.0, "leader_run": 1.75},
    }
    assert _stage_cells(parts) == ["2.000, 2.250", "", "1.500, 1.750", ""]
    parts["measured"] |= {"workers_run": 1.0, "leader_run": 0.0}
    parts["predicted"]["workers_run"] = 0.5
    assert _stage_cells(parts) == ["2.000, 2.250", "0.500, 1.000", "", "1.500, 1.250"]
