"""uint8 x int8 matmuls (``matmul(a, b, out_dtype="int32")``, MatMulInteger's import) for the target.

Kept as they are where the CPU has AVX-512 VNNI, the weights are constant and the shapes fit its
schedule (`schedules.vnni`); elsewhere in float32 where every partial sum is exact (the float matmul
rule, 4x the throughput of int32 multiplies without VNNI), else with int32 operands.

On a VNNI CPU a QDQ model's matmul becomes one too: ``matmul(dequantize(q), dequantize(W))`` with a
uint8 activation `q` (one scale and zero point) and constant int8 weights (no zero point, one scale or
one per output column) is ``(matmul(q, W, int32) - zq * colsum(W)) * (sq * sw)``: the integers summed
exactly, the scales applied once (a QDQ MobileNetV2's classifier read its 1280 x 1000 weights as float32,
4x the bytes). Elsewhere such pairs stay float arithmetic (`fake_quant`).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

from ..frontend import exact_in_float32
from .fold_affine import constant_array
from .schedules.vnni import has_vnni, vnni_fits
from .strict import own_pass

__all__ = ["IntegerMatmul"]

#: the largest magnitudes of a uint8 and of an int8 value
_BOUNDS = (255, 128)


def _last_dim(x: relax.Expr) -> int | None:
    """A tensor's last dim where it is static."""
    shape = getattr(x.ty, "shape", None)
    dim = shape.values[-1] if isinstance(shape, relax.ShapeExpr) and shape.values else None
    return int(dim.value) if isinstance(dim, tirx.IntImm) else None


@relax.transform.function_pass(opt_level=0, name="nxrt_tvm.IntegerMatmul")
class IntegerMatmul:
    """See the module docstring."""

    def __init__(self, target: tvm.target.Target):
        self.vnni = has_vnni(target)
        self.pattern = is_op("relax.matmul")(wildcard(), wildcard())
        self.activation = is_op("relax.dequantize")(wildcard(), is_const(), is_const())
        self.weights = is_op("relax.dequantize")(is_const(), is_const(), is_const())
        self.transposed = is_op("relax.permute_dims")(self.weights)
        self.qdq = is_op("relax.matmul")(self.activation, self.weights | self.transposed)

    @own_pass
    def transform_function(self, func: relax.Function, _mod: tvm.IRModule, _ctx) -> relax.Function:
        if self.vnni:
            func = rewrite_call(self.qdq, self._from_qdq, func)
        return rewrite_call(self.pattern, self._rewrite, func)

    def _from_qdq(self, call: relax.Call, matches) -> relax.Expr:
        """A QDQ matmul as a uint8 x int8 one, scaled after (see the module docstring); else unchanged."""
        activation, weights = matches[self.activation], matches[self.weights]
        transposed = matches.get(self.transposed)
        if transposed is not None and [int(a) for a in transposed.attrs.axes or [1, 0]] != [1, 0]:
            return call
        q, q_scale, q_zero = activation.args
        w_q, w_scale, w_zero = (constant_array(x) for x in weights.args)
        q_scale, q_zero = constant_array(q_scale), constant_array(q_zero)
        if (
            getattr(q.ty, "dtype", None) != "uint8"
            or q_scale.size != 1
            or q_zero.size != 1
            or w_q.dtype != np.int8
            or w_q.ndim != 2
            or w_zero.any()
            or str(call.attrs.out_dtype) not in ("", "None", "float32")
            or str(activation.attrs.out_dtype) != "float32"
        ):
            return call
        w_q = w_q.T if transposed is not None else w_q  # [K, N]
        column_axis = 0 if transposed is not None else 1
        if w_scale.size != 1 and (w_scale.size != w_q.shape[1] or int(weights.attrs.axis) != column_axis):
            return call
        sums = w_q.astype(np.int32).sum(axis=0)
        product = relax.op.matmul(q, relax.const(np.ascontiguousarray(w_q)), out_dtype="int32")
        product = relax.op.subtract(product, relax.const(sums * np.int32(q_zero.reshape(()).item())))
        scale = (np.float32(q_scale.reshape(()).item()) * w_scale.astype(np.float32).reshape(-1)).astype(
            np.float32
        )
        return relax.op.multiply(relax.op.astype(product, "float32"), relax.const(scale))

    def _rewrite(self, call: relax.Call, _matches) -> relax.Expr:
        a, b = call.args
        dtypes = tuple(getattr(x.ty, "dtype", None) for x in (a, b))
        if str(call.attrs.out_dtype) != "int32" or dtypes != ("uint8", "int8"):
            return call
        depth = _last_dim(a)
        if self.vnni and isinstance(b, tvm.ir.GenericConst) and vnni_fits(depth, _last_dim(b)):
            return call
        if exact_in_float32(depth, *_BOUNDS):
            a, b = (relax.op.astype(x, "float32") for x in (a, b))
            return relax.op.astype(relax.op.matmul(a, b, out_dtype="float32"), "int32")
        return relax.op.matmul(relax.op.astype(a, "int32"), relax.op.astype(b, "int32"), out_dtype="int32")
