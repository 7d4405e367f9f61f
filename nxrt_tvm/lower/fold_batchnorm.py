"""Inference BatchNormalization folded into the convolution before it, as onnxruntime's ConvBNFusion does.

Exported CNNs keep ``Conv -> BatchNormalization`` as two ops; left apart, the
normalisation is a separate kernel that reads and writes the whole activation
again. With constant weights and statistics it is a per-output-channel scale
and shift, so it folds into the convolution's weights and bias at compile time
(``W' = W * s``, ``b' = (b - mean) * s + beta``, ``s = gamma / sqrt(var + eps)``),
and the convolution rule's epilogue takes the shift and the activation after it.

TVM's own `FoldBatchnormToConv2D` misses the ONNX import's form (the conv bias
is an ``add`` between the conv and the norm) and leaves the unused
running-statistics outputs computing; this pass handles both.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import TupleGetItemPattern, is_const, is_op, rewrite_call, wildcard

from .strict import own_pass

__all__ = ["FoldBatchNormIntoConv", "constant_array"]


def constant_array(expr: relax.Expr) -> np.ndarray | None:
    """A constant's value, a broadcast constant (ConstantOfShape weights) as its full array; None for
    anything computed at run time."""
    if isinstance(expr, tvm.ir.GenericConst):
        return expr.value.numpy()
    if (
        isinstance(expr, relax.Call)
        and isinstance(expr.op, tvm.ir.Op)
        and expr.op.name == "relax.broadcast_to"
        and isinstance(expr.args[0], tvm.ir.GenericConst)
        and isinstance(expr.args[1], relax.ShapeExpr)
        and all(isinstance(d, tvm.tirx.IntImm) for d in expr.args[1].values)
    ):
        return np.broadcast_to(expr.args[0].value.numpy(), [int(d) for d in expr.args[1].values])
    return None


@relax.transform.function_pass(opt_level=0, name="nxrt_tvm.FoldBatchNormIntoConv")
class FoldBatchNormIntoConv:
    """``batch_norm(conv2d(x, W) [+ b])[0]`` ->
    ``conv2d(x, W') + b'`` for float32 NCHW/OIHW, inference mode."""

    def __init__(self) -> None:
        self.data = wildcard()
        self.weight = is_const() | is_op("relax.broadcast_to")(is_const(), wildcard())
        self.conv = is_op("relax.nn.conv2d")(self.data, self.weight)
        self.bias = is_const()
        shaped_bias = is_op("relax.reshape")(self.bias, wildcard()) | self.bias
        self.conv_bias = is_op("relax.add")(self.conv, shaped_bias)
        self.stats = [is_const() for _ in range(4)]  # gamma, beta, mean, var
        self.norm = is_op("relax.nn.batch_norm")(self.conv_bias | self.conv, *self.stats)
        self.pattern = TupleGetItemPattern(self.norm, 0)

    @own_pass
    def transform_function(self, func: relax.Function, _mod: tvm.IRModule, _ctx) -> relax.Function:
        if func.attrs is not None and "Primitive" in func.attrs and int(func.attrs["Primitive"]) != 0:
            return func
        folded = rewrite_call(self.pattern, self._fold, func)
        return func if folded.same_as(func) else relax.analysis.remove_all_unused(folded)

    def _fold(self, expr: relax.Expr, matches) -> relax.Expr:
        conv, norm = matches[self.conv], matches[self.norm]
        attrs, bn = conv.attrs, norm.attrs
        weight = constant_array(matches[self.weight])
        if (
            bn.training
            or int(bn.axis) != 1
            or attrs.data_layout != "NCHW"
            or attrs.kernel_layout != "OIHW"
            or attrs.out_layout != "NCHW"
            or weight.dtype != np.float32
            or conv.ty.dtype != "float32"
        ):
            return expr
        channels = weight.shape[0]
        gamma, beta, mean, var = (constant_array(matches[p]).astype(np.float64) for p in self.stats)
        bias = (
            constant_array(matches[self.bias]).astype(np.float64)
            if self.bias in matches
            else np.zeros(channels)
        )
        if any(a.size != channels for a in (gamma, beta, mean, var, bias)):
            return expr  # a bias or statistic that broadcasts otherwise: not a per-channel affine map
        scale = gamma / np.sqrt(var + float(bn.epsilon))
        new_weight = (weight.astype(np.float64) * scale.reshape(-1, 1, 1, 1)).astype(np.float32)
        shift = ((bias.reshape(-1) - mean) * scale + beta).astype(np.float32).reshape(1, channels, 1, 1)
        folded = relax.Call(conv.op, [matches[self.data], relax.const(new_weight)], attrs)
        return relax.op.add(folded, relax.const(shift))
