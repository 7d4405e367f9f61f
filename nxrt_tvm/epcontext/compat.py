"""Is a compiled blob safe to load here? Checked before any native code is loaded.

A blob is refused when its bytes are not the ones compiled (size, sha256),
when its library is not well-formed ELF that dlopen can map safely (`elf`),
when nxrt-tvm's format or TVM's version differs (the runtime ABI), when it
was built for another target kind, or when it needs hardware this host lacks
(CPU ISA features such as AVX-512 or AMX; a CUDA GPU of its architecture).
"""

from __future__ import annotations

import json

import tvm

from ..api.errors import ContextIntegrityError, ContextTargetMismatch, ContextVersionMismatch
from ..lower.target import cpu_features, host_arch, host_cpu, requires_hardware
from ..runtime.elf import elf_problem
from .record import FORMAT_VERSION, EpContext, sha256_hex

__all__ = ["check_loadable"]

_RECOMPILE = (
    "recompile it on this host (`nxrt-tvm compile MODEL -o OUT`), or open it with the session config "
    "nxrt.context_on_mismatch='recompile' (or 'fallback')"
)


def check_loadable(ctx: EpContext, target: tvm.target.Target) -> None:
    """Raise a `ContextRejected` subclass saying what differs and what to do; return if loadable."""
    name = ctx.partition_name
    if ctx.format_version != FORMAT_VERSION:
        raise ContextVersionMismatch(
            name,
            f"EPContext format version {ctx.format_version}, this nxrt-tvm reads {FORMAT_VERSION}",
            _RECOMPILE,
        )
    if ctx.ep_sdk_version != tvm.__version__:
        raise ContextVersionMismatch(
            name,
            f"built by TVM {ctx.ep_sdk_version or '(unknown)'}, this host runs TVM {tvm.__version__}",
            _RECOMPILE,
        )
    if len(ctx.blob) != ctx.size:
        raise ContextIntegrityError(
            name,
            f"blob is {len(ctx.blob)} bytes, {ctx.size} were written (truncated or replaced)",
            "restore the artifact from the compile output, or recompile",
        )
    if sha256_hex(ctx.blob) != ctx.sha256:
        raise ContextIntegrityError(
            name,
            "blob sha256 does not match the one recorded at compile time (corrupted or swapped)",
            "restore the artifact from the compile output, or recompile",
        )
    try:
        built_kind = json.loads(ctx.target)["kind"]
    except (ValueError, KeyError, TypeError):
        raise ContextIntegrityError(
            name, f"unreadable target {ctx.target!r}", "recompile the model"
        ) from None
    if built_kind != target.kind.name:
        raise ContextTargetMismatch(
            name,
            f"built for target {built_kind!r}, this session targets {target.kind.name!r}",
            f"open it with the TvmExecutionProvider option target='{built_kind}', or {_RECOMPILE}",
        )
    if built_kind == "cuda":
        _check_gpu(name, ctx)
    else:
        _check_cpu(name, ctx)
    problem = elf_problem(ctx.blob, host_arch())
    if (
        problem is not None
    ):  # sha256 and size agree with notes that were rewritten with the blob: a forged artifact
        raise ContextIntegrityError(
            name,
            f"blob is not a loadable shared library: {problem}",
            "restore the artifact from the compile output, or recompile",
        )


def _check_cpu(name: str, ctx: EpContext) -> None:
    arch = ctx.hardware_architecture.split("/", 1)[0]
    if arch != host_arch():
        raise ContextTargetMismatch(name, f"built for {arch} CPUs, this host is {host_arch()}", _RECOMPILE)
    missing = sorted(f for f in set(ctx.cpu_features) - cpu_features(host_cpu()) if requires_hardware(f))
    if missing:
        shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        raise ContextTargetMismatch(
            name,
            (
                f"built for {ctx.hardware_architecture}, it needs CPU "
                f"features this host ({host_cpu()}) lacks: {shown}"
            ),
            _RECOMPILE,
        )


def _check_gpu(name: str, ctx: EpContext) -> None:
    device = tvm.cuda(0)
    needed = ctx.hardware_architecture.split("/", 1)[-1]
    if not device.exist:
        raise ContextTargetMismatch(
            name, f"built for a CUDA GPU ({needed}), none is visible on this host", _RECOMPILE
        )
    have = "sm_" + str(device.compute_version).replace(".", "")
    if have != needed:
        raise ContextTargetMismatch(name, f"built for {needed}, this GPU is {have}", _RECOMPILE)
