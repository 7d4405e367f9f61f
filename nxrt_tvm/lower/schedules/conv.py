"""Convolution (NHWC after `CONV_LAYOUT`, any kernel
size/stride/padding): ``out[n, h, w, oc] = sum pad(x) * W``.

The padding is its own parallel loop; the register tile is output channels
(vectorised, contiguous HWIO weight vectors, packed into panels when constant)
by output pixels of one row, each input value broadcast to all of its channels.
A depthwise convolution reads every operand per channel, so nothing is broadcast:
its rows are output pixels of one row all the same, independent FMA chains
(MobileNet's 3x3 depthwise convs went from dlight's reduction rule, 10x
onnxruntime, to the tile). It reads its padding in place (a bounds check per row
of the tile, not per lane): with a few FMAs per input value, the padded copy cost
more than the convolution (MobileNetV2's depthwise convs 1.3-4x faster without it).
"""

from __future__ import annotations

from tvm import tirx

from .base import CpuRule
from .core import ContractionShape, contraction_shape, tile_contraction

__all__ = ["Conv"]


class Conv(CpuRule):
    """Two operands, several reduction axes (or a padded input): direct convolution."""

    name = "conv"

    def schedule(self, sch, blocks, target):
        shape = contraction_shape(sch, blocks)
        if shape is None or len(sch.get(shape.block).reads) < 2:
            return None
        if shape.reduce < 2 and shape.block_index == 0:
            return None  # a plain matmul: the Matmul rule's job
        if shape.depthwise:  # every operand is read per channel: rows are output pixels
            shape = _pixel_rows(sch, shape)
            if shape is None:
                return None
        return tile_contraction(sch, blocks, shape, target, inline_producers=shape.depthwise)


def _pixel_rows(sch, shape: ContractionShape) -> ContractionShape | None:
    """A depthwise convolution's shape with the output width (the spatial axis before channels) as the
    rows of the register tile: no operand is shared by rows, but each row's FMAs are independent."""
    if shape.spatial < 3 or shape.reduce < 2:
        return None
    width = sch.get(shape.block).iter_vars[shape.spatial - 2].dom.extent
    if isinstance(width, tirx.IntImm) and width.value == 1:
        return None
    return ContractionShape(
        shape.block, shape.block_index, shape.spatial, shape.reduce, shape.spatial - 2, depthwise=True
    )
