"""The graph front end on torch modules exported to ONNX: residual and inception branches merged,
element-wise layers into their producers, shapes, FLOPs, weights, options, and each spatial
layer's window against the rows autograd says an output range depends on."""

from __future__ import annotations

import io
import math
import warnings

import numpy as np
import onnx
import pytest

from raysrv.partitioning.graph import Layer, Rows, layers, options, weight_bytes
from raysrv.partitioning.shards import ELEMENT_BYTES, shards
from tests.unit.partitioning.nets import inception, nn, resnet, to_onnx, torch, vgg


def test_a_residual_block_is_one_layer_and_activations_join_their_producers() -> None:
    found = layers(to_onnx(resnet()))
    assert [layer.ops for layer in found] == [
        ("Conv", "Relu"),
        ("Conv", "Relu", "Conv", "Add", "Relu"),  # the normalization folded into the conv
        ("MaxPool",),
        ("Flatten", "Gemm"),
    ]
    assert [layer.out_shape for layer in found] == [(8, 16, 16), (8, 16, 16), (8, 8, 8), (10,)]
    assert found[0].flops == 2 * (8 * 16 * 16) * (3 * 3 * 3) + 8 * 16 * 16
    assert found[3].flops == 2 * 10 * 512
    assert found[3].in_shape == (8, 8, 8)  # the flatten travels with the layer that reads it
    assert [layer.rows for layer in found[:3]] == [Rows(1, -1, 2), Rows(1, -2, 3), Rows(2, 0, 2)]


def test_weights_are_counted_once_each_and_add_up_to_the_model() -> None:
    for module in (resnet(), inception(), vgg()):
        model = to_onnx(module)
        assert sum(layer.weight_bytes for layer in layers(model)) == weight_bytes(model)
    stem = layers(to_onnx(resnet()))[0]
    assert stem.weight_bytes == (8 * 3 * 3 * 3 + 8) * 4


def test_aninception_module_joined_by_concat_is_one_spatial_layer() -> None:
    found = layers(to_onnx(inception()))
    assert len(found) == 3
    module = found[1]
    assert module.ops.count("Conv") == 5
    assert module.ops[-1] == "Concat"
    assert module.out_shape == (16, 8, 8)
    assert module.spatial
    assert not module.channel
    assert module.rows == Rows(1, -2, 3)  # the widest branch, the 5x5
    assert options([module]) == ("none", "spatial")


def test_options_follow_each_layers_tensor_dependencies() -> None:
    found = layers(to_onnx(vgg()))
    assert [options([layer]) for layer in found] == [
        ("none", "spatial", "channel"),
        ("none", "spatial", "channel"),
        ("none", "spatial"),  # max pooling
        ("none", "spatial", "channel"),
        ("none",),  # global pooling: each output reads every row
        ("none", "channel"),  # flatten and linear
        ("none",),  # softmax reads the whole row: not element-wise, a layer of its own
    ]
    assert options(found[:3]) == ("none", "spatial")  # a group: no channel split
    assert options(found[3:5]) == ("none",)


@pytest.mark.parametrize("build", [resnet, inception, vgg])
def test_a_spatial_window_is_the_rows_an_output_range_depends_on(build: object) -> None:
    """For each spatial layer and a few output row ranges, the input rows whose gradient is not
    zero are exactly those its window says (random weights: no dependence cancels)."""
    module = build().eval()  # type: ignore[operator]
    torch.manual_seed(0)
    blocks = _layer_modules(module)
    x = torch.randn(1, 3, 16, 16)
    checked = 0
    for layer, block in zip(layers(to_onnx(module)), blocks, strict=False):
        if layer.spatial:
            for first, end in ((0, 1), (2, 5), (layer.out_shape[1] - 2, layer.out_shape[1])):
                assert _dependent_rows(block, x, first, end) == layer.rows.needs(
                    first, end, layer.in_shape[1]
                )
                checked += 1
        x = block(x).detach()
    assert checked >= 3


def _layer_modules(module: nn.Module) -> list[nn.Module]:
    """The torch modules of each exported layer, for these three models."""
    parts = list(module)
    found, current = [], []
    for part in parts:
        merged = isinstance(part, nn.ReLU) and current
        if current and not merged and not isinstance(current[-1], nn.Flatten):
            found.append(nn.Sequential(*current))
            current = []
        current.append(part)
    found.append(nn.Sequential(*current))
    return found


def _dependent_rows(block: nn.Module, x: torch.Tensor, first: int, end: int) -> tuple[int, int]:
    x = x.clone().requires_grad_(True)
    (block(x)[:, :, first:end] * torch.randn(1)).abs().sum().backward()
    rows = np.flatnonzero(x.grad.abs().sum(dim=(0, 1, 3)).numpy())
    return int(rows[0]), int(rows[-1]) + 1


def test_spatial_shards_read_a_halo_and_hold_every_weight() -> None:
    chain = layers(to_onnx(vgg()))
    group = chain[:2]  # two 3x3 convolutions, 16 rows
    parts = shards(group, "spatial", 2)
    row_in = 3 * 16 * ELEMENT_BYTES
    assert [p.in_bytes for p in parts] == [10 * row_in, 10 * row_in]  # 8 rows and 2 of halo
    assert [p.out_bytes for p in parts] == [4 * 8 * 16 * ELEMENT_BYTES] * 2
    whole = sum(layer.flops for layer in group)
    assert whole < sum(p.flops for p in parts) <= whole * 1.2  # the halo's rows again
    assert all(p.weight_bytes == chain[0].weight_bytes + chain[1].weight_bytes for p in parts)


def test_channel_shards_hold_their_filters_alone() -> None:
    fc = layers(to_onnx(resnet()))[3]
    parts = shards([fc], "channel", 3)
    assert [p.out_bytes for p in parts] == [3 * 4, 4 * 4, 3 * 4]
    assert all(p.in_bytes == 512 * 4 for p in parts)
    assert sum(p.weight_bytes for p in parts) == pytest.approx(fc.weight_bytes, abs=3)
    assert max(p.weight_bytes for p in parts) <= math.ceil(fc.weight_bytes * 4 / 10)


@pytest.mark.parametrize(
    ("pick", "option", "parts", "message"),
    [
        (slice(3, 4), "spatial", 2, "does not apply"),
        (slice(0, 2), "channel", 2, "does not apply"),
        (slice(0, 1), "none", 2, "none takes 1"),
        (slice(0, 1), "spatial", 17, "cannot split 16 into 17"),
        (slice(3, 4), "channel", 11, "cannot split 10 into 11"),
    ],
)
def test_an_option_that_does_not_fit_is_refused(
    pick: slice, option: str, parts: int, message: str
) -> None:
    found: list[Layer] = layers(to_onnx(resnet()))
    with pytest.raises(ValueError, match=message):
        shards(found[pick], option, parts)


def test_a_model_of_two_inputs_is_refused() -> None:
    class Two(nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return a + b

    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Two(), (torch.ones(1, 2), torch.ones(1, 2)), buffer, dynamo=False)
    with pytest.raises(ValueError, match="one input, this one 2"):
        layers(onnx.load_from_string(buffer.getvalue()))
