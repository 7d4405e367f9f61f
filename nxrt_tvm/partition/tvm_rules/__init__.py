"""TVM claim policy, in one place: what the TVM EP claims, and why it declines the rest.

A node is claimed when it passes `generic.check_generic` (option, domain, control flow,
converter, opset, dtypes) and the rule registered for its (domain, op type, opset) in
`TVM_OP_RULES` (`shape`: shape, indexing, reduction and resampling ops; `nn`: arithmetic,
normalisation, pooling, conv, quantisation; shared checks in `kit`). A candidate partition
then passes `group.check_group`. Every rule was found by `tools/probe_frontend.py` (onnx's
backend node cases, plus variants with constant operands and a symbolic batch dim) on TVM 0.27:
the comment above a rule says what happens without it. The support profile
(`tools/support_profile.py`) is this policy applied to the backend suite.
"""

from __future__ import annotations

from collections.abc import Collection

from onnx import defs

from ...frontend import convert_map, min_opset
from ..node_context import NodeContext
from . import nn, shape  # noqa: F401  (importing them registers their rules)
from .generic import SUPPORTED_ELEM_TYPES, check_generic
from .group import check_group
from .kit import IMPORT_TIME_INPUTS, TVM_OP_RULES, register_shape_input_check

__all__ = [
    "TVM_OP_RULES",
    "IMPORT_TIME_INPUTS",
    "SUPPORTED_ELEM_TYPES",
    "check_node",
    "check_group",
    "support_table",
    "FUNCTION_OPS",
]

_CONVERTERS = convert_map()
register_shape_input_check(_CONVERTERS)  # every other op the frontend converts gets the Shape-input check


#: Ops ONNX defines by a function body and the frontend has no converter for (Celu, Swish, SwiGLU, the
#: windows): claimed through their bodies, inlined before claims (`nxrt_tvm.graph.functions`).
FUNCTION_OPS = frozenset(
    s.name
    for s in defs.get_all_schemas()
    if s.domain == "" and s.function_opset_versions and s.name not in _CONVERTERS
)


def check_node(ctx: NodeContext, excluded: Collection[str] = ()) -> None:
    """Raise `DeclineSignal` unless TVM can import, build and run this node (`excluded`: op types
    the user keeps off TVM)."""
    check_generic(ctx, excluded)
    rule = TVM_OP_RULES.lookup(ctx.domain, ctx.op_type, ctx.opset)
    if rule is not None:
        rule(ctx)


def support_table() -> list[dict]:
    """The policy as a table, one row per registered (domain, op, since-opset): what `nxrt-tvm rules`
    prints. Every op here also passes the generic checks first (`generic`); all other ops are declined."""
    rows = []
    for key in TVM_OP_RULES.keys():
        rule = TVM_OP_RULES.lookup(key.domain, key.op_type, key.since_version)
        rows.append(
            {
                "domain": key.domain or "ai.onnx",
                "op_type": key.op_type,
                "since_opset": max(key.since_version, min_opset(key.op_type)),
                "import_time_inputs": list(IMPORT_TIME_INPUTS.get(key.op_type, ())),
                "guards": rule.guards if rule is not None else "",
            }
        )
    return rows
