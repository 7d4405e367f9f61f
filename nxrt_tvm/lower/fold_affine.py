"""Per-channel affine maps after a convolution folded into its weights and bias, as onnxruntime's
ConvBNFusion, ConvMulFusion and ConvAddFusion do.

Exported CNNs keep ``Conv -> BatchNormalization`` as two ops; left apart, the
normalisation is a separate kernel that reads and writes the whole activation
again. With constant weights and statistics it is a per-output-channel scale
and shift, so it folds into the convolution's weights and bias at compile time
(``W' = W * s``, ``b' = b * s + t``; a norm's ``s = gamma / sqrt(var + eps)``,
``t = beta - mean * s``), and the convolution rule's epilogue takes the shift and
the activation after it. A ``Mul`` or ``Add`` by a per-channel constant (Caffe2
converts write one after each norm: Inception v2) folds the same way; left apart,
its ``[C, 1, 1]`` operand also stopped the NHWC layout at the convolution, so
Inception v2 transposed every activation back and ran its pooling in NCHW.

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

__all__ = ["FoldAffineIntoConv", "constant_array", "op_call", "static_shape"]


def op_call(expr: relax.Expr | None, name: str) -> relax.Call | None:
    """`expr` where it is a call of the Relax op `name`, else None."""
    return (
        expr
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == name
        else None
    )


def static_shape(shape) -> tuple[int, ...] | None:
    """A Relax shape's dims where every one is a number; None for a symbolic or unknown shape."""
    if not isinstance(shape, relax.ShapeExpr):
        return None
    if not all(isinstance(v, tvm.tirx.IntImm) for v in shape.values):
        return None
    return tuple(int(v) for v in shape.values)


def constant_array(expr: relax.Expr) -> np.ndarray | None:
    """A constant's value, a broadcast constant (ConstantOfShape weights) as its full array; None for
    anything computed at run time."""
    if isinstance(expr, tvm.ir.GenericConst):
        return expr.value.numpy()
    broadcast = op_call(expr, "relax.broadcast_to")
    if (
        broadcast is not None
        and isinstance(broadcast.args[0], tvm.ir.GenericConst)
        and isinstance(broadcast.args[1], relax.ShapeExpr)
        and all(isinstance(d, tvm.tirx.IntImm) for d in broadcast.args[1].values)
    ):
        return np.broadcast_to(broadcast.args[0].value.numpy(), [int(d) for d in broadcast.args[1].values])
    return None


def constant_scalar(expr: relax.Expr) -> float | int | None:
    """A constant's single value (a scalar or a one-element tensor), else None."""
    value = constant_array(expr)
    return None if value is None or value.size != 1 else value.reshape(()).item()


@mutator
class _Folder(PyExprMutator):
    """Replaces ``affine(conv2d(x, W) [+ b])`` by ``conv2d(x, W') + b'`` (module doc), where `affine`
    is an inference ``batch_norm`` or a ``multiply`` or ``add`` by a per-channel constant.

    A walk over the bindings, not TVM's pattern rewriter (`rewrite_call`), which took 0.45 s of
    ResNet-50's compile matching the pattern's alternatives at every node."""

    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.uses: dict[relax.Var, int] = {}  # of the function being visited (`start`)
        self.bound: dict = {}

    def start(self, func: relax.Function) -> None:
        """Read the uses and bindings of the original `func`, before the walk rewrites it."""
        self.uses, self.bound = _use_counts(func), relax.analysis.get_var2val(func)

    def _value(self, expr: relax.Expr) -> relax.Expr:
        bound = self.lookup_binding(expr) if isinstance(expr, relax.Var) else None
        return expr if bound is None else bound

    def _exclusive(self, expr: relax.Expr) -> bool:
        """Whether the original `expr`, and the conv under its bias add, are read only by the op being
        folded: else the old conv still runs beside the new one (hardswish reads its conv's output
        twice: MobileNetV3 computed each such conv twice, its bias with the + 3 and without)."""
        if not isinstance(expr, relax.Var) or self.uses.get(expr, 0) != 1:
            return False
        add = op_call(self.bound.get(expr), "relax.add")
        inner = add.args[0] if add is not None else None
        return not isinstance(inner, relax.Var) or self.uses.get(inner, 0) == 1

    def _biased_conv(self, expr: relax.Expr) -> tuple[relax.Call, np.ndarray | None] | None:
        """``(conv, b)`` where `expr` is ``conv2d(x, W) [+ b]`` with a constant bias (None: no bias)."""
        source = self._value(expr)
        add = op_call(source, "relax.add")
        if add is None:
            conv = op_call(source, "relax.nn.conv2d")
            return None if conv is None else (conv, None)
        conv = op_call(self._value(add.args[0]), "relax.nn.conv2d")
        bias = constant_array(add.args[1])
        reshape = op_call(self._value(add.args[1]), "relax.reshape")
        if reshape is not None and isinstance(reshape.args[1], relax.ShapeExpr):  # the import's [1, C, 1, 1]
            source = constant_array(reshape.args[0])
            shape = reshape.args[1].values
            if source is not None and all(isinstance(d, tvm.tirx.IntImm) for d in shape):
                bias = source.reshape([int(d) for d in shape])
        return None if conv is None or bias is None else (conv, bias)

    def _fold(self, source: relax.Expr, affine) -> relax.Expr | None:
        """``conv2d(x, W * s) + (b * s + t)`` for ``(s, t) = affine(channels)`` applied to `source`;
        None where `source` is not a foldable convolution or `affine` is not per channel."""
        found = self._biased_conv(source)
        if found is None:
            return None
        conv, bias = found
        weight = constant_array(self._value(conv.args[1]))
        if not _foldable(conv, weight):
            return None
        channels = weight.shape[0]
        scale_shift = affine(channels)
        if scale_shift is None:
            return None
        scale, shift = scale_shift
        bias = np.zeros(channels) if bias is None else _per_channel(bias, channels)
        if bias is None:
            return None  # a bias that broadcasts otherwise: not a per-channel affine map
        new_weight = (weight.astype(np.float64) * scale.reshape(-1, 1, 1, 1)).astype(np.float32)
        new_bias = (bias * scale + shift).astype(np.float32).reshape(1, channels, 1, 1)
        out = self.builder_.emit(relax.Call(conv.op, [conv.args[0], relax.const(new_weight)], conv.attrs))
        return relax.op.add(out, relax.const(new_bias))

    def visit_tuple_getitem_(self, op: relax.TupleGetItem) -> relax.Expr:
        original = op_call(self.bound.get(op.tuple_value), "relax.nn.batch_norm")
        op = super().visit_tuple_getitem_(op)
        norm = op_call(self._value(op.tuple_value), "relax.nn.batch_norm") if op.index == 0 else None
        if norm is None or original is None or not self._exclusive(original.args[0]):
            return op
        folded = self._fold(norm.args[0], lambda channels: _norm_affine(norm, channels))
        return op if folded is None else folded

    def visit_call_(self, op: relax.Call) -> relax.Expr:
        multiply = op_call(op, "relax.multiply") is not None
        if not multiply and op_call(op, "relax.add") is None:
            return super().visit_call_(op)
        exclusive = [self._exclusive(a) for a in op.args]  # of the original operands, before the rewrite
        op = super().visit_call_(op)
        for (source, operand), alone in zip((op.args, op.args[::-1]), exclusive):
            value = constant_array(operand)
            if value is None or value.dtype != np.float32 or not alone:
                continue
            if not multiply and op_call(self._value(source), "relax.nn.conv2d") is not None:
                return op  # conv2d(x, W) + b: already the folded form

            def affine(channels: int, value=value):
                vector = _per_channel(value, channels)
                if vector is None:
                    return None
                return (vector, np.zeros(channels)) if multiply else (np.ones(channels), vector)

            folded = self._fold(source, affine)
            if folded is not None:
                return folded
        return op


def _use_counts(func: relax.Function) -> dict[relax.Var, int]:
    """How many times each variable of `func` is read (as an operand, a tuple field or the result)."""
    uses: dict[relax.Var, int] = {}

    def visit(expr: relax.Expr) -> None:
        if isinstance(expr, relax.Call):
            read = list(expr.args)
        elif isinstance(expr, relax.Tuple):
            read = list(expr.fields)
        elif isinstance(expr, relax.TupleGetItem):
            read = [expr.tuple_value]
        elif isinstance(expr, relax.SeqExpr):
            read = [expr.body]
        else:
            return
        for var in read:
            if isinstance(var, relax.Var):
                uses[var] = uses.get(var, 0) + 1

    relax.analysis.post_order_visit(func, visit)
    return uses


def _foldable(conv: relax.Call, weight: np.ndarray | None) -> bool:
    """Whether `conv` is a float32 NCHW/OIHW convolution by the constant `weight`."""
    attrs = conv.attrs
    return (
        weight is not None
        and attrs.data_layout == "NCHW"
        and attrs.kernel_layout == "OIHW"
        and attrs.out_layout == "NCHW"
        and weight.dtype == np.float32
        and conv.ty.dtype == "float32"
    )


def _per_channel(value: np.ndarray, channels: int) -> np.ndarray | None:
    """`value` (float64) as one number per channel of an NCHW output when, broadcast against it, it
    varies along the channels alone (``[C, 1, 1]``, ``[1, C, 1, 1]``, a scalar); else None."""
    if value.ndim > 4:
        return None
    shape = (1,) * (4 - value.ndim) + value.shape
    if shape[0] != 1 or shape[2:] != (1, 1) or shape[1] not in (1, channels):
        return None
    return np.broadcast_to(value.astype(np.float64).reshape(-1), (channels,))


def _norm_affine(norm: relax.Call, channels: int) -> tuple[np.ndarray, np.ndarray] | None:
    """A per-channel inference norm's ``(s, t)``: ``s = gamma / sqrt(var + eps)``, ``t = beta - mean * s``."""
    attrs = norm.attrs
    stats = [constant_array(a) for a in norm.args[1:5]]
    if attrs.training or int(attrs.axis) != 1 or any(a is None or a.size != channels for a in stats):
        return None
    gamma, beta, mean, var = (a.astype(np.float64) for a in stats)
    scale = gamma / np.sqrt(var + float(attrs.epsilon))
    return scale, beta - mean * scale


@tvm.transform.module_pass(opt_level=0, name="nxrt_tvm.FoldAffineIntoConv")
@own_pass
def FoldAffineIntoConv(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:  # noqa: N802 - a TVM pass
    """``affine(conv2d(x, W) [+ b])`` -> ``conv2d(x, W') + b'`` for float32 NCHW/OIHW, where `affine` is
    an inference norm or a multiply or add by a per-channel constant; the old ops go where nothing
    else reads them."""
    folder = _Folder(mod)
    changed = False
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function) and not (
            func.attrs is not None and "Primitive" in func.attrs and int(func.attrs["Primitive"]) != 0
        ):
            folder.start(func)
            new = folder.visit_expr(func)
            if not new.same_as(func):
                folder.builder_.update_func(gv, relax.analysis.remove_all_unused(new))
                changed = True
    return folder.builder_.get() if changed else mod
