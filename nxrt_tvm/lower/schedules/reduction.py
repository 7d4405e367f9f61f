"""Reductions: pooling and single-operand reductions, softmax / layer norm / RMS norm.

* `Pooling`: one reduction block over one input (MaxPool, AveragePool,
  ReduceMean/Sum over leading axes, GlobalAveragePool): vectorised over the
  output's last axis, accumulated in registers, run in parallel.
* `Normalization`: chains of row reductions and elementwise blocks (softmax,
  layer norm): dlight's CPU `Reduction` rule (rows in parallel, elementwise
  blocks vectorised), guarded like every rule here.
"""
from __future__ import annotations

from tvm.s_tir.dlight.cpu import Reduction as _DlightReduction

from .base import CpuRule, vector_lanes
from .core import contraction_shape, tile_contraction

__all__ = ["Pooling", "Normalization"]


class Pooling(CpuRule):
    """One reduction block reading one tensor, the output's last axis vectorised."""

    name = "pooling"

    def schedule(self, sch, blocks, target):
        shape = contraction_shape(sch, blocks)
        if shape is None or len(sch.get(shape.block).reads) != 1:
            return None
        return tile_contraction(sch, blocks, shape, vector_lanes(target), tile_i=1, vectors_j=1, inline_producers=False)


class Normalization(CpuRule):
    """Softmax, layer norm, RMS norm: several reduction blocks sharing leading row axes."""

    name = "normalization"

    def apply(self, func, target, tunable):
        try:
            return _DlightReduction().apply(func, target, tunable) if target.kind.name == "llvm" else None
        except Exception:  # noqa: BLE001 - any failure keeps TVM's default for this function
            return None
