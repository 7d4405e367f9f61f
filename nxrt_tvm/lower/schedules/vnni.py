"""uint8 x int8 matmul on AVX-512 VNNI: each vector of the register tile one ``vpdpbusd`` a step.

``vpdpbusd`` adds to each of 16 int32 lanes the sum of 4 uint8 x int8 products, 64 multiply-adds an
instruction against an fp32 FMA's 16: the dense layers of a dynamically quantised model (MatMulInteger:
uint8 activations, int8 constant weights) ran 2.5x faster so than as the float32 matmul they are
otherwise computed as (`lower.integer_matmul`). The schedule is the matmul rule's register tile
(`core.tile_contraction`) with the reduction split by 4 and the weight packed
``[N / tile, K / 4, tile, 4]`` at compile time, so a lane's 4 terms lie together.

TVM's own intrinsic (`tvm.s_tir.tensor_intrin.x86`) accumulates in global memory and passes the
operands as ``int32x16``, which the LLVM of TVM 0.27 rejects (its ``vpdpbusd`` takes ``i8x64``); ours
accumulates in the tile's registers (``local``) and passes bytes.
"""

from __future__ import annotations

from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T
from tvm.target import Target

from .base import CpuRule, has_feature
from .core import DotProduct, contraction_shape, tile_contraction

__all__ = ["MatmulVnni", "VNNI", "has_vnni", "vnni_fits"]

VNNI = DotProduct("nxrt_vnni_u8s8_16x4_local", lanes=16, depth=4)


#: the intrinsic's operands, one declaration for its description and its implementation (tensorize
#: matches a block against the one and puts the other in its place)
_A = T.Buffer((4,), "uint8", offset_factor=1)
_B = T.Buffer((16, 4), "int8", offset_factor=1)
_C = T.Buffer((16,), "int32", offset_factor=1, scope="local")


@T.prim_func(s_tir=True)
def _desc(a: _A, b: _B, c: _C) -> None:
    with T.sblock("root"):
        T.reads(c[0:16], a[0:4], b[0:16, 0:4])
        T.writes(c[0:16])
        for i, k in T.grid(16, 4):
            with T.sblock("update"):
                vi, vk = T.axis.remap("SR", [i, k])
                c[vi] = c[vi] + T.cast(a[vk], "int32") * T.cast(b[vi, vk], "int32")


@T.prim_func(s_tir=True)
def _vpdpbusd(a: _A, b: _B, c: _C) -> None:
    with T.sblock("root"):
        T.reads(c[0:16], a[0:4], b[0:16, 0:4])
        T.writes(c[0:16])
        row = T.reinterpret(a.vload([0], "uint8x4"), dtype="int32")  # a's 4 bytes, for every lane
        c[T.ramp(T.int32(0), 1, 16)] = T.call_llvm_pure_intrin(
            T.llvm_lookup_intrinsic_id("llvm.x86.avx512.vpdpbusd.512"),
            c.vload([0], dtype="int32x16"),
            T.reinterpret(T.broadcast(row, 16), dtype="int8x64"),
            b.vload([0, 0], dtype="int8x64"),
            dtype="int32x16",
        )


TensorIntrin.register(VNNI.intrin, _desc, _vpdpbusd)


def has_vnni(target: Target) -> bool:
    """Whether `target` is a CPU with AVX-512 VNNI (Zen 4 and 5, Intel since Cascade Lake)."""
    return has_feature(target, "avx512vnni")


def vnni_fits(depth: object, cols: object, padded: bool = True) -> bool:
    """Whether a ``[M, depth] x [depth, cols]`` uint8 x int8 matmul takes the VNNI schedule: the
    reduction whole groups of 4 terms, both static; the columns are padded to whole vectors, except
    where they cannot be (`padded=False`: a convolution's output channels, which must be whole)."""
    return (
        isinstance(depth, int)
        and isinstance(cols, int)
        and depth % VNNI.depth == 0
        and (padded or cols % VNNI.lanes == 0)
    )


class MatmulVnni(CpuRule):
    """A uint8 x int8 -> int32 matmul, or convolution (NHWC, its input channels the innermost reduction
    axis), with constant weights, on a CPU with AVX-512 VNNI (see above)."""

    name = "matmul-vnni"

    def schedule(self, sch, blocks, target):
        if not has_vnni(target):
            return None
        shape = contraction_shape(sch, blocks)
        if shape is None or (shape.reduce > 1 and shape.depthwise):  # nothing to sum across channels
            return None
        stmt = sch.get(shape.block)
        out = stmt.writes[0].source
        operands = sorted(str(r.source.dtype) for r in stmt.reads if not r.source.same_as(out))
        if operands != ["int8", "uint8"] or str(out.dtype) != "int32":
            return None
        return tile_contraction(sch, blocks, shape, target, j_major=shape.reduce == 1, dot=VNNI)
