"""Three digit classifiers of clearly different accuracy, exported to ONNX by hand.

The example models for raysrv's model-selection and batching demos. All three are trained on
scikit-learn's bundled 8x8 digits data set (``load_digits``, never downloaded) with one fixed,
stratified train/test split, and each is written as an ONNX graph built node by node with
``onnx.helper`` from the trained weights:

``logreg``
    Multinomial logistic regression on the image average-pooled from 8x8 to 4x4. Pooling throws
    away most of the stroke detail (16 features instead of 64) and the model is linear in what is
    left, so it confuses look-alike digits (1/7, 3/9, 5/8): about 89% test accuracy. It is weak
    on purpose, so that selection policies have a cheap, inaccurate model to route around.
``mlp``
    scikit-learn ``MLPClassifier`` with one ReLU hidden layer on all 64 pixels. A non-linear
    model of the full image: about 97%.
``cnn``
    A small convnet (two 3x3 conv + ReLU + 2x2 max-pool blocks, then a linear layer) trained with
    torch, single-threaded and seeded. Convolutions share weights across positions and see local
    stroke shapes, which is the right prior for images: about 98-99%.

Every graph has one input ``input`` ([N, 64] float32, pixel values 0..16 as ``load_digits``
gives them; the scaling to 0..1 is the first node of the graph) and two outputs: ``label``
([N] int64, the argmax) and ``probabilities`` ([N, 10] float32, the softmax).

Run ``python -m examples.digits.build [out_dir]`` to build the files (default
``examples/digits/models``); builds are cached on disk. torch and scikit-learn are imported
inside the functions that need them, so importing this module is cheap.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from raysrv.artifacts import atomic_write

__all__ = [
    "MODEL_NAMES",
    "TrainedModel",
    "build_all",
    "ensure_model",
    "main",
    "test_split",
    "train_model",
    "train_models",
    "train_split",
]

MODEL_NAMES: tuple[str, ...] = ("logreg", "mlp", "cnn")

SEED = 0
OPSET = 17
IR_VERSION = 8  # the IR version that goes with opset 17; every onnxruntime >= 1.14 loads it
N_CLASSES = 10
PIXEL_MAX = 16.0
ACCURACY_FILE = "accuracy.json"
DEFAULT_OUT_DIR = Path(__file__).parent / "models"

Array = np.ndarray
PredictProba = Callable[[Array], Array]


@dataclass(frozen=True)
class TrainedModel:
    """A trained framework model and its hand-built ONNX twin.

    ``predict_proba`` takes raw pixels ([n, 64], 0..16) like the ONNX input and returns class
    probabilities ([n, 10]); the exported graph must reproduce it.
    """

    predict_proba: PredictProba
    onnx_model: onnx.ModelProto


# --------------------------------------------------------------------------- data


def _split() -> tuple[Array, Array, Array, Array]:
    """The fixed stratified split: ``X_train, X_test, y_train, y_test`` (X float32)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        x.astype(np.float32), y.astype(np.int64), test_size=0.25, random_state=SEED, stratify=y
    )
    return x_train, x_test, y_train, y_test


def train_split() -> tuple[Array, Array]:
    """The training set the models were fitted on: ``X_train`` (float32) and ``y_train``."""
    x_train, _, y_train, _ = _split()
    return x_train, y_train


def test_split() -> tuple[Array, Array]:
    """The held-out test set: ``X_test`` (float32, [n, 64], pixels 0..16) and ``y_test``."""
    _, x_test, _, y_test = _split()
    return x_test, y_test


def _scale(x: Array) -> Array:
    """Pixels 0..16 -> 0..1, the preprocessing every model (and graph) starts with."""
    return np.asarray(x, dtype=np.float32) / np.float32(PIXEL_MAX)


def _pool4x4(x: Array) -> Array:
    """Average-pool [n, 64] 8x8 images to [n, 16] 4x4 ones, row-major like ONNX AveragePool."""
    return x.reshape(-1, 4, 2, 4, 2).mean(axis=(2, 4)).reshape(-1, 16)


# --------------------------------------------------------------------------- ONNX graph


@dataclass
class _Graph:
    """Accumulates nodes and initializers; every method returns the name of its output."""

    nodes: list[onnx.NodeProto] = field(default_factory=list)
    inits: list[TensorProto] = field(default_factory=list)

    def const(self, name: str, value: Any, dtype: type = np.float32) -> str:
        """Add an initializer holding ``value`` as ``dtype``."""
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def op(self, op_type: str, inputs: list[str], output: str, **attrs: Any) -> str:
        """Add one single-output node."""
        self.nodes.append(helper.make_node(op_type, inputs, [output], name=output, **attrs))
        return output

    def scaled_input(self) -> str:
        """``input / 16``: the shared first node."""
        return self.op("Mul", ["input", self.const("pixel_scale", 1.0 / PIXEL_MAX)], "scaled")

    def image(self, x: str) -> str:
        """[N, 64] -> [N, 1, 8, 8]."""
        return self.op("Reshape", [x, self.const("image_shape", [-1, 1, 8, 8], np.int64)], "image")

    def dense(self, name: str, x: str, weight: Array, bias: Array, trans_b: int = 0) -> str:
        """``x @ weight + bias`` (``weight.T`` when ``trans_b``, torch's layout)."""
        w, b = self.const(f"{name}_w", weight), self.const(f"{name}_b", bias)
        return self.op("Gemm", [x, w, b], name, transB=trans_b)


def _finish(graph: _Graph, logits: str, name: str) -> onnx.ModelProto:
    """Add the softmax / argmax heads, declare inputs and outputs, and check the model."""
    graph.op("Softmax", [logits], "probabilities", axis=1)
    graph.op("ArgMax", [logits], "label", axis=1, keepdims=0)
    body = helper.make_graph(
        graph.nodes,
        name,
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 64])],
        [
            helper.make_tensor_value_info("label", TensorProto.INT64, ["N"]),
            helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["N", N_CLASSES]),
        ],
        initializer=graph.inits,
    )
    model = helper.make_model(
        body, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="raysrv-examples"
    )
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    return model


# --------------------------------------------------------------------------- logreg


def _train_logreg(x_train: Array, y_train: Array) -> TrainedModel:
    """Logistic regression on 4x4-pooled images; the pooling is an AveragePool node."""
    from sklearn.linear_model import LogisticRegression

    clf = LogisticRegression(C=10.0, max_iter=5000)
    clf.fit(_pool4x4(_scale(x_train)), y_train)
    g = _Graph()
    pooled = g.op(
        "AveragePool", [g.image(g.scaled_input())], "pooled", kernel_shape=[2, 2], strides=[2, 2]
    )
    flat = g.op("Flatten", [pooled], "flat", axis=1)
    logits = g.dense("logits", flat, clf.coef_.T, clf.intercept_)
    return TrainedModel(
        predict_proba=lambda x: clf.predict_proba(_pool4x4(_scale(x))),
        onnx_model=_finish(g, logits, "digits_logreg"),
    )


# --------------------------------------------------------------------------- mlp


def _train_mlp(x_train: Array, y_train: Array) -> TrainedModel:
    """One-hidden-layer ReLU MLP; each sklearn layer becomes a Gemm."""
    from sklearn.neural_network import MLPClassifier

    clf = MLPClassifier(
        hidden_layer_sizes=(64,), activation="relu", max_iter=1000, random_state=SEED
    )
    clf.fit(_scale(x_train), y_train)
    g = _Graph()
    h = g.scaled_input()
    last = len(clf.coefs_) - 1
    for i, (w, b) in enumerate(zip(clf.coefs_, clf.intercepts_, strict=True)):
        h = g.dense("logits" if i == last else f"fc{i}", h, w, b)
        if i < last:
            h = g.op("Relu", [h], f"relu{i}")
    return TrainedModel(
        predict_proba=lambda x: clf.predict_proba(_scale(x)),
        onnx_model=_finish(g, h, "digits_mlp"),
    )


# --------------------------------------------------------------------------- cnn

_CNN_EPOCHS = 15
_CNN_BATCH = 32
_CNN_LR = 3e-3


@contextmanager
def _torch_deterministic(torch: Any) -> Iterator[None]:
    """Seeded, single-threaded, deterministic torch; the previous settings come back after."""
    threads, strict = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(SEED)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(strict)


def _cnn_net(torch: Any) -> Any:
    """[N, 64] -> 2 x (3x3 conv, ReLU, 2x2 max-pool) -> linear 128 -> 10."""
    from collections import OrderedDict

    nn = torch.nn
    layers = [
        ("image", nn.Unflatten(1, (1, 8, 8))),
        ("conv1", nn.Conv2d(1, 16, 3, padding=1)),
        ("relu1", nn.ReLU()),
        ("pool1", nn.MaxPool2d(2)),
        ("conv2", nn.Conv2d(16, 32, 3, padding=1)),
        ("relu2", nn.ReLU()),
        ("pool2", nn.MaxPool2d(2)),
        ("flat", nn.Flatten()),
        ("fc", nn.Linear(32 * 2 * 2, N_CLASSES)),
    ]
    return nn.Sequential(OrderedDict(layers))


def _fit_cnn(torch: Any, net: Any, x: Array, y: Array) -> None:
    """Adam on shuffled mini-batches with a seeded generator."""
    xs, ys = torch.from_numpy(_scale(x)), torch.from_numpy(y)
    gen = torch.Generator().manual_seed(SEED)
    opt = torch.optim.Adam(net.parameters(), lr=_CNN_LR)
    net.train()
    for _ in range(_CNN_EPOCHS):
        for idx in torch.randperm(len(xs), generator=gen).split(_CNN_BATCH):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(xs[idx]), ys[idx]).backward()
            opt.step()
    net.eval()


def _conv_block(g: _Graph, x: str, conv: Any, k: int) -> str:
    """Conv (3x3, pad 1) -> Relu -> MaxPool 2x2 from a trained ``nn.Conv2d``."""
    w = g.const(f"conv{k}_w", conv.weight.detach().numpy())
    b = g.const(f"conv{k}_b", conv.bias.detach().numpy())
    h = g.op("Conv", [x, w, b], f"conv{k}", kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    h = g.op("Relu", [h], f"relu{k}")
    return g.op("MaxPool", [h], f"pool{k}", kernel_shape=[2, 2], strides=[2, 2])


def _cnn_graph(net: Any) -> onnx.ModelProto:
    """The ONNX twin of :func:`_cnn_net`."""
    g = _Graph()
    h = _conv_block(g, g.image(g.scaled_input()), net.conv1, 1)
    h = g.op("Flatten", [_conv_block(g, h, net.conv2, 2)], "flat", axis=1)
    fc = net.fc
    logits = g.dense("logits", h, fc.weight.detach().numpy(), fc.bias.detach().numpy(), trans_b=1)
    return _finish(g, logits, "digits_cnn")


def _train_cnn(x_train: Array, y_train: Array) -> TrainedModel:
    """Train the convnet with torch and export it by hand."""
    import torch

    with _torch_deterministic(torch):
        net = _cnn_net(torch)
        _fit_cnn(torch, net, x_train, y_train)

    def predict_proba(x: Array) -> Array:
        with torch.no_grad():
            return torch.softmax(net(torch.from_numpy(_scale(x))), dim=1).numpy()

    return TrainedModel(predict_proba=predict_proba, onnx_model=_cnn_graph(net))


# --------------------------------------------------------------------------- build

_TRAINERS: dict[str, Callable[[Array, Array], TrainedModel]] = {
    "logreg": _train_logreg,
    "mlp": _train_mlp,
    "cnn": _train_cnn,
}


def train_model(name: str, x_train: Array, y_train: Array) -> TrainedModel:
    """Train one of the models (``MODEL_NAMES``) on the given images and labels: the example's
    recipe on other data (a subset, or transformed images)."""
    return _TRAINERS[name](x_train, y_train)


def train_models() -> dict[str, TrainedModel]:
    """Train all three models on the fixed split (deterministic: same weights every call)."""
    x_train, _, y_train, _ = _split()
    return {name: _TRAINERS[name](x_train, y_train) for name in MODEL_NAMES}


def _onnx_accuracy(path: Path, x_test: Array, y_test: Array) -> float:
    """Test accuracy of the exported file, measured in onnxruntime."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (labels,) = session.run(["label"], {"input": x_test})
    return float(np.mean(labels == y_test))


def _write_accuracy(paths: dict[str, Path], out_dir: Path) -> None:
    """Measure every exported model and write ``accuracy.json``."""
    x_test, y_test = test_split()
    scores = {name: _onnx_accuracy(path, x_test, y_test) for name, path in paths.items()}
    atomic_write(out_dir / ACCURACY_FILE, (json.dumps(scores, indent=2) + "\n").encode())


def build_all(out_dir: str | os.PathLike[str]) -> dict[str, Path]:
    """Train and write ``<out_dir>/<name>.onnx`` for every model, plus ``accuracy.json``.

    Cached on disk: when all three files exist nothing is trained or rewritten. Each file is
    written atomically, so a concurrent reader never sees a partial model.
    """
    out = Path(out_dir)
    paths = {name: out / f"{name}.onnx" for name in MODEL_NAMES}
    if not all(p.exists() for p in paths.values()):
        out.mkdir(parents=True, exist_ok=True)
        for name, trained in train_models().items():
            atomic_write(paths[name], trained.onnx_model.SerializeToString())
    if not (out / ACCURACY_FILE).exists():
        _write_accuracy(paths, out)
    return paths


def ensure_model(path: str | os.PathLike[str]) -> None:
    """Server hook for a missing model file: build the digits models next to ``path``.

    Raises ``ValueError`` when ``path`` is not one of the files this example builds.
    """
    path = Path(path)
    if path.name in {f"{name}.onnx" for name in MODEL_NAMES}:
        build_all(path.parent)
    if not path.exists():
        known = ", ".join(f"{name}.onnx" for name in MODEL_NAMES)
        raise ValueError(
            f"model file {str(path)!r} does not exist and the digits example cannot build it; "
            f"it builds only {known} (models: {', '.join(MODEL_NAMES)})"
        )


def main(argv: list[str] | None = None) -> int:
    """CLI: build into ``out_dir`` and print each model's test accuracy."""
    parser = argparse.ArgumentParser(description="Build the digits example ONNX models.")
    parser.add_argument(
        "out_dir",
        nargs="?",
        type=Path,
        default=DEFAULT_OUT_DIR,
        help="where to write the .onnx files (default: examples/digits/models)",
    )
    out_dir: Path = parser.parse_args(argv).out_dir
    paths = build_all(out_dir)
    scores = json.loads((out_dir / ACCURACY_FILE).read_text())
    for name, path in paths.items():
        print(f"{name:>7}  {scores[name]:.2%}  {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
