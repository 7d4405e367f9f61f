"""The lowering pipeline: a few named phases of TVM passes, joined in one place.

Phases follow TVM's own backend pipelines (library dispatch, legalise,
dataflow lowering, finalise) so a change touches one list; user passes run
on the imported Relax module, before the first phase.
"""
from __future__ import annotations

from collections.abc import Sequence

import tvm

from tvm.relax.backend.cpu_generic import pipeline as cpu_generic
from tvm.relax.backend.cuda import pipeline as cuda

__all__ = ["lowering_passes", "lowering_pipeline"]


def _backend(target: tvm.target.Target):
    return cuda if target.kind.name == "cuda" else cpu_generic


def lowering_passes(target: tvm.target.Target, user_passes: Sequence[tvm.transform.Pass] = ()) -> list[tvm.transform.Pass]:
    """Every pass that turns an imported Relax module into a buildable one, in order."""
    backend = _backend(target)
    return [
        *user_passes,
        *backend.library_dispatch_passes(target),
        *backend.legalize_passes(target),
        *backend.dataflow_lower_passes(target),
        *backend.finalize_passes(target),
    ]


def lowering_pipeline(target: tvm.target.Target, user_passes: Sequence[tvm.transform.Pass] = ()) -> tvm.transform.Pass:
    """`lowering_passes` as one module pass that runs inside the target's scope (some passes read it)."""
    passes = lowering_passes(target, user_passes)

    @tvm.transform.module_pass(opt_level=0, name="nxrt_tvm.lowering")
    def _pipeline(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        with target:
            return tvm.transform.Sequential(passes)(mod)

    return _pipeline


