"""Convolution (NCHW, any kernel size/stride/padding): ``out[n, oc, h, w] = sum_{ic,ry,rx} pad(x) * W``.

The padding block is inlined, the output width is vectorised and several
output channels share each loaded input vector (the register tile).
"""
from __future__ import annotations

from .base import CpuRule, vector_lanes
from .core import contraction_shape, tile_contraction

__all__ = ["Conv"]


class Conv(CpuRule):
    """Two operands, several reduction axes (or a padded input): NCHW direct convolution."""

    name = "conv"

    def schedule(self, sch, blocks, target):
        shape = contraction_shape(sch, blocks)
        if shape is None or len(sch.get(shape.block).reads) < 2 or shape.i_axis is None:
            return None
        if shape.reduce < 2 and shape.block_index == 0:
            return None  # a plain matmul: the Matmul rule's job
        return tile_contraction(sch, blocks, shape, vector_lanes(target), inline_producers=False)
