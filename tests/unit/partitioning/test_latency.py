"""The performance model and the latency-optimal DP (gillis §IV-A/B): the DP finds what trying
every grouping and choice finds, on exported models and random machines; its plans fit their
memory; more workers or memory never make a plan slower."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest

from raysrv.analytics.forkjoin import EMG
from raysrv.partitioning.graph import Layer, layers
from raysrv.partitioning.latency import brute_force, latency_optimal
from raysrv.partitioning.perf import PerfModel, fit_kind
from raysrv.partitioning.shards import shards
from tests.unit.partitioning.nets import resnet, to_onnx


def _machine(rng: np.random.Generator) -> PerfModel:
    """A random machine: rates, overheads and transfers over a few orders of magnitude."""
    return PerfModel(
        {
            "default": (10 ** rng.uniform(-6, -4), 10 ** rng.uniform(7, 9)),
            "Conv": (10 ** rng.uniform(-6, -4), 10 ** rng.uniform(7, 9)),
        },
        bandwidth=10 ** rng.uniform(7, 10),
        delay=EMG(10 ** rng.uniform(-6, -3), 10 ** rng.uniform(-7, -4), 10 ** rng.uniform(-7, -4)),
    )


def _plain() -> PerfModel:
    """One machine for the tests of a single term: 10 us a layer, 1 GFLOP/s, 100 MB/s."""
    return PerfModel({"default": (1e-5, 1e9)}, 1e8, EMG(1e-4, 1e-5, 2e-5))


def _total(found: list[Layer]) -> int:
    return sum(layer.weight_bytes for layer in found)


def _scale(found: list[Layer]) -> int:
    """The model's weights and its largest layer's activations, in bytes."""
    largest = max(math.prod(layer.in_shape) + math.prod(layer.out_shape) for layer in found)
    return _total(found) + 4 * largest


@pytest.mark.parametrize(
    ("name", "seed"), itertools.product(["resnet", "inception", "vgg"], range(6))
)
def test_the_dp_finds_the_brute_force_optimum(
    models: dict[str, list[Layer]], name: str, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    found = models[name]
    perf = _machine(rng)
    workers = int(rng.integers(1, 4))
    limit = int(_scale(found) * rng.uniform(0.2, 1.0))  # the leader's budget binds, or no plan fits
    try:
        expected = brute_force(found, perf, workers, limit, levels=16)
    except ValueError:
        with pytest.raises(ValueError, match="no plan fits"):
            latency_optimal(found, perf, workers, limit, levels=16)
        return
    plan = latency_optimal(found, perf, workers, limit, levels=16)
    assert plan.predicted_latency_s == pytest.approx(expected.predicted_latency_s, rel=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_a_plan_fits_its_memory_and_is_the_sum_of_its_rounds(
    models: dict[str, list[Layer]], seed: int
) -> None:
    rng = np.random.default_rng(100 + seed)
    found, perf = models["resnet"], _machine(rng)
    limit = 16_000  # the linear layer's 20 KB of weights must be split
    plan = latency_optimal(found, perf, 2, limit)
    assert max(shard.weight_bytes for s in plan.stages for shard in s.shards) < limit
    assert plan.leader_bytes <= limit
    assert all(p.weight_bytes + p.in_bytes + p.out_bytes <= limit for p in plan.worker_shards())
    edges = [(s.first, s.last) for s in plan.stages]
    assert edges[0][0] == 0
    assert edges[-1][1] == len(found) - 1
    assert all(b[0] == a[1] + 1 for a, b in itertools.pairwise(edges))
    assert plan.stages[-1].option == "channel"  # where the big weights are
    rounds = [perf.latency_s(found[s.first : s.last + 1], s.shards, s.leader) for s in plan.stages]
    assert plan.predicted_latency_s == pytest.approx(sum(rounds))


def test_more_workers_or_memory_never_make_a_plan_slower(models: dict[str, list[Layer]]) -> None:
    rng = np.random.default_rng(7)
    for found in models.values():
        perf = _machine(rng)
        base = _total(found) + 40_000
        latencies = [
            [latency_optimal(found, perf, w, int(base * f)).predicted_latency_s for f in (1, 2, 4)]
            for w in (1, 2, 3)
        ]
        grid = np.array(latencies)
        assert np.all(np.diff(grid, axis=0) <= 1e-15)
        assert np.all(np.diff(grid, axis=1) <= 1e-15)


def test_a_layer_no_split_can_fit_is_refused(models: dict[str, list[Layer]]) -> None:
    perf = _machine(np.random.default_rng(1))
    with pytest.raises(ValueError, match="no plan fits 2000 bytes a shard with 2 workers"):
        latency_optimal(models["resnet"], perf, 2, 2_000)


def test_describe_names_each_round(models: dict[str, list[Layer]]) -> None:
    plan = latency_optimal(models["resnet"], _machine(np.random.default_rng(2)), 2, 16_000)
    text = plan.describe()
    assert text.startswith(f"predicted latency {plan.predicted_latency_s * 1e3:.2f} ms")
    assert text.count("\n") == len(plan.stages)
    assert "/Flatten" in text


def test_a_round_waits_for_the_slowest_worker_and_the_expected_max_delay(
    models: dict[str, list[Layer]],
) -> None:
    stem = models["resnet"][:1]
    perf = _plain()
    pieces = shards(stem, "spatial", 3)
    remote = max(perf.run_s(stem, p) + (p.in_bytes + p.out_bytes) / 1e8 for p in pieces[1:])
    expected = max(perf.run_s(stem, pieces[0]), remote + EMG(1e-4, 1e-5, 2e-5).expected_max(2))
    assert perf.latency_s(stem, pieces, leader=True) == pytest.approx(expected)
    alone = perf.latency_s(stem, shards(stem, "none", 1), leader=True)
    assert alone == pytest.approx(1e-5 + stem[0].flops / 1e9)


def test_a_kinds_rate_is_fitted_from_run_times() -> None:
    flops = np.array([1e6, 2e6, 4e6, 8e6])
    overhead, rate = fit_kind(flops, 3e-5 + flops / 2e9)
    assert overhead == pytest.approx(3e-5)
    assert rate == pytest.approx(2e9)
    with pytest.raises(ValueError, match="two different sizes"):
        fit_kind([1e6, 1e6], [1e-3, 2e-3])
    with pytest.raises(ValueError, match="does not grow"):
        fit_kind([1e6, 2e6], [2e-3, 1e-3])


@pytest.mark.parametrize(
    ("runs", "bandwidth", "message"),
    [
        ({"Conv": (0.0, 1e9)}, 1e9, "default"),
        ({"default": (0.0, -1.0)}, 1e9, "flops_per_s positive"),
        ({"default": (-1e-6, 1e9)}, 1e9, "overhead_s must be >= 0"),
        ({"default": (0.0, 1e9)}, 0.0, "bandwidth must be positive"),
    ],
)
def test_a_machine_of_impossible_numbers_is_refused(
    runs: dict[str, tuple[float, float]], bandwidth: float, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        PerfModel(runs, bandwidth, EMG(1e-4, 1e-5, 1e-5))


def test_finer_memory_levels_never_give_a_slower_plan() -> None:
    """A shard's size rounds up to fewer bytes on finer levels, so every plan that fit still
    fits."""
    found = layers(to_onnx(resnet()))
    perf = _machine(np.random.default_rng(3))
    coarse = latency_optimal(found, perf, 2, 60_000, levels=8)
    fine = latency_optimal(found, perf, 2, 60_000, levels=128)
    assert fine.predicted_latency_s <= coarse.predicted_latency_s + 1e-15
    assert math.isfinite(fine.predicted_latency_s)


def test_within_an_slo_the_cheapest_plan_costs_no_more_than_the_fastest(
    models: dict[str, list[Layer]],
) -> None:
    rng = np.random.default_rng(11)
    for found in models.values():
        perf, limit = _machine(rng), 4 * _scale(found)
        fastest = latency_optimal(found, perf, 2, limit, levels=16)
        for slack in (1.0, 1.3, 3.0):
            slo = fastest.predicted_latency_s * slack
            cheapest = brute_force(found, perf, 2, limit, levels=16, slo_s=slo)
            assert cheapest.predicted_latency_s <= slo
            assert cheapest.cost_s <= fastest.cost_s + 1e-15
            busy = sum(
                perf.worker_s(found[s.first : s.last + 1], s.shards, s.leader)
                for s in cheapest.stages
            )
            assert cheapest.cost_s == pytest.approx(cheapest.predicted_latency_s + busy)
        with pytest.raises(ValueError, match="within"):
            brute_force(found, perf, 2, limit, levels=16, slo_s=fastest.predicted_latency_s * 0.99)


def test_an_slo_the_leader_alone_meets_is_met_without_workers(
    models: dict[str, list[Layer]],
) -> None:
    found = models["resnet"]
    perf = _machine(np.random.default_rng(12))
    alone = sum(perf.latency_s([layer], shards([layer], "none", 1), True) for layer in found)
    cheapest = brute_force(found, perf, 2, 4 * _scale(found), levels=16, slo_s=alone * 1.01)
    assert all(s.parts == 1 and s.leader for s in cheapest.stages)
    assert cheapest.cost_s == pytest.approx(cheapest.predicted_latency_s)


def test_a_shard_pays_one_session_however_many_layers_it_runs(
    models: dict[str, list[Layer]],
) -> None:
    group = models["vgg"][:3]
    without = _plain()
    with_session = PerfModel({"default": (1e-5, 1e9)}, 1e8, EMG(1e-4, 1e-5, 2e-5), 3e-4)
    whole = shards(group, "none", 1)[0]
    assert with_session.run_s(group, whole) == pytest.approx(without.run_s(group, whole) + 3e-4)
    apart = sum(with_session.run_s([layer], shards([layer], "none", 1)[0]) for layer in group)
    assert apart - with_session.run_s(group, whole) == pytest.approx(2 * 3e-4)
    with pytest.raises(ValueError, match="session_s must be >= 0"):
        PerfModel({"default": (1e-5, 1e9)}, 1e8, EMG(1e-4, 1e-5, 2e-5), -1.0)


def test_a_transfer_over_large_bytes_pays_large_s_once_each_way(
    models: dict[str, list[Layer]],
) -> None:
    stem = models["resnet"][:1]
    pieces = shards(stem, "spatial", 2)
    small = _plain()
    on_ray = dataclasses.replace(small, large_bytes=pieces[1].in_bytes - 1, large_s=1e-3)
    assert pieces[1].out_bytes > pieces[1].in_bytes  # both ways over the threshold
    assert on_ray.transfer_s(on_ray.large_bytes) == pytest.approx(on_ray.large_bytes / 1e8)
    gap = on_ray.worker_s(stem, pieces, leader=True) - small.worker_s(stem, pieces, leader=True)
    assert gap == pytest.approx(2e-3)
    with pytest.raises(ValueError, match="large_bytes and large_s must be >= 0"):
        dataclasses.replace(small, large_s=-1.0)


def test_shards_side_by_side_run_slower_and_a_shard_alone_does_not(
    models: dict[str, list[Layer]],
) -> None:
    stem = models["resnet"][:1]
    alone = _plain()
    shared = dataclasses.replace(alone, side_by_side=0.5)
    one = shards(stem, "none", 1)
    for leader in (True, False):
        assert shared.latency_s(stem, one, leader) == alone.latency_s(stem, one, leader)
    pair = shards(stem, "spatial", 2)
    run = alone.run_s(stem, pair[0])
    assert shared.latency_s(stem, pair, True) - alone.latency_s(stem, pair, True) == (
        pytest.approx(0.5 * max(run, alone.run_s(stem, pair[1])))
    )
    busy = shared.worker_s(stem, pair, False) - alone.worker_s(stem, pair, False)
    assert busy == pytest.approx(0.5 * sum(alone.run_s(stem, p) for p in pair))
    with pytest.raises(ValueError, match="side_by_side must be >= 0"):
        dataclasses.replace(alone, side_by_side=-0.1)


def test_the_leaders_run_holds_up_its_workers_by_overlap_and_nothing_else(
    models: dict[str, list[Layer]],
) -> None:
    stem = models["resnet"][:1]
    free = _plain()
    held = dataclasses.replace(free, overlap=0.5)
    pair = shards(stem, "spatial", 2)
    local = free.run_s(stem, pair[0])
    assert free.latency_s(stem, pair, True) > local  # the workers' answer ends the round
    gap = held.latency_s(stem, pair, True) - free.latency_s(stem, pair, True)
    assert gap == pytest.approx(0.5 * local)
    one = shards(stem, "none", 1)
    for leader in (True, False):  # the leader alone, or workers alone: nothing to hold up
        assert held.latency_s(stem, one, leader) == free.latency_s(stem, one, leader)
    assert held.latency_s(stem, pair, False) == free.latency_s(stem, pair, False)
    assert held.worker_s(stem, pair, True) == free.worker_s(stem, pair, True)
    with pytest.raises(ValueError, match="overlap must be >= 0"):
        dataclasses.replace(free, overlap=-0.1)


def test_a_cold_shard_pays_once_and_for_each_byte_of_its_weights_and_nothing_else(
    models: dict[str, list[Layer]],
) -> None:
    stem = models["resnet"][:1]
    warm = _plain()
    cold = dataclasses.replace(warm, cold_s=2e-5, cold_s_per_byte=1e-10)
    for option, parts in (("none", 1), ("spatial", 2), ("channel", 2)):
        for piece in shards(stem, option, parts):
            gap = cold.run_s(stem, piece) - warm.run_s(stem, piece)
            assert gap == pytest.approx(2e-5 + piece.weight_bytes * 1e-10)
    halves = shards(stem, "channel", 2)
    assert halves[0].weight_bytes < stem[0].weight_bytes  # each half holds its filters only
    for bad in ({"cold_s": -1e-6}, {"cold_s_per_byte": -1e-12}):
        with pytest.raises(ValueError, match="cold_s and cold_s_per_byte must be >= 0"):
            dataclasses.replace(warm, **bad)
