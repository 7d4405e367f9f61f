"""TVM claim rules for arithmetic, normalisation, pooling, conv, quantisation and misc ops (see `tvm_rules`)."""
from __future__ import annotations

from ..api.claim import Rejected, deny, require
from .node_context import NodeContext
from .tvm_rules import FALLBACK, require_attr, require_const, require_outputs, rule

_FLOATS = ("float16", "float", "double")

# -- elementwise arithmetic ---------------------------------------------------------------


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


# Without: detect_negative=0 / detect_positive=0 are ignored (both infinities reported).
@rule("IsInf")
def _isinf(ctx: NodeContext) -> None:
    for name in ("detect_negative", "detect_positive"):
        require_attr(ctx, name, (1,), 1, accepts=f"{name}=1 (the default)",
                     remediation=f"{FALLBACK}; use IsInf plus a sign test (Less/Greater) instead")


# Without: float16 inputs fail to import (alpha/gamma/theta become float32 constants).
def _no_float16(ctx: NodeContext) -> None:
    require(
        ctx.inputs[0].type_name != "float16",
        Rejected.DTYPE,
        f"float16 input to {ctx.op_type}",
        accepts="float32 or float64 input",
        remediation=f"{FALLBACK}; compute in float32 (Cast around the node) to let TVM take it",
    )


for _op in ("Elu", "Selu", "ThresholdedRelu"):
    rule(_op)(_no_float16)


# -- normalisation ------------------------------------------------------------------------


# Without: training_mode=1 returns wrong running mean/variance.
@rule("BatchNormalization", since=14)
def _batchnorm(ctx: NodeContext) -> None:
    require_attr(ctx, "training_mode", (0,), 0, accepts="training_mode=0 (inference)",
                 remediation=f"{FALLBACK}; export the model in eval mode")
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


# Without: the Indices output is not produced ("Missing outputs during conversion").
@rule("MaxPool")
def _maxpool(ctx: NodeContext) -> None:
    require_outputs(ctx, 1, "the pooled output Y")


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
        auto = ctx.attr("auto_pad", b"NOTSET")
        auto = auto.decode() if isinstance(auto, bytes) else auto
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
        f"output_shape={list(wanted)} differs from the {got or 'unknown'} that pads/strides/output_padding give",
        accepts="no output_shape, or one equal to what pads, strides and output_padding give",
        remediation=f"{FALLBACK}; export with explicit pads and output_padding",
    )


# Without: mode=max gives wrong values (TVM max-pools the samples ONNX averages).
@rule("RoiAlign")
def _roialign(ctx: NodeContext) -> None:
    require_attr(ctx, "mode", ("avg",), "avg", accepts="mode=avg (the default)")


# Without: the mask output comes back as float32, not bool; a training_mode
# input that is true (or computed) is ignored, so nothing is dropped.
@rule("Dropout")
def _dropout(ctx: NodeContext) -> None:
    require_outputs(ctx, 1, "the data output")
    if ctx.has_input(2):
        mode = ctx.const(2)
        require(
            mode is not None and not bool(mode.reshape(-1)[0]),
            Rejected.INPUT,
            "training_mode is " + ("true" if mode is not None else f"computed at run time ({ctx.node.input[2]!r})"),
            accepts="inference: no training_mode input, or a constant false",
            remediation=f"{FALLBACK}; export the model in eval mode",
        )


# Without: a runtime axis fails to import ("CumSum with non-constant axis input is not supported").
@rule("CumSum")
def _cumsum(ctx: NodeContext) -> None:
    require_const(ctx, 1, "axis", optional=False)


# Without: runtime depth/values fail to import ("Only constant depth currently supported").
@rule("OneHot")
def _onehot(ctx: NodeContext) -> None:
    require_const(ctx, 1, "depth", optional=False)
    require_const(ctx, 2, "values", optional=False)


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


# Without: OptionalHasElement with no input fails to import.
@rule("OptionalHasElement")
def _optional_has_element(ctx: NodeContext) -> None:
    require(
        len(ctx.node.input) > 0,
        Rejected.INPUT,
        "no input at all (an empty optional)",
        accepts="an input value",
        remediation=FALLBACK,
    )
