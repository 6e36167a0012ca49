"""The exported models the planners' tests share: a residual net, an inception module and a
VGG-like chain's first five layers, as layers."""

from __future__ import annotations

import pytest

from raysrv.partitioning.graph import Layer, layers


@pytest.fixture(scope="module")
def models() -> dict[str, list[Layer]]:
    from tests.unit.partitioning.nets import inception, resnet, to_onnx, vgg

    return {
        "resnet": layers(to_onnx(resnet())),
        "inception": layers(to_onnx(inception())),
        "vgg": layers(to_onnx(vgg()))[:5],
    }
