"""Elementwise, broadcast and layout kernels (every block injective).

Intermediates are inlined; each remaining block runs its outer loops in
parallel and vectorises the innermost one. Loops are never all fused into one
(broadcasts would turn into div/mod gathers), and an innermost axis read
through a division or modulo (Tile, reshapes) stays scalar: TVM 0.27's AVX-512
codegen has been seen to miscompile those gathers once vectorised.
"""

from __future__ import annotations

from tvm import s_tir

from .base import CpuRule, inline, parallel_vectorize, vector_lanes

__all__ = ["Injective", "injective_blocks"]


class Injective(CpuRule):
    """All blocks injective: inline intermediates, parallel outer loops, vectorise the innermost."""

    name = "injective"

    def schedule(self, sch, blocks, target):
        remaining = injective_blocks(sch, blocks)
        if remaining is None:
            return None
        lanes = vector_lanes(target)
        for block in remaining:
            parallel_vectorize(sch, block, lanes)
        return sch


def injective_blocks(sch: s_tir.Schedule, blocks: list) -> list | None:
    """The blocks left of an all-injective kernel of static extents once its intermediates are inlined
    (one, unless a costly one is read twice and keeps its loops); None for any other kernel."""
    if not all(info.is_injective() for info in blocks):
        return None
    if any(not isinstance(it.dom, int) for info in blocks for it in info.iters):
        # Symbolic extents: split tails turn into bounds-checked scalar code that measured 100x
        # slower than TVM's plain loops (a transformers BERT's Transpose: 4 ms vs 40 us).
        return None
    for info in blocks[:-1]:
        inline(sch, info.block_rv)
    root = sch.get_sblock("root") if _has_root(sch) else None
    return list(sch.get_child_blocks(root)) if root is not None else [blocks[-1].block_rv]


def _has_root(sch: s_tir.Schedule) -> bool:
    try:
        sch.get_sblock("root")
        return True
    except Exception:  # noqa: BLE001
        return False
