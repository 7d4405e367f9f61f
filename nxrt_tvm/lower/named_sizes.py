"""Compound symbolic sizes become variables of their own before the kernels are scheduled.

A kernel over a symbolic map carries its sizes as expressions of the model's input
dims: YOLOv8's anchor count is `((h - 1) // 32 * 4 + 4) * ((w - 1) // 32 * 4 + 4) + ...`
(three strides' grids summed), a conv's output width `(w + 2 - 3) // 2 + 1`. After
scheduling, every loop extent, predicate and index repeats them, and TVM's analyser
re-proves facts about them in each lowering pass: `CompactBufferAllocation` spent
1.05 s on one softmax, and TIR passes, not LLVM, were most of YOLOv8n's 12 s of code
generation. `NameCompoundSizes` replaces each compound expression that is a whole dim of
a parameter buffer by a fresh variable, which `MakePackedAPI` then binds from the
tensor's shape like any symbolic dim (the caller's tensors have those sizes: the Relax
VM allocated them so), so the lowering sees `n` where it saw the expression. A size written
with its factors regrouped (`n * (h * w) * 8` for `n * 8 * (h * w)`) or its constants merged
(a padded `t + 3` for `t + 1`) is the named size too: scratch buffers and their loops get it.

It runs on every CPU kernel, tuned or not, before the schedule rules, which then tile `n` (run
after them, a conv's tile count had merged into `(w - 1) // 128 + 1`, an expression of `w` the
pass could no longer name). Tuning takes static kernels only, so its builds need no naming.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx

from .strict import own_pass

__all__ = ["NameCompoundSizes"]


def _compound(dim: tvm.ir.Expr) -> bool:
    return not isinstance(dim, (tirx.IntImm, tirx.Var)) and bool(tirx.analysis.undefined_vars(dim))


def _operands(expr: tvm.ir.Expr, op: type) -> list[tvm.ir.Expr]:
    """The operands of a chain of `op` (`tirx.Mul`, `tirx.Add`), however it is associated."""
    if isinstance(expr, op):
        return _operands(expr.a, op) + _operands(expr.b, op)
    return [expr]


def _split_constant(terms: list[tvm.ir.Expr]) -> tuple[list[tvm.ir.Expr], int]:
    return [t for t in terms if not isinstance(t, tirx.IntImm)], sum(
        int(t.value) for t in terms if isinstance(t, tirx.IntImm)
    )


def _renamed(expr: tvm.ir.Expr, chains: list[tuple[type, list[tvm.ir.Expr], int, tirx.Var]]) -> tvm.ir.Expr:
    """`expr` with the operands of a named product or sum replaced by its name, wherever they appear in
    it: a loop over a fused `n * 8 * (h * w)` dim reads `n * (h * w) * 8` and a padded width `w' + 2`
    reads `t + 3` where `w'` is `t + 1`, which only their operands show to be the same size (PP-OCR
    rec's softmax and two convs kept every expression: 4.7 s of code generation)."""
    for op, named, constant, var in chains:
        if not isinstance(expr, op):
            continue
        operands = _operands(expr, op)
        rest, own = _split_constant(operands) if op is tirx.Add else (operands, 0)  # a product's are factors
        for operand in named:
            k = next((i for i, r in enumerate(rest) if tvm_ffi.structural_equal(r, operand)), None)
            if k is None:
                break
            del rest[k]
        else:
            out = var
            for operand in rest:
                out = op(out, operand)
            return out + (own - constant) if own != constant else out
    return expr


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="nxrt_tvm.NameCompoundSizes")
@own_pass
def NameCompoundSizes(
    func: tirx.PrimFunc, _mod: tvm.IRModule, _ctx: tvm.transform.PassContext
) -> tirx.PrimFunc:
    """Each compound dim of a parameter buffer, wherever it occurs in `func`, as a variable bound
    from that buffer's shape."""
    names: dict[int, list[tuple[tvm.ir.Expr, tirx.Var]]] = {}
    for buffer in (p for p in func.params if isinstance(p.ty, tirx.BufferType)):
        for dim in buffer.shape:
            if not _compound(dim):
                continue
            bucket = names.setdefault(tvm_ffi.structural_hash(dim), [])
            if not any(tvm_ffi.structural_equal(e, dim) for e, _ in bucket):
                bucket.append((dim, tirx.Var(f"size{sum(map(len, names.values()))}", dim.ty)))
    if not names:
        return func

    chains = []
    for e, var in (named for bucket in names.values() for named in bucket):
        if isinstance(e, tirx.Mul):
            chains.append((tirx.Mul, _operands(e, tirx.Mul), 0, var))
        elif isinstance(e, tirx.Add):
            chains.append((tirx.Add, *_split_constant(_operands(e, tirx.Add)), var))
    chains.sort(key=lambda chain: -len(chain[1]))  # the largest named chain first

    def name(expr: tvm.ir.Expr) -> tvm.ir.Expr:
        for e, var in names.get(tvm_ffi.structural_hash(expr), ()):
            if tvm_ffi.structural_equal(e, expr):
                return var
        return _renamed(expr, chains) if chains else expr

    named = tvm_ffi.structural_map(func, (tvm.ir.expr.Expr, name), order="pre")
    # where the sizes the expressions are made of still appear on their own (a conv's padded tile count
    # from `width`, its output width now `size1`), the analyser could no longer relate the two: its
    # register tile lost its static size (14 s of LLVM per conv); such kernels keep the expressions
    parts = {v for bucket in names.values() for e, _ in bucket for v in tirx.analysis.undefined_vars(e)}
    if parts & set(tirx.analysis.undefined_vars(named.body)):
        return func
    return named
