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
from .order import implicit_inputs

__all__ = [
    "fold_constant_nodes",
    "take_constant_branches",
    "branch_inputs",
    "add_initializer",
    "MAX_ELEMENTS",
]

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


def take_constant_branches(model: onnx.ModelProto) -> bool:
    """Replace each ``If`` whose condition is an initializer by the nodes of the branch it takes; True
    where any was. torch's scripted code branches on shapes (``if x.dim() == 3``, ``if state.size(0)``:
    Silero VAD's LSTM): once the shapes fold, the condition is a constant, and the TVM EP claims the
    branch's dataflow with its neighbours instead of splitting the model around control flow."""
    graph = model.graph
    conditions = {t.name: t for t in graph.initializer if _elements(t.dims) == 1}
    taken = _names(graph)
    nodes: list[onnx.NodeProto] = []
    changed = False
    for node in graph.node:
        branch = _taken_branch(node, conditions)
        inlined = None if branch is None else _inline(model, node, branch, taken)
        if inlined is None:
            nodes.append(node)
        else:
            nodes += inlined
            changed = True
    if changed:
        del graph.node[:]
        graph.node.extend(nodes)
    return changed


#: element types of an input whose value can decide a branch (a sample rate, a mode flag)
_DECIDING_TYPES = frozenset(
    {
        onnx.TensorProto.BOOL, onnx.TensorProto.INT8, onnx.TensorProto.INT16, onnx.TensorProto.INT32,
        onnx.TensorProto.INT64, onnx.TensorProto.UINT8, onnx.TensorProto.UINT16, onnx.TensorProto.UINT32,
        onnx.TensorProto.UINT64,
    }
)  # fmt: skip


def branch_inputs(model: onnx.ModelProto) -> tuple[str, ...]:
    """The graph inputs whose value alone decides an ``If`` of the main graph: integer or bool tensors of
    one element (a fixed shape) from which the condition follows through `_OPS` and constants, so that
    with the input fixed to a value `fold_constant_nodes` and `take_constant_branches` remove the ``If``.
    Silero VAD branches on its ``sr`` input (16000 or 8000) around its whole network: a build for the
    value a session is called with runs it as one TVM partition (`runtime.specialise`)."""
    graph = model.graph
    conditions = {n.input[0] for n in graph.node if n.op_type == "If" and not normalize_domain(n.domain)}
    if not conditions:
        return ()
    known = {t.name for t in graph.initializer}
    known.update(
        o for n in graph.node if n.op_type == "Constant" and not normalize_domain(n.domain) for o in n.output
    )
    found = []
    for value in graph.input:
        if value.name in known or not _one_element_of(value, _DECIDING_TYPES):
            continue
        reached = {value.name}
        grew = True
        while grew:  # nodes in any order: until no node adds a value
            grew = False
            for node in graph.node:
                if (
                    normalize_domain(node.domain)
                    or node.op_type not in _OPS
                    or reached.issuperset(node.output)
                ):
                    continue
                inputs = [i for i in node.input if i]
                if any(i in reached for i in inputs) and all(i in reached or i in known for i in inputs):
                    reached.update(node.output)
                    grew = True
        if reached & conditions:
            found.append(value.name)
    return tuple(found)


def _one_element_of(value: onnx.ValueInfoProto, types: frozenset[int]) -> bool:
    tensor = value.type.tensor_type
    if (
        not value.type.HasField("tensor_type")
        or tensor.elem_type not in types
        or not tensor.HasField("shape")
    ):
        return False
    return all(d.HasField("dim_value") and d.dim_value == 1 for d in tensor.shape.dim)


def _taken_branch(node: onnx.NodeProto, conditions: dict[str, onnx.TensorProto]) -> onnx.GraphProto | None:
    if node.op_type != "If" or normalize_domain(node.domain) or node.input[0] not in conditions:
        return None
    cond = numpy_helper.to_array(conditions[node.input[0]])
    name = "then_branch" if bool(cond.reshape(-1)[0]) else "else_branch"
    return next((a.g for a in node.attribute if a.name == name), None)


def _names(graph: onnx.GraphProto) -> set[str]:
    names = {v.name for v in (*graph.input, *graph.output, *graph.initializer)}
    names.update(o for node in graph.node for o in node.output)
    return names


def _inline(
    model: onnx.ModelProto, node: onnx.NodeProto, branch: onnx.GraphProto, taken: set[str]
) -> list[onnx.NodeProto] | None:
    """`branch`'s nodes in place of `node`: its values renamed where the outer graph has the name, its
    initializers moved out, its outputs copied to `node`'s; None where a renamed value is read from a
    nested subgraph (renaming inside those is not done) or the branch holds sparse initializers."""
    if branch.sparse_initializer or len(branch.output) != len(node.output):
        return None
    own = [t.name for t in branch.initializer] + [o for n in branch.node for o in n.output if o]
    renamed: dict[str, str] = {}
    for name in own:
        fresh, k = name, 0
        while fresh in taken or fresh in renamed.values():
            k += 1
            fresh = f"{node.name}/{name}_{k}"
        if fresh != name:
            renamed[name] = fresh
    if any(implicit_inputs(n) & renamed.keys() for n in branch.node):
        return None
    for tensor in branch.initializer:
        moved = onnx.TensorProto()
        moved.CopyFrom(tensor)
        moved.name = renamed.get(tensor.name, tensor.name)
        add_initializer(model, moved)
    nodes = []
    for inner in branch.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(inner)
        copy.name = f"{node.name}/{inner.name}" if inner.name else ""
        copy.input[:] = [renamed.get(i, i) for i in inner.input]
        copy.output[:] = [renamed.get(o, o) for o in inner.output]
        nodes.append(copy)
    for out, result in zip(branch.output, node.output):
        source = renamed.get(out.name, out.name)
        nodes.append(helper.make_node("Identity", [source], [result], name=f"{node.name}/{result}"))
    taken.update(renamed.values(), own)
    return nodes


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
