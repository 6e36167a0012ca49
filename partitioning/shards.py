"""What each shard of a parallelized layer group computes, holds and exchanges (Gillis, ICDCS'21,
§III-B/C): the inputs of the performance model and the memory check of Algorithm 1.

* ``none``: one shard runs the whole group.
* ``spatial``: the group's last output is split along its height into near-equal row ranges;
  each shard reads the input rows its range needs through every layer's window (the halo,
  §III-C, Fig. 2a), recomputes the overlapping rows of the layers in between, and holds all
  the group's weights.
* ``channel``: a single convolution or matrix product's output channels are split; each shard
  reads the whole input and holds only its own filters (weights split in proportion).

Bytes of activations assume 4-byte elements (float32). Caveat: a shard's FLOPs are the layer's
scaled by the rows or channels it computes, which ignores the padding's edge effects.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from raysrv.partitioning.graph import Layer, options

__all__ = ["ELEMENT_BYTES", "Shard", "shards"]

ELEMENT_BYTES = 4


@dataclass(frozen=True)
class Shard:
    """One shard's share of a group: FLOPs, weights held, input received, output returned."""

    flops: int
    weight_bytes: int
    in_bytes: int
    out_bytes: int


def shards(group: Sequence[Layer], option: str, parts: int) -> list[Shard]:
    """The ``parts`` shards of consecutive layers ``group`` under ``option``; ValueError where
    the option does not apply or there are more parts than rows or channels to split."""
    if option not in options(group):
        raise ValueError(f"option {option!r} does not apply; {options(group)} do")
    if parts < 1 or (option == "none" and parts != 1):
        raise ValueError(f"{option} takes {'1' if option == 'none' else '1 or more'} parts")
    if option == "spatial":
        return _spatial(group, parts)
    if option == "channel":
        return _channel(group[0], parts)
    first, last = group[0], group[-1]
    return [
        Shard(
            sum(layer.flops for layer in group),
            sum(layer.weight_bytes for layer in group),
            _bytes(first.in_shape),
            _bytes(last.out_shape),
        )
    ]


def _split(total: int, parts: int) -> list[tuple[int, int]]:
    """``[0, total)`` in ``parts`` near-equal consecutive ranges."""
    if parts > total:
        raise ValueError(f"cannot split {total} into {parts} parts")
    edges = [round(k * total / parts) for k in range(parts + 1)]
    return list(zip(edges[:-1], edges[1:], strict=True))


def _spatial(group: Sequence[Layer], parts: int) -> list[Shard]:
    weights = sum(layer.weight_bytes for layer in group)
    out = group[-1].out_shape
    found = []
    for first, end in _split(out[1], parts):
        flops, (a, b) = 0, (first, end)
        for layer in reversed(group):  # the rows each layer computes, from the last back
            flops += math.ceil(layer.flops * (b - a) / layer.out_shape[1])
            assert layer.rows is not None  # spatial layers have a window
            a, b = layer.rows.needs(a, b, layer.in_shape[1])
        received = _rows(group[0].in_shape, a, b)
        found.append(Shard(flops, weights, received, _rows(out, first, end)))
    return found


def _rows(shape: tuple[int, ...], first: int, end: int) -> int:
    return (end - first) * shape[0] * math.prod(shape[2:]) * ELEMENT_BYTES


def _channel(layer: Layer, parts: int) -> list[Shard]:
    channels = layer.out_shape[0]
    return [
        Shard(
            math.ceil(layer.flops * (end - first) / channels),
            math.ceil(layer.weight_bytes * (end - first) / channels),
            _bytes(layer.in_shape),
            _bytes(layer.out_shape) * (end - first) // channels,
        )
        for first, end in _split(channels, parts)
    ]


def _bytes(shape: tuple[int, ...]) -> int:
    return math.prod(shape) * ELEMENT_BYTES
