"""The Winograd transforms of `nxrt_tvm.lower.winograd`: register-tiled, unrolled, vectorised over channels.

Both transforms multiply each tile by small constant matrices. With the tile
and transform loops unrolled, the coefficients become constants and the zero
ones fold away, leaving a few vector FMAs per loaded channel vector:

- input (``V = B^T d B``): padding as its own parallel loop, then per
  (tile, channel vector, eps) ``alpha`` accumulators over the ``alpha x alpha``
  tile, parallel over tiles and channel vectors;
- output (``Y = A^T M A``): per (output tile, channel vector) ``m x m``
  accumulators over the ``alpha x alpha`` products, with the bias, activation and
  residual after the convolution inlined into the write-back.
"""

from __future__ import annotations

import math

from tvm import s_tir

from ..winograd import INPUT_BLOCK, OUTPUT_BLOCK, PAD_BLOCK
from .base import CpuRule, extent_of, parallel, parallel_vectorize, vector_lanes

__all__ = ["Winograd"]


def _block_named(sch: s_tir.Schedule, blocks: list, name: str):
    return next((info.block_rv for info in blocks if sch.get(info.block_rv).name_hint == name), None)


class Winograd(CpuRule):
    """The two transform kernels of a Winograd convolution (recognised by their stage names)."""

    name = "winograd"

    def schedule(self, sch, blocks, target):
        lanes = vector_lanes(target)
        block = _block_named(sch, blocks, INPUT_BLOCK)
        if block is not None:
            return self._input(sch, blocks, block, lanes)
        block = _block_named(sch, blocks, OUTPUT_BLOCK)
        if block is not None:
            return self._output(sch, blocks, block, lanes)
        return None

    @staticmethod
    def _input(sch, blocks, block, lanes):
        pad = _block_named(sch, blocks, PAD_BLOCK)
        if pad is None or len(blocks) != 2:
            return None
        parallel_vectorize(sch, pad, lanes)
        e, p, ch, r1, r2 = sch.get_loops(block)
        alpha = extent_of(sch, r1)
        eps, nu = sch.split(e, factors=[alpha, alpha])
        vec = _channel_vector(extent_of(sch, ch), lanes)
        co, ci = sch.split(ch, factors=[None, vec])
        sch.reorder(p, co, eps, r1, r2, nu, ci)
        write_back = sch.cache_write(block, 0, "local")
        sch.reverse_compute_at(write_back, eps, preserve_unit_loops=True)
        return _register_tile(sch, block, write_back, [p, co], [eps, r1, r2, nu], ci, r1, vec)

    @staticmethod
    def _output(sch, blocks, block, lanes):
        index = next(k for k, info in enumerate(blocks) if info.block_rv.same_as(block))
        if index != 0:
            return None
        epilogue = [info.block_rv for info in blocks[1:]]
        for rv in epilogue[:-1]:
            sch.compute_inline(rv)
        *batch, y, z, k, eps, nu = sch.get_loops(block)  # a unit batch loop is normalised away
        m = _tile_of(sch, block)
        th, ym = sch.split(y, factors=[None, m])
        tw, zm = sch.split(z, factors=[None, m])
        vec = _channel_vector(extent_of(sch, k), lanes)
        ko, ki = sch.split(k, factors=[None, vec])
        sch.reorder(*batch, th, tw, ko, eps, nu, ym, zm, ki)
        write_back = sch.cache_write(block, 0, "local")
        if epilogue:
            sch.reverse_compute_inline(epilogue[-1])
        sch.reverse_compute_at(write_back, ko, preserve_unit_loops=True)
        return _register_tile(sch, block, write_back, [*batch, th, tw, ko], [eps, nu, ym, zm], ki, eps, vec)


def _channel_vector(channels: int, lanes: int) -> int:
    """The widest vector that divides the channels (static, a multiple of 4: the rewrite's conditions): a
    masked tail vector in the unrolled transform made LLVM take 95 s over one 24-channel input transform."""
    return math.gcd(channels, lanes)


def _register_tile(
    sch: s_tir.Schedule, block, write_back, tiles: list, unrolled: list, vector, first_reduce, lanes: int
) -> s_tir.Schedule:
    """The loops of a transform once its accumulators sit in registers: outer tiles in parallel, the transform
    unrolled (so its coefficients fold), channels vectorised (`lanes` wide) in the tile, its init and its
    write-back."""
    sch.vectorize(sch.split(sch.get_loops(write_back)[-1], factors=[None, lanes])[-1])
    parallel(sch, sch.fuse(*tiles))
    for loop in unrolled:
        sch.unroll(loop)
    sch.vectorize(vector)
    init = sch.decompose_reduction(block, first_reduce)
    sch.vectorize(sch.get_loops(init)[-1])
    return sch


def _tile_of(sch: s_tir.Schedule, block) -> int:
    """The output tile edge m of an output transform: alpha (its reduction extent) - 2."""
    return int(sch.get(block).iter_vars[-1].dom.extent) - 2
