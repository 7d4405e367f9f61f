"""Reductions: pooling and single-operand reductions, softmax / layer norm / RMS norm.

* `Pooling`: one reduction block over one input (MaxPool, AveragePool,
  ReduceMean/Sum over leading axes, GlobalAveragePool): padding inlined into
  the window reads, the output's last axis vectorised inside the window loops
  (channels, in NHWC), the outer rows run in parallel; an epilogue (average
  pooling's divide) runs as its own parallel, vectorised loop. No register
  tile: a window has few taps, and the tiled form measured 6x slower on
  ResNet's 3x3 max pool (200 us vs 34 us).
* `Normalization`: chains of row reductions and elementwise blocks (softmax,
  layer norm): dlight's CPU `Reduction` rule (rows in parallel, elementwise
  blocks vectorised), guarded like every rule here.
"""
from __future__ import annotations

from tvm.s_tir.dlight.cpu import Reduction as _DlightReduction

from .base import CpuRule, extent_of, parallel_outer, parallel_vectorize, vector_lanes
from .core import contraction_shape, pick_j_tile

__all__ = ["Pooling", "Normalization"]


class Pooling(CpuRule):
    """One reduction block reading one tensor, the output's last axis vectorised."""

    name = "pooling"

    def schedule(self, sch, blocks, target):
        shape = contraction_shape(sch, blocks)
        if shape is None or len(sch.get(shape.block).reads) != 1:
            return None
        lanes = vector_lanes(target)
        for info in blocks[: shape.block_index]:
            sch.compute_inline(info.block_rv)
        block = shape.block
        loops = sch.get_loops(block)
        spatial, reduce = list(loops[: shape.spatial]), list(loops[shape.spatial:])
        extent = extent_of(sch, spatial[-1])
        _, vec = pick_j_tile(extent, lanes, 1)
        j_outer, j_vec = sch.split(spatial[-1], factors=[None, vec])
        sch.reorder(*spatial[:-1], j_outer, *reduce, j_vec)
        parallel_outer(sch, spatial[:-1] or [j_outer])
        sch.vectorize(j_vec)
        init = sch.decompose_reduction(block, reduce[0])
        sch.vectorize(sch.get_loops(init)[-1])
        epilogue = [info.block_rv for info in blocks[shape.block_index + 1:]]
        for rv in epilogue[:-1]:
            sch.compute_inline(rv)
        if epilogue:
            parallel_vectorize(sch, epilogue[-1], lanes)
        return sch


class Normalization(CpuRule):
    """Softmax, layer norm, RMS norm: several reduction blocks sharing leading row axes."""

    name = "normalization"

    def apply(self, func, target, tunable):
        try:
            return _DlightReduction().apply(func, target, tunable) if target.kind.name == "llvm" else None
        except Exception:  # noqa: BLE001 - any failure keeps TVM's default for this function
            return None
