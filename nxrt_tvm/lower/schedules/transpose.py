"""Transposes: kernels whose output's innermost axis is strided in the tensor they move.

A transpose written elementwise reads one scalar per output element from rows
of the input far apart (attention's ``K^T``, a channel shuffle, NCHW <-> NHWC
around a model): vectorised along the output, each lane is a separate load.
Here the output is tiled over the two axes that are contiguous in either
tensor: each tile is read into a small local block along the input's
contiguous axis (whole vectors), then written along the output's (whole
vectors), the lanes exchanged in registers. A reshape fused in (heads split
or merged, ShuffleNet's ``[g, c/g]`` shuffle) is seen through: an axis read
through ``c // d`` and ``c % d`` is two axes, ``c // d`` and ``c % d``.

Tiles are whole vectors (or half or quarter ones that divide the axis); an
axis no such tile divides ends in a guarded tile. Axes shorter than a vector
(an image's 3 channels) are left to `Injective`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tvm import ir, s_tir, sym, tirx

from .base import (
    CpuRule,
    div_mod_of,
    dividing_lanes,
    division_run,
    parallel_outer,
    split_iterator,
    vector_lanes,
)
from .injective import injective_blocks

__all__ = ["Transpose"]


@dataclass(frozen=True)
class _Axis:
    """One axis of the block's iteration: an iterator, or one of the two pieces of an iterator read
    through a division (``v // run``: the high piece, ``v % run``: the low one)."""

    var_index: int
    high: bool  #: the ``v // run`` piece of a split iterator
    extent: int
    stride: int  #: elements apart in the moved tensor
    divided: bool  #: the moved tensor's index divides it (it cannot be the copy's vector)


class Transpose(CpuRule):
    """One injective block that moves a tensor with its output's innermost axis strided in it."""

    name = "transpose"

    def schedule(self, sch, blocks, target):
        remaining = injective_blocks(sch, blocks)
        if remaining is None or len(remaining) != 1:  # not injective, or a producer kept its own loops
            return None
        (block,) = remaining
        found = _axes(sch, block)
        if found is None:
            return None
        source, axes = found
        lanes = vector_lanes(target)
        out = len(axes) - 1  # the output's innermost axis (the low piece where its iterator is split)
        into = next((k for k, axis in enumerate(axes) if axis.stride == 1), None)
        # contiguous nowhere, along the output already, or within the output's innermost iterator
        if into is None or axes[out].stride == 0 or axes[into].var_index == axes[out].var_index:
            return None
        if axes[into].high or axes[into].divided:  # the copy's vector must read plainly
            return None
        # reads in vectors of 2 or more (ShuffleNet's 34 channels a group), writes in 4 or more
        tile_in, tile_out = _tile(axes[into].extent, lanes, 2), _tile(axes[out].extent, lanes, 4)
        if tile_in is None or tile_out is None:
            return None
        cache = sch.reindex_cache_read(
            block, source, "local", tirx.IndexMap.from_func(lambda *v: v, ndim=len(sch.get(block).iter_vars))
        )
        loops = _split_loops(sch, block, axes)
        in_outer, in_tile = sch.split(loops[into], factors=[None, tile_in])
        out_outer, out_tile = sch.split(loops[out], factors=[None, tile_out])
        outer = [loop for k, loop in enumerate(loops) if k not in (into, out)]
        sch.reorder(*outer, in_outer, out_outer, in_tile, out_tile)
        sch.compute_at(cache, out_outer)
        # the tile's copy: one loop per iterator, the output's order; the input's contiguous one innermost
        copy = sch.get_loops(cache)[len(outer) + 2 :]
        if len(copy) != 2:
            return None
        sch.reorder(copy[1], copy[0])
        sch.unroll(copy[1])
        sch.vectorize(copy[0])
        sch.unroll(in_tile)
        sch.vectorize(out_tile)
        parallel_outer(sch, [*outer, in_outer, out_outer])
        return sch


def _tile(extent: int, lanes: int, least: int) -> int | None:
    """The widest vector of `least` lanes or more (halving from `lanes`) that divides `extent`; else a
    whole vector where the extent is longer, its last tile guarded (`vector_guards` runs every other
    tile unguarded: ViT's 197 patches as 24 whole tiles and a guarded one)."""
    whole = dividing_lanes(extent, lanes, least)
    return whole if whole is not None or extent <= lanes else lanes


def _axes(sch: s_tir.Schedule, block) -> tuple[int, list[_Axis]] | None:
    """(the read of the moved tensor, the block's axes, outermost first), or None where that read is not
    linear in them or the tensor is not moved whole (a broadcast, a slice)."""
    stmt = sch.get(block)
    if len(stmt.writes) != 1 or not stmt.reads:
        return None
    source = max(range(len(stmt.reads)), key=lambda k: _size(stmt.reads[k].source.shape))
    region = stmt.reads[source]
    if _size(region.source.shape) != _size(stmt.writes[0].source.shape):
        return None
    # plain iterators first (a reshape's ``s // 14 * 3808 + s % 14 * 272`` is ``s * 272``), else each one
    # read through a division split in two
    return _linear(stmt, source, split=False) or _linear(stmt, source, split=True)


def _linear(stmt, source: int, split: bool) -> tuple[int, list[_Axis]] | None:
    region = stmt.reads[source]
    index = [r.min for r in region.region]
    analyzer = sym.Analyzer()
    pieces: list[tuple[tirx.Var, int, bool, int]] = []  # (var, var index, high, extent)
    for k, iv in enumerate(stmt.iter_vars):
        extent = int(iv.dom.extent)
        run = division_run(index, iv.var) if split else 0
        if run and extent % run == 0 and run < extent:
            high, low = split_iterator(analyzer, iv.var, extent, run)
            pieces += [(high, k, True, extent // run), (low, k, False, run)]
        else:
            analyzer.bind(iv.var, ir.Range(0, extent))
            pieces.append((iv.var, k, False, extent))
    flat = tirx.const(0, "int64")
    for dim, r in zip(region.source.shape, region.region):
        flat = flat * int(dim) + r.min
    flat = analyzer.simplify(flat)
    variables = [p[0] for p in pieces]
    base = _at(flat, variables, None)
    strides = []
    for var in variables:
        stride = sym.Analyzer().simplify(_at(flat, variables, var) - base)
        if not isinstance(stride, tirx.IntImm):
            return None
        strides.append(int(stride.value))
    linear = base
    for var, stride in zip(variables, strides):
        linear = linear + var * stride
    if not analyzer.can_prove(linear == flat):
        return None
    # the output's innermost axis is vectorised over the other operands (a bias): none may divide it
    lane = variables[-1]
    others = [r.min for k, read in enumerate(stmt.reads) if k != source for r in read.region]
    if any(div_mod_of(analyzer.simplify(i), lane) for i in others):
        return None
    moved = [analyzer.simplify(i) for i in index]
    axes = [
        _Axis(k, high, extent, stride, any(div_mod_of(i, var) for i in moved))
        for (var, k, high, extent), stride in zip(pieces, strides)
    ]
    return source, axes


def _at(flat: tirx.PrimExpr, variables: list, one) -> tirx.PrimExpr:
    """`flat` with `one` at 1 and every other variable at 0."""
    analyzer = sym.Analyzer()
    for var in variables:
        analyzer.bind(var, tirx.const(1 if var is one else 0, "int64"))
    return analyzer.simplify(flat)


def _size(shape) -> int:
    return math.prod(int(d) for d in shape)


def _split_loops(sch: s_tir.Schedule, block, axes: list[_Axis]) -> list:
    """The block's loops, one per axis: an iterator read through a division split in two."""
    loops, out = sch.get_loops(block), []
    for k, loop in enumerate(loops):
        pieces = [axis for axis in axes if axis.var_index == k]
        if len(pieces) == 2:
            out += sch.split(loop, factors=[pieces[0].extent, pieces[1].extent])
        else:
            out.append(loop)
    return out
