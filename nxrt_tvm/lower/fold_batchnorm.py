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
from tvm.relax.expr_functor import PyExprMutator, mutator

from .strict import own_pass

__all__ = ["FoldBatchNormIntoConv", "constant_array"]


def _op_call(expr: relax.Expr | None, name: str) -> relax.Call | None:
    """`expr` where it is a call of the Relax op `name`, else None."""
    return (
        expr
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == name
        else None
    )


def constant_array(expr: relax.Expr) -> np.ndarray | None:
    """A constant's value, a broadcast constant (ConstantOfShape weights) as its full array; None for
    anything computed at run time."""
    if isinstance(expr, tvm.ir.GenericConst):
        return expr.value.numpy()
    broadcast = _op_call(expr, "relax.broadcast_to")
    if (
        broadcast is not None
        and isinstance(broadcast.args[0], tvm.ir.GenericConst)
        and isinstance(broadcast.args[1], relax.ShapeExpr)
        and all(isinstance(d, tvm.tirx.IntImm) for d in broadcast.args[1].values)
    ):
        return np.broadcast_to(broadcast.args[0].value.numpy(), [int(d) for d in broadcast.args[1].values])
    return None


@mutator
class _Folder(PyExprMutator):
    """Replaces ``batch_norm(conv2d(x, W) [+ b])[0]`` by ``conv2d(x, W') + b'`` (module doc).

    A walk over the bindings, not TVM's pattern rewriter (`rewrite_call`), which took 0.45 s of
    ResNet-50's compile matching the pattern's alternatives at every node."""

    def _value(self, expr: relax.Expr) -> relax.Expr:
        bound = self.lookup_binding(expr) if isinstance(expr, relax.Var) else None
        return expr if bound is None else bound

    def visit_tuple_getitem_(self, op: relax.TupleGetItem) -> relax.Expr:
        op = super().visit_tuple_getitem_(op)
        norm = _op_call(self._value(op.tuple_value), "relax.nn.batch_norm") if op.index == 0 else None
        if norm is None:
            return op
        stats = [constant_array(a) for a in norm.args[1:5]]
        source = self._value(norm.args[0])
        bias = None
        add = _op_call(source, "relax.add")
        if add is not None:
            conv = _op_call(self._value(add.args[0]), "relax.nn.conv2d")
            shaped = add.args[1]
            reshape = _op_call(self._value(shaped), "relax.reshape")
            bias = constant_array(reshape.args[0] if reshape is not None else shaped)
            if bias is None:
                return op
        else:
            conv = _op_call(source, "relax.nn.conv2d")
        if conv is None or any(a is None for a in stats):
            return op
        weight = constant_array(self._value(conv.args[1]))
        folded = _fold(conv, norm, weight, stats, bias)
        if folded is None:
            return op
        new_weight, shift = folded
        out = self.builder_.emit(relax.Call(conv.op, [conv.args[0], relax.const(new_weight)], conv.attrs))
        return relax.op.add(out, relax.const(shift))


def _fold(conv: relax.Call, norm: relax.Call, weight, stats, bias) -> tuple[np.ndarray, np.ndarray] | None:
    """(W', b') for float32 NCHW/OIHW and a per-output-channel inference norm; None otherwise."""
    attrs, bn = conv.attrs, norm.attrs
    if (
        weight is None
        or bn.training
        or int(bn.axis) != 1
        or attrs.data_layout != "NCHW"
        or attrs.kernel_layout != "OIHW"
        or attrs.out_layout != "NCHW"
        or weight.dtype != np.float32
        or conv.ty.dtype != "float32"
    ):
        return None
    channels = weight.shape[0]
    gamma, beta, mean, var = (a.astype(np.float64) for a in stats)
    bias = bias.astype(np.float64) if bias is not None else np.zeros(channels)
    if any(a.size != channels for a in (gamma, beta, mean, var, bias)):
        return None  # a bias or statistic that broadcasts otherwise: not a per-channel affine map
    scale = gamma / np.sqrt(var + float(bn.epsilon))
    new_weight = (weight.astype(np.float64) * scale.reshape(-1, 1, 1, 1)).astype(np.float32)
    shift = ((bias.reshape(-1) - mean) * scale + beta).astype(np.float32).reshape(1, channels, 1, 1)
    return new_weight, shift


@tvm.transform.module_pass(opt_level=0, name="nxrt_tvm.FoldBatchNormIntoConv")
@own_pass
def FoldBatchNormIntoConv(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:  # noqa: N802 - a TVM pass
    """``batch_norm(conv2d(x, W) [+ b])[0]`` -> ``conv2d(x, W') + b'`` for float32 NCHW/OIHW, inference
    mode; the norm and the old convolution go where nothing else reads them."""
    folder = _Folder(mod)
    changed = False
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function) and not (
            func.attrs is not None and "Primitive" in func.attrs and int(func.attrs["Primitive"]) != 0
        ):
            new = folder.visit_expr(func)
            if not new.same_as(func):
                folder.builder_.update_func(gv, relax.analysis.remove_all_unused(new))
                changed = True
    return folder.builder_.get() if changed else mod
