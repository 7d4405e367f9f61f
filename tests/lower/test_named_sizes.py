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
