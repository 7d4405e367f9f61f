"""TVM claim rules for arithmetic, normalisation, pooling, conv, quantisation and misc ops (see `kit`)."""

from __future__ import annotations

from ...api.claim import Rejected, deny, require
from ..node_context import NodeContext
from .kit import FALLBACK, is_shape_derived, require_attr, require_const, require_outputs, rule
from .shape import require_bounded_indices

_FLOATS = ("float16", "float", "double")

# -- elementwise arithmetic ---------------------------------------------------------------


def require_static_broadcast(ctx: NodeContext, skip_axis: int | None = None) -> None:
    """Broadcast dims must agree statically: a symbolic dim against a constant other than 1 fails.

    Without: "Cannot broadcast symbolic dimension N with non-1 constant 3" at import,
    or an InternalError when the build checks the broadcast.
    """
    shapes = [i.shape for i in ctx.inputs if i is not None and i.shape is not None]
    rank = max((len(s) for s in shapes), default=0)
    for k in range(1, rank + 1):
        if skip_axis is not None and rank - k == skip_axis % rank:
            continue
        dims = [s[-k] for s in shapes if len(s) >= k]
        consts = {d for d in dims if isinstance(d, int) and d != 1}
        symbolic = [d for d in dims if not isinstance(d, int)]
        require(
            not (consts and symbolic),
            Rejected.SHAPE,
            (
                f"dim {rank - k} is symbolic ({symbolic[0] if symbolic else ''!s}) "
                f"in one input and {sorted(consts)} in another"
            ),
            accepts="inputs whose broadcast dims are both static, both the same symbol, or 1",
            remediation=(
                f"{FALLBACK}; export with matching dim names, or "
                "fix the dims (onnxsim --overwrite-input-shape)"
            ),
        )


for _op in (
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Mod",
    "And",
    "Or",
    "Xor",
    "Less",
    "LessOrEqual",
    "Greater",
    "GreaterOrEqual",
    "BitShift",
    "BitwiseAnd",
    "BitwiseOr",
    "BitwiseXor",
    "Max",
    "Min",
    "Mean",
    "Sum",
    "PRelu",
):
    rule(_op)(require_static_broadcast)


# Without: Equal on shape values is folded by the frontend at import; with symbolic dims the
# comparison comes out wrong (a transformers BERT export: [False, False] for [False, True]).
@rule("Equal")
def _equal(ctx: NodeContext) -> None:
    computed = [i for i in (0, 1) if not ctx.is_const(i) and is_shape_derived(ctx, i)]
    require(
        not computed,
        Rejected.INPUT,
        f"input {computed[0] if computed else ''} is computed from "
        "tensor shapes, which the frontend compares at import "
        "time (wrongly for symbolic dims)",
        accepts="tensor data, or constants",
        remediation=(
            f"{FALLBACK}; fix the symbolic dims "
            "(SessionOptions.add_free_dimension_override_by_name) or fold them (onnxsim)"
        ),
    )
    require_static_broadcast(ctx)


# Without: Where choosing between two shape-derived tensors is folded by the frontend at
# import, and with a condition computed at run time it picks the wrong branch (found on a
# transformers BERT export: the mask's Expand shape became [3, -1, 12, 12] instead of [3, 1, 12, 12]).
# Two constant branches stay tensors (a mask's 0 and -inf): relax.op.where, right.
@rule("Where")
def _where(ctx: NodeContext) -> None:
    require(
        ctx.is_const(0)
        or (ctx.is_const(1) and ctx.is_const(2))
        or not all(is_shape_derived(ctx, i) for i in (1, 2)),
        Rejected.INPUT,
        f"condition {ctx.node.input[0]!r} is computed at run time and both branches are shape values, "
        "which the frontend folds at import (selecting the wrong branch)",
        accepts="a constant condition, or branches that are tensor data",
        remediation=(
            f"{FALLBACK}; fold the shape computation to constants (onnxsim, or free-dimension overrides)"
        ),
    )
    require_static_broadcast(ctx)


# Without: a symbolic dim against a different constant in a non-concat axis fails to build.
@rule("Concat")
def _concat(ctx: NodeContext) -> None:
    require_static_broadcast(ctx, skip_axis=ctx.attr("axis", 0))


# Without: int ** int fails to build ("power only applies to float"); mixed base/exponent
# types fail to import ("Binary operators must have the same datatype").
@rule("Pow")
def _pow(ctx: NodeContext) -> None:
    base, exp = (ctx.inputs[0].type_name, ctx.inputs[1].type_name)
    require(
        base == exp and base in _FLOATS,
        Rejected.DTYPE,
        f"base {base} and exponent {exp}",
        accepts="a float base and exponent of the same type",
        remediation=f"{FALLBACK}; Cast the exponent to the base's float type to let TVM take it",
    )
    require_static_broadcast(ctx)


# Without: detect_negative=0 / detect_positive=0 are ignored (both infinities reported).
@rule("IsInf")
def _isinf(ctx: NodeContext) -> None:
    for name in ("detect_negative", "detect_positive"):
        require_attr(
            ctx,
            name,
            (1,),
            1,
            accepts=f"{name}=1 (the default)",
            remediation=f"{FALLBACK}; use IsInf plus a sign test (Less/Greater) instead",
        )


# Without: float16/bfloat16 inputs fail to import (alpha/gamma/theta become float32 constants).
def _no_float16(ctx: NodeContext) -> None:
    require(
        ctx.inputs[0].type_name not in ("float16", "bfloat16"),
        Rejected.DTYPE,
        f"{ctx.inputs[0].type_name} input to {ctx.op_type}",
        accepts="float32 or float64 input",
        remediation=f"{FALLBACK}; compute in float32 (Cast around the node) to let TVM take it",
    )


for _op in ("Elu", "Selu", "ThresholdedRelu"):
    rule(_op)(_no_float16)


# -- normalisation ------------------------------------------------------------------------


# Without: training_mode=1 returns wrong running mean/variance.
@rule("BatchNormalization", since=9)
def _batchnorm(ctx: NodeContext) -> None:
    require_attr(
        ctx,
        "training_mode",
        (0,),
        0,
        accepts="training_mode=0 (inference)",
        remediation=f"{FALLBACK}; export the model in eval mode",
    )
    require_outputs(ctx, 1, "the normalised output Y")


# Without: the Mean / InvStdDev outputs come back as scalars, not (..., 1) tensors.
@rule("LayerNormalization")
def _layernorm(ctx: NodeContext) -> None:
    require_outputs(ctx, 1, "the normalised output Y")


# Without: axis 0 (normalising over every dim) fails to build ("Tensor dimension mismatch").
@rule("RMSNormalization")
def _rmsnorm(ctx: NodeContext) -> None:
    rank = ctx.rank(0)
    axis = ctx.attr("axis", -1)
    if rank is not None:
        require(
            axis % rank != 0,
            Rejected.ATTRIBUTE,
            f"axis={axis} normalises over all {rank} dims",
            accepts="axis >= 1 (a leading dim left unnormalised)",
            remediation=f"{FALLBACK}; Unsqueeze a leading dim of 1 and use axis=1 to let TVM take it",
        )


# -- pooling, conv, ROI ------------------------------------------------------------------


# Without: the output_shape attribute is ignored: TVM's output has the size that
# pads/strides/output_padding give, which differs unless they were chosen to match.
@rule("ConvTranspose")
def _conv_transpose(ctx: NodeContext) -> None:
    wanted = ctx.attr("output_shape")
    if wanted is None:
        return
    x, w = ctx.inputs[0].shape, ctx.inputs[1].shape
    nsp = len(x) - 2 if x is not None else 0
    spatial = list(x[2:]) if x is not None else []
    kernel = list(ctx.attr("kernel_shape") or (w[2:] if w is not None else []))
    got = None
    if nsp and all(isinstance(d, int) for d in spatial + kernel) and len(kernel) == nsp:
        strides = list(ctx.attr("strides", [1] * nsp))
        dil = list(ctx.attr("dilations", [1] * nsp))
        outpad = list(ctx.attr("output_padding", [0] * nsp))
        auto = ctx.attr("auto_pad", "NOTSET")
        pads = list(ctx.attr("pads", [0] * 2 * nsp))
        got = []
        for i in range(nsp):
            full = strides[i] * (spatial[i] - 1) + outpad[i] + (kernel[i] - 1) * dil[i] + 1
            if auto in ("SAME_UPPER", "SAME_LOWER"):
                total = max((kernel[i] - 1) * dil[i] + 1 + outpad[i] - strides[i], 0)
            elif auto == "VALID":
                total = 0
            else:
                total = pads[i] + pads[i + nsp]
            got.append(full - total)
    require(
        got is not None and list(wanted)[-nsp:] == got,
        Rejected.ATTRIBUTE,
        (
            f"output_shape={list(wanted)} differs from the "
            f"{got or 'unknown'} that pads/strides/output_padding give"
        ),
        accepts="no output_shape, or one equal to what pads, strides and output_padding give",
        remediation=f"{FALLBACK}; export with explicit pads and output_padding",
    )


# Without: mode=max gives wrong values (TVM max-pools the samples ONNX averages).
@rule("RoiAlign")
def _roialign(ctx: NodeContext) -> None:
    require_attr(ctx, "mode", ("avg",), "avg", accepts="mode=avg (the default)")
    # batch_indices are not bounds-checked by TVM (see require_bounded_indices).

    batch = ctx.inputs[0].shape[0] if ctx.inputs[0] is not None and ctx.inputs[0].shape else None
    require_bounded_indices(ctx, 2, lambda v: [(v, batch)], allow_negative=False, what="batch_indices")


# Without: a training_mode input that is true (or computed) is ignored, so nothing is dropped.
@rule("Dropout")
def _dropout(ctx: NodeContext) -> None:
    if ctx.has_input(2):
        mode = ctx.const(2)
        require(
            mode is not None and not bool(mode.reshape(-1)[0]),
            Rejected.INPUT,
            "training_mode is "
            + ("true" if mode is not None else f"computed at run time ({ctx.node.input[2]!r})"),
            accepts="inference: no training_mode input, or a constant false",
            remediation=f"{FALLBACK}; export the model in eval mode",
        )


# Without: a runtime axis fails to import ("CumSum with non-constant axis input is not supported").
@rule("CumSum")
def _cumsum(ctx: NodeContext) -> None:
    require_const(ctx, 1, "axis", optional=False)


# Without: runtime depth/values fail to import ("Only constant depth currently supported").
# A float depth (ONNX allows any numeric type) fails to import too (one_hot wants an int).
@rule("OneHot")
def _onehot(ctx: NodeContext) -> None:
    require_const(ctx, 1, "depth", optional=False)
    require_const(ctx, 2, "values", optional=False)
    depth = ctx.const(1)
    require(
        depth.dtype.kind in "iu",
        Rejected.DTYPE,
        f"depth is {depth.dtype}",
        accepts="an integer depth",
        remediation=f"{FALLBACK}; store depth as int64 to let TVM take it",
    )


# -- quantisation ---------------------------------------------------------------------------


def _no_block_quant(ctx: NodeContext) -> None:
    # Without: block_size > 0 fails to import ("blocked quantization is not supported yet").
    require(
        not ctx.attr("block_size", 0),
        Rejected.ATTRIBUTE,
        f"block_size={ctx.attr('block_size', 0)} (blocked quantisation)",
        accepts="per-tensor or per-axis quantisation (block_size=0)",
        remediation=FALLBACK,
    )


rule("QuantizeLinear")(_no_block_quant)
rule("DequantizeLinear")(_no_block_quant)


# -- recurrent cells ---------------------------------------------------------------------------

#: LSTM's and GRU's activations when the node names none (ONNX's defaults), per direction
_DEFAULT_ACTIVATIONS = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh")}


# The frontend's recurrence (`nxrt_tvm.recurrence`) is ONNX's equations with their defaults, float32,
# time-major, every sequence as long as the input: anything else is onnxruntime's.
def _recurrent(ctx: NodeContext) -> None:
    x = ctx.inputs[0]
    require(
        x is not None and x.dtype == "float32",
        Rejected.DTYPE,
        f"X is {x.dtype if x is not None else 'untyped'}",
        accepts="float32",
        remediation=FALLBACK,
    )
    require_attr(ctx, "layout", (0,), 0, accepts="layout=0 (X as [seq, batch, input])")
    require_attr(ctx, "input_forget", (0,), 0, accepts="input_forget=0")
    require_attr(ctx, "clip", (None,), None, accepts="no cell clip")
    names = list(ctx.attr("activations", []))
    default = _DEFAULT_ACTIVATIONS[ctx.op_type]
    require(
        not names or tuple(names) == default * (len(names) // len(default)),
        Rejected.ATTRIBUTE,
        f"activations={names}",
        accepts=f"the default activations {list(default)}",
        remediation=FALLBACK,
    )
    require(
        not ctx.has_input(4),
        Rejected.INPUT,
        f"sequence_lens (input 4, {ctx.node.input[4] if len(ctx.node.input) > 4 else ''!r}) is given",
        accepts="no sequence_lens: every sequence as long as X",
        remediation=f"{FALLBACK}; drop sequence_lens where every sequence has the full length",
    )
    require(
        not (ctx.op_type == "LSTM" and ctx.has_input(7)),
        Rejected.INPUT,
        "peephole weights P (input 7) are given",
        accepts="an LSTM without peepholes",
        remediation=FALLBACK,
    )
    static = [ctx.inputs[i] for i in (1, 2)]
    require(
        all(
            v is not None and v.shape is not None and all(isinstance(d, int) for d in v.shape) for v in static
        )
        and x.shape is not None
        and len(x.shape) == 3
        and isinstance(x.shape[2], int),
        Rejected.SHAPE,
        "X's input size or the shape of W or R is not static",
        accepts="X of rank 3 with a static input size, W and R of static shape",
        remediation=f"{FALLBACK}; fix the input shape (onnxsim --overwrite-input-shape)",
    )


rule("LSTM", since=7)(_recurrent)
rule("GRU", since=7)(_recurrent)


# -- ops the frontend converts as something else ----------------------------------------------


# Without: ai.onnx Attention (opset 23) is converted as com.microsoft's packed-QKV
# Attention and fails to import (KeyError 'num_heads').
@rule("Attention")
def _attention(ctx: NodeContext) -> None:
    deny(
        Rejected.OP,
        "ai.onnx Attention is imported as com.microsoft's Attention, a different op",
        accepts="its decomposition (MatMul, Softmax, ...)",
        remediation=f"{FALLBACK}; export attention decomposed to let TVM take it",
    )


# -- symbolic dims -----------------------------------------------------------------------------


def _require_static_input(ctx: NodeContext, why: str) -> None:
    shape = ctx.inputs[0].shape if ctx.inputs and ctx.inputs[0] else None
    require(
        shape is not None and all(isinstance(d, int) for d in shape),
        Rejected.SHAPE,
        f"input shape {list(shape) if shape is not None else 'unknown'} has symbolic dims ({why})",
        accepts="a static input shape",
        remediation=f"{FALLBACK}; fix the input shape (onnxsim --overwrite-input-shape) to let TVM take it",
    )


# Without: auto_pad SAME_* with a symbolic dim fails to import (int() of a shape var);
# MaxPool's Indices output is not produced ("Missing outputs during conversion").
def _pool(ctx: NodeContext) -> None:
    auto = ctx.attr("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        _require_static_input(ctx, f"auto_pad={auto}")


@rule("MaxPool")
def _maxpool(ctx: NodeContext) -> None:
    require_outputs(ctx, 1, "the pooled output Y")
    _pool(ctx)


rule("AveragePool")(_pool)
rule("LpPool")(_pool)


# Without: the output_shape input fails to import, runtime or constant ("no attribute tolist");
# a symbolic input dim fails too ("Var" object has no attribute "value").
@rule("MaxUnpool")
def _max_unpool(ctx: NodeContext) -> None:
    require(
        not ctx.has_input(2),
        Rejected.INPUT,
        f"output_shape input {ctx.node.input[2]!r} is given" if ctx.has_input(2) else "",
        accepts="MaxUnpool without the output_shape input",
        remediation=FALLBACK,
    )
    _require_static_input(ctx, "MaxUnpool")
    # Indices are flat positions in the output that TVM writes without a bounds check: accept
    # them from a MaxPool (in range by construction) or as constants in range.
    producer = ctx.graph.producer.get(ctx.node.input[1])
    if (
        producer is not None
        and ctx.graph.nodes[producer].op_type == "MaxPool"
        and ctx.graph.nodes[producer].domain in ("", "ai.onnx")
    ):
        return

    require_bounded_indices(ctx, 1, lambda v: [(v, _unpool_extent(ctx))], allow_negative=False)


def _unpool_extent(ctx: NodeContext):
    """Elements of MaxUnpool's output (static input dims, kernel, strides, pads), or None."""
    out = ctx.outputs[0].shape if ctx.outputs and ctx.outputs[0] is not None else None
    if out is None or not all(isinstance(d, int) for d in out):
        return None
    n = 1
    for d in out:
        n *= d
    return n


# Without: a symbolic dim on the Hardmax axis fails to import (one_hot needs an int depth).
@rule("Hardmax", since=13)
def _hardmax(ctx: NodeContext) -> None:
    shape = ctx.inputs[0].shape
    if shape:
        d = shape[ctx.attr("axis", -1) % len(shape)]
        require(
            isinstance(d, int),
            Rejected.SHAPE,
            f"the Hardmax axis has symbolic size {d!r}",
            accepts="a static size on the Hardmax axis",
            remediation=FALLBACK,
        )


# Without: batch dims symbolic in one input and constant (not 1) in the other fail to build.
@rule("MatMul")
def _matmul(ctx: NodeContext) -> None:
    a, b = ctx.inputs[0].shape, ctx.inputs[1].shape
    if a is None or b is None or len(a) < 3 and len(b) < 3:
        return
    for x, y in zip(reversed(a[:-2]), reversed(b[:-2])):
        require(
            not (
                (isinstance(x, int) and x != 1 and not isinstance(y, int))
                or (isinstance(y, int) and y != 1 and not isinstance(x, int))
            ),
            Rejected.SHAPE,
            f"batch dims {x!r} and {y!r}: one symbolic, one constant",
            accepts="batch dims both static, both the same symbol, or 1",
            remediation=f"{FALLBACK}; export with matching dim names or static shapes",
        )


# Without: a bias C whose dims are constant where A/B give a symbolic M or N fails to build.
@rule("Gemm")
def _gemm(ctx: NodeContext) -> None:
    if not ctx.has_input(2) or ctx.inputs[2] is None or ctx.inputs[2].shape is None:
        return
    a, b = ctx.inputs[0].shape, ctx.inputs[1].shape
    if a is None or b is None or len(a) != 2 or len(b) != 2:
        return
    m = a[1] if ctx.attr("transA", 0) else a[0]
    n = b[0] if ctx.attr("transB", 0) else b[1]
    for c, d in zip(reversed(ctx.inputs[2].shape), (n, m)):
        require(
            not (isinstance(c, int) and c != 1 and not isinstance(d, int)),
            Rejected.SHAPE,
            f"bias dim {c} against symbolic output dim {d!r}",
            accepts="a bias broadcastable to the output with static dims",
            remediation=f"{FALLBACK}; fix the input shape (onnxsim --overwrite-input-shape)",
        )
