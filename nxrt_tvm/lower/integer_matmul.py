"""uint8 x int8 matmuls (``matmul(a, b, out_dtype="int32")``, MatMulInteger's import) for the target.

Kept as they are where the CPU has AVX-512 VNNI, the weights are constant and the shapes fit its
schedule (`schedules.vnni`); elsewhere in float32 where every partial sum is exact (the float matmul
rule, 4x the throughput of int32 multiplies without VNNI), else with int32 operands.

On a VNNI CPU a QDQ model's matmul becomes one too: ``matmul(dequantize(q), dequantize(W))`` with a
uint8 activation `q` (one scale and zero point) and constant int8 weights (no zero point, one scale or
one per output column) is ``(matmul(q, W, int32) - zq * colsum(W)) * (sq * sw)``: the integers summed
exactly, the scales applied once (a QDQ MobileNetV2's classifier read its 1280 x 1000 weights as float32,
4x the bytes). Elsewhere such pairs stay float arithmetic (`fake_quant`). A QDQ contraction whose
result is quantized again is `qlinear`'s, which runs first: this takes those with a float result.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

from ..frontend import exact_in_float32
from .fold_affine import constant_array
from .grouped_conv import conv2d_like
from .schedules.vnni import has_vnni, vnni_fits
from .strict import own_pass

__all__ = ["IntegerMatmul", "vnni_conv_fits"]

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
        self.qdq_conv = is_op("relax.nn.conv2d")(self.activation, self.weights)

    @own_pass
    def transform_function(self, func: relax.Function, _mod: tvm.IRModule, _ctx) -> relax.Function:
        if self.vnni:
            func = rewrite_call(self.qdq, self._from_qdq, func)
            func = rewrite_call(self.qdq_conv, self._conv_from_qdq, func)
        return rewrite_call(self.pattern, self._rewrite, func)

    def _operands(self, call: relax.Call, matches) -> tuple | None:
        """(q, its scale, its zero point, int8 weights, their scales) of a QDQ contraction whose
        activation is uint8 with one scale and zero point and whose weights have no zero point; else
        None."""
        activation, weights = matches[self.activation], matches[self.weights]
        q = activation.args[0]
        q_scale, q_zero, w_q, w_scale, w_zero = (
            constant_array(x) for x in (*activation.args[1:], *weights.args)
        )
        if (
            getattr(q.ty, "dtype", None) != "uint8"
            or q_scale.size != 1
            or q_zero.size != 1
            or w_q.dtype != np.int8
            or w_zero.any()
            or str(call.attrs.out_dtype) not in ("", "None", "float32")
            or str(activation.attrs.out_dtype) != "float32"
        ):
            return None
        return q, q_scale.reshape(()).item(), int(q_zero.reshape(()).item()), w_q, w_scale.astype(np.float32)

    def _from_qdq(self, call: relax.Call, matches) -> relax.Expr:
        """A QDQ matmul as a uint8 x int8 one, scaled after (see the module docstring); else unchanged."""
        transposed = matches.get(self.transposed)
        operands = self._operands(call, matches)
        if operands is None or (
            transposed is not None and [int(a) for a in transposed.attrs.axes or [1, 0]] != [1, 0]
        ):
            return call
        q, q_scale, q_zero, w_q, w_scale = operands
        if w_q.ndim != 2:
            return call
        w_q = np.ascontiguousarray(w_q.T if transposed is not None else w_q)  # [K, N]
        if not vnni_fits(*w_q.shape):  # the float arithmetic it was is faster than int32
            return call
        column_axis = 0 if transposed is not None else 1
        if w_scale.size != 1 and (
            w_scale.size != w_q.shape[1] or int(matches[self.weights].attrs.axis) != column_axis
        ):
            return call
        product = relax.op.matmul(q, relax.const(w_q), out_dtype="int32")
        return _scaled(product, w_q.astype(np.int32).sum(axis=0), q_scale, q_zero, w_scale.reshape(-1))

    def _conv_from_qdq(self, call: relax.Call, matches) -> relax.Expr:
        """A QDQ convolution as a uint8 x int8 one, scaled after, where the VNNI rule takes it: NCHW,
        no padding (it would be the zero point, not 0), one group, input channels whole groups of 4 and
        output channels whole vectors; else unchanged."""
        operands = self._operands(call, matches)
        if operands is None:
            return call
        q, q_scale, q_zero, w_q, w_scale = operands
        channels = w_q.shape[0]
        if not vnni_conv_fits(call.attrs, w_q) or (
            w_scale.size != 1 and (w_scale.size != channels or int(matches[self.weights].attrs.axis) != 0)
        ):
            return call
        product = conv2d_like(call, q, relax.const(w_q), out_dtype="int32")
        per_channel = (1, channels, 1, 1)
        sums = w_q.astype(np.int32).sum(axis=(1, 2, 3)).reshape(per_channel)
        scale = w_scale.reshape(per_channel if w_scale.size != 1 else ())
        return _scaled(product, sums, q_scale, q_zero, scale)

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


def vnni_conv_fits(attrs, weights: np.ndarray) -> bool:
    """Whether the VNNI rule takes a uint8 x int8 convolution by `weights` ([O, I, kh, kw]): NCHW, one
    group, no padding (it would be 0, not the activation's zero point), input channels whole groups of
    4 and output channels whole vectors."""
    return (
        (attrs.data_layout, attrs.kernel_layout, attrs.out_layout) == ("NCHW", "OIHW", "NCHW")
        and int(attrs.groups) == 1
        and not any(int(p) for p in attrs.padding)
        and vnni_fits(weights.shape[1], weights.shape[0], padded=False)
    )


def _scaled(product: relax.Expr, sums: np.ndarray, q_scale: float, q_zero: int, w_scale: np.ndarray):
    """``(product - q_zero * sums) * q_scale * w_scale`` in float32: a uint8 x int8 contraction's
    zero point taken out (`sums`: the weights' sums per output channel) and its scales applied."""
    product = relax.op.subtract(product, relax.const(sums * np.int32(q_zero)))
    scale = (np.float32(q_scale) * w_scale).astype(np.float32)
    return relax.op.multiply(relax.op.astype(product, "float32"), relax.const(scale))
