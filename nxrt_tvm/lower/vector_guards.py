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

from .strict import own_pass

__all__ = ["VersionGuardedVectors"]

_IF_THEN_ELSE = "prim.if_then_else"
_LIKELY = "prim.likely"

#: a loop var with its smallest and largest values
_Box = list[tuple[tirx.Var, tirx.Expr, tirx.Expr]]


def _uses(expr: tirx.Expr, box: _Box) -> bool:
    found = False

    def visit(var: tirx.Var) -> tirx.Var:
        nonlocal found
        found = found or any(var.same_as(v) for v, _, _ in box)
        return var

    tvm_ffi.structural_map(expr, (tirx.Var, visit))
    return found


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


def _always(cond: tirx.Expr, box: _Box) -> tirx.Expr | None:
    """A condition free of the box's vars under which `cond` holds at every point of the box."""
    if not _uses(cond, box):
        return cond
    if isinstance(cond, tvm.ir.Call) and cond.op.name == _LIKELY:
        return _always(cond.args[0], box)
    if isinstance(cond, tirx.And):
        a, b = _always(cond.a, box), _always(cond.b, box)
        return None if a is None or b is None else tirx.And(a, b)
    if isinstance(cond, tirx.Or):
        a, b = _always(cond.a, box), _always(cond.b, box)
        if a is None or b is None:
            return a if b is None else b
        return tirx.Or(a, b)
    if isinstance(cond, tirx.Not):
        return _never(cond.a, box)
    compare = _COMPARISONS.get(type(cond))
    return None if compare is None else compare(cond.a - cond.b, box)


def _never(cond: tirx.Expr, box: _Box) -> tirx.Expr | None:
    """A condition free of the box's vars under which `cond` is false at every point of the box."""
    if not _uses(cond, box):
        return tirx.Not(cond)
    if isinstance(cond, tvm.ir.Call) and cond.op.name == _LIKELY:
        return _never(cond.args[0], box)
    if isinstance(cond, tirx.Or):
        a, b = _never(cond.a, box), _never(cond.b, box)
        return None if a is None or b is None else tirx.And(a, b)
    if isinstance(cond, tirx.And):
        a, b = _never(cond.a, box), _never(cond.b, box)
        if a is None or b is None:
            return a if b is None else b
        return tirx.Or(a, b)
    if isinstance(cond, tirx.Not):
        return _always(cond.a, box)
    negated = _NEGATED.get(type(cond))
    return None if negated is None else _always(negated(cond.a, cond.b), box)


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

    def guard(cond, keep_then_first: bool):
        """(keep the then-branch?, condition) for a guard, or None."""
        tries = [(True, _always), (False, _never)]
        for keep, test in tries if keep_then_first else tries[::-1]:
            q = test(cond, box)
            if q is not None:
                return keep, q
        return None

    def on_if(stmt: tirx.IfThenElse):
        nonlocal undecided
        if not _uses(stmt.condition, box):
            return stmt
        decided = guard(stmt.condition, keep_then_first=True)
        if decided is None:
            undecided = True
            return stmt
        keep, q = decided
        conditions.append(q)
        if keep:
            return stmt.then_case
        return stmt.else_case if stmt.else_case is not None else tirx.Evaluate(0)

    def on_call(call: tvm.ir.Call):
        nonlocal undecided
        if call.op.name != _IF_THEN_ELSE or not _uses(call.args[0], box):
            return call
        cond, then, other = call.args
        decided = guard(cond, keep_then_first=not _is_constant(then))  # the data, not a fill value
        if decided is None:
            undecided = True
            return call
        keep, q = decided
        conditions.append(q)
        return then if keep else other

    def on_select(select: tirx.Select):
        nonlocal undecided
        if not _uses(select.condition, box):
            return select
        decided = guard(select.condition, keep_then_first=not _is_constant(select.true_value))
        if decided is None:
            undecided = True
            return select
        keep, q = decided
        conditions.append(q)
        return select.true_value if keep else select.false_value

    fast = tvm_ffi.structural_map(
        body, [(tirx.IfThenElse, on_if), (tvm.ir.Call, on_call), (tirx.Select, on_select)]
    )
    if undecided or not conditions:
        return None
    return fast, conditions


def _box_of(loop: tirx.For) -> _Box:
    """The loop's var and those of the loops inside it, each with its first and last value."""
    box: _Box = []

    def note(inner: tirx.For) -> tirx.For:
        box.append((inner.loop_var, inner.min, inner.min + inner.extent - 1))
        return inner

    tvm_ffi.structural_map(loop, (tirx.For, note))
    return box


def _version(loop: tirx.For) -> tirx.Stmt:
    if loop.kind != tirx.ForKind.VECTORIZED:
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
    return tirx.IfThenElse(test, _with_body(loop, fast_body), loop)


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
    """Give each vectorised loop whose guards depend on the lane a whole-vector version (see module)."""
    return func.with_body(tvm_ffi.structural_map(func.body, (tirx.For, _version)))
