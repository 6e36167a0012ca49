"""Small torch models exported to ONNX for the partitioning tests: a residual net, an inception
module behind a strided stem, and a VGG-like chain ending in global pooling and softmax."""

from __future__ import annotations

import io
import warnings

import onnx
import pytest

torch = pytest.importorskip("torch")  # the examples extra
nn = torch.nn


class Residual(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.a = nn.Conv2d(c, c, 3, padding=1)
        self.norm = nn.BatchNorm2d(c)
        self.b = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.b(torch.relu(self.norm(self.a(x)))))


class Inception(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.one = nn.Conv2d(c, 4, 1)
        self.three = nn.Conv2d(c, 4, 3, padding=1)
        self.five = nn.Sequential(nn.Conv2d(c, 2, 1), nn.ReLU(), nn.Conv2d(2, 4, 5, padding=2))
        self.pool = nn.Sequential(nn.AvgPool2d(3, 1, 1), nn.Conv2d(c, 4, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.one(x), self.three(x), self.five(x), self.pool(x)], 1)


def resnet() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        Residual(8),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(8 * 8 * 8, 10),
    )


def inception() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 6, 3, stride=2, padding=1), nn.ReLU(), Inception(6), nn.AvgPool2d(2)
    )


def vgg() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(4, 4, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(4, 8, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 5),
        nn.Softmax(dim=1),
    )


def to_onnx(module: nn.Module, shape: tuple[int, ...] = (3, 16, 16)) -> onnx.ModelProto:
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module.eval(),
            (torch.randn(1, *shape),),
            buffer,
            dynamo=False,
            input_names=["x"],
            dynamic_axes={"x": {0: "batch"}},
        )
    return onnx.load_from_string(buffer.getvalue())
