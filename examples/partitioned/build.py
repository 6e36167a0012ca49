"""A wide convnet on scikit-learn's digits, too big for one worker of the partitioned example.

``wide-cnn``: two 3x3 convolutions of 64 and 128 channels over the 8x8 image (each with ReLU),
a 2x2 max-pool, a 3x3 convolution of 256 channels, then fully connected layers of 1,024 and 10
units and a softmax: about 17 MB of float32 weights, most of them in the first fully connected
layer. Trained with torch (single-threaded, seeded, a few epochs on the training split of the
digits example) and exported to ONNX with a free batch size. Input: ``[N, 1, 8, 8]`` float32
pixels 0..16 (the scaling to 0..1 is the model's first node); output: ``[N, 10]``
probabilities.

Run ``python -m examples.partitioned.build [out_dir]`` to build it (default
``examples/partitioned/models``); the build is cached on disk.
"""

from __future__ import annotations

import argparse
import io
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from examples.digits.build import PIXEL_MAX, SEED, test_split, train_split
from raysrv.artifacts import atomic_write

__all__ = ["MODEL_FILE", "accuracy", "build", "ensure_model", "main"]

MODEL_FILE = "wide-cnn.onnx"
EPOCHS = 4
DEFAULT_OUT_DIR = Path(__file__).parent / "models"


def _module() -> Any:
    import torch
    from torch import nn

    class WideCnn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(1, 64, 3, padding=1),
                nn.ReLU(),
                nn.Conv2d(64, 128, 3, padding=1),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Conv2d(128, 256, 3, padding=1),
                nn.ReLU(),
            )
            self.head = nn.Sequential(
                nn.Flatten(),
                nn.Linear(256 * 4 * 4, 1024),
                nn.ReLU(),
                nn.Linear(1024, 10),
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.features(x / PIXEL_MAX))

    return WideCnn()


def _images(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).reshape(-1, 1, 8, 8)


def build(out_dir: str | os.PathLike[str] = DEFAULT_OUT_DIR) -> Path:
    """Train the model and write it to ``out_dir``/``MODEL_FILE``; returns the path."""
    import torch
    from torch import nn

    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    x_train, y_train = train_split()
    images, labels = torch.from_numpy(_images(x_train)), torch.from_numpy(y_train)
    module = _module()
    optimizer = torch.optim.Adam(module.parameters(), lr=1e-3)
    loss = nn.CrossEntropyLoss()
    order = torch.Generator().manual_seed(SEED)
    for _ in range(EPOCHS):
        for batch in torch.randperm(len(labels), generator=order).split(64):
            optimizer.zero_grad()
            loss(module(images[batch]), labels[batch]).backward()
            optimizer.step()
    module = nn.Sequential(module, nn.Softmax(dim=1)).eval()
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            (torch.zeros(1, 1, 8, 8),),
            buffer,
            dynamo=False,
            input_names=["input"],
            output_names=["probabilities"],
            dynamic_axes={"input": {0: "N"}, "probabilities": {0: "N"}},
        )
    path = Path(out_dir) / MODEL_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, buffer.getvalue())
    return path


def accuracy(path: str | os.PathLike[str]) -> float:
    """The model's accuracy on the digits example's test split."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x_test, y_test = test_split()
    (probabilities,) = session.run(None, {"input": _images(x_test)})
    return float(np.mean(probabilities.argmax(axis=1) == y_test))


def ensure_model(path: str | os.PathLike[str]) -> None:
    """Server hook for a missing model file: build ``wide-cnn.onnx`` at ``path``.

    Raises ``ValueError`` when ``path`` does not name that file."""
    path = Path(path)
    if path.name != MODEL_FILE:
        raise ValueError(
            f"model file {str(path)!r} does not exist and the partitioned example cannot build "
            f"it; it builds only {MODEL_FILE}"
        )
    build(path.parent)


def main(argv: list[str] | None = None) -> int:
    """CLI: build into ``out_dir`` and print the model's test accuracy and size."""
    parser = argparse.ArgumentParser(description="Build the partitioned example's model.")
    parser.add_argument("out_dir", nargs="?", type=Path, default=DEFAULT_OUT_DIR)
    path = build(parser.parse_args(argv).out_dir)
    print(f"{path}: {path.stat().st_size / 2**20:.1f} MiB, accuracy {accuracy(path):.2%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
