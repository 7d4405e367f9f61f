"""The rule for whatever no other rule fits: no kernel runs TVM's single-threaded default loop nest.

Symbolic extents (a transformers export's batch and sequence), reductions over
a leading or middle axis (ReduceMax over channels), index kernels (arange,
take, where on masks), casts, quantise chains: every block that is left after
its injective producers are inlined runs its leading spatial loops fused and
in parallel, and an injective block also vectorises its innermost loop where
that loop's extent is static and splits into whole vectors (no bounds-checked
tail: on a symbolic or ragged extent those ran up to 100x slower than plain
loops). Reduction loops stay serial inside each parallel iteration.

Blocks with too little static work to pay for waking the thread pool (a shape
computation of a few elements) keep a serial loop, vectorised where it can be.
"""

from __future__ import annotations

import math

import tvm_ffi
from tvm import s_tir, tirx

from .base import CpuRule, dividing_lanes, extent_of, inline, parallel, uses_div_mod, vector_lanes

__all__ = ["Generic"]

#: blocks with fewer statically known elements than this run serially (a parallel launch costs microseconds)
MIN_PARALLEL_WORK = 4096


class Generic(CpuRule):
    """Any function: leading spatial loops fused and in parallel, the inner loop vectorised where exact."""

    name = "generic"

    def schedule(self, sch, blocks, target):
        lanes = vector_lanes(target)
        for info in blocks[:-1]:
            if info.is_injective():
                inline(sch, info.block_rv)
        scheduled = False
        for block in sch.get_child_blocks(sch.get_sblock("root")):
            scheduled |= _schedule_block(sch, block, lanes)
        return sch if scheduled else None


def _schedule_block(sch: s_tir.Schedule, block, lanes: int) -> bool:
    """Parallel leading spatial loops and an exact inner vector for one block; False where it has no
    loop per iterator (opaque or already-nested blocks: left as they are)."""
    stmt = sch.get(block)
    loops = sch.get_loops(block)
    if not stmt.iter_vars or len(loops) != len(stmt.iter_vars):
        return False
    kinds = [iv.iter_type for iv in stmt.iter_vars]
    spatial = 0
    while spatial < len(kinds) and kinds[spatial] == tirx.IterVar.DataPar:
        spatial += 1
    lead = list(loops[:spatial])
    injective = spatial == len(kinds)
    if injective and lead:
        inner = _vectorise_inner(sch, block, lead[-1], spatial - 1, lanes)
        if inner is not None:
            lead = [*lead[:-1], inner] if inner != lead[-1] else lead[:-1]
        elif len(lead) > 1:
            lead = lead[:-1]  # the innermost loop stays serial, contiguous, inside each parallel iteration
    cut = next((k + 1 for k, loop in enumerate(lead) if _clamped(sch.get(loop).extent)), len(lead))
    lead = lead[:cut]  # loops after a clamped extent stay serial inside each parallel iteration
    extents = [extent_of(sch, loop) for loop in lead]
    symbolic = any(e is None for e in extents)
    if lead and (symbolic or math.prod(extents) >= MIN_PARALLEL_WORK):
        parallel(sch, sch.fuse(*lead) if len(lead) > 1 else lead[0])
    return True


def _clamped(extent: tirx.Expr) -> bool:
    """Whether a loop extent holds a max/min (a pooled length clamped at 0). Fused with a loop after it,
    TVM 0.27's index analysis fails the build (FlattenBuffer: "padding factor ... is not divisible")."""
    found = False

    def note(node):
        nonlocal found
        found = True
        return node

    tvm_ffi.structural_map(extent, ((tirx.Max, tirx.Min, tirx.Select), note))
    return found


def _vectorise_inner(sch: s_tir.Schedule, block, loop, var_index: int, lanes: int):
    """Vectorise `loop` (the innermost) where its extent is static and whole vectors cover it; returns the
    loop left outside the vector (`loop` itself when it was vectorised whole), or None when it stays
    scalar."""
    extent = extent_of(sch, loop)
    if extent is None or extent < 2 or uses_div_mod(sch, block, var_index):
        return None
    if extent <= lanes:
        sch.vectorize(loop)
        return loop
    lanes = dividing_lanes(extent, lanes)
    if lanes is None:
        return None
    outer, vec = sch.split(loop, factors=[None, lanes])
    sch.vectorize(vec)
    return outer
