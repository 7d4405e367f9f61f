"""Cut a node set out of a graph as a standalone ONNX model an EP can compile or run."""

from __future__ import annotations

from collections.abc import Sequence

import onnx
from onnx import defs, helper

from .model import GraphView, ValueInfo

__all__ = ["extract_model"]


def extract_model(
    graph: GraphView,
    nodes: Sequence[int],
    inputs: Sequence[str],
    outputs: Sequence[str],
    name: str,
    *,
    input_infos: dict[str, ValueInfo] | None = None,
    exclude_initializers: Sequence[str] = (),
    internal_shapes: bool = True,
) -> onnx.ModelProto:
    """A model with `nodes` (in graph order), `inputs`/`outputs`
    as its interface and the initializers it reads.

    `input_infos` overrides the declared type of boundary inputs (used to give
    unknown dims a name so compilers treat them as symbolic); initializers in
    `exclude_initializers` are left out (the caller feeds them as inputs). Without `internal_shapes`
    the values inside carry no value_info: onnxruntime infers its own, and ours (symbolic shapes
    from `graph.inference`) made its optimizer pick slower kernels (a transformers BERT 0.45 -> 0.55 ms).
    """
    members = sorted(nodes)
    used: dict[str, None] = {}
    for i in members:
        for n in graph.node_inputs[i]:
            used[n] = None
    skip = set(exclude_initializers)
    initializers = [graph.initializers[n] for n in used if n in graph.initializers and n not in skip]
    infos = input_infos or {}
    produced = {o for i in members for o in graph.nodes[i].output if o}
    value_info = [
        graph.value_info[o].to_proto()
        for o in sorted(produced - set(outputs))
        if internal_shapes and o in graph.value_info and graph.value_info[o].elem_type is not None
    ]

    def boundary_proto(value: str) -> onnx.ValueInfoProto:
        if value in graph.other_types:  # a sequence or optional keeps its declared type
            return graph.other_types[value]
        return (infos.get(value) or graph.info(value)).to_proto()

    needed = {*outputs, *used}
    body = helper.make_graph(
        [_trimmed(graph, i, needed) for i in members],
        name,
        [boundary_proto(n) for n in inputs],
        [boundary_proto(n) for n in outputs],
        initializer=initializers,
        value_info=value_info,
    )
    model = helper.make_model(
        body,
        opset_imports=list(graph.model.opset_import),
        ir_version=graph.model.ir_version,
        producer_name="nxrt-tvm",
    )
    model.functions.extend(graph.model.functions)
    return model


def _trimmed(graph: GraphView, index: int, needed: set[str]) -> onnx.NodeProto:
    """Node `index` without the trailing optional outputs that nothing `needed` reads (Dropout's mask,
    MaxPool's indices, a norm's statistics), as onnxruntime's graph cleanup drops them: TVM's converters
    produce only the outputs they compute, and failed to import a node that names more."""
    node = graph.nodes[index]
    try:
        schema = defs.get_schema(node.op_type, graph.opset_of(index), node.domain)
    except defs.SchemaError:
        return node
    optional = defs.OpSchema.FormalParameterOption.Optional
    keep = len(node.output)
    while (
        keep > 1
        and node.output[keep - 1] not in needed
        and keep - 1 < len(schema.outputs)
        and schema.outputs[keep - 1].option == optional
    ):
        keep -= 1
    if keep == len(node.output):
        return node
    trimmed = onnx.NodeProto()
    trimmed.CopyFrom(node)
    del trimmed.output[keep:]
    return trimmed
