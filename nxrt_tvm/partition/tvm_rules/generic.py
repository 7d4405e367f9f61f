"""The checks every node passes before its op's rule:
option, domain, control flow, converter, opset, dtypes."""

from __future__ import annotations

from collections.abc import Collection

import onnx

from ...api.claim import Rejected, deny, require
from ...frontend import convert_map, min_opset
from ..node_context import NodeContext

__all__ = ["SUPPORTED_ELEM_TYPES", "check_generic"]

T = onnx.TensorProto
#: Element types TVM imports, computes and returns through DLPack.
SUPPORTED_ELEM_TYPES = frozenset(
    {
        T.FLOAT,
        T.FLOAT16,
        T.BFLOAT16,
        T.DOUBLE,
        T.INT8,
        T.INT16,
        T.INT32,
        T.INT64,
        T.UINT8,
        T.UINT16,
        T.UINT32,
        T.UINT64,
        T.BOOL,
    }
)
_SUPPORTED_NAMES = ", ".join(sorted(T.DataType.Name(t).lower() for t in SUPPORTED_ELEM_TYPES))
_CONVERTERS = convert_map()


def check_generic(ctx: NodeContext, excluded: Collection[str] = ()) -> None:
    """Raise `DeclineSignal` unless the frontend has a converter for this node at its opset and dtypes."""
    op = ctx.op_type
    require(
        op not in excluded,
        Rejected.OPTION,
        f"{op} is listed in op_types_to_exclude",
        accepts="ops not excluded by the provider options",
        remediation="remove it from op_types_to_exclude to let TVM compile it",
    )
    require(
        ctx.domain == "",
        Rejected.DOMAIN,
        f"domain {ctx.domain!r}",
        accepts="ops of the default ONNX domain (ai.onnx)",
        remediation="runs on the fallback EP; TVM's frontend has no converter for this domain",
    )
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in ctx.node.attribute):
        deny(
            Rejected.OP,
            f"{op} carries subgraphs (control flow)",
            accepts="dataflow ops without subgraph attributes",
            remediation=(
                "runs on the fallback EP; an If whose condition follows from shapes is taken where they are "
                "known (fix symbolic dims: --dim), one decided by an integer input's value in the build for "
                "that value once calls repeat it"
            ),
        )
    require(
        op in _CONVERTERS,
        Rejected.OP,
        f"the Relax ONNX frontend has no converter for {op}",
        accepts=f"the {len(_CONVERTERS)} ops of tvm.relax.frontend.onnx (see `nxrt-tvm plan --json`)",
        remediation="runs on the fallback EP; rewrite it into supported ops to let TVM fuse across it",
    )
    lowest = min_opset(op)
    require(
        ctx.opset >= lowest,
        Rejected.OPSET,
        f"opset {ctx.opset} predates the converter's lowest version {lowest}",
        accepts=f"{op} at opset >= {lowest}",
        remediation=f"upgrade the model (onnx.version_converter.convert_version(model, {max(lowest, 13)}))",
    )
    for kind, values in (("input", ctx.inputs), ("output", ctx.outputs)):
        for info in values:
            if info is None or info.elem_type is None:
                continue  # unknown types matter only at a partition boundary (see `group`)
            require(
                info.elem_type in SUPPORTED_ELEM_TYPES,
                Rejected.DTYPE,
                f"{kind} {info.name!r} has element type {info.type_name}",
                accepts=_SUPPORTED_NAMES,
                remediation=(
                    "runs on the fallback EP; cast to a supported type in the model to let TVM take it"
                ),
            )
