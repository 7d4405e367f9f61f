"""A QDQ model's quantize/dequantize pair as the float arithmetic it is, without integer casts.

``DequantizeLinear(QuantizeLinear(x, s, z), s, z)`` with one scale and zero point (the pair QDQ exports
put on every activation) is ``(clip(round(x / s) + z, lo, hi) - z) * s``, which is
``clip(round(x / s), lo - z, hi - z) * s`` exactly: every value between the division and the multiply
is a small integer held exactly in float32. TVM's lowering casts to 8 bits and back (float -> int32 ->
packed 8-bit -> int32 -> float: a dozen instructions a vector in the epilogue of the conv the pair is
fused into); this form is a division, a rounding, two bounds and a multiply. Runs after the precision
policy, which takes `quantize` for what it is (not a discrete consumer) and would take its rounding
for one.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax import PyExprMutator
from tvm.relax.expr_functor import mutator

from .fold_affine import constant_scalar, op_call
from .strict import own_pass

__all__ = ["QUANTIZED_RANGES", "FakeQuantAsFloat"]

#: the quantised types whose pairs are rewritten, and their ranges
QUANTIZED_RANGES = {"int8": (-128, 127), "uint8": (0, 255)}


@mutator
class _Rewrite(PyExprMutator):
    def visit_call_(self, op: relax.Call) -> relax.Expr:
        call = super().visit_call_(op)
        if op_call(call, "relax.dequantize") is None:
            return call
        operand = call.args[0]
        quantize = op_call(
            self.lookup_binding(operand) if isinstance(operand, relax.Var) else operand, "relax.quantize"
        )
        if quantize is None:
            return call
        x = quantize.args[0]
        bounds = QUANTIZED_RANGES.get(str(quantize.attrs.out_dtype))
        scale, zero = constant_scalar(quantize.args[1]), constant_scalar(quantize.args[2])
        if (
            bounds is None
            or str(call.attrs.out_dtype) != "float32"
            or getattr(x.ty, "dtype", None) != "float32"
            or scale is None
            or zero is None
            or constant_scalar(call.args[1]) != scale
            or constant_scalar(call.args[2]) != zero
        ):
            return call
        steps = relax.op.round(relax.op.divide(x, relax.const(np.float32(scale))))
        low, high = (relax.const(np.float32(b - zero)) for b in bounds)
        clipped = relax.op.minimum(relax.op.maximum(steps, low), high)
        return relax.op.multiply(clipped, relax.const(np.float32(scale)))


@relax.transform.function_pass(opt_level=0, name="nxrt_tvm.FakeQuantAsFloat")
class FakeQuantAsFloat:
    """``dequantize(quantize(x, s, z), s, z)`` (float32, one constant scale and zero point, 8 bits) ->
    ``clip(round(x / s), lo - z, hi - z) * s``; the quantize nothing else reads is dropped."""

    @own_pass
    def transform_function(self, func: relax.Function, mod: tvm.IRModule, _ctx) -> relax.Function:
        if func.attrs is not None and "Primitive" in func.attrs and int(func.attrs["Primitive"]) != 0:
            return func
        return relax.analysis.remove_all_unused(_Rewrite(mod).visit_expr(func))
