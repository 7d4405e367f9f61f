"""Elementwise ops between NHWC convolutions run in NHWC, so they fuse into the conv before them.

TVM's layout conversion keeps in NCHW every op it has no layout rule for, between an NHWC->NCHW and
an NCHW->NHWC transpose: `quantize`/`dequantize` (a QDQ model's pair on every activation:
MobileNetV2-int8 ran 34 kernels of two transposes and the pair), and binary ops whose other operand
does not have the tensor's rank (PP-OCR's hardswish and learnable affine blocks: ``x + 3``,
``clip``, ``* s + b`` by one-element constants, a transposed kernel after each conv, 7 % of its run).
An elementwise op commutes with a transpose: ``f(permute(x, p)) == permute(f(x), p)``, the other
operand transposed back where it has one value per element (``p^-1``; a constant at compile time,
one value or both operands transposed alike as they are), a quantisation axis renamed (``p[a]``).
So one walk over the bindings moves each transpose past the elementwise ops after it, where it meets
the transpose back to NHWC and both go (``permute(permute(x, p), p^-1) == x``).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax import PyExprMutator
from tvm.relax.expr_functor import mutator

from .fold_affine import constant_array, op_call, static_shape
from .strict import own_pass

__all__ = ["sink_transposes"]

#: elementwise ops of one tensor (others' operands are attributes or scalars)
_UNARY = frozenset(
    {
        "relax.abs",
        "relax.astype",
        "relax.ceil",
        "relax.clip",
        "relax.erf",
        "relax.exp",
        "relax.floor",
        "relax.negative",
        "relax.nn.gelu",
        "relax.nn.relu",
        "relax.nn.silu",
        "relax.round",
        "relax.sigmoid",
        "relax.sqrt",
        "relax.tanh",
    }
)
#: elementwise ops of two tensors, broadcasting
_BINARY = frozenset(
    {
        "relax.add",
        "relax.divide",
        "relax.maximum",
        "relax.minimum",
        "relax.multiply",
        "relax.power",
        "relax.subtract",
    }
)
_QDQ = {"relax.quantize": relax.op.quantize, "relax.dequantize": relax.op.dequantize}


def _axes(call: relax.Call) -> list[int] | None:
    """A permute_dims call's axes (its attribute may be None: reversed), None where its rank is unknown."""
    ndim = getattr(call.args[0].ty, "ndim", -1)
    if ndim < 0:
        return None
    axes = call.attrs.axes
    return list(reversed(range(ndim))) if axes is None else [int(a) % ndim for a in axes]


@mutator
class _Sink(PyExprMutator):
    """Rewrites ``f(permute(x, p), ...)`` to ``permute(f(x, ...), p)`` in binding order (so a chain moves
    in one walk), and ``permute(permute(x, p), r)`` to ``x`` or one permute."""

    def _permuted(self, expr: relax.Expr) -> tuple[relax.Expr, list[int]] | None:
        """``(x, p)`` where `expr` is bound to ``permute_dims(x, p)`` of known rank."""
        bound = op_call(
            self.lookup_binding(expr) if isinstance(expr, relax.Var) else None, "relax.permute_dims"
        )
        if bound is None:
            return None
        axes = _axes(bound)
        return None if axes is None else (bound.args[0], axes)

    def visit_call_(self, op: relax.Call) -> relax.Expr:
        call = super().visit_call_(op)
        name = call.op.name if isinstance(call.op, tvm.ir.Op) else None
        if name == "relax.permute_dims":
            return self._compose(call)
        if name not in _UNARY and name not in _BINARY and name not in _QDQ:
            return call
        found = self._permuted(call.args[0])
        if name in _BINARY:
            found = found or self._permuted(call.args[1])
        if found is None:
            return call
        axes = found[1]
        args = [self._unpermuted(a, axes) for a in call.args] if name in _BINARY else [found[0]]
        if any(a is None for a in args):
            return call
        if name in _QDQ:
            attrs = call.attrs
            axis = axes[int(attrs.axis) % len(axes)]
            inner = _QDQ[name](*args, *call.args[1:], axis=axis, out_dtype=str(attrs.out_dtype))
        else:
            inner = relax.Call(call.op, args + list(call.args[len(args) :]), call.attrs, call.ty_args)
        return relax.op.permute_dims(self.builder_.emit(inner), axes)

    def _unpermuted(self, operand: relax.Expr, axes: list[int]) -> relax.Expr | None:
        """`operand` as the other operand of the op moved past ``permute(., axes)``: as it is where it
        broadcasts alike in both layouts (one value), else transposed back; None where it cannot be."""
        found = self._permuted(operand)
        if found is not None:
            return found[0] if found[1] == axes else None
        if getattr(operand.ty, "ndim", -1) == 0:
            return operand
        shape = static_shape(getattr(operand.ty, "shape", None))
        if shape is None or len(shape) > len(axes):
            return None
        if all(d == 1 for d in shape):
            return operand
        value = constant_array(operand)
        if value is None:
            return None
        full = value.reshape([1] * (len(axes) - value.ndim) + list(value.shape))
        return relax.const(np.ascontiguousarray(np.transpose(full, np.argsort(axes))))

    def _compose(self, call: relax.Call) -> relax.Expr:
        found, outer = self._permuted(call.args[0]), _axes(call)
        if found is None or outer is None:
            return call
        source, inner = found
        composed = [inner[a] for a in outer]
        if composed == list(range(len(composed))):
            return source
        return relax.op.permute_dims(source, composed)


def sink_transposes() -> tvm.transform.Pass:
    """Transposes moved past the elementwise ops after them (module doc); run after the layout
    conversion. The transposes nothing reads any more are dropped, and the bindings of one variable to
    another that cancelled transposes leave are resolved: fusion stops at such an alias (PP-OCR's
    hardswish stayed out of its conv, in two kernels of its own)."""

    @tvm.transform.module_pass(opt_level=0, name="nxrt_tvm.SinkTransposes")
    @own_pass
    def sink(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        mutator = _Sink(mod)
        for gv, func in mod.functions_items():
            primitive = func.attrs is not None and int(func.attrs.get("Primitive", 0)) != 0
            if isinstance(func, relax.Function) and not primitive:
                sunk = relax.analysis.remove_all_unused(mutator.visit_expr(func))
                mutator.builder_.update_func(gv, sunk)
        return relax.transform.CanonicalizeBindings()(mutator.builder_.get())

    return sink
