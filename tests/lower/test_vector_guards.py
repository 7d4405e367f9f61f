"""Guarded vector loops: whole vectors run as vectors, the partial one stays guarded, results unchanged.

A kernel over a symbolic length splits its vectorised loop with a tail guard; the CPU pipeline's
`VersionGuardedVectors` gives the loop an unguarded version taken where every lane is in range. Results
match numpy exactly (the same fp32 operations per element).
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import s_tir, te, tirx

from nxrt_tvm.lower.target import make_target
from nxrt_tvm.lower.tir_pipeline import CPU_TIR_PIPELINE
from nxrt_tvm.lower.vector_guards import VersionGuardedVectors

TARGET = make_target("llvm")


def _tail_kernel(fill: bool) -> tvm.IRModule:
    """y[j] = 2 x[j] + 1 over a symbolic n, its loop split into 16-lane vectors: the last one guarded
    (`fill`: the guard is a select of 0 past the end into a padded buffer, as a row reduction's copy)."""
    n = te.var("n", "int64")
    x = te.placeholder((n,), "float32", name="x")
    if fill:
        padded = (n + 15) // 16 * 16
        y = te.compute((padded,), lambda j: tvm.tirx.if_then_else(j < n, x[j] * 2.0 + 1.0, 0.0), name="y")
    else:
        y = te.compute((n,), lambda j: x[j] * 2.0 + 1.0, name="y")
    sch = s_tir.Schedule(te.create_prim_func([x, y]))
    (loop,) = sch.get_loops(sch.get_sblock("y"))
    _, lanes = sch.split(loop, factors=[None, 16])
    sch.vectorize(lanes)
    return sch.mod


def _vector_stores(lib: tvm.runtime.Module) -> int:
    return sum("store <16 x float>" in line for line in lib.inspect_source("ll").splitlines())


@pytest.mark.parametrize("fill", [False, True])
def test_whole_vectors_of_a_guarded_loop_run_as_vectors(fill):
    mod = _tail_kernel(fill)
    if not fill:  # TVM's own pipeline scalarises the guarded loop (its select form it keeps as vectors)
        assert _vector_stores(tvm.tirx.build(mod, TARGET)) == 0
    lib = tvm.tirx.build(mod, TARGET, pipeline=CPU_TIR_PIPELINE)
    assert _vector_stores(lib) > 0
    for n in (1, 15, 16, 17, 100):
        x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
        want = x * np.float32(2) + np.float32(1)
        if fill:
            want = np.concatenate([want, np.zeros(-n % 16, np.float32)])
        y = tvm.runtime.tensor(np.full(want.shape, np.nan, np.float32))
        lib["main"](tvm.runtime.tensor(x), y)
        np.testing.assert_array_equal(y.numpy(), want)


_MASK = tirx.decl_buffer((1024,), "float32", name="mask")


def _guarded(condition) -> tirx.PrimFunc:
    """for i in range((n + 15) // 16): for v in vectorized(16): if condition(i, v, n): ..."""
    n = tirx.Var("n", "int64")
    i, v = tirx.Var("i", "int64"), tirx.Var("v", "int64")
    store = tirx.Evaluate(tirx.call_extern("int32", "touch", i * 16 + v))
    lanes = tirx.For(
        v,
        tirx.IntImm("int64", 0),
        tirx.IntImm("int64", 16),
        tirx.ForKind.VECTORIZED,
        tirx.IfThenElse(condition(i, v, n), store, None),
    )
    rows = tirx.For(i, tirx.IntImm("int64", 0), (n + 15) // 16, tirx.ForKind.SERIAL, lanes)
    return tirx.PrimFunc([n], rows)


def _evaluate(expr: tirx.Expr, values: dict[str, int]) -> bool:
    import tvm_ffi
    from tvm import sym

    bound = tvm_ffi.structural_map(
        expr, (tirx.Var, lambda var: tirx.IntImm("int64", values[var.name]) if var.name in values else var)
    )
    return bool(sym.Analyzer().simplify(bound).value)


def _versions(func: tirx.PrimFunc) -> list[tirx.IfThenElse]:
    out = VersionGuardedVectors(tvm.IRModule({"main": func}))["main"]
    found = []

    def note(stmt):
        if isinstance(stmt, tirx.IfThenElse) and isinstance(stmt.then_case, tirx.For):
            found.append(stmt)
        return stmt

    import tvm_ffi

    tvm_ffi.structural_map(out.body, (tirx.IfThenElse, note))
    return found


def test_a_linear_guard_gets_an_unguarded_version_for_whole_vectors():
    (version,) = _versions(_guarded(lambda i, v, n: i * 16 + v < n))
    fast = version.then_case
    assert fast.kind == tirx.ForKind.VECTORIZED and not isinstance(fast.body, tirx.IfThenElse)
    # taken exactly where the last lane is in range: i * 16 + 15 < n
    for i, n, whole in ((0, 15, False), (0, 16, True), (2, 47, False), (2, 48, True)):
        assert _evaluate(version.condition, {"i": i, "n": n}) == whole
    assert isinstance(version.else_case.body, tirx.IfThenElse)  # the partial vector keeps its guard


@pytest.mark.parametrize(
    "condition",
    [
        lambda i, v, n: v * v < n,  # not affine in the lane
        lambda i, v, n: tirx.call_extern("bool", "is_set", i * 16 + v),  # read from data
        lambda i, v, n: _MASK[i * 16 + v] > 0,  # a load indexed by the lane
    ],
)
def test_a_guard_that_cannot_be_decided_for_every_lane_is_left_alone(condition):
    assert _versions(_guarded(condition)) == []


def test_a_row_tile_reading_padded_rows_gets_an_unguarded_version():
    """A padded register tile's loads are guarded per row (``if_then_else(row < n, a, 0)``, the row
    unrolled, not a lane): the tile's loop under the parallel one gets a version without the select,
    taken for every tile whose last row is in range (BERT's symbolic dense layers: 20% faster)."""
    n = tirx.Var("n", "int64")
    t, k, r = (tirx.Var(name, "int64") for name in ("t", "k", "r"))
    a = tirx.decl_buffer((1024,), "float32", name="a")
    row = t * 8 + r
    load = tirx.if_then_else(row < n, a[row * 4 + k], tirx.const(0, "float32"))
    zero, four, eight = (tirx.IntImm("int64", v) for v in (0, 4, 8))
    rows = tirx.For(
        r, zero, eight, tirx.ForKind.UNROLLED, tirx.Evaluate(tirx.call_extern("int32", "touch", load))
    )
    tile = tirx.For(k, zero, four, tirx.ForKind.SERIAL, rows)
    func = tirx.PrimFunc([n], tirx.For(t, zero, (n + 7) // 8, tirx.ForKind.PARALLEL, tile))
    (version,) = _versions(func)
    fast = version.then_case
    assert fast.loop_var.name == "k" and "if_then_else" not in str(fast)
    assert not fast.loop_var.same_as(k)  # its own vars: a TIR var is defined once
    assert "if_then_else" in str(version.else_case)
    for tile_index, size, whole in ((0, 7, False), (0, 8, True), (1, 15, False), (1, 16, True)):
        assert _evaluate(version.condition, {"t": tile_index, "n": size}) == whole
