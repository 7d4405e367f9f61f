"""The TIR pipeline every CPU kernel is built with: TVM's own, with small scratch buffers on the stack.

TVM's `LowerTVMBuiltin` puts only *global*-scope buffers under 1 KB on the
stack; every other allocation becomes a `TVMBackendAllocWorkspace` /
`TVMBackendFreeWorkspace` pair at the point it is declared. The CPU schedules
declare their register tiles (`cache_write(..., "local")`, 0.4-1.5 KB) inside
the parallel loop, so a ResNet-18 inference made tens of thousands of such
calls: 5% of its CPU time in the workspace pool, and tiles that LLVM could not
keep in registers because their memory came from an opaque call. Marking
constant-size buffers up to `STACK_LIMIT_BYTES` with the builtin's own opt-out
annotation makes them `alloca`s in the entry block of the (parallel) function.

The limit is far below the 8 MB stacks of Linux threads (TVM's workers and
callers alike), and buffers allocated once per call (padded inputs, whole
intermediates) stay in the workspace pool.
"""

from __future__ import annotations

import importlib

import tvm
import tvm_ffi
from tvm import tirx
from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock
from tvm.tirx import compilation_pipeline

from .strict import own_pass

__all__ = [
    "CPU_TIR_PIPELINE",
    "STACK_LIMIT_BYTES",
    "MEASURED_PIPELINE",
    "StackAllocateSmallBuffers",
    "tir_pipeline_for",
    "build_for_measurement",
]

#: name of the CPU pipeline in TVM's TIR pipeline registry (`tvm.compile(..., tir_pipeline=...)` takes names)
CPU_TIR_PIPELINE = "nxrt_tvm.cpu"

#: the largest scratch buffer put on the stack (register
#: tiles are under 2 KB; 16 KB leaves room for tuned tiles)
STACK_LIMIT_BYTES = 16 * 1024

#: what of this pipeline shapes measured times: tuning measures its baselines again when it changes
MEASURED_PIPELINE = f"{CPU_TIR_PIPELINE}/stack<={STACK_LIMIT_BYTES}"

#: `LowerTVMBuiltin`'s opt-out annotation (`tirx::transform::kDisableLowerTVMBuiltin`)
_KEEP_AS_ALLOCA = "disable_lower_builtin"


def _constant_bytes(buffer: tirx.Buffer) -> int | None:
    elements = 1
    for extent in buffer.shape:
        if not isinstance(extent, tirx.IntImm):
            return None
        elements *= int(extent.value)
    return elements * buffer.dtype.bits * buffer.dtype.lanes // 8


def _on_stack(alloc: tirx.AllocBuffer) -> tirx.AllocBuffer:
    annotations = dict(alloc.annotations or {})
    size = _constant_bytes(alloc.buffer)
    if (
        _KEEP_AS_ALLOCA in annotations
        or alloc.buffer.scope() not in ("global", "local")
        or size is None
        or size > STACK_LIMIT_BYTES
    ):
        return alloc
    annotations[_KEEP_AS_ALLOCA] = tirx.IntImm("bool", 1)
    return tirx.AllocBuffer(alloc.buffer, annotations=annotations, span=alloc.span)


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="nxrt_tvm.StackAllocateSmallBuffers")
@own_pass
def StackAllocateSmallBuffers(
    func: tirx.PrimFunc, _mod: tvm.IRModule, _ctx: tvm.transform.PassContext
) -> tirx.PrimFunc:
    """Mark constant-size global/local buffers up to `STACK_LIMIT_BYTES` to stay stack allocations."""
    return func.with_body(tvm_ffi.structural_map(func.body, (tirx.AllocBuffer, _on_stack)))


def _cpu_pipeline():
    main, finalize_host, finalize_device = compilation_pipeline.get_tir_pipeline("default")

    @tvm.transform.module_pass(opt_level=0, name=CPU_TIR_PIPELINE)
    def pipeline(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return StackAllocateSmallBuffers(main(mod))  # before finalize_host_passes' LowerTVMBuiltin

    return pipeline, finalize_host, finalize_device


compilation_pipeline.register_tir_pipeline(CPU_TIR_PIPELINE, _cpu_pipeline)


def tir_pipeline_for(target: tvm.target.Target) -> str:
    """The TIR pipeline name to build `target`'s kernels with (TVM's default off the CPU)."""
    return CPU_TIR_PIPELINE if target.kind.name == "llvm" else "default"


def build_for_measurement(mod: tvm.IRModule, target: tvm.target.Target, _params=None) -> tvm.runtime.Module:
    """MetaSchedule's default build (`LocalBuilder(f_build=...)`) with this pipeline: candidates are timed
    as compile will build them. Module-level, so builder worker processes import it by name.

    TVM's build imports its tensor intrinsics first; that takes 17 s here, in every worker of every build
    round, and no CPU fp32 schedule tensorises, so only other targets pay it.
    """
    if target.kind.name != "llvm":
        importlib.import_module("tvm.s_tir.tensor_intrin")
    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return tvm.tirx.build(mod, target=target, pipeline=tir_pipeline_for(target))
