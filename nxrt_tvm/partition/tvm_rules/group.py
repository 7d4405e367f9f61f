"""Checks of a whole candidate partition: what its boundary must carry for TVM to compile it."""

from __future__ import annotations

from ...api.claim import DeclineSignal, Rejected
from ...graph.model import GraphView
from .kit import IMPORT_TIME_INPUTS

__all__ = ["check_group"]


def check_group(graph: GraphView, group: tuple[int, ...]) -> dict[int, DeclineSignal]:
    """Nodes to decline so that `group` can compile: consumers of untyped boundary values, and
    nodes whose compile-time inputs (a Reshape's shape, ...) would come from another partition."""
    inputs, _ = graph.boundary(group)
    problems: dict[int, DeclineSignal] = {}
    members = set(group)
    for name in inputs:
        info = graph.info(name)
        if info.elem_type is not None and info.shape is not None:
            continue
        what = "element type" if info.elem_type is None else "rank"
        for i in graph.consumers.get(name, ()):
            if i in members:
                problems[i] = DeclineSignal(
                    Rejected.SHAPE,
                    f"input {name!r} comes from outside the partition with unknown {what}",
                    "partition inputs whose type and rank ONNX shape inference determines",
                    "declare the model's input shapes, or run onnx.shape_inference / onnxsim on the model",
                )
    for i in group:
        node = graph.nodes[i]
        for k in IMPORT_TIME_INPUTS.get(node.op_type, ()):
            if k < len(node.input) and node.input[k] in inputs:
                problems[i] = DeclineSignal(
                    Rejected.INPUT,
                    f"input {k} ({node.input[k]!r}) comes from another partition at run time, "
                    "but TVM must know it when compiling",
                    "a constant, or a value computed from tensor shapes in the same partition",
                    "runs on the fallback EP; fold it to a constant (onnxsim) or fix symbolic dims "
                    "(SessionOptions.add_free_dimension_override_by_name)",
                )
    return problems
