"""A QDQ model's quantised groups computed as onnxruntime computes them, to the bit.

onnxruntime runs a QDQ model as integer kernels: ``Q(Conv(DQ(x), DQ(W)) + DQ(b))`` is a QLinearConv,
``Q(MatMul|Gemm(...))`` a QGemm, ``Q(Add(DQ(a), DQ(b)))`` a QLinearAdd. Their arithmetic is not the
float arithmetic the QDQ nodes spell: a convolution sums integers exactly and requantises once,
``round(float(acc + b) * (sx * sw / sy))``; MLAS's add is ``round(fma(a, sa/sc, fma(b, sb/sc, k)))``
on the raw 8-bit values, ``k = zc - (sa/sc * za + sb/sc * zb)``. Either way the 8-bit result can land
one step from the float form's wherever a value sits near a rounding half-point, and a step taken early
grows through the layers: a QDQ MobileNetV2 computed in float (`fake_quant`) ended 5 steps from
onnxruntime's logits, and computing its adds in the literal form alone puts it 131 steps off.

So each such group becomes that arithmetic (the reference is onnxruntime's x86 MLAS kernels on AVX-512
VNNI or AVX2 with FMA; without VNNI, MLAS's uint8 x int8 products saturate pairs of terms at 16 bits,
which the exact accumulator here does not reproduce):

- contraction: the accumulator is exact, either int32 (the uint8 x int8 VNNI kernel, `schedules.vnni`)
  or float32 over the integers (the zero point subtracted; exact wherever every partial sum stays
  below 2**24, which the weights bound), then ``(acc + b) * fl(fl(sx * sw) / sy)``, rounded half to
  even and clamped, as MLAS's requantisation;
- add: both fused multiply-adds in float64, where the products are exact and each sum is exact for
  the constants at hand (checked), then rounded to float32 once: a correctly rounded fma;
- a Relu or Clip between either and the quantize is dropped where the quantize saturates there
  anyway, as onnxruntime drops it before fusing (a QDQ ResNet's Conv -> Relu, a MobileNet's ReLU6).

A group's 8-bit output is kept as the float "steps" ``q - zero_point`` for the groups reading it (no
cast to 8 bits and back between two kernels); other readers dequantize its 8-bit form. A group
this cannot take exactly (other dtypes, per-tensor scales where onnxruntime's kernel has them, no
bound, a broadcasting add) keeps the QDQ nodes' float arithmetic. Weights stay integers cast to float
(folded at compile time): a float constant would let Winograd transform the convolution, inexactly.
"""

from __future__ import annotations

import numpy as np
import tvm
import tvm_ffi
from tvm import relax
from tvm.relax import PyExprMutator
from tvm.relax.expr_functor import mutator

from .fake_quant import QUANTIZED_RANGES
from .fold_affine import constant_array, constant_scalar, op_call
from .grouped_conv import conv2d_like
from .integer_matmul import vnni_conv_fits
from .schedules.vnni import has_vnni, vnni_fits
from .strict import own_pass

__all__ = ["QLinearAsOnnxruntime"]

#: float32 holds every integer up to this exactly
_EXACT_F32 = 2**24
_F32 = np.float32


def _lowest_bit(value: float) -> float:
    """The weight of the lowest set bit of a float32 value's significand (inf for 0)."""
    if value == 0:
        return float("inf")
    mantissa, exponent = np.frexp(np.float64(value))
    bits = int(mantissa * 2**24)
    return float(2.0 ** (exponent - 24 + ((bits & -bits).bit_length() - 1)))


def _f64_fma_exact(terms: list[tuple[int, float]], addend: float) -> bool:
    """Whether ``sum(bound * ratio) + addend`` (each product of an integer up to `bound` and a float32
    ratio) is exact in float64 for every operand: its span of bits fits the 53 of the significand."""
    largest = sum(bound * abs(ratio) for bound, ratio in terms) + abs(addend)
    lowest = min([_lowest_bit(ratio) for _, ratio in terms] + [_lowest_bit(addend)])
    return largest == 0 or largest < 2.0**52 * lowest


@mutator
class _Rewrite(PyExprMutator):
    def __init__(self, mod: tvm.IRModule, vnni: bool) -> None:
        super().__init__(mod)
        self.vnni = vnni
        self.steps: set[relax.Var] = set()  # the steps (q - zero point) of the groups rewritten

    # -- reading the graph
    def _bound(self, expr: relax.Expr) -> relax.Expr:
        while isinstance(expr, relax.Var) and self.lookup_binding(expr) is not None:
            expr = self.lookup_binding(expr)
        return expr

    def _dequantized(self, expr: relax.Expr) -> tuple[relax.Expr, float, int] | None:
        """(q, scale, zero point) of a per-tensor dequantize of a float32 result from 8 bits."""
        call = op_call(self._bound(expr), "relax.dequantize")
        if call is None or str(call.attrs.out_dtype) != "float32":
            return None
        q = call.args[0]
        scale, zero = constant_scalar(call.args[1]), constant_scalar(call.args[2])
        if str(getattr(q.ty, "dtype", "")) not in QUANTIZED_RANGES or scale is None or zero is None:
            return None
        return q, scale, int(zero)

    def _group_steps(self, q: relax.Expr, zero: int) -> relax.Expr | None:
        """The steps var behind `q` where a rewritten group made `q` with zero point `zero`."""
        cast = op_call(self._bound(q), "relax.astype")
        shifted = op_call(self._bound(cast.args[0]), "relax.add") if cast is not None else None
        if shifted is None or shifted.args[0] not in self.steps or constant_scalar(shifted.args[1]) != zero:
            return None
        return shifted.args[0]

    def _steps(self, q: relax.Expr, zero: int) -> relax.Expr:
        """``q - zero`` in float32 (exact)."""
        steps = self._group_steps(q, zero)
        if steps is not None:
            return steps
        return relax.op.subtract(relax.op.astype(q, "float32"), relax.const(_F32(zero)))

    def _raw(self, q: relax.Expr, zero: int) -> relax.Expr:
        """`q` (with zero point `zero`) as float32."""
        steps = self._group_steps(q, zero)
        if steps is not None:
            return relax.op.add(steps, relax.const(_F32(zero)))
        return relax.op.astype(q, "float32")

    # -- the rewrites
    def visit_call_(self, op: relax.Call) -> relax.Expr:
        call = super().visit_call_(op)
        if op_call(call, "relax.quantize") is None:
            return call
        x, scale, zero = call.args[0], constant_scalar(call.args[1]), constant_scalar(call.args[2])
        dtype = str(call.attrs.out_dtype)
        if (
            dtype not in QUANTIZED_RANGES
            or getattr(x.ty, "dtype", None) != "float32"
            or scale is None
            or zero is None
            or not (0 < scale < np.inf)
        ):
            return call
        zero = int(zero)
        low, high = QUANTIZED_RANGES[dtype]
        body = self._unclamped(self._bound(x), scale, zero, low, high)
        value = self._requantised(body, _F32(scale))
        if value is not None:
            steps = _clamped(relax.op.round(value), low - zero, high - zero)
        else:
            value = self._added(body, _F32(scale), zero, dtype)
            if value is None:
                return call
            steps = relax.op.subtract(_clamped(relax.op.round(value), low, high), relax.const(_F32(zero)))
        var = self.builder_.emit(steps)
        self.steps.add(var)
        return relax.op.astype(relax.op.add(var, relax.const(_F32(zero))), dtype)

    def _unclamped(self, body: relax.Expr, scale: float, zero: int, low: int, high: int) -> relax.Expr:
        """What a Relu or Clip before the quantize reads, where onnxruntime drops it before fusing the
        conv, matmul or add before it; else `body`. A Relu goes where the quantize's zero point is its
        type's least value (ReluQuantFusion); a Clip where its bounds lie within float32 epsilon of the
        quantize's range or beyond (ClipQuantFusion: the quantize saturates there anyway)."""
        relu = op_call(body, "relax.nn.relu")
        if relu is not None:
            return self._bound(relu.args[0]) if zero == low else body
        bounds = self._clip(body)
        if bounds is None:
            return body
        x, clip_low, clip_high = bounds
        lower, upper = _F32(scale) * _F32(low - zero), _F32(scale) * _F32(high - zero)
        eps = np.finfo(np.float32).eps
        if eps < _F32(clip_low) - lower or eps < upper - _F32(clip_high):
            return body
        return self._bound(x)

    def _clip(self, body: relax.Expr) -> tuple[relax.Expr, float, float] | None:
        """(input, low, high) of an ONNX Clip with constant bounds as the frontend imports it:
        ``minimum(maximum(x, where(isnan(lo), -inf, lo)), where(isnan(hi), inf, hi))``."""
        upper = op_call(body, "relax.minimum")
        lower = op_call(self._bound(upper.args[0]), "relax.maximum") if upper is not None else None
        if lower is None:
            return None
        bounds = [self._clip_bound(lower.args[1]), self._clip_bound(upper.args[1])]
        if None in bounds:
            return None
        return lower.args[0], bounds[0], bounds[1]

    def _clip_bound(self, expr: relax.Expr) -> float | None:
        """The constant `c` of ``where(isnan(c), +-inf, c)``, else None."""
        where = op_call(self._bound(expr), "relax.where")
        isnan = op_call(self._bound(where.args[0]), "relax.isnan") if where is not None else None
        if isnan is None:
            return None
        value = constant_scalar(isnan.args[0])
        return value if value is not None and constant_scalar(where.args[2]) == value else None

    def _requantised(self, body: relax.Expr, out_scale: np.float32) -> relax.Expr | None:
        """``float(acc + b) * (sx * sw / sy)`` of a quantized conv2d or matmul (+ constant int32 bias
        dequantized at scale ``sx * sw``), or None."""
        contraction, bias = body, None
        add = op_call(body, "relax.add")
        if add is not None:
            for this, other in (add.args, add.args[::-1]):
                bias = self._bias(other)
                if bias is not None:
                    contraction = self._bound(this)
                    break
            else:
                return None
        conv = op_call(contraction, "relax.nn.conv2d")
        matmul = op_call(contraction, "relax.matmul")
        call = conv if conv is not None else matmul
        if call is None or str(call.attrs.out_dtype) not in ("", "None", "float32"):
            return None
        activation = self._dequantized(call.args[0])
        weights = self._weights(call.args[1], conv is not None)
        if activation is None or weights is None:
            return None
        q, in_scale, in_zero = activation
        w, w_scale = weights  # conv: [O, I, kh, kw]; matmul: [K, N]
        channels = w.shape[0] if conv is not None else w.shape[1]
        w_scale = np.broadcast_to(w_scale, (channels,)).astype(_F32)
        product_scale = (_F32(in_scale) * w_scale).astype(_F32)
        if bias is None:
            bias = np.zeros(channels, np.int32)
        else:
            bias_values, bias_scale = bias
            if bias_values.shape != (channels,) or np.any(
                np.broadcast_to(bias_scale, (channels,)) != product_scale
            ):
                return None
            bias = bias_values
        multiplier = (product_scale / out_scale).astype(_F32)
        per_channel = (1, channels, 1, 1) if conv is not None else (channels,)
        if conv is not None and str(conv.attrs.data_layout) != "NCHW":
            return None
        accumulated = self._accumulated(call, q, in_zero, w, bias, conv is not None)
        if accumulated is None:
            return None
        return relax.op.multiply(accumulated, relax.const(multiplier.reshape(per_channel)))

    def _bias(self, expr: relax.Expr) -> tuple[np.ndarray, np.ndarray] | None:
        """(int32 values [C], scales) of a bias: a constant int32 vector dequantized with zero point 0,
        maybe reshaped to [1, C, 1, 1]."""
        expr = self._bound(expr)
        reshape = op_call(expr, "relax.reshape")
        if reshape is not None:
            expr = self._bound(reshape.args[0])
        call = op_call(expr, "relax.dequantize")
        if call is None:
            return None
        values, scale, zero = (constant_array(a) for a in call.args)
        if values is None or values.dtype != np.int32 or values.ndim != 1 or scale is None or zero is None:
            return None
        if zero.any():
            return None
        return values, scale.astype(_F32).reshape(-1)

    def _weights(self, expr: relax.Expr, conv: bool) -> tuple[np.ndarray, np.ndarray] | None:
        """(int8 weights, scales per output channel or one) of a dequantized constant weight with
        zero point 0: a conv's [O, I, kh, kw] (scales on axis 0), a matmul's [K, N] (on N; also
        through a transpose of [N, K] with scales on axis 0)."""
        expr = self._bound(expr)
        transposed = op_call(expr, "relax.permute_dims") if not conv else None
        if transposed is not None:
            if [int(a) for a in transposed.attrs.axes or [1, 0]] != [1, 0]:
                return None
            expr = self._bound(transposed.args[0])
        call = op_call(expr, "relax.dequantize")
        if call is None:
            return None
        w, scale, zero = (constant_array(a) for a in call.args)
        if w is None or w.dtype != np.int8 or scale is None or zero is None or zero.any():
            return None
        if not conv and w.ndim != 2 or conv and w.ndim != 4:
            return None
        channel_axis = 0 if conv or transposed is not None else 1
        if scale.size != 1 and (scale.size != w.shape[channel_axis] or int(call.attrs.axis) != channel_axis):
            return None
        if transposed is not None:
            w = w.T
        return np.ascontiguousarray(w), scale.reshape(-1)

    def _accumulated(self, call, q, zero: int, w: np.ndarray, bias: np.ndarray, conv: bool):
        """``float(acc + bias)`` with the integer accumulator exact: int32 on the VNNI kernel where it
        takes the contraction, else float32 where the weights bound every partial sum, else None."""
        per_channel = (1, -1, 1, 1) if conv else (-1,)
        if self._vnni_takes(call, q, w, conv):
            sums = w.astype(np.int64).sum(axis=(1, 2, 3) if conv else 0)
            product = (
                conv2d_like(call, q, relax.const(w), out_dtype="int32")
                if conv
                else relax.op.matmul(q, relax.const(w), out_dtype="int32")
            )
            offset = (bias.astype(np.int64) - zero * sums).astype(np.int32)
            return relax.op.astype(relax.op.add(product, relax.const(offset.reshape(per_channel))), "float32")
        low, high = QUANTIZED_RANGES[str(q.ty.dtype)]
        largest_step = max(zero - low, high - zero)
        magnitudes = np.abs(w.astype(np.int64)).sum(axis=(1, 2, 3) if conv else 0)
        if np.max(largest_step * magnitudes + np.abs(bias.astype(np.int64))) >= _EXACT_F32:
            return None
        weight = relax.op.astype(relax.const(w), "float32")
        steps = self._steps(q, zero)
        product = conv2d_like(call, steps, weight) if conv else relax.op.matmul(steps, weight)
        return relax.op.add(product, relax.const(bias.astype(_F32).reshape(per_channel)))

    def _vnni_takes(self, call, q, w: np.ndarray, conv: bool) -> bool:
        """Whether the uint8 x int8 VNNI kernel takes this contraction (see `integer_matmul`)."""
        if not self.vnni or str(q.ty.dtype) != "uint8":
            return False
        return vnni_conv_fits(call.attrs, w) if conv else vnni_fits(*w.shape)

    def _added(self, body: relax.Expr, out_scale: np.float32, out_zero: int, dtype: str):
        """MLAS's QLinearAdd before rounding, ``fma(a, ra, fma(b, rb, k))`` on the raw 8-bit values, of
        an add of two dequantized tensors of the output's type and one shape; else None."""
        add = op_call(body, "relax.add")
        if add is None:
            return None
        operands = [self._dequantized(a) for a in add.args]
        if any(o is None or str(o[0].ty.dtype) != dtype for o in operands):
            return None
        (qa, sa, za), (qb, sb, zb) = operands
        shapes = [getattr(q.ty, "shape", None) for q in (qa, qb)]
        if not isinstance(shapes[0], relax.ShapeExpr) or not tvm_ffi.structural_equal(*shapes):
            return None  # broadcasting: MLAS folds a scalar operand into its constant another way
        ra, rb = _F32(_F32(sa) / out_scale), _F32(_F32(sb) / out_scale)
        constant = _F32(_F32(out_zero) - _F32(_F32(ra * _F32(za)) + _F32(rb * _F32(zb))))
        low, high = QUANTIZED_RANGES[dtype]
        bound = max(-low, high)
        if not _f64_fma_exact([(bound, rb)], float(constant)) or not _f64_fma_exact(
            [(bound, ra), (bound, rb)], float(constant)
        ):
            return None

        def fma(x, ratio, addend):
            product = relax.op.multiply(relax.op.astype(x, "float64"), relax.const(float(ratio), "float64"))
            return relax.op.astype(relax.op.add(product, addend), "float32")

        inner = fma(self._raw(qb, zb), rb, relax.const(float(constant), "float64"))
        return fma(self._raw(qa, za), ra, relax.op.astype(inner, "float64"))


def _clamped(x: relax.Expr, low: int, high: int) -> relax.Expr:
    return relax.op.minimum(relax.op.maximum(x, relax.const(_F32(low))), relax.const(_F32(high)))


@relax.transform.function_pass(opt_level=0, name="nxrt_tvm.QLinearAsOnnxruntime")
class QLinearAsOnnxruntime:
    """See the module docstring. Runs on the imported module, before `IntegerMatmul`."""

    def __init__(self, target: tvm.target.Target):
        self.vnni = has_vnni(target)

    @own_pass
    def transform_function(self, func: relax.Function, mod: tvm.IRModule, _ctx) -> relax.Function:
        if func.attrs is not None and "Primitive" in func.attrs and int(func.attrs["Primitive"]) != 0:
            return func
        return relax.analysis.remove_all_unused(_Rewrite(mod, self.vnni).visit_expr(func))
