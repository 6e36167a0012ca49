"""An ONNX model as a linear sequence of layers, each with its shapes, FLOPs and weight bytes,
and which parallelization options it allows (Gillis, ICDCS'21, §III-C).

Steps, in order:

1. **Branch merging** (§III-C, Fig. 5). The nodes are taken in the graph's (topological) order;
   after each, the *live* tensors are those produced so far that a later node still reads. A cut
   falls wherever exactly one tensor is live: everything between two cuts is one layer. A chain
   of single-input nodes becomes one layer a node; a residual block or an inception module,
   whose branches fork from one tensor and join into one, becomes a single layer.
2. **Element-wise merging** (§III-C): a layer of element-wise nodes only (activations,
   normalization, arithmetic with a constant) joins the layer before it, its producer. A
   flatten or reshape joins the layer after it, the fully connected layer that reads it.
3. **Tensor dependencies** (§III-C, Fig. 6). A layer is ``spatial`` when each output element
   depends only on a window of its input at the same height and width (convolution, pooling,
   element-wise, and branches of these that join on the same grid): consecutive spatial layers
   may form one group split along the height, each part reading a *halo* of extra input rows
   (:attr:`Layer.rows`). A layer is ``channel`` when it is one convolution (ungrouped) or one
   matrix product with constant weights, followed by element-wise nodes: its output channels may
   be split, each shard holding only its own filters. Such a layer is a group of its own.

Shapes come from ONNX shape inference, without the batch dimension (a batch of one). FLOPs count
a multiply-add as two. Weight bytes are those of the initializers the layer's nodes read.
Caveats: a model whose graph has several inputs is refused; a tensor read far downstream (a
long skip connection) keeps every node in between in one layer, which then cannot be split.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

__all__ = ["Layer", "Rows", "layers", "node_rows", "options", "weight_bytes", "window_of"]

ELEMENTWISE = frozenset(
    {
        "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Clip", "Elu", "Selu", "Gelu", "HardSigmoid",
        "HardSwish", "Softplus", "Erf", "Sqrt", "Exp", "Neg", "Abs", "BatchNormalization",
        "Dropout", "Identity", "Add", "Sub", "Mul", "Div", "Pow", "Cast",
    }
)  # fmt: skip
RESHAPES = frozenset({"Flatten", "Reshape", "Squeeze", "Unsqueeze"})
WINDOWED = frozenset({"Conv", "MaxPool", "AveragePool"})
JOINS = frozenset({"Add", "Sub", "Mul", "Concat", "Sum", "Max"})  # on the same grid: still local
MATMULS = frozenset({"Gemm", "MatMul"})


@dataclass(frozen=True)
class Rows:
    """Which input rows one output row needs: output row ``i`` reads input rows
    ``[i * stride + lo, i * stride + hi)`` (clipped to the input), composed over a layer's
    windows; a spatial split's halo is ``hi - lo - stride`` rows."""

    stride: int = 1
    lo: int = 0
    hi: int = 1

    def then(self, after: Rows) -> Rows:
        """``after``'s window read through this one (this one runs first)."""
        return Rows(
            self.stride * after.stride,
            after.lo * self.stride + self.lo,
            (after.hi - 1) * self.stride + self.hi,
        )

    def union(self, other: Rows) -> Rows | None:
        """The window covering both, for branches that join; None on different strides."""
        if self.stride != other.stride:
            return None
        return Rows(self.stride, min(self.lo, other.lo), max(self.hi, other.hi))

    def needs(self, first: int, end: int, height: int) -> tuple[int, int]:
        """Input rows ``[a, b)`` within ``[0, height)`` that output rows ``[first, end)`` read."""
        return max(0, first * self.stride + self.lo), min(height, (end - 1) * self.stride + self.hi)


@dataclass(frozen=True)
class Layer:
    """One layer of the linear sequence: merged ONNX nodes, one tensor in and one out."""

    name: str
    ops: tuple[str, ...]
    nodes: tuple[int, ...]  # indices into the graph's nodes
    input: str
    output: str
    in_shape: tuple[int, ...]  # without the batch dimension
    out_shape: tuple[int, ...]
    flops: int
    weight_bytes: int
    spatial: bool
    channel: bool
    rows: Rows | None = field(default=None)  # the height window, where spatial

    def describe(self) -> str:
        return (
            f"{self.name}: {'+'.join(self.ops)} {list(self.in_shape)} -> {list(self.out_shape)}, "
            f"{self.flops / 1e6:.2f} MFLOP, {self.weight_bytes / 1e6:.2f} MB"
            f"{', spatial' if self.spatial else ''}{', channel' if self.channel else ''}"
        )


def options(group: Sequence[Layer]) -> tuple[str, ...]:
    """How consecutive ``group`` may be parallelized (gillis Fig. 6): ``none`` always,
    ``spatial`` where every layer is, ``channel`` for one channel-splittable layer."""
    found = ["none"]
    if group and all(layer.spatial for layer in group):
        found.append("spatial")
    if len(group) == 1 and group[0].channel:
        found.append("channel")
    return tuple(found)


def layers(model: str | Path | onnx.ModelProto) -> list[Layer]:
    """The model's layers, in order (steps 1-3 above)."""
    proto = model if isinstance(model, onnx.ModelProto) else onnx.load(str(model))
    graph = _Graph(onnx.shape_inference.infer_shapes(proto).graph)
    segments = _merge_reshapes(graph, _merge_elementwise(graph, _cut(graph)))
    return [graph.layer(segment) for segment in segments]


class _Graph:
    """An ONNX graph's nodes, shapes and initializers, as the steps read them."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.nodes = list(graph.node)
        self.weights = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        inputs = [v for v in graph.input if v.name not in self.weights]
        if len(inputs) != 1:
            raise ValueError(f"a partitioned model takes one input, this one {len(inputs)}")
        self.input = inputs[0].name
        self.shapes = {v.name: _dims(v) for v in [*graph.input, *graph.value_info, *graph.output]}
        self.outputs = [v.name for v in graph.output]

    def reads(self, node: onnx.NodeProto) -> list[str]:
        """The tensors ``node`` reads that other nodes (or the model's input) produce."""
        return [name for name in node.input if name and name not in self.weights]

    def constant(self, name: str) -> bool:
        return name in self.weights

    def shape(self, name: str) -> tuple[int, ...]:
        dims = self.shapes.get(name)
        if dims is None:
            raise ValueError(f"tensor {name!r} has no shape after ONNX shape inference")
        return dims[1:]

    def layer(self, segment: list[int]) -> Layer:
        nodes = [self.nodes[k] for k in segment]
        produced = {out for node in nodes for out in node.output}
        entry = next(t for node in nodes for t in self.reads(node) if t not in produced)
        exit_ = nodes[-1].output[0]
        rows = _rows(self, nodes, entry)
        used = {name for node in nodes for name in node.input if self.constant(name)}
        return Layer(
            name=nodes[0].name or nodes[0].output[0],
            ops=tuple(node.op_type for node in nodes),
            nodes=tuple(segment),
            input=entry,
            output=exit_,
            in_shape=self.shape(entry),
            out_shape=self.shape(exit_),
            flops=sum(_flops(self, node) for node in nodes),
            weight_bytes=sum(int(self.weights[name].nbytes) for name in used),
            spatial=rows is not None and len(self.shape(exit_)) == 3,
            channel=_channel(self, nodes),
            rows=rows,
        )


def _dims(value: onnx.ValueInfoProto) -> tuple[int, ...] | None:
    dims = value.type.tensor_type.shape.dim
    if not value.type.tensor_type.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else 1 for d in dims)


def _cut(graph: _Graph) -> list[list[int]]:
    """Step 1: the nodes between cuts, where one tensor alone is live."""
    last_read: dict[str, int] = {}
    for k, node in enumerate(graph.nodes):
        for name in graph.reads(node):
            last_read[name] = k
    live = {graph.input}
    segments: list[list[int]] = [[]]
    for k, node in enumerate(graph.nodes):
        segments[-1].append(k)
        live.update(out for out in node.output if last_read.get(out, -1) > k)
        live -= {name for name in graph.reads(node) if last_read[name] == k}
        if len(live) == 1 and k + 1 < len(graph.nodes):
            segments.append([])
    return segments


def _only(graph: _Graph, segment: list[int], kinds: frozenset[str]) -> bool:
    """Whether every node of ``segment`` is of ``kinds`` with one non-constant input."""
    return all(
        graph.nodes[k].op_type in kinds and len(graph.reads(graph.nodes[k])) == 1 for k in segment
    )


def _merge_elementwise(graph: _Graph, segments: list[list[int]]) -> list[list[int]]:
    """Step 2: element-wise layers into their producers."""
    merged: list[list[int]] = []
    for segment in segments:
        if merged and _only(graph, segment, ELEMENTWISE) and not _only(graph, merged[-1], RESHAPES):
            merged[-1] = merged[-1] + segment
        else:
            merged.append(segment)
    return merged


def _merge_reshapes(graph: _Graph, segments: list[list[int]]) -> list[list[int]]:
    """Step 2: a flatten or reshape into the layer that reads it."""
    merged: list[list[int]] = []
    carried: list[int] = []
    for segment in segments:
        if _only(graph, segment, RESHAPES):
            carried += segment
            continue
        merged.append(carried + segment)
        carried = []
    if carried:
        merged.append(carried)
    return merged


def _attribute(node: onnx.NodeProto, name: str, default: object) -> object:
    for attribute in node.attribute:
        if attribute.name == name:
            return onnx.helper.get_attribute_value(attribute)
    return default


def node_rows(node: onnx.NodeProto, weights: Mapping[str, np.ndarray]) -> Rows | None:
    """The height window of one node (its kernel, stride and padding), given the model's
    initializers; None where an output row does not depend on a window of input rows alone."""
    if node.op_type in WINDOWED:
        return _windowed(node, weights)
    if node.op_type == "Concat" and _attribute(node, "axis", 1) not in (1, -3):
        return None  # joined along the height or width: not on the same grid
    if node.op_type in ELEMENTWISE or node.op_type in JOINS:
        constants = [weights[name] for name in node.input if name in weights]
        if any(c.ndim >= 2 and c.shape[-2] > 1 for c in constants):
            return None  # a constant that varies along the height: not sliced with the rows
        return Rows()
    return None


def _windowed(node: onnx.NodeProto, weights: Mapping[str, np.ndarray]) -> Rows | None:
    kernel, stride, pad = window_of(node, weights)
    if not kernel or _attribute(node, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        return None
    if _attribute(node, "ceil_mode", 0):
        return None  # a last window that runs past the input
    return Rows(stride, -pad, kernel - pad)


def window_of(node: onnx.NodeProto, weights: Mapping[str, np.ndarray]) -> tuple[int, int, int]:
    """A convolution's or pooling's extent, stride and leading padding along the height (0
    for the extent where unknown)."""
    if node.op_type == "Conv":
        weight = weights.get(node.input[1])
        kernel = int(weight.shape[2]) if weight is not None and weight.ndim == 4 else 0
    else:
        kernel = int(list(_attribute(node, "kernel_shape", [0]))[0])  # type: ignore[call-overload]
    stride = int(list(_attribute(node, "strides", [1, 1]))[0])  # type: ignore[call-overload]
    pad = int(list(_attribute(node, "pads", [0, 0, 0, 0]))[0])  # type: ignore[call-overload]
    dilation = int(list(_attribute(node, "dilations", [1, 1]))[0])  # type: ignore[call-overload]
    return (kernel - 1) * dilation + 1 if kernel else 0, stride, pad


def _rows(graph: _Graph, nodes: Iterable[onnx.NodeProto], entry: str) -> Rows | None:
    """The layer's height window from ``entry`` to its output; None if a node is not local."""
    reach: dict[str, Rows] = {entry: Rows()}
    for node in nodes:
        window = node_rows(node, graph.weights)
        if window is None:
            return None
        combined: Rows | None = None
        for name in graph.reads(node):
            if name not in reach:
                return None
            through = reach[name].then(window)
            combined = through if combined is None else combined.union(through)
            if combined is None:
                return None
        if combined is None:
            return None
        for out in node.output:
            reach[out] = combined
    return reach[list(nodes)[-1].output[0]]


def _channel(graph: _Graph, nodes: list[onnx.NodeProto]) -> bool:
    """One ungrouped convolution or constant-weight matrix product, then element-wise nodes
    of one input (a flatten or reshape may come before it)."""
    while nodes and nodes[0].op_type in RESHAPES:
        nodes = nodes[1:]
    if not nodes:
        return False
    head, rest = nodes[0], nodes[1:]
    weighted = (head.op_type == "Conv" and _attribute(head, "group", 1) == 1) or (
        head.op_type in MATMULS and len(head.input) > 1 and graph.constant(head.input[1])
    )
    return weighted and all(
        node.op_type in ELEMENTWISE and list(graph.reads(node)) == list(node.input[:1])
        for node in rest
    )  # no constant of its own: per-channel constants would need splitting too


def _flops(graph: _Graph, node: onnx.NodeProto) -> int:
    """Floating-point operations of one node at a batch of one (a multiply-add is two)."""
    out = graph.shape(node.output[0])
    elements = math.prod(out)
    if node.op_type == "Conv":
        weight = graph.weights.get(node.input[1])
        per_output = math.prod(weight.shape[1:]) if weight is not None else 1
        return 2 * elements * per_output
    if node.op_type in MATMULS:
        inner = graph.shape(node.input[0])[-1]
        return 2 * elements * inner
    if node.op_type in ("MaxPool", "AveragePool"):
        kernel = _attribute(node, "kernel_shape", [1])
        return elements * math.prod(kernel)  # type: ignore[arg-type]
    if node.op_type in ("GlobalAveragePool", "GlobalMaxPool"):
        return math.prod(graph.shape(node.input[0]))
    if node.op_type in RESHAPES:
        return 0
    return elements * (2 if node.op_type == "BatchNormalization" else 1)


def weight_bytes(model: str | Path | onnx.ModelProto) -> int:
    """Bytes of all the model's initializers (what one worker holding it whole holds)."""
    proto = model if isinstance(model, onnx.ModelProto) else onnx.load(str(model))
    return sum(int(numpy_helper.to_array(t).nbytes) for t in proto.graph.initializer)
