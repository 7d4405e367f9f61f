"""Quantize and dequantize in the convolutions' layout, so a QDQ model's fake quantisation fuses
into the conv before it.

TVM's layout conversion has no rule for `quantize`/`dequantize`: in a QDQ model (every activation
``DequantizeLinear(QuantizeLinear(x))``) it kept each pair in NCHW, between an NHWC->NCHW and an
NCHW->NHWC transpose, one kernel of two transposes and the pair per activation (MobileNetV2-int8:
34 of them), and the residual sums of two dequantised values with them. Both are elementwise,
reading their scale and zero point along one axis, so a transpose before one moves after it, that
axis renamed: ``q(permute(x, p), axis=a) == permute(q(x, axis=p[a]), p)``. Moved there, it meets
the transpose back and both go (``permute(permute(x, p), p^-1) == x``), and the pair is the conv's
epilogue. A sum of two operands transposed alike moves the same way.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, rewrite_call, wildcard

from .strict import own_pass

__all__ = ["QdqInConvLayout"]

_QDQ = {"relax.quantize": relax.op.quantize, "relax.dequantize": relax.op.dequantize}
#: elementwise ops of two same-shaped operands (a QDQ model's residual sum of two dequantized values)
_BINARY = {
    "relax.add": relax.op.add,
    "relax.subtract": relax.op.subtract,
    "relax.multiply": relax.op.multiply,
    "relax.maximum": relax.op.maximum,
    "relax.minimum": relax.op.minimum,
}
#: rewrites until nothing moves: each moved permute may meet another to cancel or to move with
_MAX_ROUNDS = 8


def _axes(call: relax.Call) -> list[int] | None:
    """A permute_dims call's axes (its attribute may be None: reversed), None where its rank is unknown."""
    ndim = getattr(call.args[0].ty, "ndim", -1)
    if ndim < 0:
        return None
    axes = call.attrs.axes
    return list(reversed(range(ndim))) if axes is None else [int(a) % ndim for a in axes]


@relax.transform.function_pass(opt_level=0, name="nxrt_tvm.QdqInConvLayout")
class QdqInConvLayout:
    """``q(permute(x, p), axis=a)`` -> ``permute(q(x, axis=p[a]), p)`` for quantize and dequantize,
    ``f(permute(x, p), permute(y, p))`` -> ``permute(f(x, y), p)`` for elementwise `f` of two operands,
    and ``permute(permute(x, p), r)`` -> ``x`` (or one permute); run after the layout conversion."""

    def __init__(self) -> None:
        self.moved = wildcard()
        self.permuted = is_op("relax.permute_dims")(self.moved)
        scale, zero_point = wildcard(), wildcard()
        self.qdq = is_op("relax.quantize")(self.permuted, scale, zero_point) | is_op("relax.dequantize")(
            self.permuted, scale, zero_point
        )
        self.lhs, self.rhs = wildcard(), wildcard()
        self.left = is_op("relax.permute_dims")(self.lhs)
        self.right = is_op("relax.permute_dims")(self.rhs)
        binary = [is_op(op)(self.left, self.right) for op in _BINARY]
        self.binary = binary[0]
        for pattern in binary[1:]:
            self.binary |= pattern
        self.inner = wildcard()
        self.first = is_op("relax.permute_dims")(self.inner)
        self.twice = is_op("relax.permute_dims")(self.first)

    @own_pass
    def transform_function(self, func: relax.Function, _mod: tvm.IRModule, _ctx) -> relax.Function:
        if func.attrs is not None and "Primitive" in func.attrs and int(func.attrs["Primitive"]) != 0:
            return func
        for _ in range(_MAX_ROUNDS):
            before = func
            func = rewrite_call(self.qdq, self._move, func)
            func = rewrite_call(self.binary, self._move_binary, func)
            func = rewrite_call(self.twice, self._compose, func)
            if func.same_as(before):
                break
        return func

    def _move(self, call: relax.Call, matches) -> relax.Expr:
        axes = _axes(matches[self.permuted])
        if axes is None:
            return call
        attrs = call.attrs
        axis = axes[int(attrs.axis) % len(axes)]
        moved = _QDQ[call.op.name](
            matches[self.moved], call.args[1], call.args[2], axis=axis, out_dtype=str(attrs.out_dtype)
        )
        return relax.op.permute_dims(moved, axes)

    def _move_binary(self, call: relax.Call, matches) -> relax.Expr:
        left, right = matches[self.left], matches[self.right]
        axes = _axes(left)
        if axes is None or axes != _axes(right):
            return call
        return relax.op.permute_dims(_BINARY[call.op.name](matches[self.lhs], matches[self.rhs]), axes)

    def _compose(self, call: relax.Call, matches) -> relax.Expr:
        outer, inner = _axes(call), _axes(matches[self.first])
        if outer is None or inner is None:
            return call
        composed = [inner[a] for a in outer]
        if composed == list(range(len(composed))):
            return matches[self.inner]
        return relax.op.permute_dims(matches[self.inner], composed)
