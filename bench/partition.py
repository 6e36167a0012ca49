"""Partitioned models in one process: the latency-optimal plan's predicted latency against its
measured one, its speedup over the whole model on one worker, and the DP against brute force;
the SLO-aware planner's cost against the latency-optimal plan's, random search's and brute
force's.

    python -m bench.partition [--rounds 3] [--runs 50] [--out bench/out/partition.json]

Two models with random weights (torch, exported to ONNX): ``vgg`` (six 3x3 convolutions of 64
to 256 channels over a 32x32 image, three poolings, two fully connected layers: 21 MB of
weights) and ``wide-resnet`` (a stem and three residual blocks of 64 to 256 channels, one
fully connected layer). For each: the machine is profiled on the model
(:func:`raysrv.partitioning.profile.profile`, one worker: this machine has two cores, one for
the leader, one for a worker), then the DP plans it at two per-shard memory limits, ``tight``
(the smallest, to 1%, for which a plan exists: the model must be split) and ``loose`` (four
times the weights: split only where that is faster). Each plan runs fork-join in this process
(:class:`raysrv.partitioning.local.LocalPlan`, the workers threads), ``--runs`` times after a
warm-up, alternating with the whole model in one onnxruntime session on one thread, for
``--rounds`` rounds; medians. Its outputs are checked against the whole model's. The whole
model's run is predicted too (one stage, on the leader): this machine's speed drifts between
profiling and measuring by as much as the model errs, and the plan's measured / predicted over
the whole model's is the model's error less that drift ("drift-corrected"). Brute force:
the first five layers of each model under random machines and limits.

SLO-aware (tight limit): at SLOs of 1.1, 1.5 and 2.5 times the latency-optimal plan's predicted
latency, the cost (busy ms of leader and workers a query, as predicted) of the latency-optimal
plan, of REINFORCE's plan (:func:`raysrv.partitioning.slo_aware`, seed 0) and of the best of as
many random draws; REINFORCE's plan is measured as above (``--runs`` runs, one round). Then the
plan :func:`raysrv.partitioning.plan` chooses for the cost objective, which measures the
candidates it finds cheaper than the latency-optimal plan before it takes one, measured again
here (``--rounds`` rounds of ``--runs`` runs, median) against the SLO. On the first five layers,
the same searches against brute force's exact optimum.

Results: bench/RESULTS.md, "Partitioned models".
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["main", "models"]

WORKERS = 1  # two cores: the leader and one worker


def models() -> dict[str, Any]:
    """The two torch models, random weights from a fixed seed."""
    import torch
    from torch import nn

    torch.manual_seed(0)

    def vgg() -> nn.Module:
        parts: list[nn.Module] = []
        channels = 3
        for width in (64, 64, "pool", 128, 128, "pool", 256, 256, "pool"):
            if width == "pool":
                parts.append(nn.MaxPool2d(2))
                continue
            parts += [nn.Conv2d(channels, int(width), 3, padding=1), nn.ReLU()]
            channels = int(width)
        head = [nn.Flatten(), nn.Linear(256 * 16, 1024), nn.ReLU(), nn.Linear(1024, 10)]
        return nn.Sequential(*parts, *head)

    class Block(nn.Module):
        def __init__(self, c: int) -> None:
            super().__init__()
            self.a = nn.Conv2d(c, c, 3, padding=1)
            self.b = nn.Conv2d(c, c, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(x + self.b(torch.relu(self.a(x))))

    def wide_resnet() -> nn.Module:
        return nn.Sequential(
            nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), Block(64), nn.MaxPool2d(2),
            nn.Conv2d(64, 128, 1), Block(128), nn.MaxPool2d(2),
            nn.Conv2d(128, 256, 1), Block(256), nn.AdaptiveAvgPool2d(1),
            nn.Flatten(), nn.Linear(256, 10),
        )  # fmt: skip

    return {"vgg": vgg(), "wide-resnet": wide_resnet()}


def export(module: Any, path: Path) -> None:
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module.eval(), (torch.randn(1, 3, 32, 32),), str(path), dynamo=False,
            input_names=["x"], dynamic_axes={"x": {0: "batch"}},
        )  # fmt: skip


def measure(path: Path, rounds: int, runs: int) -> dict[str, Any]:
    """One model's points: the profile, each limit's plan predicted and measured."""
    import onnx
    import onnxruntime as ort

    from raysrv.partitioning import latency_optimal, layers, weight_bytes
    from raysrv.partitioning.local import LocalPlan
    from raysrv.partitioning.profile import measure_s, profile

    model = onnx.load(str(path))
    found, weights = layers(model), weight_bytes(model)
    perf = profile(model, workers=WORKERS)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    whole = ort.InferenceSession(str(path), options)
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    expected = whole.run(None, {"x": x})[0]
    from raysrv.partitioning import shards

    out: dict[str, Any] = {"weight_bytes": weights, "layers": len(found), "plans": {}}
    whole_predicted = perf.latency_s(found, shards(found, "none", 1), True)
    limit = tightest(found, perf, weights)
    out["slo"] = slo_points(path, model, found, perf, limit, x, rounds, runs)
    for name, limit in (("tight", tightest(found, perf, weights)), ("loose", 4 * weights)):
        plan = latency_optimal(found, perf, WORKERS, limit)
        with LocalPlan(model, plan) as local:
            error = float(np.max(np.abs(local.run(x) - expected)))
            timed: dict[str, list[float]] = {"plan": [], "whole": []}
            for k in range(rounds):
                order = ("plan", "whole") if k % 2 == 0 else ("whole", "plan")
                for system in order:
                    run = (
                        (lambda: local.run(x))
                        if system == "plan"
                        else (lambda: whole.run(None, {"x": x}))
                    )
                    timed[system].append(measure_s(run, runs))
        out["plans"][name] = {
            "limit_bytes": limit,
            "largest_shard_bytes": max(
                p.weight_bytes + p.in_bytes + p.out_bytes for s in plan.stages for p in s.shards
            ),
            "leader_bytes": plan.leader_bytes,
            "predicted_ms": plan.predicted_latency_s * 1e3,
            "measured_ms": statistics.median(timed["plan"]) * 1e3,
            "whole_ms": statistics.median(timed["whole"]) * 1e3,
            "whole_predicted_ms": whole_predicted * 1e3,
            "rounds_ms": {k: [v * 1e3 for v in vs] for k, vs in timed.items()},
            "max_abs_error": error,
            "describe": plan.describe(),
        }
    return out


SLACKS = (1.1, 1.5, 2.5)  # SLOs, in the latency-optimal plan's predicted latencies


def slo_points(
    path: Path, model: Any, found: list[Any], perf: Any, limit: int, x: np.ndarray,
    rounds: int, runs: int,
) -> list[dict[str, Any]]:  # fmt: skip
    """At each SLO of :data:`SLACKS`: the latency-optimal plan's cost, the cost of the plans
    REINFORCE and as many random draws find within it (the learned plan measured), the plan
    the planner chooses for the cost objective (measured), and the three searches on the
    first five layers against brute force's optimum."""
    from raysrv.partitioning import brute_force, latency_optimal, plan, random_search, slo_aware
    from raysrv.partitioning.local import LocalPlan
    from raysrv.partitioning.planner import MIB
    from raysrv.partitioning.profile import measure_s

    fastest = latency_optimal(found, perf, WORKERS, limit)
    head = found[:5]
    head_fastest = latency_optimal(head, perf, WORKERS, limit)
    points = []
    for slack in SLACKS:
        slo = fastest.predicted_latency_s * slack
        learned = slo_aware(found, perf, WORKERS, limit, slo)
        drawn = random_search(found, perf, WORKERS, limit, slo, learned.evaluated)
        assert learned.plan is not None  # the fastest plan is within every SLO here
        with LocalPlan(model, learned.plan) as local:
            measured = measure_s(lambda: local.run(x), runs)  # noqa: B023 - used at once
        chosen = plan(path, WORKERS, limit / MIB, "cost", slo * 1e3, perf=perf)
        with LocalPlan(model, chosen) as local:
            chosen_s = statistics.median(
                measure_s(lambda: local.run(x), runs)  # noqa: B023 - used at once
                for _ in range(rounds)
            )
        head_slo = head_fastest.predicted_latency_s * slack
        exact = brute_force(head, perf, WORKERS, limit, slo_s=head_slo)
        head_learned = slo_aware(head, perf, WORKERS, limit, head_slo).plan
        head_drawn = random_search(head, perf, WORKERS, limit, head_slo, 4801).plan
        points.append(
            {
                "slack": slack,
                "slo_ms": slo * 1e3,
                "fastest_cost_ms": fastest.cost_s * 1e3,
                "learned_cost_ms": learned.plan.cost_s * 1e3,
                "learned_predicted_ms": learned.plan.predicted_latency_s * 1e3,
                "learned_measured_ms": measured * 1e3,
                "random_cost_ms": drawn.plan.cost_s * 1e3 if drawn.plan else None,
                "chosen_cost_ms": chosen.cost_s * 1e3,
                "chosen_predicted_ms": chosen.predicted_latency_s * 1e3,
                "chosen_measured_ms": chosen_s * 1e3,
                "chosen_is_fastest": chosen.stages == fastest.stages,
                "evaluated": learned.evaluated,
                "learned_curve_ms": list(learned.best_costs_ms),
                "random_curve_ms": list(drawn.best_costs_ms),
                "head": {
                    "brute_force_cost_ms": exact.cost_s * 1e3,
                    "learned_cost_ms": head_learned.cost_s * 1e3 if head_learned else None,
                    "random_cost_ms": head_drawn.cost_s * 1e3 if head_drawn else None,
                },
                "describe": learned.plan.describe(),
            }
        )
    return points


def tightest(found: list[Any], perf: Any, weights: int) -> int:
    """The smallest per-shard memory limit, to 1%, for which the DP finds a plan."""
    from raysrv.partitioning import latency_optimal

    low, high = 1_000, 4 * weights  # infeasible, feasible
    while high > low * 1.01:
        middle = (low + high) // 2
        try:
            latency_optimal(found, perf, WORKERS, middle)
        except ValueError:
            low = middle
        else:
            high = middle
    return high


def brute_force_check(path: Path, cases: int, seed: int = 0) -> dict[str, int]:
    """How often the DP's latency equals brute force's on the model's first five layers."""
    import onnx

    from raysrv.analytics.forkjoin import EMG
    from raysrv.partitioning import brute_force, latency_optimal, layers
    from raysrv.partitioning.perf import PerfModel

    found = layers(onnx.load(str(path)))[:5]
    rng = np.random.default_rng(seed)
    equal = infeasible = 0
    for _ in range(cases):
        perf = PerfModel(
            {"default": (10 ** rng.uniform(-6, -4), 10 ** rng.uniform(8, 11))},
            10 ** rng.uniform(8, 10),
            EMG(10 ** rng.uniform(-5, -3), 10 ** rng.uniform(-6, -4), 10 ** rng.uniform(-6, -4)),
        )
        limit = int(sum(layer.weight_bytes for layer in found) * rng.uniform(0.3, 1.2)) + 300_000
        workers = int(rng.integers(1, 4))
        try:
            best = brute_force(found, perf, workers, limit, levels=16)
        except ValueError:
            infeasible += 1
            continue
        dp = latency_optimal(found, perf, workers, limit, levels=16)
        equal += abs(dp.predicted_latency_s - best.predicted_latency_s) <= 1e-12
    return {"cases": cases, "equal": equal, "infeasible": infeasible}


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, predicted, measured, whole = [], [], [], []
    for model, found in results.items():
        for name, point in found["plans"].items():
            labels.append(f"{model}\n{name}")
            predicted.append(point["predicted_ms"])
            measured.append(point["measured_ms"])
            whole.append(point["whole_ms"])
    x = np.arange(len(labels))
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar(x - 0.27, predicted, 0.27, label="plan, predicted")
    ax.bar(x, measured, 0.27, label="plan, measured")
    ax.bar(x + 0.27, whole, 0.27, label="whole model, one worker")
    ax.set_xticks(x, labels)
    ax.set_ylabel("latency, ms (median)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=50, help="timed runs a round")
    parser.add_argument("--cases", type=int, default=20, help="brute-force cases a model")
    parser.add_argument("--out", type=Path, default=Path("bench/out/partition.json"))
    parser.add_argument("--plot", type=Path, default=Path("bench/figures/partition.png"))
    args = parser.parse_args(argv)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="raysrv-partition-") as tmp:
        for name, module in models().items():
            path = Path(tmp) / f"{name}.onnx"
            export(module, path)
            results[name] = measure(path, args.rounds, args.runs)
            results[name]["brute_force"] = brute_force_check(path, args.cases)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    plot(results, args.plot)
    print("| model | limit | weights / limit | predicted ms | measured ms | measured / predicted "
          "| whole model: predicted, measured ms | drift-corrected | speedup | max abs error "
          "| DP = brute force |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for model, found in results.items():
        check = found["brute_force"]
        for name, p in found["plans"].items():
            print(
                f"| {model} | {name} | {found['weight_bytes'] / p['limit_bytes']:.2f} "
                f"| {p['predicted_ms']:.3f} | {p['measured_ms']:.3f} "
                f"| {p['measured_ms'] / p['predicted_ms']:.3f} "
                f"| {p['whole_predicted_ms']:.3f}, {p['whole_ms']:.3f} "
                f"| {_corrected(p):.3f} "
                f"| {p['whole_ms'] / p['measured_ms']:.2f}x | {p['max_abs_error']:.1e} "
                f"| {check['equal']} of {check['cases'] - check['infeasible']} |"
            )
        for name, p in found["plans"].items():
            print(f"\n{model}, {name}:\n{p['describe']}")
    print("\n| model | SLO | SLO ms | latency-optimal cost | REINFORCE cost | random cost "
          "| REINFORCE predicted ms | measured ms | planner's choice: cost, measured ms "
          "| first 5 layers: brute force / REINFORCE / random cost |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|---|")
    for model, found in results.items():
        for p in found["slo"]:
            head = p["head"]
            which = "latency-optimal" if p["chosen_is_fastest"] else "learned"
            print(
                f"| {model} | {p['slack']}x | {p['slo_ms']:.3f} | {p['fastest_cost_ms']:.3f} "
                f"| {p['learned_cost_ms']:.3f} | {_ms(p['random_cost_ms'])} "
                f"| {p['learned_predicted_ms']:.3f} | {p['learned_measured_ms']:.3f} "
                f"| {which} {p['chosen_cost_ms']:.3f}, {p['chosen_measured_ms']:.3f} "
                f"| {head['brute_force_cost_ms']:.3f} / {_ms(head['learned_cost_ms'])} "
                f"/ {_ms(head['random_cost_ms'])} |"
            )
    return 0


def _corrected(point: dict[str, Any]) -> float:
    """The plan's measured / predicted over the whole model's: the model's error, less the
    machine's drift between profiling and measuring."""
    whole = point["whole_ms"] / point["whole_predicted_ms"]
    return point["measured_ms"] / point["predicted_ms"] / whole


def _ms(value: float | None) -> str:
    return "none" if value is None else f"{value:.3f}"


if __name__ == "__main__":
    sys.exit(main())
