"""Matmul, dense and batch matmul: ``C[b.., i, j] = sum_k A[b.., i, k] * B[b.., k, j]`` plus epilogue.

A constant ``B`` is packed into column panels at compile time (see `core`).
"""

from __future__ import annotations

from .base import CpuRule
from .core import contraction_shape, tile_contraction

__all__ = ["Matmul"]


class Matmul(CpuRule):
    """One reduction axis, two operands: register tile of 2 vectors by 8 rows (6 without AVX-512),
    epilogue fused, constant weights packed."""

    name = "matmul"

    def schedule(self, sch, blocks, target):
        shape = contraction_shape(sch, blocks)
        if shape is None or shape.reduce != 1 or len(sch.get(shape.block).reads) < 2:
            return None
        return tile_contraction(sch, blocks, shape, target, j_major=True)
