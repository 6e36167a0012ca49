"""A plan's shards as ONNX models of their own, run fork-join in one process (Gillis, ICDCS'21,
§III-B/C): what the shard actors run, checked here against the whole model.

* ``none``: the group's nodes, as they are.
* ``channel``: the convolution's or matrix product's weights and bias cut to the shard's output
  channels (a ``Gemm``'s ``transB`` says which axis); the outputs are concatenated.
* ``spatial``: the group's nodes computing only the shard's output rows. Going back from the
  group's output, each tensor gets the rows its readers need (a window's rows through its
  stride and padding, the same rows through an element-wise node); going forward, each node
  reads a ``Slice`` of exactly those rows and pads only where its window passes the true top
  or bottom of its input, as the whole model pads there. The leader sends each shard its
  input rows (with their halo) and stacks the outputs' rows.

Needs onnxruntime; no Ray. Tensors are NCHW for the spatial and convolution options.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from raysrv.partitioning.graph import node_rows, window_of
from raysrv.partitioning.latency import Plan, Stage

__all__ = ["AXIS_H", "LocalPlan", "Sharder", "join_axis", "rows_of", "shard_session"]

AXIS_H = 2  # NCHW


class Sharder:
    """A model's shards as models of their own: its nodes, initializers and shapes, read (and
    its shapes inferred) once for every stage cut from it."""

    def __init__(self, proto: onnx.ModelProto) -> None:
        inferred = onnx.shape_inference.infer_shapes(proto)
        self.opset = list(proto.opset_import)
        self.ir_version = proto.ir_version
        self.nodes = list(inferred.graph.node)
        self.weights = {t.name: numpy_helper.to_array(t) for t in inferred.graph.initializer}
        values = [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]
        self.types = {v.name: v.type.tensor_type for v in values}

    def height(self, tensor: str) -> int:
        return self.types[tensor].shape.dim[AXIS_H].dim_value

    def value(self, tensor: str, rows: int | None = None) -> onnx.ValueInfoProto:
        """``tensor``'s type with a free batch size (and ``rows`` rows, where given)."""
        kind = self.types[tensor]
        dims: list[int | str] = ["N"] + [d.dim_value for d in kind.shape.dim[1:]]
        if rows is not None:
            dims[AXIS_H] = rows
        return helper.make_tensor_value_info(tensor, kind.elem_type, dims)

    def build(
        self, nodes: Sequence[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], output: str,
        extra: dict[str, np.ndarray] | None = None,
    ) -> onnx.ModelProto:  # fmt: skip
        """A model of ``nodes`` with the initializers they read (``extra`` replacing or adding
        some)."""
        extra = extra or {}
        used = {name for node in nodes for name in node.input}
        tensors = {name: array for name, array in self.weights.items() if name in used}
        tensors.update({name: a for name, a in extra.items() if name in used})
        graph = helper.make_graph(
            list(nodes),
            "shard",
            inputs,
            [helper.make_tensor_value_info(output, self.types[output].elem_type, None)],
            [numpy_helper.from_array(array, name) for name, array in tensors.items()],
        )
        return helper.make_model(graph, opset_imports=self.opset, ir_version=self.ir_version)

    def shard_models(
        self, plan: Plan, stage: Stage
    ) -> list[tuple[onnx.ModelProto, tuple[int, int] | None]]:
        """``stage``'s shards as models, each with the input rows the leader sends it (None:
        the whole input)."""
        group = plan.layers[stage.first : stage.last + 1]
        nodes = [self.nodes[k] for layer in group for k in layer.nodes]
        entry, exit_ = group[0].input, group[-1].output
        if stage.option == "none":
            return [(self.build(nodes, [self.value(entry)], exit_), None)]
        if stage.option == "channel":
            return [(m, None) for m in _channel_models(self, nodes, entry, exit_, stage.parts)]
        height = self.height(exit_)
        edges = [round(k * height / stage.parts) for k in range(stage.parts + 1)]
        return [_spatial_model(self, nodes, entry, exit_, r) for r in itertools.pairwise(edges)]


def _channel_models(
    whole: Sharder, nodes: list[onnx.NodeProto], entry: str, exit_: str, parts: int
) -> list[onnx.ModelProto]:
    head = next(node for node in nodes if node.op_type in ("Conv", "Gemm", "MatMul"))
    weight = whole.weights[head.input[1]]
    axis = _output_axis(head)
    channels = weight.shape[axis]
    edges = [round(k * channels / parts) for k in range(parts + 1)]
    found = []
    for first, end in itertools.pairwise(edges):
        cut = {head.input[1]: np.take(weight, range(first, end), axis=axis)}
        if len(head.input) > 2 and head.input[2] in whole.weights:
            cut[head.input[2]] = whole.weights[head.input[2]][first:end]
        found.append(whole.build(nodes, [whole.value(entry)], exit_, cut))
    return found


def _output_axis(head: onnx.NodeProto) -> int:
    """The axis of the weights that runs over the output channels."""
    if head.op_type == "Conv":
        return 0
    if head.op_type == "Gemm":
        trans = next((a.i for a in head.attribute if a.name == "transB"), 0)
        return 0 if trans else 1
    return 1  # MatMul: (K, N)


def _spatial_model(
    whole: Sharder, nodes: list[onnx.NodeProto], entry: str, exit_: str, rows: tuple[int, int]
) -> tuple[onnx.ModelProto, tuple[int, int]]:
    need = _rows_needed(whole, nodes, exit_, rows)
    built: list[onnx.NodeProto] = []
    extra: dict[str, np.ndarray] = {}
    for k, node in enumerate(nodes):
        wanted = _input_rows(whole, node, need[node.output[0]])
        inputs = list(node.input)
        for i, name in enumerate(node.input):
            if name in need and need[name] != wanted[name]:
                inputs[i] = _slice(built, extra, name, need[name], wanted[name], f"{k}_{i}")
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        del copy.input[:]
        copy.input.extend(inputs)
        if node.op_type in ("Conv", "MaxPool", "AveragePool"):
            _repad(copy, whole, node, need[node.output[0]])
        built.append(copy)
    first, end = need[entry]
    model = whole.build(built, [whole.value(entry, end - first)], exit_, extra)
    return model, (first, end)


def _input_rows(
    whole: Sharder, node: onnx.NodeProto, out: tuple[int, int]
) -> dict[str, tuple[int, int]]:
    """The rows of each of ``node``'s tensor inputs that its output rows ``out`` read."""
    rows = node_rows(node, whole.weights)
    assert rows is not None  # a spatial group's nodes all have windows
    found = {}
    for name in node.input:
        if name in whole.weights or not name:
            continue
        found[name] = rows.needs(out[0], out[1], whole.height(name))
    return found


def _rows_needed(
    whole: Sharder, nodes: list[onnx.NodeProto], exit_: str, rows: tuple[int, int]
) -> dict[str, tuple[int, int]]:
    """Every tensor's rows that the output rows ``rows`` need, from the last node back; a
    tensor read by several nodes, the rows that cover all of them."""
    need = {exit_: rows}
    for node in reversed(nodes):
        for name, (a, b) in _input_rows(whole, node, need[node.output[0]]).items():
            held = need.get(name)
            need[name] = (a, b) if held is None else (min(a, held[0]), max(b, held[1]))
    return need


def _slice(
    built: list[onnx.NodeProto], extra: dict[str, np.ndarray], name: str,
    held: tuple[int, int], wanted: tuple[int, int], tag: str,
) -> str:  # fmt: skip
    """A ``Slice`` of rows ``wanted`` from ``name``, which holds rows ``held``."""
    starts, ends, axes = f"slice_{tag}_starts", f"slice_{tag}_ends", f"slice_{tag}_axes"
    extra[starts] = np.array([wanted[0] - held[0]], dtype=np.int64)
    extra[ends] = np.array([wanted[1] - held[0]], dtype=np.int64)
    extra[axes] = np.array([AXIS_H], dtype=np.int64)
    sliced = f"{name}__rows_{tag}"
    built.append(helper.make_node("Slice", [name, starts, ends, axes], [sliced]))
    return sliced


def _repad(
    copy: onnx.NodeProto, whole: Sharder, node: onnx.NodeProto, out: tuple[int, int]
) -> None:
    """Pad along the height only where the window passes the input's true top or bottom."""
    extent, stride, pad = window_of(node, whole.weights)
    height = whole.height(node.input[0])
    top = max(0, pad - out[0] * stride)
    bottom = max(0, (out[1] - 1) * stride - pad + extent - height)
    for attribute in copy.attribute:
        if attribute.name == "pads":
            pads = list(attribute.ints)
            pads[0], pads[len(pads) // 2] = top, bottom
            del attribute.ints[:]
            attribute.ints.extend(pads)
            return
    if top or bottom:
        copy.attribute.append(helper.make_attribute("pads", [top, 0, bottom, 0]))


class LocalPlan:
    """A plan run fork-join in this process: each shard an onnxruntime session of its own, made
    once, on one intra-op thread. :meth:`run` runs a stage's first shard on the calling thread
    where the leader takes one, and the others at once on a pool of threads (the workers;
    onnxruntime runs without the GIL), then joins their outputs in order."""

    def __init__(self, model: str | Path | onnx.ModelProto, plan: Plan) -> None:
        proto = model if isinstance(model, onnx.ModelProto) else onnx.load(str(model))
        self.plan = plan
        sharder = Sharder(proto)
        self._stages = [
            [
                (shard_session(m.SerializeToString()), rows)
                for m, rows in sharder.shard_models(plan, stage)
            ]
            for stage in plan.stages
        ]
        self._axes = [join_axis(plan, stage) for stage in plan.stages]
        width = max((s.parts - s.leader for s in plan.stages), default=0)
        self._pool = ThreadPoolExecutor(max(1, width), "shard")

    def run(self, x: np.ndarray) -> np.ndarray:
        for stage, shards, axis in zip(self.plan.stages, self._stages, self._axes, strict=True):
            local = shards[:1] if stage.leader else []
            forked = [self._pool.submit(_run, s, x, rows) for s, rows in shards[len(local) :]]
            outputs = [_run(s, x, rows) for s, rows in local] + [f.result() for f in forked]
            x = outputs[0] if len(outputs) == 1 else np.concatenate(outputs, axis=axis)
        return x

    def close(self) -> None:
        self._pool.shutdown()

    def __enter__(self) -> LocalPlan:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def shard_session(model: bytes) -> Any:
    """An onnxruntime session of a shard's serialized model, on one thread."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def _run(session: Any, x: np.ndarray, rows: tuple[int, int] | None) -> np.ndarray:
    return session.run(None, {session.get_inputs()[0].name: rows_of(x, rows)})[0]


def rows_of(x: np.ndarray, rows: tuple[int, int] | None) -> np.ndarray:
    """The rows of ``x`` a shard reads (all of them for None), contiguous."""
    return x if rows is None else np.ascontiguousarray(x[:, :, rows[0] : rows[1]])


def join_axis(plan: Plan, stage: Stage) -> int:
    """The axis a stage's outputs are joined along: rows, or channels (the last axis of a
    matrix product's output)."""
    if stage.option == "spatial":
        return AXIS_H
    layer = plan.layers[stage.first]
    return 1 if "Conv" in layer.ops else -1
