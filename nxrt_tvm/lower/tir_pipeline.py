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

A kernel whose outputs are all empty at run time does nothing
(`SkipEmptyOutputs`): a schedule that fuses tile loops of symbolic extent
derives its scratch-buffer bounds by dividing by the tile count, which is 0
for a zero-size output, and an integer division by zero is SIGFPE (a 1-sample
waveform through a strided Conv1d + MaxPool gives a length-0 map).
"""

from __future__ import annotations

import importlib

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock
from tvm.tirx import compilation_pipeline

from . import (
    hyperbolic,  # noqa: F401 - registers cosh and sinh for llvm
    nearbyint,  # noqa: F401 - marks rounding vectorisable
)
from .schedules.core import LAYOUT_REWRITE
from .small_powers import SmallPowers
from .strict import own_pass
from .vector_guards import VersionGuardedVectors

__all__ = [
    "CPU_TIR_PIPELINE",
    "STACK_LIMIT_BYTES",
    "MEASURED_PIPELINE",
    "SkipEmptyOutputs",
    "StackAllocateSmallBuffers",
    "tir_pipeline_for",
    "build_for_measurement",
    "measured_module",
]

#: name of the CPU pipeline in TVM's TIR pipeline registry (`tvm.compile(..., tir_pipeline=...)` takes names)
CPU_TIR_PIPELINE = "nxrt_tvm.cpu"

#: the largest scratch buffer put on the stack (register
#: tiles are under 2 KB; 16 KB leaves room for tuned tiles)
STACK_LIMIT_BYTES = 16 * 1024

#: what of this pipeline shapes measured times: tuning measures its baselines again when it changes
MEASURED_PIPELINE = (
    f"{CPU_TIR_PIPELINE}/stack<={STACK_LIMIT_BYTES}/versioned-vectors/integer-powers/vector-nearbyint"
)

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


def _written_params(func: tirx.PrimFunc) -> list[tirx.Var]:
    """The parameter buffers `func` stores to: its outputs (Relax passes them last, unmarked)."""
    stored: list[tirx.Buffer] = []

    def note(store: tirx.BufferStore) -> tirx.BufferStore:
        stored.append(store.buffer)
        return store

    tvm_ffi.structural_map(func.body, (tirx.BufferStore, note))
    return [p for p in func.params if isinstance(p, tirx.Buffer) and any(b.same_as(p) for b in stored)]


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="nxrt_tvm.SkipEmptyOutputs")
@own_pass
def SkipEmptyOutputs(
    func: tirx.PrimFunc, _mod: tvm.IRModule, _ctx: tvm.transform.PassContext
) -> tirx.PrimFunc:
    """Run the kernel only when an output has elements, where an output's size is symbolic.

    Kernels that write only through calls (extern sorts, scans) have no stores and stay as they are.
    """
    outputs = _written_params(func)
    realize = func.body
    if (
        not isinstance(realize, s_tir.SBlockRealize)
        or not outputs
        or all(isinstance(d, tirx.IntImm) for buf in outputs for d in buf.shape)
    ):
        return func
    nonempty = tirx.any(*[tirx.all(*[d > 0 for d in buf.shape]) for buf in outputs])
    root = realize.block
    # the root's buffers move under the guard too: their compacted sizes may divide by the tile counts
    inner = s_tir.SBlock([], [], [], "nonempty", root.body, None, root.alloc_buffers, root.match_buffers)
    guarded = s_tir.SBlock(
        root.iter_vars,
        root.reads,
        root.writes,
        root.name_hint,
        tirx.IfThenElse(nonempty, s_tir.SBlockRealize([], tirx.const(True, "bool"), inner), None),
        root.init,
        annotations=root.annotations,
    )
    return func.with_body(s_tir.SBlockRealize(realize.iter_values, realize.predicate, guarded))


def _lowering_passes(config) -> list[tvm.transform.Pass]:
    """TVM 0.27's default TIR lowering (`tvm.s_tir.pipeline.default_s_tir_pipeline`), pass for pass, for
    CPU kernels: our passes go where TVM's list has no hook (`VersionGuardedVectors` must see the
    flattened loops before `VectorizeLoop`)."""
    S, X = s_tir.transform, tirx.transform
    passes = [
        SmallPowers,
        S.CanonicalizeLoop(),
        S.LowerCrossThreadReduction(),
        S.LowerInitBlock(),
        S.PlanAndUpdateBufferAllocationLocation(),
        S.ConvertBlocksToOpaque(),
        S.LiftThreadBinding(),
        S.ManifestSharedMemoryLocalStage(),
        S.CompactBufferAllocation(),
        S.LowerAutoCopy(),
        S.UnifyThreadBinding(),
        S.LowerMatchBuffer(),
        S.StmtSimplify(),
        S.InjectPermutedLayout(),
        S.AnnotateIrregularLoop(),
        S.InjectSoftwarePipeline(),
        S.TransformMmaBufferLayout(),
        S.LowerOpaqueBlock(),
        X.FlattenBuffer(),
        X.BF16ComputeLegalize(),
        X.NarrowDataType(32),
        S.LoopPartition(),
        VersionGuardedVectors,
        X.VectorizeLoop(not bool(config.get("tirx.disable_vectorize", False))),
        S.InjectVirtualThread(),
        S.InjectDoubleBuffer(),
    ]
    if not bool(config.get("tirx.disable_storage_rewrite", False)):
        passes.append(X.StorageRewrite())
    passes += [
        S.HoistIfThenElse(),
        X.UnrollLoop(),
        S.RenormalizeSplitPattern(),
        X.StmtSimplify(),
        X.RemoveNoOp(),
        S.RewriteUnsafeSelect(),
    ]
    if bool(config.get("tirx.instrument_bound_checkers", False)):
        passes.append(S.InstrumentBoundCheckers())
    if not bool(config.get("tirx.disable_cse_tir", False)):
        passes.append(X.CommonSubexprElim())
    return passes + [
        X.FP8ComputeLegalize(),
        S.VerifyVTCMLimit(),
        S.LowerVtcmAlloc(),
        X.VerifyMemory(),
        X.AnnotateEntryFunc(),
        S.ThreadSync("shared"),
        S.ThreadSync("shared.dyn"),
        S.ThreadSync("warp"),
        S.InferFragment(),
        S.LowerThreadAllreduce(),
        S.MergeSharedMemoryAllocations(),
        X.SplitHostDevice(),
        X.MakePackedAPI(),
        X.FP8StorageLegalize(),
        X.BF16StorageLegalize(),
    ]


def _cpu_pipeline():
    _, finalize_host, finalize_device = compilation_pipeline.get_tir_pipeline("default")

    @tvm.transform.module_pass(opt_level=0, name=CPU_TIR_PIPELINE)
    def pipeline(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        # the guard wraps blocks (before lowering); stack marks precede finalize's LowerTVMBuiltin
        lowering = _lowering_passes(tvm.transform.PassContext.current().config)
        return StackAllocateSmallBuffers(tvm.transform.Sequential(lowering)(SkipEmptyOutputs(mod)))

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


def measured_module(mod: tvm.IRModule) -> tvm.IRModule:
    """A scheduled kernel as its measurement builds and feeds it: a weight packed with padding (the
    matmul and conv rules' `pad_einsum` zero fill, where a tile does not divide the output channels:
    SqueezeNet's 1000 classes on AVX-512) is copied by a select, which MetaSchedule's
    `RemoveWeightLayoutRewriteBlock` cannot take ("Check failed: (load)"): the rule's schedule went
    unmeasured and a searched record slower than it was applied. The measured kernel takes the packed
    weight as its argument either way (compile folds the packing into a constant), so the select, never
    run, is dropped."""

    def plain_copy(block: s_tir.SBlock) -> s_tir.SBlock:
        store = block.body
        if LAYOUT_REWRITE not in block.annotations or not isinstance(store, tirx.BufferStore):
            return block
        value = store.value
        if not (
            isinstance(value, tvm.ir.Call)
            and value.op.name == "prim.if_then_else"
            and isinstance(value.args[1], tvm.ir.TensorLoad)
        ):
            return block
        copy = tirx.BufferStore(store.buffer, value.args[1], store.indices)
        return s_tir.SBlock(
            block.iter_vars,
            block.reads,
            block.writes,
            block.name_hint,
            copy,
            block.init,
            block.alloc_buffers,
            block.match_buffers,
            block.annotations,
        )

    return tvm_ffi.structural_map(mod, (s_tir.SBlock, plain_copy))
