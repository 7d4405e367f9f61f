"""The CPU TIR pipeline: small scratch buffers become
stack allocations, large ones stay in the workspace pool.

A per-row scratch buffer is declared inside a parallel loop (as the schedules'
register tiles are); the built module's LLVM IR shows whether each iteration
calls the workspace pool. Results match numpy exactly (same fp32 operations).
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import s_tir, te

from nxrt_tvm.lower.target import make_target
from nxrt_tvm.lower.tir_pipeline import (
    CPU_TIR_PIPELINE,
    STACK_LIMIT_BYTES,
    build_for_measurement,
    tir_pipeline_for,
)

TARGET = make_target("llvm")


def _row_scratch(width: int, scope: str) -> tvm.IRModule:
    """y[i, :] = 2 * x[i, :] + 1 through a `width`-float scratch row allocated in each parallel iteration."""
    x = te.placeholder((8, width), "float32", name="x")
    y = te.compute((8, width), lambda i, j: x[i, j] * 2.0 + 1.0, name="y")
    sch = s_tir.Schedule(te.create_prim_func([x, y]))
    block = sch.get_sblock("y")
    rows, _ = sch.get_loops(block)
    sch.parallel(rows)
    scratch = sch.cache_write(block, 0, scope)
    sch.reverse_compute_at(scratch, rows)
    return sch.mod


def _workspace_calls(lib: tvm.runtime.Module) -> int:
    """Loads of the pool's function pointer in the module's LLVM IR (one per allocation site)."""
    return sum(
        "load" in line and "@__TVMBackendAllocWorkspace" in line
        for line in lib.inspect_source("ll").splitlines()
    )


@pytest.mark.parametrize(
    "scope, width", [("local", 64), ("global", 512)]
)  # TVM stacks global buffers under 1 KB only
def test_a_small_scratch_buffer_is_a_stack_allocation(scope, width):
    mod = _row_scratch(width, scope)
    assert _workspace_calls(tvm.tirx.build(mod, TARGET)) > 0  # TVM's pipeline: a pool call per row
    lib = tvm.tirx.build(mod, TARGET, pipeline=CPU_TIR_PIPELINE)
    assert _workspace_calls(lib) == 0
    x = np.random.default_rng(0).standard_normal((8, width)).astype(np.float32)
    y = tvm.runtime.tensor(np.zeros_like(x))
    lib["main"](tvm.runtime.tensor(x), y)
    np.testing.assert_array_equal(y.numpy(), x * np.float32(2) + np.float32(1))


def test_a_scratch_buffer_over_the_limit_stays_in_the_workspace_pool():
    width = STACK_LIMIT_BYTES // 4 + 16
    lib = tvm.tirx.build(_row_scratch(width, "local"), TARGET, pipeline=CPU_TIR_PIPELINE)
    assert _workspace_calls(lib) > 0
    x = np.random.default_rng(1).standard_normal((8, width)).astype(np.float32)
    y = tvm.runtime.tensor(np.zeros_like(x))
    lib["main"](tvm.runtime.tensor(x), y)
    np.testing.assert_array_equal(y.numpy(), x * np.float32(2) + np.float32(1))


def test_tuning_measures_candidates_as_compile_builds_them():
    lib = build_for_measurement(_row_scratch(64, "local"), TARGET)
    assert _workspace_calls(lib) == 0


def test_only_cpu_targets_get_the_cpu_pipeline():
    assert tir_pipeline_for(TARGET) == CPU_TIR_PIPELINE
    assert tir_pipeline_for(tvm.target.Target("cuda")) == "default"


def test_rounding_to_even_stays_a_vector_loop():
    """`tirx.nearbyint` (Relax's round, every quantisation step) is vectorised, not left as a scalar loop
    for LLVM (which vectorised a QDQ convolution's epilogue as scatter stores)."""
    x = te.placeholder((64,), "float32", name="x")
    y = te.compute((64,), lambda i: tvm.tirx.nearbyint(x[i]), name="y")
    sch = s_tir.Schedule(te.create_prim_func([x, y]))
    sch.vectorize(sch.get_loops(sch.get_sblock("y"))[0])
    opaque = s_tir.transform.ConvertBlocksToOpaque()(sch.mod)
    lowered = tvm.tirx.transform.VectorizeLoop()(s_tir.transform.LowerOpaqueBlock()(opaque))
    text = lowered.script()
    assert "T.Ramp" in text and "for " not in text, text
    lib = tvm.compile(sch.mod, TARGET, tir_pipeline=tir_pipeline_for(TARGET))
    a = np.arange(64, dtype=np.float32) - 31.5  # every tie between -31.5 and 31.5
    out = tvm.runtime.tensor(np.zeros(64, np.float32))
    lib["main"](tvm.runtime.tensor(a), out)
    np.testing.assert_array_equal(out.numpy(), np.round(a))  # numpy's round is to even
