"""The rule kit: the registry of per-op rules, the `rule` decorator and the checks rules share.

One registry keyed by (domain, op type, since-opset), like the frontend's
versioned converters; each entry is a function that calls `require`/`deny`
for every ordinary reason the op would fail to import, legalise, build or
give a wrong answer. The rules themselves live in `shape` and `nn`; the
generic checks every node passes first (domain, converter, opset, dtypes,
control flow) in `generic`, and the whole-partition ones in `group`.

The frontend turns a `Shape` output into a Relax shape value, which only a
few converters accept; `rule()` runs that check (`require_no_shape_inputs`)
before every registered rule, and `register_shape_input_check` registers it
alone for the ops that have no rule of their own.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from ...api.claim import Rejected, require
from ...api.registry import OpKey, OpRegistry
from ..node_context import NodeContext

__all__ = ["TVM_OP_RULES", "OpRule", "Rule", "rule", "IMPORT_TIME_INPUTS"]

OpRule = Callable[[NodeContext], None]


@dataclass(frozen=True)
class Rule:
    """One row of the claim-policy table: an op's checks, and what goes wrong without them."""

    key: OpKey
    check: OpRule
    #: the rule as written (its comment says what TVM 0.27 does without it); None for the shared checks
    source: OpRule | None = None
    shared: str = ""  #: which shared checks a rule-less op gets

    def __call__(self, ctx: NodeContext) -> None:
        self.check(ctx)

    @property
    def guards(self) -> str:
        """What the rule guards against: read from its source only when the table is printed."""
        if self.source is None:
            return self.shared
        comment = " ".join(
            line.lstrip("# ") for line in (inspect.getcomments(self.source) or "").splitlines()
        )
        return " ".join((comment or self.source.__doc__ or "op-specific checks").split())


TVM_OP_RULES: OpRegistry[Rule] = OpRegistry()

FALLBACK = "runs on the fallback EP"

# Converters that accept a shape value (the frontend's `shape_compatible_ops`);
# any other op fed by a Shape output fails to import ("cannot handle ShapeExpr inputs").
SHAPE_VALUE_OPS = frozenset(
    {
        "Reshape",
        "Resize",
        "ConstantOfShape",
        "Gather",
        "Slice",
        "Shape",
        "Expand",
        "Concat",
        "Equal",
        "Where",
        "Cast",
        "CastLike",
        "Squeeze",
    }
)


#: Inputs the frontend must know at import time: a constant, or a value computed from tensor
#: shapes *inside the same partition*. Fed from another partition at run time, Reshape fails
#: to import and Expand/ConstantOfShape/Range/Tile build with wrong or unknown output shapes.
#: Per-node rules accept shape-derived values; the partition check (`providers/tvm.py`) enforces
#: that they do not cross a partition boundary.
IMPORT_TIME_INPUTS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,),
    "Expand": (1,),
    "ConstantOfShape": (0,),
    "Range": (0, 1, 2),
    "Tile": (1,),
}


def rule(op_type: str, since: int = 1, domain: str = "") -> Callable[[OpRule], OpRule]:
    def register(fn: OpRule) -> OpRule:
        def checked(ctx: NodeContext) -> None:
            if op_type not in SHAPE_VALUE_OPS:
                require_no_shape_inputs(ctx)
            require_exact_values(ctx)
            fn(ctx)

        key = OpKey(domain, op_type, since)
        TVM_OP_RULES.register(key, Rule(key, checked, source=fn))
        return fn

    return register


# -- helpers shared by the rule modules ------------------------------------------------


def is_shape_value(ctx: NodeContext, name: str, depth: int = 0) -> bool:
    """Whether the frontend holds `name` as a Relax shape value rather than a tensor.

    `Shape` makes one; `Concat`/`Where` of shape values and constant 1-D int64
    tensors keep one (a `Slice` or `Gather` of one is a tensor or scalar again).
    """
    graph = ctx.graph
    if depth > 16 or name not in graph.producer:
        return False
    node = graph.nodes[graph.producer[name]]
    if node.domain not in ("", "ai.onnx"):
        return False
    if node.op_type == "Shape":
        return True
    if node.op_type in ("Concat", "Where"):
        flags = []
        for inp in node.input:
            if not inp:
                continue
            if is_shape_value(ctx, inp, depth + 1):
                flags.append(True)
                continue
            value = graph.constant(inp)
            if value is None or (
                node.op_type == "Concat" and not (value.ndim == 1 and value.dtype == np.int64)
            ):
                return False
            flags.append(False)
        return any(flags)
    return False


def is_shape_derived(ctx: NodeContext, i: int, depth: int = 0) -> bool:
    """Whether input `i` is a constant or computed from tensor shapes only (Shape, Gather, Concat, ...).

    The frontend folds such values into shape expressions; a shape read from
    tensor data at run time is what it cannot import.
    """
    if not ctx.has_input(i):
        return False
    return _shape_derived_name(ctx, ctx.node.input[i], depth)


_SHAPE_ARITH = {
    "Gather",
    "Concat",
    "Unsqueeze",
    "Squeeze",
    "Slice",
    "Cast",
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Reshape",
    "Identity",
    "Max",
    "Min",
    "Where",
    "Equal",
    "ConstantOfShape",
}


def _shape_derived_name(ctx: NodeContext, name: str, depth: int) -> bool:
    graph = ctx.graph
    if name in graph.initializers:
        return True
    if depth > 24 or name not in graph.producer:
        return False
    node = graph.nodes[graph.producer[name]]
    if node.op_type == "Shape" or node.op_type == "Size":
        return True
    if node.op_type not in _SHAPE_ARITH:
        return False
    inputs = [n for n in node.input if n]
    if node.op_type in ("Reshape", "Unsqueeze", "Squeeze", "Slice", "Gather") and inputs:
        inputs = inputs[:1]
    return all(_shape_derived_name(ctx, n, depth + 1) for n in inputs)


def require_no_shape_inputs(ctx: NodeContext) -> None:
    for i, name in enumerate(ctx.node.input):
        if name and is_shape_value(ctx, name):
            require(
                False,
                Rejected.INPUT,
                f"input {i} ({name!r}) is the output of a Shape op, which the Relax frontend keeps as a "
                f"shape value that {ctx.op_type} cannot take",
                accepts=f"tensor inputs; shape values only into {', '.join(sorted(SHAPE_VALUE_OPS))}",
                remediation=(
                    f"{FALLBACK}; fold the shape arithmetic to "
                    "constants (e.g. onnxsim with static input shapes)"
                ),
            )


def require_const(
    ctx: NodeContext, i: int, what: str, *, optional: bool = True, remediation: str = ""
) -> None:
    """Input `i` must be an initializer (or absent, when `optional`)."""
    if not ctx.has_input(i):
        require(optional, Rejected.INPUT, f"{what} (input {i}) is missing", accepts=f"a constant {what}")
        return
    require(
        ctx.is_const(i),
        Rejected.INPUT,
        f"{what} (input {i}, {ctx.node.input[i]!r}) is computed at run time",
        accepts=f"a constant {what} (an initializer or Constant node)",
        remediation=remediation or f"{FALLBACK}; fold {what} to a constant (e.g. onnxsim) to let TVM take it",
    )


def require_attr(
    ctx: NodeContext, name: str, ok: Iterable, default, *, accepts: str, remediation: str = ""
) -> None:
    value = ctx.attr(name, default)
    require(
        value in tuple(ok),
        Rejected.ATTRIBUTE,
        f"{name}={value!r} is not supported by the Relax frontend",
        accepts=accepts,
        remediation=remediation or FALLBACK,
    )


def require_outputs(ctx: NodeContext, n: int, names: str, *, remediation: str = "") -> None:
    """Only the first `n` outputs may be used (optional outputs the frontend does not produce). An output
    that is named but read by no node and not a graph output is unused, as onnxruntime treats it
    (SqueezeNet's Dropout names its mask)."""
    graph = ctx.graph
    used = [
        i
        for i, o in enumerate(ctx.node.output)
        if o and i >= n and (o in graph.output_names or graph.consumers.get(o))
    ]
    require(
        not used,
        Rejected.ATTRIBUTE,
        f"optional output(s) {used} of {ctx.op_type} are used",
        accepts=f"{names} only",
        remediation=remediation or f"{FALLBACK}; drop the unused outputs from the node to let TVM take it",
    )


# -- value checks every op goes through (found by onnx's backend suite, tests/test_onnx_backend.py) --

#: Ops that sum or multiply many values: TVM accumulates float16/bfloat16 in that type, onnxruntime
#: (and onnx's reference) in float32. Measured: MatMul K=256, ReduceSum of 256, Conv 16x3x3 in
#: float16 are off by 0.4-0.6 % (the suite's rtol is 0.1 %); the fp16 attention and causal-conv
#: cases of the suite fail for it.
ACCUMULATING_OPS = frozenset(
    {
        "MatMul",
        "Gemm",
        "Conv",
        "ConvTranspose",
        "Einsum",
        "CumSum",
        "ReduceSum",
        "ReduceMean",
        "ReduceL1",
        "ReduceL2",
        "ReduceSumSquare",
        "ReduceLogSum",
        "ReduceLogSumExp",
        "ReduceProd",
        "Softmax",
        "LogSoftmax",
        "LayerNormalization",
        "GroupNormalization",
        "InstanceNormalization",
        "MeanVarianceNormalization",
        "RMSNormalization",
        "SkipLayerNormalization",
        "LpNormalization",
        "AveragePool",
        "GlobalAveragePool",
        "LpPool",
        "GlobalLpPool",
        "Attention",
    }
)
_HALF_TYPES = {"float16", "bfloat16"}


#: Ops that make or take ONNX sequences: TVM's kernel hands back tensors only, so a sequence
#: leaving a TVM partition fails at run time (suite: split_to_sequence_nokeepdims, TypeError
#: "int() argument must be ... not 'Tensor'").
SEQUENCE_OPS = frozenset(
    {
        "SequenceConstruct",
        "SequenceEmpty",
        "SequenceAt",
        "SequenceInsert",
        "SequenceErase",
        "SequenceLength",
        "SplitToSequence",
        "ConcatFromSequence",
        "SequenceMap",
        "Optional",
        "OptionalGetElement",
        "OptionalHasElement",
    }
)


def require_exact_values(ctx: NodeContext) -> None:
    """Value-level checks shared by all ops (run before each op's own rule)."""
    op = ctx.op_type
    require(
        op not in SEQUENCE_OPS,
        Rejected.OP,
        f"{op} makes or takes an ONNX sequence/optional, which a TVM partition cannot hand over",
        accepts="ops on tensors",
        remediation=FALLBACK,
    )
    types = {i.type_name for i in ctx.inputs if i is not None and i.elem_type is not None}
    if op in ACCUMULATING_OPS:
        half = sorted(types & _HALF_TYPES)
        require(
            not half,
            Rejected.DTYPE,
            (
                f"{half[0] if half else ''} inputs: TVM accumulates "
                f"{op} in that type (0.5 % off onnxruntime at 256 terms)"
            ),
            accepts="float32 / float64 (and integer) inputs",
            remediation=f"{FALLBACK}; or cast to float32 around the op to let TVM take it",
        )
    # Without: a slice that is all -inf (ReduceMax) / +inf (ReduceMin) gives -/+3.4e38 instead of
    # -/+inf (TVM starts the reduction from the lowest finite value): fully masked attention rows
    # come out wrong (suite: attention *_fullymasked_* / *_nan_robustness_* / local_window expanded).
    if op in ("ReduceMax", "ReduceMin"):
        floats = sorted(t for t in types if t in _HALF_TYPES | {"float", "double"})
        require(
            not floats,
            Rejected.DTYPE,
            f"{floats[0] if floats else ''} input: TVM's {op} "
            f"returns {'-' if op == 'ReduceMax' else '+'}3.4e38, "
            f"not {'-' if op == 'ReduceMax' else '+'}inf, for a slice "
            f"that is all {'-' if op == 'ReduceMax' else '+'}inf",
            accepts="integer inputs",
            remediation=FALLBACK,
        )
    # Without: float Mod with fmod=0 (Python-style remainder) gives other values than onnxruntime
    # at the edges (zero divisor, infinities): suite mod_float_edge_cases_fmod_0_*.
    if op == "Mod" and not ctx.attr("fmod", 0):
        floats = sorted(t for t in types if t in _HALF_TYPES | {"float", "double"})
        require(
            not floats,
            Rejected.ATTRIBUTE,
            f"fmod=0 on {floats[0] if floats else ''} inputs (integer-style modulo of floats)",
            accepts="integer inputs, or fmod=1 for floats",
            remediation=FALLBACK,
        )


def _generic_checks(ctx: NodeContext) -> None:
    require_no_shape_inputs(ctx)
    require_exact_values(ctx)


def register_shape_input_check(op_types: Iterable[str]) -> None:
    """Register the Shape-input and value checks alone for ops without a rule of their own."""
    for op in op_types:
        if ("", op) in TVM_OP_RULES:
            continue
        key = OpKey("", op, 1)
        if op in SHAPE_VALUE_OPS:
            TVM_OP_RULES.register(key, Rule(key, require_exact_values, shared="shared value checks only"))
        else:
            TVM_OP_RULES.register(
                key, Rule(key, _generic_checks, shared="shared Shape-input and value checks only")
            )
