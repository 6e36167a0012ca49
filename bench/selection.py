"""Model selection from feedback on the digits models (issue 5; Clipper, NSDI'17, §5).

    python -m bench.selection [--seeds 10] [--out bench/out/selection.json]

Two runs through the selection-policy interface (``select`` / ``combine`` / ``observe``), each
query's feedback given right after its answer, as clipper's own runs are simulated:

- ``failure`` (clipper Fig. 8): 20,000 sequential queries drawn from the digits test set, five
  models of different accuracy; from query 5,000 to 10,000 the best one (``cnn``) is degraded:
  half its answers are replaced by a wrong label. Reported per model and policy: cumulative
  error, the error over queries 5,500-6,000 (the 500 queries that end 1,000 after the failure)
  beside the best remaining model's, and the same after the recovery (10,500-11,000). The
  cumulative error curves are plotted to ``bench/figures/selection_failure.png``.
- ``contexts`` (clipper Fig. 10's idea): three contexts see the digits upright, mirrored and
  upside down; three models were each trained on one of the views, a fourth on all three.
  Exp4 with one state per context, Exp4 with one global state, and each static model.

The five models of the first run: the example's ``logreg``, ``mlp`` and ``cnn`` (their ONNX
files, run in onnxruntime) and two more built here with scikit-learn: Gaussian naive Bayes and
the ``mlp`` architecture trained on 150 images. Every figure is the mean over ``--seeds`` runs
(query order, corruption and policy draws change with the seed).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from examples.digits import build as digits
from raysrv import policies

__all__ = ["context_run", "failure_run", "labeler", "main"]

N_QUERIES = 20_000
FAIL_AT, RECOVER_AT = 5_000, 10_000
WINDOW = 500
SETTLE = 1_000
POLICIES = ("exp3", "exp4", "epsilon_greedy", "ucb1")
FAILING = "cnn"

Views = dict[str, Callable[[np.ndarray], np.ndarray]]
VIEWS: Views = {
    "upright": lambda x: x,
    "mirrored": lambda x: x.reshape(-1, 8, 8)[:, :, ::-1].reshape(-1, 64),
    "upside down": lambda x: x.reshape(-1, 8, 8)[:, ::-1, :].reshape(-1, 64),
}


def _onnx_labels(path: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (labels,) = session.run(["label"], {"input": x})
    return np.asarray(labels, dtype=int)


def labeler(kind: str, x: np.ndarray, y: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """A digits classifier fitted on ``x`` (pixels 0..16) and ``y``, as a function from images
    to labels: the example's ``mlp`` recipe (``mlp``) or Gaussian naive Bayes (``nb``)."""
    if kind == "mlp":
        model = digits.train_model("mlp", x, y)
        return lambda images: np.argmax(model.predict_proba(images), axis=1)
    from sklearn.naive_bayes import GaussianNB

    nb = GaussianNB().fit(x, y)
    return lambda images: np.asarray(nb.predict(images), dtype=int)


def failure_models() -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Every model's label for every test image, and the true labels."""
    (x_train, y_train), (x_test, y_test) = digits.train_split(), digits.test_split()
    paths = digits.build_all(digits.DEFAULT_OUT_DIR)
    labels = {name: _onnx_labels(path, x_test) for name, path in paths.items()}
    subset = np.random.default_rng(0).choice(len(x_train), 150, replace=False)
    labels["nb"] = labeler("nb", x_train, y_train)(x_test)
    labels["mlp-150"] = labeler("mlp", x_train[subset], y_train[subset])(x_test)
    order = ("nb", "logreg", "mlp-150", "mlp", "cnn")
    return {m: labels[m] for m in order}, y_test


def _stream(
    labels: dict[str, np.ndarray], truth: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The queries' true labels and each model's answers, the failing model's corrupted."""
    items = rng.integers(len(truth), size=N_QUERIES)
    answers = {m: labels[m][items].copy() for m in labels}
    failed = np.arange(N_QUERIES)
    failed = (failed >= FAIL_AT) & (failed < RECOVER_AT) & (rng.random(N_QUERIES) < 0.5)
    wrong = (truth[items] + rng.integers(1, 10, N_QUERIES)) % 10
    answers[FAILING][failed] = wrong[failed]
    return truth[items], answers


def _run_policy(
    name: str, truth: np.ndarray, answers: dict[str, np.ndarray], seed: int
) -> np.ndarray:
    """Errors (0/1) of one policy over the stream, feedback after every query."""
    models = list(answers)
    policy = policies.make_policy(name, models, {}, np.random.default_rng(seed))
    state = policy.init()
    errors = np.zeros(truth.size)
    for t in range(truth.size):
        chosen = policy.select(state, None)
        predictions = {m: int(answers[m][t]) for m in chosen}
        output, _ = policy.combine(state, None, predictions)
        errors[t] = output != truth[t]
        state = policy.observe(state, None, int(truth[t]), predictions)
    return errors


@dataclass(frozen=True)
class FailureRow:
    system: str
    cumulative_error: float
    error_after_failure: float
    error_after_recovery: float


def failure_run(seeds: int) -> tuple[list[FailureRow], dict[str, list[float]], dict[str, Any]]:
    """Rows, mean cumulative-error curves, and the window comparison per seed."""
    labels, truth = failure_models()
    curves: dict[str, np.ndarray] = {}
    windows: dict[str, list[tuple[float, float]]] = {}
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        y, answers = _stream(labels, truth, rng)
        errors = {m: (a != y).astype(float) for m, a in answers.items()}
        for name in POLICIES:
            errors[name] = _run_policy(name, y, answers, seed)
        for system, e in errors.items():
            cumulative = np.cumsum(e) / np.arange(1, e.size + 1)
            curves[system] = curves.get(system, 0) + cumulative / seeds
            windows.setdefault(system, []).append(
                (_window(e, FAIL_AT + SETTLE), _window(e, RECOVER_AT + SETTLE))
            )
    rows = [
        FailureRow(s, float(curves[s][-1]), *np.mean(windows[s], axis=0).tolist()) for s in curves
    ]
    remaining = [m for m in labels if m != FAILING]
    best_after = min(np.mean([w[0] for w in windows[m]]) for m in remaining)
    gaps = {
        name: [w[0] - min(windows[m][k][0] for m in remaining) for k, w in enumerate(windows[name])]
        for name in POLICIES
    }
    summary = {"best_remaining_after_failure": float(best_after), "gap_per_seed": gaps}
    return rows, {s: c.tolist() for s, c in curves.items()}, summary


def _window(errors: np.ndarray, end: int) -> float:
    return float(errors[end - WINDOW : end].mean())


# --------------------------------------------------------------------------- contexts


def context_models() -> tuple[dict[str, dict[str, np.ndarray]], np.ndarray]:
    """Per view, every model's labels for the test images seen that way; the true labels."""
    (x_train, y_train), (x_test, y_test) = digits.train_split(), digits.test_split()
    models = {f"{v}-mlp": labeler("mlp", f(x_train), y_train) for v, f in VIEWS.items()}
    every = np.concatenate([f(x_train) for f in VIEWS.values()])
    models["all-views-mlp"] = labeler("mlp", every, np.tile(y_train, len(VIEWS)))
    labels = {
        view: {m: label(f(x_test)) for m, label in models.items()} for view, f in VIEWS.items()
    }
    return labels, y_test


def context_run(seeds: int) -> dict[str, float]:
    """Error rate of per-context Exp4, global Exp4 and each static model (mean over seeds)."""
    labels, truth = context_models()
    views = list(VIEWS)
    models = list(labels[views[0]])
    totals: dict[str, float] = {}
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        view_of = rng.integers(len(views), size=N_QUERIES)
        items = rng.integers(len(truth), size=N_QUERIES)
        policy = policies.make_policy("exp4", models, {}, rng)
        states = {"global": policy.init(), **{v: policy.init() for v in views}}
        errors = dict.fromkeys(["exp4 per context", "exp4 global", *models], 0)
        for v, i in zip(view_of, items, strict=True):
            view, y = views[v], int(truth[i])
            predictions = {m: int(labels[view][m][i]) for m in models}
            for system, key in (("exp4 per context", view), ("exp4 global", "global")):
                output, _ = policy.combine(states[key], None, predictions)
                errors[system] += output != y
                states[key] = policy.observe(states[key], None, y, predictions)
            for m in models:
                errors[m] += predictions[m] != y
        for system, n in errors.items():
            totals[system] = totals.get(system, 0.0) + n / N_QUERIES / seeds
    return totals


def _plot(curves: dict[str, list[float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for system, curve in curves.items():
        style = "-" if system in POLICIES else ":"
        ax.plot(np.arange(1, len(curve) + 1), curve, style, label=system)
    for at in (FAIL_AT, RECOVER_AT):
        ax.axvline(at, color="grey", lw=0.5)
    ax.set(xlabel="queries", ylabel="cumulative error", ylim=(0, 0.3))
    ax.legend(ncol=3, fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=10, help="runs averaged per figure")
    parser.add_argument("--out", type=Path, default=Path("bench/out/selection.json"))
    parser.add_argument("--figure", type=Path, default=Path("bench/figures/selection_failure.png"))
    args = parser.parse_args(argv)
    rows, curves, summary = failure_run(args.seeds)
    print("| system | cumulative error | error 5,500-6,000 | error 10,500-11,000 |")
    print("|---|---|---|---|")
    for r in rows:
        print(
            f"| {r.system} | {r.cumulative_error:.2%} | {r.error_after_failure:.2%} "
            f"| {r.error_after_recovery:.2%} |"
        )
    best = summary["best_remaining_after_failure"]
    print(f"\nbest remaining model over 5,500-6,000: {best:.2%}")
    for name, gaps in summary["gap_per_seed"].items():
        print(f"  {name}: gap to it per seed, max {max(gaps):+.2%}, mean {np.mean(gaps):+.2%}")
    print(f"\ncontexts ({args.seeds} seeds):", file=sys.stderr, flush=True)
    contexts = context_run(args.seeds)
    print("\n| system | error |\n|---|---|")
    for system, error in contexts.items():
        print(f"| {system} | {error:.2%} |")
    _plot(curves, args.figure)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    out = {"failure": [asdict(r) for r in rows], "summary": summary, "contexts": contexts}
    args.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
