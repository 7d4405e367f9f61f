"""Matmul, dense and batch matmul: ``C[b.., i, j] = sum_k A[b.., i, k] * B[b.., k, j]`` plus epilogue.

Where ``B`` is a constant weight (a *layout-free* buffer: TVM's
`AttachAttrLayoutFreeBuffers` marks it), it is packed at compile time into
``[N / tile, K, tile]`` panels, one per column tile, so the inner loop streams
one contiguous panel instead of reading two vectors from rows ``4 * N`` bytes
apart. The packing is a layout-rewrite block that `SplitLayoutRewritePreproc`
moves out of the kernel and `FoldConstant` evaluates on the weight, as for
MetaSchedule's own layout rewrites: it costs nothing at run time.
"""
from __future__ import annotations

from tvm import s_tir, tirx

from .base import CpuRule, vector_lanes
from .core import VECTORS_J, ContractionShape, contraction_shape, tile_contraction

__all__ = ["Matmul", "LAYOUT_REWRITE"]

#: the block annotation `relax.transform.SplitLayoutRewritePreproc` moves out of a kernel
LAYOUT_REWRITE = "meta_schedule.layout_rewrite_preproc"


class Matmul(CpuRule):
    """One reduction axis, two operands: register tile 8 rows x 2 vectors, epilogue fused, constant weights packed."""

    name = "matmul"

    def schedule(self, sch, blocks, target):
        shape = contraction_shape(sch, blocks)
        if shape is None or shape.reduce != 1 or len(sch.get(shape.block).reads) < 2:
            return None
        lanes = vector_lanes(target)
        weight = _packable_weight(sch, shape, lanes * VECTORS_J)
        sch = tile_contraction(sch, blocks, shape, lanes, j_major=True)
        if weight is not None:
            _pack(sch, shape.block, weight, lanes * VECTORS_J)
        return sch


def _packable_weight(sch: s_tir.Schedule, shape: ContractionShape, tile: int) -> tirx.Buffer | None:
    """The ``B[k, j]`` operand when it is a layout-free 2-D parameter whose width the column tile divides."""
    func = sch.mod["main"]
    free = func.attrs.get("layout_free_buffers") if func.attrs is not None else None
    if not free:
        return None
    free_buffers = [func.params[int(i)] for i in free]
    stmt = sch.get(shape.block)
    j_var = stmt.iter_vars[shape.spatial - 1].var
    k_var = stmt.iter_vars[shape.spatial].var
    for region in stmt.reads:
        buffer = region.source
        if not any(buffer.same_as(b) for b in free_buffers) or len(buffer.shape) != 2:
            continue
        width = buffer.shape[1]
        rows, cols = (r.min for r in region.region)
        if (isinstance(width, tirx.IntImm) and int(width.value) % tile == 0
                and rows.same_as(k_var) and cols.same_as(j_var)):
            return buffer
    return None


def _pack(sch: s_tir.Schedule, block, weight: tirx.Buffer, tile: int) -> None:
    """Read `weight` through a ``[N / tile, K, tile]`` copy made by a layout-rewrite block (folded at compile time)."""
    index = next(k for k, region in enumerate(sch.get(block).reads) if region.source.same_as(weight))
    packed = sch.cache_read(block, index, "global")
    sch.annotate(packed, LAYOUT_REWRITE, True)
    sch.transform_layout(block, ("read", index), lambda k, n: (n // tile, k, n % tile))
