"""Small computations on constants evaluated before claims, as onnxruntime's constant folding does.

Exporters build some attributes-turned-inputs from constants at run time: torch's
``F.pad`` in opset 11+ computes Pad's ``pads`` by ConstantOfShape, Concat, Reshape,
Slice, Transpose and Cast of Constant nodes (Silero VAD's STFT). onnxruntime
folds such chains when it loads the model; unfolded, they reached the TVM EP as
values "computed at run time", its Pad was declined, and the model split in two
around a 6-node partition of its own.

A node is evaluated (onnx's reference implementation, all such nodes of a model
in one run) when every input is a small initializer or such a node's result and
the op is one of the size-bounded shape and arithmetic ops below, deterministic
and without subgraphs; what it makes replaces it as initializers unless it is
larger than `MAX_ELEMENTS` (weights are left to the compiler, which folds them
itself). Graph outputs stay computed. Nodes the reference implementation cannot
evaluate are left as they are: onnxruntime says what is wrong with them, if
anything.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..api.registry import normalize_domain

__all__ = ["fold_constant_nodes", "add_initializer", "MAX_ELEMENTS"]

log = logging.getLogger(__name__)

#: largest input or result evaluated: shapes, pads, axes, scales; not weights
MAX_ELEMENTS = 1024

#: ops whose result is no larger than their inputs, or (ConstantOfShape) whose size is known first
_OPS = frozenset(
    {
        "Abs", "Add", "And", "Cast", "Ceil", "Concat", "ConstantOfShape", "Div", "Equal", "Floor",
        "Gather", "Greater", "GreaterOrEqual", "Identity", "Less", "LessOrEqual", "Max", "Min", "Mod",
        "Mul", "Neg", "Not", "Or", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSum", "Reshape",
        "Shape", "Size", "Slice", "Sqrt", "Squeeze", "Sub", "Transpose", "Unsqueeze", "Where", "Xor",
    }
)  # fmt: skip


def fold_constant_nodes(model: onnx.ModelProto) -> bool:
    """Replace each evaluable node of constants by initializers (chains too: one evaluation of them
    all); True where any was. `model`'s nodes must be in topological order."""
    graph = model.graph
    small = {t.name: t for t in graph.initializer if _elements(t.dims) <= MAX_ELEMENTS and not _external(t)}
    outputs = {o.name for o in graph.output}
    region: list[onnx.NodeProto] = []
    made: set[str] = set()
    for node in graph.node:
        if _evaluable(node, small, made, outputs):
            region.append(node)
            made.update(node.output)
    if not region:
        return False
    values = _evaluate(model, region, small)
    if values is None:
        return False
    folded = {id(node) for node in region if all(_fits(values.get(o)) for o in node.output)}
    if not folded:
        return False
    for node in region:
        if id(node) in folded:
            for name in node.output:
                add_initializer(model, numpy_helper.from_array(values[name], name))
    kept = [node for node in graph.node if id(node) not in folded]
    log.debug("evaluated %d nodes of constants", len(folded))
    del graph.node[:]
    graph.node.extend(kept)
    return True


def add_initializer(model: onnx.ModelProto, tensor: onnx.TensorProto) -> None:
    """Add `tensor` as an initializer, declared as a graph input too where the IR version (before 4)
    types an initializer only by the input it fills (onnx's shape inference saw none of them)."""
    model.graph.initializer.append(tensor)
    if model.ir_version < 4:
        model.graph.input.append(helper.make_tensor_value_info(tensor.name, tensor.data_type, tensor.dims))


def _evaluable(
    node: onnx.NodeProto, small: dict[str, onnx.TensorProto], made: set[str], outputs: set[str]
) -> bool:
    """Whether `node` is one of `_OPS` over small initializers or values evaluated before it."""
    if normalize_domain(node.domain) or node.op_type not in _OPS or not node.input:
        return False
    if any(name and name not in small and name not in made for name in node.input):
        return False
    if any(o in outputs for o in node.output):
        return False
    if node.op_type == "ConstantOfShape":  # its size is its input's value: known only from an initializer
        shape = small.get(node.input[0])
        return shape is not None and _elements(numpy_helper.to_array(shape)) <= MAX_ELEMENTS
    return True


def _evaluate(
    model: onnx.ModelProto, region: list[onnx.NodeProto], small: dict[str, onnx.TensorProto]
) -> dict[str, np.ndarray] | None:
    """Every value `region` makes (onnx's reference implementation, one run), or None where it fails."""
    made = [o for node in region for o in node.output if o]
    used = {name for node in region for name in node.input if name in small}
    graph = helper.make_graph(
        region,
        "constants",
        [],
        [helper.make_tensor_value_info(o, 0, None) for o in made],
        [small[name] for name in sorted(used)],
    )
    try:
        from onnx.reference import ReferenceEvaluator

        results = ReferenceEvaluator(helper.make_model(graph, opset_imports=model.opset_import)).run(None, {})
    except Exception as exc:  # noqa: BLE001 - onnxruntime reports a bad node when it runs it
        log.debug("nodes of constants not evaluated: %s", exc)
        return None
    return {name: np.asarray(r) for name, r in zip(made, results) if isinstance(r, (np.ndarray, np.generic))}


def _fits(value: np.ndarray | None) -> bool:
    return value is not None and value.size <= MAX_ELEMENTS and value.dtype != object


def _elements(dims) -> int:
    return math.prod(int(d) for d in dims)


def _external(tensor: onnx.TensorProto) -> bool:
    return tensor.data_location == onnx.TensorProto.EXTERNAL
