"""Tuning tasks: the fused TIR kernels of every TVM partition, deduplicated across partitions and models."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import tvm
import tvm_ffi
from tvm import s_tir
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.analysis import estimate_tir_flops
from tvm.s_tir.dlight.analysis import normalize_prim_func

from ..api.claim import SubgraphClaim
from ..graph.model import GraphView
from ..lower.build import imported, partition_model
from ..lower.pipeline import Lowering, fusion_passes

__all__ = ["TuningTask", "extract_tasks", "fuse", "has_reduction"]

log = logging.getLogger(__name__)


@dataclass
class TuningTask:
    """One distinct kernel: how often the models call it, and its cost per call."""

    name: str
    workload: str  # structural hash of the kernel: the identity MetaSchedule's database uses
    extracted: ms.ExtractedTask
    weight: int
    flops: float
    partitions: list[str] = field(default_factory=list)

    @property
    def weighted_flops(self) -> float:
        return self.weight * max(self.flops, 1.0)


def fuse(mod: tvm.IRModule, target: tvm.target.Target, lowering: Lowering = Lowering()) -> tvm.IRModule:
    """The module as lowering sees it when tuning records are applied (after operator fusion)."""
    with target:
        return tvm.transform.Sequential([*lowering.user_passes, *fusion_passes(target, lowering)])(mod)


def extract_tasks(
    partitions: Sequence[tuple[GraphView, SubgraphClaim]],
    target: tvm.target.Target,
    lowering: Lowering = Lowering(),
) -> list[TuningTask]:
    """Tasks of all partitions, merged by workload, heaviest (weight x flops) first.

    `lowering` is the compile configuration the records are for: its user passes and convolution
    algorithm change which kernels there are.
    """
    tasks: dict[str, TuningTask] = {}
    skipped: list[str] = []
    movement: list[str] = []
    for graph, claim in partitions:
        fused = fuse(imported(partition_model(graph, claim.nodes, claim.name)), target, lowering)
        for extracted in ms.relax_integration.extract_tasks(fused, target):
            if extracted.mod.attrs is not None and extracted.mod.attrs.get("tirx.is_scheduled", False):
                continue
            kernel = extracted.dispatched[0]
            if not _static(kernel):
                skipped.append(extracted.task_name)
                continue
            if not has_reduction(kernel):
                movement.append(extracted.task_name)
                continue
            workload = str(tvm_ffi.structural_hash(kernel))
            task = tasks.get(workload)
            if task is None:
                try:
                    flops = float(estimate_tir_flops(kernel))
                except Exception:  # dynamic shapes have no static flop count
                    flops = 0.0
                task = tasks[workload] = TuningTask(extracted.task_name, workload, extracted, 0, flops)
            task.weight += int(extracted.weight)
            task.partitions.append(claim.name)
    if skipped:
        log.warning(
            "%d kernel(s) have symbolic shapes, which MetaSchedule cannot tune (%s); fix the dims "
            "(tune_model(free_dims={'N': 64}) / --dim N=64) to tune them",
            len(skipped),
            ", ".join(sorted(set(skipped))[:5]),
        )
    if movement:
        log.info(
            "%d elementwise/data-movement kernel(s) left to the default schedule rules (memory-bound: "
            "their parallel, vectorised loops are what tuning would find): %s",
            len(movement),
            ", ".join(sorted(set(movement))[:5]),
        )
    return sorted(tasks.values(), key=lambda t: (-t.weighted_flops, t.name))


def has_reduction(kernel: tvm.IRModule) -> bool:
    """Whether a kernel reduces (matmul, conv, pooling, norms): where tuning beats the default rules.

    Measured here: records for transposes and reshapes came out 10-100x slower than
    the default rules' loops after 16 trials, so such kernels are not tuned.
    """
    try:
        infos = normalize_prim_func(s_tir.Schedule(kernel["main"]))
    except Exception:  # analysis gaps: let tuning try
        return True
    return infos is None or any("R" in info.dom_kind() for info in infos)


def _static(kernel: tvm.IRModule) -> bool:
    for func in kernel.functions.values():
        for buffer in getattr(func, "params", ()):
            shape = getattr(buffer, "shape", ())
            if any(not isinstance(d, tvm.tirx.IntImm) for d in shape):
                return False
    return True
