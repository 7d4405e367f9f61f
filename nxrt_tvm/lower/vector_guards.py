"""Guarded vector loops run as whole vectors wherever their guard holds for every lane.

A schedule over a symbolic extent (a sequence length) splits its vectorised loop with a guard: the
store of a padded tile's epilogue is under ``if row < seq and col < seq``, a row's tail under
``base + lane < width``, a padded copy selects its fill value where ``width % 16 <= lane``. TVM's
`VectorizeLoop` turns any loop whose guard depends on the lane into scalar code, so every vector of
the loop ran scalar, not only the last partial one: attention scores of a BERT export with a
symbolic sequence ran 11x slower than the next matmul with the same work.

`VersionGuardedVectors` runs before `VectorizeLoop` and gives each such loop two versions:

    if <every guard decided for all lanes>: the loop with each guard replaced by its branch
    else: the loop as it was

A register tile over padded rows has the same problem one level up: each load of a row past the end
reads as zero (``if_then_else(row < seq, a, 0)``), a select per row at every step of the reduction,
which left a BERT export's symbolic dense layers 30-45% slower than with the sequence fixed. So each
serial loop that is a parallel loop's body (a tile's reduction, its epilogue) is versioned the same
way over its rows, before the vector loops inside it.

The test is a sound under-approximation: a comparison affine in the lane (and in loops inside it)
with constant coefficients holds for all lanes where it holds at the lanes' extreme corner;
``and``/``or``/``not`` combine those tests; a guard the test cannot decide leaves the loop as it was.
So the fast version runs only where it computes what the guarded loop computes.
"""

from __future__ import annotations

from collections.abc import Callable

import tvm
import tvm_ffi
from tvm import sym, tirx
from tvm.s_tir.dlight.analysis import collect_vars_used_in_prim_expr

from .strict import own_pass

__all__ = ["VersionGuardedVectors"]

_IF_THEN_ELSE = "prim.if_then_else"
_LIKELY = "prim.likely"

#: a loop var with its smallest and largest values
_Box = list[tuple[tirx.Var, tirx.Expr, tirx.Expr]]


def _uses(expr: tirx.Expr, box: _Box) -> bool:
    return any(v.same_as(b) for v in collect_vars_used_in_prim_expr(expr) for b, _, _ in box)


def _corner(d: tirx.Expr, box: _Box, largest: bool) -> tirx.Expr | None:
    """The largest (or smallest) value of `d` over the box; None where `d` is not affine in the box's
    vars with constant coefficients."""
    coeffs = sym.detect_linear_equation(d, [v for v, _, _ in box])
    if len(coeffs) != len(box) + 1:
        return None
    value = coeffs[-1]
    for c, (_, lo, hi) in zip(coeffs[:-1], box):
        if not isinstance(c, tirx.IntImm):
            return None
        if c.value:
            value = value + c * (hi if (c.value > 0) == largest else lo)
    # a term the analysis took as constant may still read a lane (a load indexed by it): undecided
    return None if _uses(value, box) else value


def _holds(cond: tirx.Expr, box: _Box, value: bool) -> tirx.Expr | None:
    """A condition free of the box's vars under which `cond` is `value` at every point of the box;
    None where the test cannot tell."""
    if not _uses(cond, box):
        return cond if value else tirx.Not(cond)
    if isinstance(cond, tvm.ir.Call) and cond.op.name == _LIKELY:
        return _holds(cond.args[0], box, value)
    if isinstance(cond, tirx.Not):
        return _holds(cond.a, box, not value)
    if isinstance(cond, (tirx.And, tirx.Or)):
        a, b = _holds(cond.a, box, value), _holds(cond.b, box, value)
        if isinstance(cond, tirx.And) == value:  # both parts must settle it (and: true; or: false)
            return None if a is None or b is None else tirx.And(a, b)
        if a is None or b is None:  # either part settles it
            return a if b is None else b
        return tirx.Or(a, b)
    bound = _COMPARISONS.get(type(cond) if value else _NEGATED.get(type(cond)))
    return None if bound is None else bound(cond.a - cond.b, box)


def _below(d, box, strict: bool):
    top = _corner(d, box, largest=True)
    return None if top is None else (top < 0 if strict else top <= 0)


def _above(d, box, strict: bool):
    bottom = _corner(d, box, largest=False)
    return None if bottom is None else (bottom > 0 if strict else bottom >= 0)


def _nonzero(d, box):
    below, above = _below(d, box, True), _above(d, box, True)
    return None if below is None or above is None else tirx.Or(below, above)


_COMPARISONS: dict[type, Callable] = {
    tirx.LT: lambda d, box: _below(d, box, True),
    tirx.LE: lambda d, box: _below(d, box, False),
    tirx.GT: lambda d, box: _above(d, box, True),
    tirx.GE: lambda d, box: _above(d, box, False),
    tirx.NE: _nonzero,
}
_NEGATED: dict[type, Callable] = {
    tirx.LT: tirx.GE,
    tirx.LE: tirx.GT,
    tirx.GT: tirx.LE,
    tirx.GE: tirx.LT,
    tirx.EQ: tirx.NE,
}


def _is_constant(expr: tirx.Expr) -> bool:
    if isinstance(expr, tirx.Broadcast):
        expr = expr.value
    return isinstance(expr, (tirx.IntImm, tirx.FloatImm))


def _decide(body: tirx.Stmt, box: _Box) -> tuple[tirx.Stmt, list] | None:
    """`body` with every guard that depends on the box replaced by the branch it takes for every lane,
    and the conditions under which each does; None where a guard cannot be decided."""
    conditions: list = []
    undecided = False

    def pick(guarded, cond, then, other, then_first: bool):
        """The branch `cond` takes for every lane, its condition noted; `guarded` where undecided."""
        nonlocal undecided
        for keep in (True, False) if then_first else (False, True):
            q = _holds(cond, box, keep)
            if q is not None:
                conditions.append(q)
                return then if keep else other
        undecided = True
        return guarded

    def on_if(stmt: tirx.IfThenElse):
        if not _uses(stmt.condition, box):
            return stmt
        other = stmt.else_case if stmt.else_case is not None else tirx.Evaluate(0)
        return pick(stmt, stmt.condition, stmt.then_case, other, then_first=True)

    def on_call(call: tvm.ir.Call):
        if call.op.name != _IF_THEN_ELSE or not _uses(call.args[0], box):
            return call
        cond, then, other = call.args
        return pick(call, cond, then, other, then_first=not _is_constant(then))  # the data, not a fill

    def on_select(select: tirx.Select):
        if not _uses(select.condition, box):
            return select
        then_first = not _is_constant(select.true_value)
        return pick(select, select.condition, select.true_value, select.false_value, then_first)

    fast = tvm_ffi.structural_map(
        body, [(tirx.IfThenElse, on_if), (tvm.ir.Call, on_call), (tirx.Select, on_select)]
    )
    if undecided or not conditions:
        return None
    return fast, conditions


def _nodes(stmt: tirx.Stmt, types) -> list:
    """Every node of `types` (a type or a tuple of them) in `stmt`, innermost first."""
    found: list = []

    def note(node):
        found.append(node)
        return node

    tvm_ffi.structural_map(stmt, (types, note))
    return found


def _box_of(loop: tirx.For) -> _Box:
    """The loop's var and those of the loops inside it, each with its first and last value."""
    return [(inner.loop_var, inner.min, inner.min + inner.extent - 1) for inner in _nodes(loop, tirx.For)]


def _version(loop: tirx.For) -> tirx.Stmt:
    if loop.kind != tirx.ForKind.VECTORIZED:
        return loop
    return _versioned(loop)


def _tile_loops(func: tirx.PrimFunc) -> list[tirx.For]:
    """The serial loops that are a parallel loop's body (a register tile's reduction, its epilogue)."""
    found: list[tirx.For] = []

    def under(stmt: tirx.Stmt) -> None:
        if isinstance(stmt, tirx.SeqStmt):
            for part in stmt.seq:
                under(part)
        elif isinstance(stmt, tirx.For):
            if stmt.kind in (tirx.ForKind.SERIAL, tirx.ForKind.UNROLLED):
                found.append(stmt)
        elif hasattr(stmt, "body") and not isinstance(stmt, tirx.IfThenElse):
            under(stmt.body)

    for loop in _nodes(func.body, tirx.For):
        if loop.kind == tirx.ForKind.PARALLEL:
            under(loop.body)
    return found


def _versioned(loop: tirx.For) -> tirx.Stmt:
    """`loop` as ``if <its guards decided>: loop without them else: loop``, or as it was.

    The unguarded copy gets loop vars of its own (a var is defined once in TIR: a pooling kernel's
    tile, duplicated with its vars, failed TVM's bound analysis); a loop that defines anything else
    (a buffer, a let) is left as it is.
    """
    if _nodes(loop.body, (tirx.AllocBuffer, tirx.DeclBuffer, tirx.LetStmt, tirx.Let)):
        return loop
    box = _box_of(loop)
    decided = _decide(loop.body, box)
    if decided is None:
        return loop
    fast_body, conditions = decided
    analyzer = sym.Analyzer()
    test = conditions[0]
    for q in conditions[1:]:
        test = tirx.And(test, q)
    test = analyzer.simplify(test)
    if isinstance(test, tirx.IntImm):  # decided at compile time
        return _with_body(loop, fast_body) if test.value else loop
    return tirx.IfThenElse(test, _renamed(_with_body(loop, fast_body), box), loop)


def _renamed(loop: tirx.For, box: _Box) -> tirx.Stmt:
    """`loop` with each of its loop vars (`box`) replaced by a fresh var of the same name and type."""
    fresh = {var: tirx.Var(var.name, var.ty) for var, _, _ in box}

    def swap(var: tirx.Var) -> tirx.Var:
        return next((new for old, new in fresh.items() if old.same_as(var)), var)

    return tvm_ffi.structural_map(loop, (tirx.Var, swap))


def _with_body(loop: tirx.For, body: tirx.Stmt) -> tirx.For:
    return tirx.For(
        loop.loop_var,
        loop.min,
        loop.extent,
        loop.kind,
        body,
        loop.thread_binding,
        loop.annotations,
        loop.step,
    )


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="nxrt_tvm.VersionGuardedVectors")
@own_pass
def VersionGuardedVectors(
    func: tirx.PrimFunc, _mod: tvm.IRModule, _ctx: tvm.transform.PassContext
) -> tirx.PrimFunc:
    """Give each tile loop whose guards depend on the row, and each vectorised loop whose guards depend
    on the lane, an unguarded version (see module)."""
    tiles = _tile_loops(func)
    if tiles:
        func = func.with_body(
            tvm_ffi.structural_map(
                func.body,
                (tirx.For, lambda loop: _versioned(loop) if any(loop.same_as(t) for t in tiles) else loop),
            )
        )
    return func.with_body(tvm_ffi.structural_map(func.body, (tirx.For, _version)))
