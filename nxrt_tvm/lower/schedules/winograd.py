"""The Winograd transforms of `nxrt_tvm.lower.winograd`: unrolled, vectorised over channels.

Each transform is separable (``B^T d B`` is ``(B^T d) B``) and made of two
stages, the first computed per (tile, channel vector) into a few registers.
With their loops unrolled, the coefficients become constants and the zero ones
fold away, leaving a few vector FMAs per loaded channel vector:

- input (``V = B^T d B``): padding as its own parallel loop, then per (tile,
  channel vector, eps) ``alpha`` row vectors of ``B^T d``, each output a sum of
  ``alpha`` of them, parallel over tiles and channel vectors;
- output (``Y = A^T M A``): per (output tile, channel vector) the ``alpha x m`` products
  ``M A``, each output a sum of ``alpha`` of them, with the bias, activation and
  residual after the convolution inlined into its store.
"""

from __future__ import annotations

import math

from tvm import s_tir

from ..winograd import INPUT_BLOCK, INPUT_ROWS, OUTPUT_BLOCK, OUTPUT_ROWS, PAD_BLOCK
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
        pad, rows = _block_named(sch, blocks, PAD_BLOCK), _block_named(sch, blocks, INPUT_ROWS)
        if pad is None or rows is None or len(blocks) != 3:
            return None
        parallel_vectorize(sch, pad, lanes)
        e, p, ch = sch.get_loops(block)
        alpha = int(sch.get(rows).iter_vars[0].dom.extent)
        eps, nu = sch.split(e, factors=[alpha, alpha])
        vec = _channel_vector(extent_of(sch, ch), lanes)
        co, ci = sch.split(ch, factors=[None, vec])
        sch.reorder(p, co, eps, nu, ci)
        _in_registers(sch, rows, eps)
        return _unrolled(sch, block, [p, co], [eps, nu], ci)

    @staticmethod
    def _output(sch, blocks, block, lanes):
        rows = _block_named(sch, blocks, OUTPUT_ROWS)
        if rows is None or not blocks[0].block_rv.same_as(rows) or not blocks[1].block_rv.same_as(block):
            return None
        epilogue = [info.block_rv for info in blocks[2:]]
        for rv in epilogue[:-1]:
            sch.compute_inline(rv)
        if epilogue:
            sch.reverse_compute_inline(epilogue[-1])
        *batch, y, z, k = sch.get_loops(block)  # a unit batch loop is normalised away
        m = int(sch.get(rows).iter_vars[2].dom.extent)
        th, ym = sch.split(y, factors=[None, m])
        tw, zm = sch.split(z, factors=[None, m])
        vec = _channel_vector(extent_of(sch, k), lanes)
        ko, ki = sch.split(k, factors=[None, vec])
        sch.reorder(*batch, th, tw, ko, ym, zm, ki)
        _in_registers(sch, rows, ko)
        return _unrolled(sch, block, [*batch, th, tw, ko], [ym, zm], ki)


def _channel_vector(channels: int, lanes: int) -> int:
    """The widest vector that divides the channels (static, a multiple of 4: the rewrite's conditions): a
    masked tail vector in the unrolled transform made LLVM take 95 s over one 24-channel input transform."""
    return math.gcd(channels, lanes)


def _in_registers(sch: s_tir.Schedule, rows, loop) -> None:
    """Compute a transform's first stage under `loop` of its second, in a local buffer: its loops
    unrolled (its coefficients fold) but the innermost, the channel vector."""
    sch.compute_at(rows, loop)
    sch.set_scope(rows, 0, "local")
    loops = sch.get_loops(rows)
    at = next(k for k, outer in enumerate(loops) if sch.get(outer).same_as(sch.get(loop)))
    *unrolled, vector = loops[at + 1 :]
    for inner in unrolled:
        sch.unroll(inner)
    sch.vectorize(vector)


def _unrolled(sch: s_tir.Schedule, block, tiles: list, unrolled: list, vector) -> s_tir.Schedule:
    """A transform's second stage: outer tiles in parallel, the transform unrolled (so its coefficients
    fold), channels vectorised."""
    parallel(sch, sch.fuse(*tiles))
    for loop in unrolled:
        sch.unroll(loop)
    sch.vectorize(vector)
    return sch
