"""Compound symbolic sizes lowered as variables of their own (`NameCompoundSizes`).

A kernel whose buffers are `n * m` long repeats that product in every extent and index; the pass gives it a
variable bound from the buffer's shape. Where `n` also appears alone, the analyser needs the product to relate
the two, so the kernel keeps it. Built kernels compute exactly what numpy does at several sizes.
"""

from __future__ import annotations

import numpy as np
import tvm
import tvm_ffi
from tvm import te, tirx

from nxrt_tvm.lower.named_sizes import NameCompoundSizes
from nxrt_tvm.lower.target import make_target
from nxrt_tvm.lower.tir_pipeline import tir_pipeline_for

TARGET = make_target("llvm")


def _sizes(mod: tvm.IRModule) -> list[list[str]]:
    func = mod["main"]
    return [[str(d) for d in p.shape] for p in func.params if isinstance(p.ty, tirx.BufferType)]


def _flattened(with_row_sum: bool) -> tvm.IRModule:
    """y = 2 x + 1 over an `n * m` vector (a flattened map); with a per-`n` row sum as a second output."""
    n, m = te.var("n", "int64"), te.var("m", "int64")
    x = te.placeholder((n * m,), "float32", name="x")
    y = te.compute((n * m,), lambda i: x[i] * 2.0 + 1.0, name="y")
    outputs = [y]
    if with_row_sum:
        k = te.reduce_axis((0, m), name="k")
        outputs.append(te.compute((n,), lambda r: te.sum(x[r * m + k], axis=k), name="s"))
    return tvm.IRModule({"main": te.create_prim_func([x, *outputs]).with_attr("global_symbol", "main")})


def test_a_compound_dim_becomes_a_variable_bound_from_the_shape():
    mod = _flattened(with_row_sum=False)
    named = NameCompoundSizes(mod)
    assert _sizes(mod) == [["n * m"], ["n * m"]]
    ((x,), (y,)) = _sizes(named)
    assert x == y and x not in ("n * m",) and "*" not in x
    assert not tvm_ffi.structural_equal(named["main"], mod["main"])
    lib = tvm.tirx.build(named, target=TARGET, pipeline=tir_pipeline_for(TARGET))
    for size in (1, 7, 48, 1000):
        data = np.random.default_rng(size).standard_normal(size).astype(np.float32)
        out = tvm.runtime.empty((size,), "float32")
        lib["main"](tvm.runtime.tensor(data), out)
        np.testing.assert_array_equal(out.numpy(), data * 2 + 1)


def test_a_kernel_that_also_uses_the_parts_keeps_the_expression():
    mod = _flattened(with_row_sum=True)
    assert tvm_ffi.structural_equal(NameCompoundSizes(mod)["main"], mod["main"])


def _regrouped_product() -> tvm.IRModule:
    """y = 2 x + 1 through a scratch buffer whose size is the same product grouped otherwise
    (`n * (h * w) * 8` for `n * 8 * (h * w)`: PP-OCR rec's fused softmax rows)."""
    n, h, w = (te.var(v, "int64") for v in "nhw")
    x = te.placeholder((n * 8 * (h * w),), "float32", name="x")
    t = te.compute((n * (h * w) * 8,), lambda i: x[i] * 2.0, name="t")
    y = te.compute((n * 8 * (h * w),), lambda i: t[i] + 1.0, name="y")
    return tvm.IRModule({"main": te.create_prim_func([x, y]).with_attr("global_symbol", "main")})


def _padded_width() -> tvm.IRModule:
    """A zero-padded 3-tap sum over a `w // 2 + 1` row: its padded scratch row is `w // 2 + 3` long, the
    row's size plus 2 with the constants merged (a conv's padded input)."""
    w = te.var("w", "int64")
    x = te.placeholder((w // 2 + 1,), "float32", name="x")
    pad = te.compute(
        (w // 2 + 3,),
        lambda i: tirx.if_then_else(tirx.all(i >= 1, i < w // 2 + 2), x[i - 1], tirx.const(0.0, "float32")),
        name="pad",
    )
    y = te.compute((w // 2 + 1,), lambda i: pad[i] + pad[i + 1] + pad[i + 2], name="y")
    return tvm.IRModule({"main": te.create_prim_func([x, y]).with_attr("global_symbol", "main")})


def test_a_regrouped_product_or_a_shifted_sum_is_the_named_size_too():
    """Sizes written with their factors regrouped or their constants merged are the named size (plus the
    difference): before, the kernel kept every expression (PP-OCR rec: 4.7 s of code generation)."""
    for mod, parts, sizes, reference in (
        (_regrouped_product(), {"n", "h", "w"}, [(1, 1, 1), (2, 3, 5)], lambda x: x * 2 + 1),
        (
            _padded_width(),
            {"w"},
            [(0,), (1,), (9,), (40,)],
            lambda x: np.convolve(np.pad(x, 1), np.ones(3), "valid"),
        ),
    ):
        named = NameCompoundSizes(mod)
        left = {v.name for v in tirx.analysis.undefined_vars(named["main"].body)}
        assert not parts & left, left
        lib = tvm.tirx.build(named, target=TARGET, pipeline=tir_pipeline_for(TARGET))
        for size in sizes:
            length = int(np.prod(size)) * 8 if len(size) == 3 else size[0] // 2 + 1
            data = np.random.default_rng(length).standard_normal(length).astype(np.float32)
            out = tvm.runtime.empty((length,), "float32")
            lib["main"](tvm.runtime.tensor(data), out)
            np.testing.assert_allclose(out.numpy(), reference(data), rtol=1e-6, atol=1e-6)
