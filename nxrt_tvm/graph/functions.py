"""Ops that ONNX defines as functions, inlined into their bodies before claims.

ONNX gives some ops (Celu, Swish, SwiGLU, the window functions) a body of
simpler ops. An EP that compiles the body but has no kernel for the op itself
asks for it (`ExecutionProvider.function_ops`); the op is then replaced by its
body, so the EP claims it with its neighbours and fuses across it instead of
splitting the graph around it. onnxruntime inlines a function op the same way
when no EP takes it whole.

The newest body onnx has is used when each of its ops exists at the model's
opset (onnx 1.23 keeps Celu's body only under opset 28, in ops that opset 15
already has); otherwise the node stays as it is, and the EPs decline or take it
whole as before.
"""

from __future__ import annotations

from collections.abc import Collection

import onnx
from onnx import defs

from ..api.registry import default_opset, normalize_domain

__all__ = ["inline_function_ops"]

#: an op inlines into an op it inlines into ... at most this deep (onnx's bodies nest once or not at all)
_MAX_DEPTH = 4


def _body(op_type: str, opset: int) -> onnx.FunctionProto | None:
    """The body of default-domain `op_type` to run at `opset`: every op it uses exists there."""
    if not defs.has(op_type, opset):
        return None
    latest = defs.get_schema(op_type)
    versions = sorted(latest.function_opset_versions)
    if not versions:
        return None
    version = max((v for v in versions if v <= opset), default=versions[-1])
    body = onnx.FunctionProto.FromString(latest.get_function_with_opset_version(version))
    if not body.node or any(
        normalize_domain(n.domain) != "" or not defs.has(n.op_type, opset) for n in body.node
    ):
        return None
    return body


def _attribute(
    proto: onnx.AttributeProto, given: dict[str, onnx.AttributeProto], schema: defs.OpSchema
) -> onnx.AttributeProto | None:
    """A body node's attribute with a reference (``@alpha``) resolved from the
    node or the op's default; None when neither has it."""
    if not proto.ref_attr_name:
        return proto
    source = given.get(proto.ref_attr_name)
    if source is None:
        declared = schema.attributes.get(proto.ref_attr_name)
        if declared is None or declared.default_value.type == onnx.AttributeProto.UNDEFINED:
            return None
        source = declared.default_value
    resolved = onnx.AttributeProto()
    resolved.CopyFrom(source)
    resolved.name = proto.name
    return resolved


def _expand(node: onnx.NodeProto, body: onnx.FunctionProto, taken: set[str]) -> list[onnx.NodeProto]:
    """`node` as copies of its body's nodes, wired to its inputs and outputs; inner values and
    nodes are named ``<node name>/<body name>`` (made unique against `taken`)."""

    def fresh(name: str) -> str:
        candidate, k = f"{node.name}/{name}", 1
        while candidate in taken:
            candidate, k = f"{node.name}/{name}_{k}", k + 1
        taken.add(candidate)
        return candidate

    names = {formal: actual for formal, actual in zip(body.input, node.input)}
    names.update({formal: "" for formal in body.input[len(node.input) :]})  # optional inputs left out
    names.update({formal: actual for formal, actual in zip(body.output, node.output)})
    given = {a.name: a for a in node.attribute}
    schema = defs.get_schema(node.op_type)
    nodes = []
    for k, inner in enumerate(body.node):
        copy = onnx.NodeProto()
        copy.op_type, copy.domain = inner.op_type, inner.domain
        copy.name = fresh(inner.name or f"{inner.op_type}_{k}")
        copy.input.extend(names.get(i, i) if i else "" for i in inner.input)
        for out in inner.output:
            if out and out not in names:
                names[out] = fresh(out)
            copy.output.append(names.get(out, out) if out else "")
        for attr in inner.attribute:
            resolved = _attribute(attr, given, schema)
            if resolved is not None:
                copy.attribute.append(resolved)
        nodes.append(copy)
    return nodes


def inline_function_ops(model: onnx.ModelProto, ops: Collection[str]) -> int:
    """Replace the main graph's default-domain nodes whose op is in `ops` by their ONNX function bodies
    (in place; nested function ops too). Returns the number of nodes inlined."""
    if not any(normalize_domain(n.domain) == "" and n.op_type in ops for n in model.graph.node):
        return 0  # most models: no name sets built at every load
    opset = default_opset(model)
    if opset is None:
        return 0
    graph = model.graph
    taken = {n.name for n in graph.node} | {v for n in graph.node for v in [*n.input, *n.output]}
    taken |= {v.name for v in [*graph.input, *graph.output, *graph.initializer, *graph.value_info]}
    bodies: dict[str, onnx.FunctionProto | None] = {}
    inlined = 0
    for _ in range(_MAX_DEPTH):
        nodes, changed = [], False
        for node in graph.node:
            if normalize_domain(node.domain) == "" and node.op_type in ops:
                if node.op_type not in bodies:
                    bodies[node.op_type] = _body(node.op_type, opset)
                body = bodies[node.op_type]
                if body is not None:
                    nodes.extend(_expand(node, body, taken))
                    inlined += 1
                    changed = True
                    continue
            nodes.append(node)
        if not changed:
            break
        del graph.node[:]
        graph.node.extend(nodes)
    return inlined
