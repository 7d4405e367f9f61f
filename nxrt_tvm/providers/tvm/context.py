"""EPContext save/load for TVM kernels: the record written, and the checks before any native code loads."""

from __future__ import annotations

import json
from collections.abc import Mapping

import onnx
import tvm

from ...api.device import DeviceId
from ...api.kernel import KernelVariant
from ...epcontext.compat import check_loadable
from ...epcontext.record import EpContext, TensorSignature, sha256_hex
from ...epcontext.variants import describe_choice
from ...lower.target import hardware_of
from ...runtime.artifact import load_executable
from ...runtime.kernel import TvmKernel
from .weights import DeviceWeights

__all__ = ["context_of", "kernel_of"]


def context_of(
    kernel: TvmKernel,
    source: str,
    target: tvm.target.Target,
    tuning_digest: str,
    tuning_sources: tuple[str, ...] = (),
) -> EpContext:
    blob = kernel.blob if kernel.blob is not None else kernel.library.blob()
    hardware, features = hardware_of(target)
    return EpContext(
        source=source,
        partition_name=kernel.name,
        blob=blob,
        embed_mode=1,
        target=json.dumps(dict(target.export()), sort_keys=True, default=str),
        hardware_architecture=hardware,
        cpu_features=features,
        ep_sdk_version=tvm.__version__,
        sha256=sha256_hex(blob),
        size=len(blob),
        inputs=tuple(TensorSignature.of(i) for i in kernel.inputs),
        outputs=tuple(TensorSignature.of(o) for o in kernel.outputs),
        weights=kernel.weight_names,
        tuning_digest=tuning_digest,
        tuning_sources=tuning_sources,
    )


def kernel_of(
    context: EpContext,
    target: tvm.target.Target,
    device: DeviceId,
    weights: DeviceWeights,
    initializers: Mapping[str, onnx.TensorProto],
) -> TvmKernel:
    """Check the blob fits this host (raising `ContextRejected` before any native code loads),
    then load it."""
    loadable = check_loadable(context, target)
    library = load_executable(loadable.blob, loadable.partition_name, loadable.sha256)
    chosen = []
    if context.variants:  # the plan says which build of a fat node runs here
        mcpu = loadable.hardware_architecture.split("/", 1)[-1]
        chosen = [KernelVariant(context.partition_name, f"cpu:{mcpu}", describe_choice(context, mcpu))]
    return TvmKernel(
        library,
        device,
        context.partition_name,
        [s.to_info() for s in context.inputs],
        [s.to_info() for s in context.outputs],
        [(w, weights.bind(w, initializers)) for w in context.weights],
        blob=loadable.blob,
        variants=chosen,
    )
