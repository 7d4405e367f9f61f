"""Convolution (NHWC after `CONV_LAYOUT`, any kernel
size/stride/padding): ``out[n, h, w, oc] = sum pad(x) * W``.

The padding is its own parallel loop; the register tile is output channels
(vectorised, contiguous HWIO weight vectors, packed into panels when constant)
by output pixels of one row, each input value broadcast to all of its channels.
"""

from __future__ import annotations

from .base import CpuRule, vector_lanes
from .core import contraction_shape, tile_contraction

__all__ = ["Conv"]


class Conv(CpuRule):
    """Two operands, several reduction axes (or a padded input): direct convolution."""

    name = "conv"

    def schedule(self, sch, blocks, target):
        shape = contraction_shape(sch, blocks)
        if shape is None or len(sch.get(shape.block).reads) < 2 or shape.i_axis is None:
            return None
        if shape.reduce < 2 and shape.block_index == 0:
            return None  # a plain matmul: the Matmul rule's job
        return tile_contraction(sch, blocks, shape, vector_lanes(target), inline_producers=False)
