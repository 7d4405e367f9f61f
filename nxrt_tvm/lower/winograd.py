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

from .fold_affine import constant_array
from .strict import own_pass

__all__ = ["WinogradConv2D", "INPUT_BLOCK", "OUTPUT_BLOCK", "PAD_BLOCK", "winograd_tile"]

#: TE stage names the `Winograd` schedule rule recognises its kernels by
INPUT_BLOCK = "winograd_input"
OUTPUT_BLOCK = "winograd_output"
PAD_BLOCK = "winograd_pad"

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


def _const(matrix: np.ndarray, row, col, dtype: str) -> tirx.PrimExpr:
    """``matrix[row, col]`` as a select chain over constants (folds away once the loops are unrolled)."""
    value = tirx.const(0.0, dtype)
    for r in range(matrix.shape[0]):
        for c in range(matrix.shape[1]):
            if matrix[r, c] != 0:
                value = tirx.Select(
                    tirx.all(row == r, col == c), tirx.const(float(matrix[r, c]), dtype), value
                )
    return value


def _input_transform(x: te.Tensor, m: int, pad: tuple[int, int, int, int]) -> te.Tensor:
    """``V[eps * alpha + nu, p, c] = sum B[r1, eps] B[r2, nu] d[p][r1, r2, c]``
    over zero-padded input tiles."""
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
    r1 = te.reduce_axis((0, alpha), "r1")
    r2 = te.reduce_axis((0, alpha), "r2")
    per_image = tiles_h * tiles_w

    def value(e, p, ch):
        eps, nu = e // alpha, e % alpha
        b, t = p // per_image, p % per_image
        y, z = t // tiles_w * m, t % tiles_w * m
        return te.sum(
            _const(bmat, r1, eps, x.dtype) * _const(bmat, r2, nu, x.dtype) * padded[b, y + r1, z + r2, ch],
            axis=[r1, r2],
        )

    return te.compute((alpha * alpha, n * per_image, c), value, name=INPUT_BLOCK)


def _output_transform(mm: te.Tensor, m: int, n: int, h: int, w: int) -> te.Tensor:
    """``Y[b, y, z, k] = sum A[eps, y % m] A[nu, z % m] M[eps * alpha + nu, tile(b, y, z), k]``."""
    alpha = m + 2
    amat, _, _ = _matrices(m)
    tiles_w = math.ceil(w / m)
    per_image = math.ceil(h / m) * tiles_w
    eps = te.reduce_axis((0, alpha), "eps")
    nu = te.reduce_axis((0, alpha), "nu")

    def value(b, y, z, k):
        p = b * per_image + y // m * tiles_w + z // m
        return te.sum(
            _const(amat, eps, y % m, mm.dtype)
            * _const(amat, nu, z % m, mm.dtype)
            * mm[eps * alpha + nu, p, k],
            axis=[eps, nu],
        )

    return te.compute((n, h, w, int(mm.shape[2])), value, name=OUTPUT_BLOCK)


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


def _static(shape) -> tuple[int, ...] | None:
    if not isinstance(shape, relax.ShapeExpr) or not all(isinstance(v, tirx.IntImm) for v in shape.values):
        return None
    return tuple(int(v) for v in shape.values)


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
        self._kernels[key] = (call.args[0], call.ty_args[0])
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
        in_shape, out_shape = _static(data.ty.shape), _static(call.ty.shape)
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
