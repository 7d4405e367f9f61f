"""Write a model whose compiled partitions are EPContext nodes.

Fallback partitions stay ONNX nodes. Each compiled partition also keeps its
original subgraph as a model-local function (domain `SOURCE_DOMAIN`, named
after the partition), so a host that cannot load the blob can still run it.
Every file is written atomically (temp file + rename).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import onnx
from onnx import helper

from ..fileio import atomic_write
from ..graph.model import GraphView
from ..partition.plan import PartitionPlan
from .codec import EP_CONTEXT_DOMAIN, encode_node, is_ep_context
from .compat import COMPATIBILITY_KEY, compatibility_info
from .record import EpContext
from .signing import signature_path

__all__ = ["SOURCE_DOMAIN", "PLANNED_KEY", "write_context_model", "external_blob_name"]

#: Domain of the model-local functions that keep each compiled partition's source subgraph.
SOURCE_DOMAIN = "ai.nxrt_tvm.source"
#: Metadata entry of every model written here: its plan was made when it was compiled, so its plain nodes
#: are the fallback's (where a claim policy measured them faster there, or no EP would take them); a
#: deployment must not compile them again (`epcontext.loader`).
PLANNED_KEY = "nxrt_tvm.planned"


def external_blob_name(model_path: Path, partition: str, fat: bool = False) -> str:
    """A shared library's file, or a fat node's bundle of libraries (not itself loadable)."""
    return f"{model_path.stem}.{partition}.tvm.{'fat' if fat else 'so'}"


def _source_function(
    graph: GraphView, nodes: tuple[int, ...], name: str, inputs: list[str], outputs: list[str]
) -> onnx.FunctionProto:
    return helper.make_function(
        SOURCE_DOMAIN,
        name,
        inputs,
        outputs,
        [graph.nodes[i] for i in nodes],
        opset_imports=list(graph.model.opset_import),
    )


def write_context_model(
    graph: GraphView,
    plan: PartitionPlan,
    contexts: Mapping[str, EpContext],
    path: str | os.PathLike,
    *,
    embed_mode: int = 1,
    keep_source: bool = True,
) -> list[Path]:
    """Write the EPContext model (and, with embed_mode 0, its blob files); returns the files written."""
    out = Path(path)
    written: list[Path] = []
    nodes: list[onnx.NodeProto] = []
    functions: list[onnx.FunctionProto] = []
    used: set[str] = set()
    for partition in plan.partitions:
        ctx = contexts.get(partition.name)
        if ctx is None:  # a fallback partition stays plain ONNX
            for i in partition.nodes:
                nodes.append(graph.nodes[i])
                used.update(graph.node_inputs[i])
            continue
        if embed_mode == 0:
            rel = external_blob_name(out, partition.name, fat=bool(ctx.variants))
            atomic_write(out.parent / rel, ctx.blob)
            written.append(out.parent / rel)
            ctx = replace(ctx, embed_mode=0, external_path=rel)
        nodes.append(encode_node(ctx, partition.name))
        used.update(ctx.weights)
        if keep_source:
            consts = [n for i in partition.nodes for n in graph.node_inputs[i] if n in graph.initializers]
            fn_inputs = list(dict.fromkeys([*partition.inputs, *consts]))
            functions.append(
                _source_function(graph, partition.nodes, partition.name, fn_inputs, list(partition.outputs))
            )
            used.update(consts)
    model = graph.model
    body = helper.make_graph(
        nodes,
        model.graph.name,
        list(model.graph.input),
        list(model.graph.output),
        initializer=[t for name, t in graph.initializers.items() if name in used],
        value_info=[
            v.to_proto()
            for name, v in sorted(graph.value_info.items())
            if v.elem_type is not None
            and name not in graph.initializers
            and name not in {i.name for i in model.graph.input} | graph.output_names
        ],
    )
    opsets = {o.domain: o.version for o in model.opset_import}
    opsets.setdefault(EP_CONTEXT_DOMAIN, 1)
    if functions:
        opsets.setdefault(SOURCE_DOMAIN, 1)
    result = helper.make_model(
        body,
        opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()],
        ir_version=max(model.ir_version, 8),  # model-local functions need IR 8
        producer_name="nxrt-tvm",
        functions=[*model.functions, *functions],
    )
    plain = sum(1 for n in body.node if not is_ep_context(n))
    props = {e.key: e.value for e in model.metadata_props if e.key != COMPATIBILITY_KEY}
    props[PLANNED_KEY] = f"{plain} nodes on the fallback EP"  # replaces any mark the source carries
    if contexts:  # what onnxruntime's get_model_compatibility_for_ep_devices hands the plugin
        props[COMPATIBILITY_KEY] = compatibility_info(next(iter(contexts.values())))
    helper.set_model_props(result, props)
    onnx.checker.check_model(result)
    signature_path(out).unlink(missing_ok=True)  # an older model's signature would refuse this one
    atomic_write(out, result.SerializeToString())
    written.append(out)
    return written
