"""Reductions: pooling and single-operand reductions, softmax / layer norm / RMS norm.

* `Pooling`: one reduction block over one input (MaxPool, AveragePool,
  ReduceMean/Sum over leading axes, GlobalAveragePool): padding inlined into
  the window reads, the output's last axis vectorised inside the window loops
  (channels, in NHWC), the outer rows run in parallel; an epilogue (average
  pooling's divide) runs as its own parallel, vectorised loop. No register
  tile: a window has few taps, and the tiled form measured 6x slower on
  ResNet's 3x3 max pool (200 us vs 34 us). A long sum (ReduceSum/Mean over a
  middle axis) is summed in blocks (`_blocked_sum`), as onnxruntime sums: one
  float accumulator over 512 terms had 4x its rounding error, which a model's
  E[x^2] - E[x]^2 variance turned into 6e-3 relative on its output.
* `RowReduction`: softmax-like chains (every reduction over the last axis of
  the same rows, elementwise blocks between): one parallel loop over rows with
  every block computed inside it, and each reduction split into vector-wide
  partial results (`rfactor`) so it runs on vectors, then reduced across lanes.
  Softmax over 4x128x128 measured 33 us against 94 us for dlight's rule below,
  whose row reductions stay scalar; over ViT's 197-wide rows 31 us against 130.
* `Normalization`: chains of row reductions and elementwise blocks (softmax,
  layer norm): dlight's CPU `Reduction` rule (rows in parallel, elementwise
  blocks vectorised), guarded like every rule here.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import collect_block_iter_vars_used_in_access_region
from tvm.s_tir.dlight.cpu import Reduction as _DlightReduction

from ..strict import own_failure, raised_by_us
from .base import (
    CpuRule,
    KernelStart,
    dividing_lanes,
    extent_of,
    parallel,
    parallel_outer,
    parallel_vectorize,
    vector_lanes,
)
from .core import contraction_shape, pick_j_tile

__all__ = ["FullReduction", "Pooling", "RowReduction", "Normalization"]


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
        spatial, reduce = list(loops[: shape.spatial]), list(loops[shape.spatial :])
        extent = extent_of(sch, spatial[-1])
        _, vec = pick_j_tile(extent, lanes, 1)
        partial = _blocked_sum(sch, block, reduce) if vec > 1 else None
        if partial is not None:  # the block now sums the partial sums
            reduce = list(sch.get_loops(block)[shape.spatial :])
        j_outer, j_vec = sch.split(spatial[-1], factors=[None, vec])
        sch.reorder(*spatial[:-1], j_outer, *reduce, j_vec)
        parallel_outer(sch, spatial[:-1] or [j_outer])
        sch.vectorize(j_vec)
        init = sch.decompose_reduction(block, reduce[0])
        sch.vectorize(sch.get_loops(init)[-1])
        if partial is not None:  # each vector of partial sums computed where it is summed: a small local
            sch.compute_at(partial, j_outer)
            blocks_, lanes_, taps = sch.get_loops(partial)[-3:]
            sch.reorder(blocks_, taps, lanes_)
            sch.vectorize(lanes_)
            sch.vectorize(sch.get_loops(sch.decompose_reduction(partial, taps))[-1])
        epilogue = [info.block_rv for info in blocks[shape.block_index + 1 :]]
        for rv in epilogue[:-1]:
            sch.compute_inline(rv)
        if epilogue:
            parallel_vectorize(sch, epilogue[-1], lanes)
        return sch


#: a sum of more terms than this is summed in blocks of `_SUM_BLOCKS` terms (the first that divides it)
_LONG_SUM = 64
_SUM_BLOCKS = (16, 32, 8)


def _blocked_sum(sch: s_tir.Schedule, block, reduce: list) -> s_tir.SBlockRV | None:
    """Split a long float sum over one axis into sums of blocks of terms, then a sum of those (`rfactor`);
    the block-partial block, or None where `block` is not such a sum.

    One accumulator's rounding error grows with the number of terms it adds (`n` ulp at worst); block
    partial sums bound it by the block length plus the number of blocks (16 + 32 for 512 terms):
    3.6x lower measured on a [3, 512, 256] sum of squares, at the same speed."""
    stmt = sch.get(block)
    n = extent_of(sch, reduce[-1]) if len(reduce) == 1 else None
    if n is None or n <= _LONG_SUM or not _is_float_sum(stmt):
        return None
    size = next((b for b in _SUM_BLOCKS if n % b == 0), None)  # no tail: rfactor drops a split's predicate
    if size is None:
        return None
    blocks, _ = sch.split(reduce[-1], factors=[None, size])
    return sch.rfactor(blocks, factor_axis=0)


def _is_float_sum(stmt: s_tir.SBlock) -> bool:
    """``out = out + f(...)`` from 0: a float sum (max/min need no blocks: they round nothing)."""
    body, init = stmt.body, stmt.init
    accumulated = getattr(
        getattr(body, "value", None), "a", None
    )  # a load (TVM 0.27: `source` is its buffer)
    return (
        isinstance(body, tirx.BufferStore)
        and isinstance(init, tirx.BufferStore)
        and str(body.buffer.dtype).startswith("float")
        and isinstance(body.value, tirx.Add)
        and getattr(accumulated, "source", None) is not None
        and accumulated.source.same_as(body.buffer)
        and isinstance(init.value, tirx.FloatImm)
        and init.value.value == 0.0
    )


class Normalization(CpuRule):
    """Softmax, layer norm, RMS norm: several reduction blocks sharing leading row axes."""

    name = "normalization"

    def apply_to(self, start, target):
        return self._apply(start, target, False)

    def apply(self, func, target, tunable):
        return self._apply(KernelStart(func), target, tunable) if isinstance(func, tirx.PrimFunc) else None

    def _apply(self, start: KernelStart, target, tunable: bool):
        try:
            fresh = start.fresh() if target.kind.name == "llvm" else None
            if fresh is None or not _has_rows(*fresh):
                return None
            return _DlightReduction().apply(start.func, target, tunable)
        except Exception as exc:  # noqa: BLE001 - dlight refusing the function keeps TVM's default
            if raised_by_us(exc):
                own_failure(f"schedule rule {self.name!r}", exc)
            return None


def _has_rows(sch: s_tir.Schedule, blocks: list) -> bool:
    """Whether the kernel (its normalised `blocks`, shared by the rules: see `KernelStart`) reduces, and
    every reduction block keeps a spatial (row) iterator and reduces one operand (not a contraction).
    dlight's rule parallelises the first loop it finds: on a single row ([1, 1000] softmax) that was the
    reduced axis, every thread recomputing the whole row into one shared scalar (1000x the work, and a
    data race). A kernel that reduces nothing is the injective rule's (dlight's made no schedule of it,
    after making and normalising two more schedules of every elementwise kernel)."""
    if all(info.is_injective() for info in blocks):
        return False
    for info in blocks:
        if info.is_injective():
            continue
        rows = [it.dom for it in info.iters if it.kind == "S"]
        if not rows or all(isinstance(d, int) and d == 1 for d in rows):
            return False
        if _reduced_operands(sch, info.block_rv) > 1:
            return False  # a contraction (a grouped conv: 230 ms for AlexNet's 5x5; 2 ms as convs)
    return True


def _reduced_operands(sch: s_tir.Schedule, block) -> int:
    """How many buffers `block` reads through its reduction iterators (softmax, norms, pooling: one)."""
    stmt = sch.get(block)
    reduced = [iv.var for iv in stmt.iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
    count = 0
    for region in stmt.reads:
        used = collect_block_iter_vars_used_in_access_region(stmt, region.region)
        if any(v.same_as(r) for v in used for r in reduced):
            count += 1
    return count


def _extent(dim):
    """A buffer dim as dlight's block infos give extents: an int where static."""
    return int(dim.value) if isinstance(dim, tirx.IntImm) else dim


def _same_dims(a: list, b: list) -> bool:
    """Whether two lists of extents (ints or symbolic expressions) are the same extents."""
    return len(a) == len(b) and all(
        x == y if isinstance(x, int) and isinstance(y, int) else tvm_ffi.structural_equal(x, y)
        for x, y in zip(a, b)
    )


class FullReduction(CpuRule):
    """One reduction of a whole tensor to one value (DynamicQuantizeLinear's min and max of every
    activation): its innermost loop split into vectors, one partial result a lane (`rfactor`), and
    one a lane of each chunk of an outer loop, the chunks in parallel where the kernel is large enough
    (`parallel`: these mostly are not); those few reduced after. The generic rule reduced one scalar at
    a time: a dynamic-int8 BERT ran 16 of them, 20 us each for 16K elements. The lanes are read
    contiguously, without the division of a fused index (TVM 0.27 has miscompiled vectorised gathers
    through one)."""

    name = "full-reduction"

    def schedule(self, sch, blocks, target):
        reductions = [info for info in blocks if not info.is_injective()]
        if len(reductions) != 1 or reductions[0] is not blocks[-1]:
            return None
        block = reductions[0].block_rv
        stmt = sch.get(block)
        if any(iv.iter_type == tirx.IterVar.DataPar and _extent(iv.dom.extent) != 1 for iv in stmt.iter_vars):
            return None  # some output axis: a row or pooling reduction
        loops = sch.get_loops(block)
        width = extent_of(sch, loops[-1])
        if stmt.iter_vars[-1].iter_type != tirx.IterVar.CommReduce or width is None:
            return None
        lanes = dividing_lanes(width, vector_lanes(target))
        if lanes is None:
            return None
        for info in blocks[:-1]:
            sch.compute_inline(info.block_rv)
        _, lane = sch.split(loops[-1], factors=[None, lanes])
        partial = sch.rfactor(lane, 0)  # one partial result a lane
        outer = next((loop for loop in sch.get_loops(partial)[:-1] if (extent_of(sch, loop) or 1) > 1), None)
        chunks = next(
            (c for c in (16, 8, 4, 2) if outer is not None and extent_of(sch, outer) % c == 0), None
        )
        if chunks is not None:  # and one a lane of each chunk of the outer loop, the chunks in parallel
            chunk, _ = sch.split(outer, factors=[chunks, None])
            at = [sch.get(loop).same_as(sch.get(chunk)) for loop in sch.get_loops(partial)].index(True)
            partial = sch.rfactor(chunk, 0)
            partial_loops = sch.get_loops(partial)  # the same nest, the chunk loop at the same place
            sch.reorder(partial_loops[at], *partial_loops[:at], *partial_loops[at + 1 :])
        partial_loops = sch.get_loops(partial)
        sch.vectorize(partial_loops[-1])
        if chunks is not None:
            parallel(sch, partial_loops[0])
        init = sch.decompose_reduction(partial, partial_loops[1 if chunks is not None else 0])
        sch.vectorize(sch.get_loops(init)[-1])
        return sch


class RowReduction(CpuRule):
    """Softmax-like: reductions of the last axis of one set
    of rows, all computed inside one parallel row loop.

    Rows whose width is not whole vectors (ViT's 197 patches, Whisper's 1500 frames) are reduced as
    whole vectors too: what each reduction reads is laid out in vectors with its reduction's identity
    after the row's end (`_padded_operand`), and elementwise loops run their whole vectors apart from the
    tail (`_vectorize_whole`). dlight's rule, which ran them, reduced scalars: a 197-wide softmax ran 5x
    slower, a 1500-wide one 7x.
    """

    name = "row-reduction"

    def schedule(self, sch, blocks, target):
        lanes = vector_lanes(target)
        last = blocks[-1]
        kinds = last.dom_kind()
        if not last.is_injective() or len(kinds) < 2 or set(kinds) != {"S"}:
            return None
        rows = [it.dom for it in last.iters[:-1]]
        width = last.iters[-1].dom
        if isinstance(width, int) and width < lanes:
            # rows of 8 to 15 on AVX-512 (GRU's 12 classes a frame) in half vectors, as AVX2 runs them
            lanes //= 2
            if width < lanes or lanes < 8:
                return None  # rows may be symbolic (a batch), and so may their width (a sequence)
        whole = width // lanes if isinstance(width, int) else None  # whole vectors per row, where known
        reductions = [info for info in blocks if not info.is_injective()]
        if not reductions:
            return None
        names = [sch.get(info.block_rv).name_hint for info in blocks]
        per_row = set()  # blocks with one value per row (layer norm's mean)
        for name, info in zip(names[:-1], blocks[:-1]):
            doms = [it.dom for it in info.iters]
            if info.is_injective():
                if _same_dims(doms, rows):
                    per_row.add(name)
                elif info.dom_kind() != kinds or not _same_dims(doms, [*rows, width]):  # per row or element
                    return None
            elif (
                info.dom_kind() != "S" * len(rows) + "R"
                or not _same_dims(doms, [*rows, width])
                or len(sch.get(info.block_rv).writes) != 1
            ):
                return None
        for name, info in zip(names[:-1], blocks[:-1]):
            # one consumer: inlined; more (softmax's exp, read by its sum and its normalisation), or one
            # value a row (softmax's reciprocal of its sum): computed once per row
            if info.is_injective() and name not in per_row and len(sch.get_consumers(info.block_rv)) == 1:
                sch.compute_inline(info.block_rv)
        padded: set[str] = set()  # blocks writing vectors padded with a reduction's identity
        if whole is None or width % lanes:
            for info in reductions:
                if not _padded_operand(sch, info.block_rv, width, lanes, padded):
                    return None
        partials = []
        for info in reductions:
            _, ki = sch.split(sch.get_loops(info.block_rv)[-1], factors=[None, lanes])
            partials.append(sch.rfactor(ki, factor_axis=len(rows)))
        out = sch.get_sblock(names[-1])
        loops = sch.get_loops(out)
        row = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
        parallel(sch, row)
        out_chunks = sch.split(loops[-1], factors=[None, lanes])[0]
        inside = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
        inside = [name for name in inside if name != names[-1]]
        partial_names = {sch.get(b).name_hint for b in partials}
        for name in reversed(inside):
            sch.compute_at(sch.get_sblock(name), row, preserve_unit_loops=True)
        for name in inside:
            if name in per_row:
                continue  # a scalar per row
            block = sch.get_sblock(name)
            block_loops = sch.get_loops(block)[1:]
            if name in partial_names:
                # loops (lane, unit row loops..., chunk): chunks outside, the lane loop inside and vectorised
                sch.reorder(block_loops[-1], block_loops[0])
                block_loops = sch.get_loops(block)[1:]
                sch.vectorize(block_loops[-1])
                sch.decompose_reduction(block, block_loops[0])
            elif name in padded:  # (..., chunk, lane) already
                _vectorize_whole(sch, block_loops[-2], whole)
            elif all(iv.iter_type == tirx.IterVar.DataPar for iv in sch.get(block).iter_vars):
                _vectorize_whole(sch, sch.split(block_loops[-1], factors=[None, lanes])[0], whole)
        _vectorize_whole(sch, out_chunks, whole)
        return sch


#: a loop TVM's `LoopPartition` splits where a condition under it changes (the lowering runs it before
#: vectorising; without the hint it partitions nothing)
PARTITION_HINT = "pragma_loop_partition_hint"


def _vectorize_whole(sch: s_tir.Schedule, chunks, whole: int | None) -> None:
    """Vectorise the lane loop under `chunks` (the chunk, lane split of a row) where a row is `whole`
    vectors (None: a symbolic width); where it ends in a part of one, the chunk loop is partitioned when
    lowered: the whole vectors run unguarded, the last part apart (TVM scalarises a guarded lane loop
    whole: a 1500-wide softmax ran 2.4x slower so)."""
    if whole is not None and extent_of(sch, chunks) != whole and _static(sch.mod["main"]):
        # TVM 0.27's LoopPartition mixes int32 bounds into int64 loops, which stay int64 where a dim is
        # symbolic ("mismatched types. int32 vs. int64" when built): those tails stay guarded
        sch.annotate(chunks, PARTITION_HINT, 1)
    (block,) = sch.get_child_blocks(chunks)
    sch.vectorize(sch.get_loops(block)[-1])


def _static(func: tirx.PrimFunc) -> bool:
    """Whether every parameter of `func` has a static shape."""
    return all(
        isinstance(d, tirx.IntImm) for p in func.params if isinstance(p.ty, tirx.BufferType) for d in p.shape
    )


def _padded_operand(sch: s_tir.Schedule, block, width, lanes: int, padded: set[str]) -> bool:
    """Lay out what reduction `block` reduces as [..., chunk, lane] with its identity after the row's
    end, so its vector partial reductions read no element of another row (False: it cannot be).

    The reduced value must be one buffer's element (softmax's max and sum; not layer norm's squared
    deviations). It is copied row by row into the padded layout (`cache_read`): TVM pads a buffer where
    it is written only where that block's loops can grow (a second writer of the padding, otherwise,
    which `compute_at` refuses). The copy's block is added to `padded`."""
    stmt = sch.get(block)
    body, init = stmt.body, stmt.init
    if not (isinstance(body, tirx.BufferStore) and isinstance(init, tirx.BufferStore)):
        return False
    value = body.value
    if not isinstance(value, (tirx.Add, tirx.Max, tirx.Min)) or not isinstance(init.value, tirx.FloatImm):
        return False
    operand = next(
        (
            b
            for a, b in ((value.a, value.b), (value.b, value.a))
            if isinstance(a, tvm.ir.TensorLoad) and a.source.same_as(body.buffer)
        ),
        None,
    )
    if not isinstance(operand, tvm.ir.TensorLoad) or not _same_dims(
        [_extent(operand.source.shape[-1])], [width]
    ):
        return False
    index = next(i for i, r in enumerate(stmt.reads) if r.source.same_as(operand.source))
    writer = sch.cache_read(block, index, "global")
    name = sch.get(writer).name_hint
    rank = len(operand.source.shape)
    layout = tirx.IndexMap.from_func(lambda *i: (*i[:-1], i[-1] // lanes, i[-1] % lanes), ndim=rank)
    sch.transform_layout(writer, ("write", 0), layout, pad_value=init.value)  # the identity
    padded.add(name)
    return True
