"""3x3 stride-1 convolutions as Winograd F(m x m, 3 x 3): fewer multiplications than any direct schedule.

A direct convolution spends ``9 * C`` multiply-adds per output value; once it
runs near the CPU's fp32 peak (the conv rule does, and so does onnxruntime's
MLAS) only fewer FLOPs make it faster. Winograd's minimal filtering computes
an ``m x m`` output tile from an ``(m + 2) x (m + 2)`` input tile with
``(m + 2)^2`` products per channel pair instead of ``9 m^2`` (F(4x4): 4x fewer,
F(2x2): 2.25x). The convolution becomes three kernels:

1. ``V = B^T d B`` per input tile and channel (`winograd_input`): ``[alpha^2, P, C]``;
2. ``M = V @ U``: ``alpha^2`` matmuls ``[P, C] x [C, K]``, where ``U = G g G^T`` is the
   weight transformed at compile time (a constant, packed like any matmul weight);
3. ``Y = A^T M A`` per output tile (`winograd_output`), NHWC, which the bias,
   activation and residual after the convolution fuse into.

The heavy middle step is an ordinary batch matmul (the `Matmul` rule and
tuning records apply to it); the transforms get the `Winograd` schedule rule.
The transform matrices are TVM's (`topi.nn.winograd_util`, the interpolation
points of Barabasz et al. that keep fp32 error lowest); the error grows with
the tile, so small maps and few channels (where the transforms would cost
more than they save) keep the direct convolution.
"""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax, te, tirx
from tvm.relax.expr_functor import PyExprMutator, mutator
from tvm.topi.nn.winograd_util import _cook_toom_convolution, _interpolation_points

from .fold_affine import constant_array, static_shape
from .strict import own_pass

__all__ = [
    "WinogradConv2D",
    "INPUT_BLOCK",
    "INPUT_ROWS",
    "OUTPUT_BLOCK",
    "OUTPUT_ROWS",
    "PAD_BLOCK",
    "winograd_tile",
]

#: TE stage names the `Winograd` schedule rule recognises its kernels by
INPUT_BLOCK = "winograd_input"
INPUT_ROWS = "winograd_input_rows"
OUTPUT_BLOCK = "winograd_output"
OUTPUT_ROWS = "winograd_output_rows"
PAD_BLOCK = "winograd_pad"

#: `relax.OpPatternKind.kOutEWiseFusable`, which `AnnotateTIROpPattern` keeps where a kernel already has one
_OUT_ELEMWISE_FUSABLE = 4

#: fewer channels than this (in or out) keep the direct convolution: the transforms would dominate
MIN_CHANNELS = 16


def winograd_tile(height: int, width: int) -> int | None:
    """Output tile edge for an ``height x width`` output
    map: 4 (F(4x4, 3x3)) on maps of 12 and more, else None.

    Small maps keep the direct convolution: a 7x7 map has 4 tiles of 4 (or 16 of 2), too
    few rows for the 36 (16) matmuls to run well, and the transformed weights, 4x (1.8x)
    the size of the originals, make a 512-channel layer bandwidth-bound (ResNet's last
    stage measured no faster as F(2x2) and would double its weight memory).
    """
    return 4 if min(height, width) >= 12 else None


def _matrices(m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(A, B, G) of F(m x m, 3 x 3) in float64: ``A``
    (alpha x m), ``B`` (alpha x alpha), ``G`` (alpha x 3)."""
    return _cook_toom_convolution(_interpolation_points(m + 1), m, 3)


def _coefficient(row: np.ndarray, index: tirx.PrimExpr, dtype: str) -> tirx.PrimExpr:
    """``row[index]`` as a select chain over the row's nonzero constants (folds once `index` is unrolled)."""
    value = tirx.const(0.0, dtype)
    for k, c in enumerate(row):
        if c != 0:
            value = tirx.Select(index == k, tirx.const(float(c), dtype), value)
    return value


def _combine(matrix: np.ndarray, column: tirx.PrimExpr, term, dtype: str) -> tirx.PrimExpr:
    """``sum_r matrix[r, column] * term(r)`` over the rows with a nonzero entry, `r` static.

    One factor of a separable transform: each stage sums ``alpha`` terms (``alpha^2`` for the transform in
    one step), so its unrolled kernel is ``alpha / 2`` times smaller, to build and to run."""
    total = None
    for r in range(matrix.shape[0]):
        if matrix[r].any():
            product = _coefficient(matrix[r], column, dtype) * term(r)
            total = product if total is None else total + product
    return total


def _input_transform(x: te.Tensor, m: int, pad: tuple[int, int, int, int]) -> te.Tensor:
    """``V[eps * alpha + nu, p, c] = (B^T d B)[eps, nu]`` over zero-padded input tiles ``d[p]``, as
    ``rows = B^T d`` then ``rows B``."""
    n, h, w, c = (int(v) for v in x.shape)
    top, left, bottom, right = pad
    alpha = m + 2
    tiles_h, tiles_w = math.ceil((h + top + bottom - 2) / m), math.ceil((w + left + right - 2) / m)
    padded = te.compute(
        (n, tiles_h * m + 2, tiles_w * m + 2, c),
        lambda b, y, z, ch: tirx.if_then_else(
            tirx.all(y >= top, y < h + top, z >= left, z < w + left),
            x[b, y - top, z - left, ch],
            tirx.const(0.0, x.dtype),
        ),
        name=PAD_BLOCK,
    )
    _, bmat, _ = _matrices(m)
    per_image = tiles_h * tiles_w

    def row(eps, p, r2, ch):
        b, t = p // per_image, p % per_image
        y, z = t // tiles_w * m, t % tiles_w * m
        return _combine(bmat, eps, lambda r1: padded[b, y + r1, z + r2, ch], x.dtype)

    rows = te.compute((alpha, n * per_image, alpha, c), row, name=INPUT_ROWS)
    return te.compute(
        (alpha * alpha, n * per_image, c),
        lambda e, p, ch: _combine(bmat, e % alpha, lambda r2: rows[e // alpha, p, r2, ch], x.dtype),
        name=INPUT_BLOCK,
    )


def _output_transform(mm: te.Tensor, m: int, n: int, h: int, w: int) -> te.Tensor:
    """``Y[b, y, z, k] = (A^T M[tile(b, y, z)] A)[y % m, z % m]``, as ``rows = M A`` then ``A^T rows``."""
    alpha = m + 2
    amat, _, _ = _matrices(m)
    tiles_w = math.ceil(w / m)
    per_image = math.ceil(h / m) * tiles_w
    tiles, channels = int(mm.shape[1]), int(mm.shape[2])
    rows = te.compute(
        (alpha, tiles, m, channels),
        lambda eps, p, zm, k: _combine(amat, zm, lambda nu: mm[eps * alpha + nu, p, k], mm.dtype),
        name=OUTPUT_ROWS,
    )

    def value(b, y, z, k):
        p = b * per_image + y // m * tiles_w + z // m
        return _combine(amat, y % m, lambda eps: rows[eps, p, z % m, k], mm.dtype)

    return te.compute((n, h, w, channels), value, name=OUTPUT_BLOCK)


def transform_weight(weight: np.ndarray, m: int) -> np.ndarray:
    """HWIO 3x3 weights -> ``U[eps * alpha + nu, c, k] = (G g G^T)[eps, nu]``
    (float64 math, stored as the weight's dtype).

    Two matrix products (`tensordot`), not one three-operand `einsum`, which loops over every index
    at once: 40 against 9 ms for a 256 x 256 layer, 0.4 s of ResNet-50's compile."""
    _, _, gmat = _matrices(m)
    alpha = m + 2
    rows = np.tensordot(gmat, weight.astype(np.float64), axes=([1], [0]))  # [e, b, c, k]
    u = np.tensordot(rows, gmat, axes=([1], [1]))  # [e, c, k, n]
    u = u.transpose(0, 3, 1, 2)  # [e, n, c, k]
    return u.reshape(alpha * alpha, weight.shape[2], weight.shape[3]).astype(weight.dtype)


@mutator
class _Rewriter(PyExprMutator):
    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        #: each distinct transform kernel, made once (see `_call_te`)
        self._kernels: dict[tuple, tuple[tvm.ir.GlobalVar, relax.TensorType]] = {}

    def _call_te(self, key: tuple, make, arg: relax.Expr, *params, name: str) -> relax.Expr:
        """`call_te(make, arg, *params)`, each distinct kernel (`key`) made once: building a transform's
        TE (select chains over its matrices) takes about 20 ms, and a CNN repeats each convolution
        shape several times (ResNet-50: 11 convolutions, 22 transforms, of 6 shapes)."""
        known = self._kernels.get(key)
        if known is not None:
            return relax.call_tir(known[0], relax.Tuple([arg]), known[1])
        call = self.builder_.call_te(make, arg, *params, primfunc_name_hint=name)
        gv = call.args[0]
        # fused like a matmul: the epilogue joins the output transform, and no layout transpose (or any
        # injective producer) joins the input transform, whose rule schedules its stages alone
        self.builder_.update_func(gv, self.builder_.get()[gv].with_attr("op_pattern", _OUT_ELEMWISE_FUSABLE))
        self._kernels[key] = (gv, call.ty_args[0])
        return call

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        rewritten = self._winograd(call)
        return call if rewritten is None else rewritten

    def _constant(self, expr: relax.Expr) -> np.ndarray | None:
        """The value of a constant weight, also through the transpose `ConvertLayout` puts on it (folded
        later) and a broadcast constant (`ConstantOfShape` weights: VGG-19 and SqueezeNet of onnx's
        model data kept every 3x3 convolution direct)."""
        while isinstance(expr, relax.Var) and self.lookup_binding(expr) is not None:
            expr = self.lookup_binding(expr)
        value = constant_array(expr)
        if value is not None:
            return value
        if (
            isinstance(expr, relax.Call)
            and isinstance(expr.op, tvm.ir.Op)
            and expr.op.name == "relax.permute_dims"
        ):
            value = self._constant(expr.args[0])
            if value is not None:
                axes = None if expr.attrs.axes is None else [int(a) for a in expr.attrs.axes]
                return np.transpose(value, axes)
        return None

    def _winograd(self, call: relax.Call) -> relax.Expr | None:
        if not isinstance(call.op, tvm.ir.Op) or call.op.name != "relax.nn.conv2d":
            return None
        data, weight = call.args
        attrs = call.attrs
        if (
            attrs.data_layout != "NHWC"
            or attrs.kernel_layout != "HWIO"
            or attrs.out_layout != "NHWC"
            or int(attrs.groups) != 1
            or any(int(s) != 1 for s in attrs.strides)
            or any(int(d) != 1 for d in attrs.dilation)
        ):
            return None
        kernel = self._constant(weight)
        dtype = call.ty.dtype
        if kernel is None or dtype != "float32" or data.ty.dtype != dtype or kernel.dtype != np.float32:
            return None
        in_shape, out_shape = static_shape(data.ty.shape), static_shape(call.ty.shape)
        if in_shape is None or out_shape is None or kernel.shape[:2] != (3, 3):
            return None
        n, h_out, w_out, channels_out = out_shape
        if min(in_shape[3], channels_out) < MIN_CHANNELS or in_shape[3] % 4 or channels_out % 4:
            return None  # odd channel counts would vectorise the transforms with a masked tail (see its rule)
        m = winograd_tile(h_out, w_out)
        if m is None:
            return None
        pad = tuple(int(p) for p in attrs.padding)
        v = self.builder_.emit(
            self._call_te(
                (INPUT_BLOCK, in_shape, dtype, m, pad), _input_transform, data, m, pad, name=INPUT_BLOCK
            )
        )
        u = relax.const(transform_weight(kernel, m))
        mm = self.builder_.emit(relax.op.matmul(v, u))
        key = (OUTPUT_BLOCK, in_shape[0], h_out, w_out, channels_out, dtype, m)
        return self._call_te(key, _output_transform, mm, m, n, h_out, w_out, name=OUTPUT_BLOCK)


@tvm.transform.module_pass(opt_level=0, name="nxrt_tvm.WinogradConv2D")
@own_pass
def WinogradConv2D(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:  # noqa: N802 - a TVM pass
    """Rewrite NHWC/HWIO float32 3x3 stride-1 convolutions
    with constant weights (run after `ConvertLayout`)."""
    rewriter = _Rewriter(mod)
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            rewriter.builder_.update_func(gv, rewriter.visit_expr(func))
    return rewriter.builder_.get()
