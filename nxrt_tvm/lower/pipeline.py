"""The lowering pipeline: a few named phases of TVM passes, joined in one place.

Phases follow TVM's own backend pipelines (library dispatch, legalise,
dataflow lowering, finalise) so a change touches one list; user passes run
on the imported Relax module, before the first phase. On llvm targets two
more phases carry the default CPU schedules (`nxrt_tvm.lower.schedules`):
fast math before legalisation, and the schedule rules right after FuseTIR.
Tuning records apply first in that schedule phase, so a tuned kernel wins
over the rules; the kernels after FuseTIR are what tuning tasks are made of
(`fusion_passes`), so extraction and compilation share those phases.
Constant weights may be repacked by a schedule (`layout_passes`): the
repacking is moved out of the kernel and folded at compile time.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, s_tir
from tvm.relax.backend.cpu_generic import pipeline as cpu_generic
from tvm.relax.backend.cuda import pipeline as cuda

from ..api.kernel import KernelVariant
from ..timing import mark_phase
from . import schedules
from .fold_constants import with_bulk_folding
from .integer_matmul import IntegerMatmul
from .lift_constants import lift_constants
from .named_sizes import NameCompoundSizes
from .qlinear import QLinearAsOnnxruntime
from .reshape_views import ReshapeKernelsAsViews, legalize_reshape
from .schedules.base import RULE_ATTR
from .schedules.core import LAYOUT_REWRITE
from .size_params import MergeNamedKernels, SizeParamsInOrder
from .strict import own_pass
from .tuned import SEARCHED_MARGIN, TUNING_ATTR, ApplyTuningRecords, TuningDatabase, TuningRecords

__all__ = [
    "codegen_digest",
    "RECORD_UNFIT",
    "RULE_KEPT",
    "Lowering",
    "fusion_passes",
    "layout_passes",
    "lowering_passes",
    "lowering_pipeline",
    "schedule_phase",
]


@dataclass(frozen=True)
class Lowering:
    """How partitions are lowered: user passes, schedule rules (None: the defaults), tuning records."""

    user_passes: tuple[tvm.transform.Pass, ...] = ()
    schedule_passes: tuple[tvm.transform.Pass, ...] | None = None
    database: TuningDatabase | TuningRecords | None = field(default=None, compare=False)
    conv_algorithm: str = "auto"  #: `schedules.CONV_ALGORITHMS`: "direct" keeps every convolution direct

    def digest(self) -> str:
        """What of this configuration shapes compiled code (compile-cache keys)."""
        schedule = (
            "default" if self.schedule_passes is None else ",".join(p.info.name for p in self.schedule_passes)
        )
        return "|".join(
            [
                ",".join(p.info.name for p in self.user_passes),
                schedule,
                self.database.digest if self.database is not None else "",
                self.conv_algorithm,
            ]
        )


#: the source that decides what code a partition compiles to: the frontend's converters and all of `lower/`
#: what makes kernels: the converters, this package (passes,
#: rules, pipelines, tuning-record replay), the linker
_CODEGEN_SOURCES = (
    Path(__file__).parents[1] / "frontend.py",
    Path(__file__).parent,
    Path(__file__).parents[1] / "runtime" / "artifact.py",
)


@functools.cache
def codegen_digest() -> str:
    """sha256 of the nxrt-tvm source that generates kernels (converters, passes, schedule rules, pipelines).

    Part of compile-cache keys: a changed rule or pass rebuilds instead of serving kernels the old code made.
    """
    h = hashlib.sha256()
    for root in _CODEGEN_SOURCES:
        for path in sorted(root.rglob("*.py")) if root.is_dir() else [root]:
            h.update(str(path.relative_to(root.parent)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _backend(target: tvm.target.Target):
    return cuda if target.kind.name == "cuda" else cpu_generic


def schedule_phase(
    target: tvm.target.Target,
    schedule_passes: Sequence[tvm.transform.Pass] | None = None,
    conv_algorithm: str = "auto",
) -> tuple[list[tvm.transform.Pass], list[tvm.transform.Pass]]:
    """(before legalisation, after FuseTIR) passes of the default schedules.

    `schedule_passes=None` gives the defaults for `target` (none for cuda,
    whose backend schedules with dlight in its own phases); an explicit list
    replaces both (`[]`: TVM's unscheduled default kernels).
    """
    if schedule_passes is not None:
        return [], list(schedule_passes)
    if target.kind.name != "llvm":
        return [], []
    return schedules.pre_legalize_passes(target, conv_algorithm), schedules.cpu_schedule_passes(target)


def layout_passes(target: tvm.target.Target) -> tuple[list[tvm.transform.Pass], list[tvm.transform.Pass]]:
    """(after FuseTIR, after scheduling) passes that let CPU kernels repack constant weights at compile time.

    The first marks kernel parameters bound to constants as layout-free; a schedule (the matmul
    rule, or a tuning record made by MetaSchedule's RewriteLayout) may then read them through a
    layout-rewrite block, which the second pair moves out of the kernel and folds on the constant.
    """
    if target.kind.name != "llvm":
        return [], []
    return [relax.transform.AttachAttrLayoutFreeBuffers()], [
        _split_layout_rewrites(),
        *with_bulk_folding([relax.transform.FoldConstant()]),
        # the kernels split, and the weight-packing kernels run on the constants now: building those
        # cost mobilenet_v3 43 of its 112 kernels' code generation
        relax.transform.DeadCodeElimination(),
    ]


def _rewrites_layout(func: tvm.tirx.PrimFunc) -> bool:
    """Whether a block of `func` carries the layout-rewrite mark (a walk over its blocks: a schedule made
    to look took 0.76 of YOLOv8n's 0.91 s in this pass)."""

    def marked(block: s_tir.SBlock) -> tvm_ffi.VisitInterrupt | None:
        return tvm_ffi.VisitInterrupt(block) if LAYOUT_REWRITE in block.annotations else None

    return tvm_ffi.structural_walk(func.body, (s_tir.SBlock, marked), order="pre") is not None


def _split_layout_rewrites() -> tvm.transform.Pass:
    """`SplitLayoutRewritePreproc` on the kernels that have a layout-rewrite block, and only those.

    TVM's pass visits every kernel of the module it is given and fails on any whose root holds a
    statement outside a block (a size check's assert, a scan), so the mark is dropped where no schedule
    used it and the pass sees only the kernels that keep it; it is skipped when none does. Before, one
    size check in a BERT export's partition left every matmul repacking its weight at each call.
    """

    @tvm.transform.module_pass(opt_level=0, name="nxrt_tvm.SplitLayoutRewrites")
    @own_pass
    def split(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        # TVM's pass visits every kernel and fails on one whose root holds a statement without a block
        # (our size checks' assert), so it sees only the Relax functions and the kernels it splits
        functions, rewriting, others = {}, {}, {}
        for gv, func in mod.functions_items():
            if not isinstance(func, tvm.tirx.PrimFunc):
                functions[gv] = func
            elif "layout_free_buffers" not in (func.attrs or {}):
                others[gv] = func
            elif _rewrites_layout(func):
                rewriting[gv] = func
            else:
                others[gv] = func.without_attr("layout_free_buffers")
        if not rewriting:
            return mod
        try:
            split = relax.transform.SplitLayoutRewritePreproc()(
                tvm.IRModule({**functions, **rewriting}, attrs=mod.attrs)
            )
        except tvm.error.InternalError:
            return _unsplittable_kept_inside(mod)
        for gv, func in others.items():
            split[gv] = func
        return split  # the kernels split stay until the dead-code pass after the fold (`layout_passes`)

    return split


def _unsplittable_kept_inside(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every layout-rewrite mark dropped, for a module TVM's `SplitLayoutRewritePreproc`
    fails on: the weight packing stays inside each kernel (run at every call, right all the same).

    No kernel of the corpus needs it since the pass stopped seeing the kernels it does not split.
    """
    mod = mod.clone()
    for gv, func in list(mod.functions_items()):
        if (
            not isinstance(func, tvm.tirx.PrimFunc)
            or func.attrs is None
            or "layout_free_buffers" not in func.attrs
        ):
            continue
        if isinstance(func.body, s_tir.SBlockRealize):
            sch = s_tir.Schedule(func)
            pending = [sch.get_sblock(func.body.block.name_hint)]
            while pending:
                block = pending.pop()
                if LAYOUT_REWRITE in sch.get(block).annotations:
                    sch.unannotate(block, LAYOUT_REWRITE)
                pending.extend(sch.get_child_blocks(block))
            func = sch.mod["main"]
        mod[gv] = func.without_attr("layout_free_buffers")
    return mod


def _empty_constants_allocated() -> tvm.transform.Pass:
    """Each constant with no elements becomes an allocation of its shape: TVM writes such a constant
    into the executable but cannot read it back ("Invalid DLTensor file format" when the module
    loads), and a zero-size pad (`ConstantOfShape` of a [2, 4, 0] shape) is an ordinary export."""

    @relax.expr_functor.mutator
    class _Allocate(relax.PyExprMutator):
        def visit_generic_const_(self, op: tvm.ir.GenericConst) -> relax.Expr:
            value = op.value
            if not isinstance(value, tvm.runtime.Tensor) or 0 not in value.shape:
                return op
            return relax.op.builtin.alloc_tensor(relax.ShapeExpr(list(value.shape)), value.dtype, 0)

    @tvm.transform.module_pass(opt_level=0, name="nxrt_tvm.EmptyConstantsAllocated")
    def allocate(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        mutator = _Allocate(mod)
        for gv, func in mod.functions_items():
            if isinstance(func, relax.Function):
                mutator.builder_.update_func(gv, mutator.visit_expr(func))
        return mutator.builder_.get()

    return allocate


def fusion_passes(target: tvm.target.Target, lowering: Lowering = Lowering()) -> list[tvm.transform.Pass]:
    """Up to FuseTIR (and layout-free marks): the kernels
    here are the workloads tuning records are keyed on."""
    backend = _backend(target)
    pre_legalize, _ = schedule_phase(target, lowering.schedule_passes, lowering.conv_algorithm)
    mark_layout_free, _ = layout_passes(target)
    legalize: list[tvm.transform.Pass] = []
    for p in with_bulk_folding(backend.legalize_passes(target)):
        if p.info.name == "LegalizeOps":  # TVM's, with reshape kernels marked (`lower.reshape_views`)
            p = relax.transform.LegalizeOps({"relax.reshape": legalize_reshape})
        legalize.append(p)
        # each makes kernels whose size parameters it orders by address (`lower.size_params`)
        if p.info.name in ("LegalizeOps", "FuseTIR"):
            legalize.append(SizeParamsInOrder)
        if p.info.name == "FuseTIR":
            legalize.append(ReshapeKernelsAsViews)
    return [
        *backend.library_dispatch_passes(target),
        QLinearAsOnnxruntime(target),
        IntegerMatmul(target),
        *pre_legalize,
        *legalize,
        *mark_layout_free,
    ]


_TUNED = {
    "exact": ("tuned", "a tuning record of this device matched"),
    "anchor": ("tuned:anchor", "a tuning record of the same anchor op (another epilogue) was transferred"),
}


#: The reason a kernel with tuning records runs the default rule (the searched ones did not beat it).
RULE_KEPT = f"tuning found no schedule {SEARCHED_MARGIN:.0%} faster than the default rule"
#: The reason a kernel with a matching record runs the default rule: the record's trace did not replay on it.
RECORD_UNFIT = "a tuning record matched but did not replay on this kernel (logged); default CPU schedule rule"


def _variant(name: str, attrs) -> KernelVariant:
    how, _, source = str(attrs.get(TUNING_ATTR, "")).partition("@")
    if how in _TUNED:
        variant, reason = _TUNED[how]
        if source:  # a compatible key's record (lower.device_key.compatible_keys)
            variant = f"{variant}:transferred from {source}"
            reason = (
                f"{reason.replace('of this device ', '')}, tuned on {source} (ISA features all present here)"
            )
        return KernelVariant(name, variant, reason)
    if RULE_ATTR in attrs:
        reason = {"rule-best": RULE_KEPT, "unfit": RECORD_UNFIT}.get(
            how, "no tuning record; default CPU schedule rule"
        )
        if source:
            reason = f"{reason} (records of {source})"
        return KernelVariant(name, f"default:{attrs[RULE_ATTR]}", reason)
    return KernelVariant(name, "tvm-default", "no tuning record and no schedule rule fits")


def _record(variants: list[KernelVariant]) -> tvm.transform.Pass:
    """A pass that notes, per kernel, which implementation the schedule phase gave it."""

    @tvm.transform.module_pass(opt_level=0, name="nxrt_tvm.record_variants")
    @own_pass
    def record(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        variants.clear()
        for gv, func in mod.functions.items():
            if isinstance(func, tvm.tirx.PrimFunc):
                variants.append(_variant(gv.name_hint, func.attrs or {}))
        return mod

    return record


def lowering_passes(
    target: tvm.target.Target,
    lowering: Lowering = Lowering(),
    variants: list[KernelVariant] | None = None,
    constants: list[np.ndarray] | None = None,
) -> list[tvm.transform.Pass]:
    """Every pass that turns an imported Relax module into a buildable one, in order.

    With `variants`, the list is filled with which implementation each kernel got; with `constants` (CPU
    targets), with the large constants lifted out of the module into parameters (`lift_constants`).
    """
    backend = _backend(target)
    _, schedule = schedule_phase(target, lowering.schedule_passes, lowering.conv_algorithm)
    _, fold_layouts = layout_passes(target)
    tuned = [ApplyTuningRecords(lowering.database)] if lowering.database is not None else []
    notes = variants if variants is not None else []
    return [
        _step("relax passes"),
        *lowering.user_passes,
        *fusion_passes(target, lowering),
        _step("schedules"),
        *tuned,
        *([NameCompoundSizes, MergeNamedKernels] if target.kind.name == "llvm" else []),  # rules tile them
        *schedule,
        _step("relax passes"),
        *fold_layouts,
        _record(notes),  # after the layout rewrites, which rename the kernels they split (`..._prepacked`)
        _empty_constants_allocated(),  # after the last FoldConstant
        *backend.dataflow_lower_passes(target),
        *backend.finalize_passes(target),
        *([lift_constants(constants)] if constants is not None and target.kind.name == "llvm" else []),
        _step("codegen"),  # what tvm.compile does after this pipeline: VM code, TIR passes, LLVM
    ]


def _step(name: str) -> tvm.transform.Pass:
    """A pass that only says the lowering has reached step `name` (`timing.mark_phase`)."""

    @tvm.transform.module_pass(opt_level=0, name=f"nxrt_tvm.step.{name.replace(' ', '_')}")
    def step(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        mark_phase(name)
        return mod

    return step


def lowering_pipeline(
    target: tvm.target.Target,
    lowering: Lowering = Lowering(),
    variants: list[KernelVariant] | None = None,
    constants: list[np.ndarray] | None = None,
) -> tvm.transform.Pass:
    """`lowering_passes` as one module pass, run inside the target's scope (the schedule passes read it)."""

    @tvm.transform.module_pass(opt_level=0, name="nxrt_tvm.lowering")
    def _pipeline(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        with target:
            return tvm.transform.Sequential(lowering_passes(target, lowering, variants, constants))(mod)

    return _pipeline
