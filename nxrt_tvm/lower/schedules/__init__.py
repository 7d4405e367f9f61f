"""Default CPU schedules: untuned kernels that use the host's vector width and cores.

Rules in the spirit of `tvm.s_tir.dlight`, one module per family, tried in
order on every PrimFunc after fusion; the first that fits schedules it, a
function no rule fits (or a rule that fails on it) keeps TVM's default:

=================  ==========================================================
`Winograd`         the input and output transforms of Winograd convolutions (unrolled, channel vectors)
`MatmulVnni`       uint8 x int8 matmul and convolution with constant weights on AVX-512 VNNI
                   (``vpdpbusd`` tiles)
`Conv`             convolution, NHWC (padding as its own loop, register tile, epilogue); depthwise with
                   output pixels as the tile's rows
`Matmul`           matmul, dense, batch matmul (+ bias/activation epilogue)
`Pooling`          max/average pooling, single-input reductions
`RowReduction`     softmax-like chains of last-axis reductions (vectorised partial reductions per row; any
                   row count, widths of a vector or more, rows ending in part of one padded)
`Normalization`    what is left of softmax, layer norm, RMS norm (dlight's CPU Reduction)
`Transpose`        transposes (the output's innermost axis strided in the moved tensor, reshapes seen
                   through): tiles read along the input's contiguous axis, written along the output's
`Injective`        elementwise, broadcast, reshape, and transposes no tile divides
`Generic`          anything else (symbolic extents, reductions over any axis, index kernels): parallel
                   leading spatial loops, exact inner vectors
=================  ==========================================================

``cpu_schedule_passes(target)`` is the schedule phase (after FuseTIR);
``pre_legalize_passes(target)`` runs before legalisation (BatchNorm folded into convolutions,
fast exp/erf/tanh where the precision policy allows, NHWC convolutions).
Replace or extend either list through `lowering_passes(..., schedule_passes=...)`.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, rewrite_call, wildcard

from ..conv1d import Conv1dAsConv2d
from ..conv_transpose import ConvTransposeAsMatmul
from ..fake_quant import FakeQuantAsFloat
from ..fold_affine import FoldAffineIntoConv
from ..fold_constants import FoldConstantLayouts
from ..grouped_conv import SplitGroupedConv, conv2d_like
from ..precision import PreciseFastMath
from ..sink_transposes import sink_transposes
from ..strict import own_pass
from ..winograd import WinogradConv2D
from .base import RULE_ATTR, ApplySchedules, CpuRule, schedule_with_rules
from .conv import Conv
from .generic import Generic
from .injective import Injective
from .matmul import Matmul
from .reduction import FullReduction, Normalization, Pooling, RowReduction
from .transpose import Transpose
from .vnni import MatmulVnni
from .winograd import Winograd

__all__ = [
    "CONV_ALGORITHMS",
    "cpu_schedule_passes",
    "pre_legalize_passes",
    "default_rules",
    "ApplySchedules",
    "schedule_with_rules",
    "CpuRule",
    "RULE_ATTR",
    "Conv",
    "Matmul",
    "MatmulVnni",
    "Pooling",
    "FullReduction",
    "RowReduction",
    "Normalization",
    "Transpose",
    "Injective",
    "Generic",
    "Winograd",
]


def default_rules() -> list[CpuRule]:
    """The rules, most specific first."""
    return [
        Winograd(),
        MatmulVnni(),  # before Conv, which would take a uint8 convolution in int32 arithmetic
        Conv(),
        Matmul(),
        Pooling(),
        FullReduction(),
        RowReduction(),
        Normalization(),
        Transpose(),
        Injective(),
        Generic(),
    ]


#: The layout convolutions run in on CPUs: output channels innermost, so the register tile vectorises over
#: them with contiguous weight vectors (HWIO) and broadcast input pixels, whatever the stride or image width
#: (NCHW vectorises over output width: strided gathers at stride 2, half-empty vectors on 7x7 maps).
CONV_LAYOUT = {"relax.nn.conv2d": ["NHWC", "HWIO"]}
#: layouts kept where the conversion would otherwise carry NHWC into an op: TVM legalises a transposed
#: convolution only in NCHW/IOHW (in NHWC after an NHWC conv it stayed a Relax op, and the build failed)
_KEPT_LAYOUT = {"relax.nn.conv2d_transpose": ["NCHW", "IOHW"]}


#: values of the `conv_algorithm` option: "auto" runs 3x3 stride-1 convolutions as Winograd where they fit
CONV_ALGORITHMS = ("auto", "direct")


def pre_legalize_passes(target: tvm.target.Target, conv_algorithm: str = "auto") -> list[tvm.transform.Pass]:
    """Relax passes before legalisation: 1-D convolutions as 1xK 2-D ones (`nxrt_tvm.lower.conv1d`);
    transposed convolutions whose stride is their kernel as a matmul and a pixel shuffle
    (`nxrt_tvm.lower.conv_transpose`);
    inference BatchNormalization folded into the conv before it;
    grouped convolutions split into one per group (`nxrt_tvm.lower.grouped_conv`);
    exp/erf/tanh as vectorisable polynomials, not libm calls, where the precision policy allows
    (`nxrt_tvm.lower.precision`); 2-D convolutions in NHWC (`CONV_LAYOUT`;
    transposes between them cancel, weights transpose at compile time), the elementwise ops between them
    moved into that layout (`nxrt_tvm.lower.sink_transposes`), quantize/dequantize pairs as float arithmetic
    (`nxrt_tvm.lower.fake_quant`); with ``conv_algorithm="auto"``,
    3x3 stride-1 convolutions on large maps as Winograd F(4x4, 3x3) (`nxrt_tvm.lower.winograd`); then
    the weights' transposes and reshapes evaluated (`nxrt_tvm.lower.fold_constants.FoldConstantLayouts`)."""
    if target.kind.name != "llvm":
        return []
    winograd = [WinogradConv2D] if conv_algorithm == "auto" else []
    return [
        Conv1dAsConv2d(),
        ConvTransposeAsMatmul(),
        FoldAffineIntoConv,
        SplitGroupedConv(),
        convert_conv_layout(),  # first: approximations are kernels, which layout conversion cannot enter
        sink_transposes(),
        PreciseFastMath(),
        FakeQuantAsFloat(),  # after: the precision policy knows quantize, not the rounding it becomes
        *winograd,
        FoldConstantLayouts,  # last: the layout conversion and Winograd transpose weights
    ]


def _has_conv(mod: tvm.IRModule) -> bool:
    found = False

    def visit(expr) -> None:
        nonlocal found
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name in CONV_LAYOUT:
            found = True

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return found


def convert_conv_layout() -> tvm.transform.Pass:
    """`ConvertLayout(CONV_LAYOUT)` where a module has convolutions, else nothing.

    TVM's layout conversion is not total (0.27 fails a whole module on some symbolic-shape dataflow:
    "DataflowBlock Pass should not rewrite or delete any global-scope Var"), so where it fails each
    convolution is converted on its own, between transposes (`_NhwcBetweenTransposes`): a layout
    copy per conv instead of NCHW convolutions (a jax2tf 1-D conv as Nx1 2-D ran 50x slower in NCHW).
    """

    @tvm.transform.module_pass(opt_level=0, name="nxrt_tvm.ConvertConvLayout")
    @own_pass
    def convert(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        if not _has_conv(mod):
            return mod
        try:
            return relax.transform.ConvertLayout({**CONV_LAYOUT, **_KEPT_LAYOUT})(mod)
        except tvm.error.InternalError:  # a failed check in TVM's layout conversion
            return _NhwcBetweenTransposes()(mod)

    return convert


@relax.transform.function_pass(opt_level=0, name="nxrt_tvm.NhwcBetweenTransposes")
class _NhwcBetweenTransposes:
    """Every NCHW/OIHW 2-D convolution as ``NHWC->NCHW(conv_nhwc(NCHW->NHWC(x), OIHW->HWIO(W)))``."""

    def __init__(self) -> None:
        self.pattern = is_op("relax.nn.conv2d")(wildcard(), wildcard())

    @own_pass
    def transform_function(self, func: relax.Function, _mod: tvm.IRModule, _ctx) -> relax.Function:
        return rewrite_call(self.pattern, self._rewrite, func)

    def _rewrite(self, call: relax.Call, _matches) -> relax.Expr:
        attrs = call.attrs
        if (attrs.data_layout, attrs.kernel_layout, attrs.out_layout) != ("NCHW", "OIHW", "NCHW"):
            return call
        data, weight = call.args
        nhwc = conv2d_like(
            call,
            relax.op.permute_dims(data, [0, 2, 3, 1]),
            relax.op.permute_dims(weight, [2, 3, 1, 0]),
            data_layout="NHWC",
            kernel_layout="HWIO",
            out_layout="NHWC",
        )
        return relax.op.permute_dims(nhwc, [0, 3, 1, 2])


def cpu_schedule_passes(target: tvm.target.Target) -> list[tvm.transform.Pass]:
    """The schedule phase for `target`: the default rules on every unscheduled PrimFunc (llvm only)."""
    if target.kind.name != "llvm":
        return []
    return [ApplySchedules(default_rules())]
