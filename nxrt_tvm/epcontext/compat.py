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
from ..runtime.artifact import blob_problem
from .record import FAT_FORMAT_VERSION, FORMAT_VERSION, BlobVariant, EpContext, sha256_hex
from .variants import choose_variant, closeness

__all__ = ["check_loadable", "COMPATIBILITY_KEY", "compatibility_info", "judge_compatibility"]

#: Model metadata entry onnxruntime reads a compiled model's compatibility from
#: (`ep_compatibility_info.<EP type>`; `GetCompatibilityInfoFromModel`).
COMPATIBILITY_KEY = "ep_compatibility_info.TvmExecutionProvider"

_RECOMPILE = (
    "recompile it on this host (`nxrt-tvm compile MODEL -o OUT`), or open it with the session config "
    "nxrt.context_on_mismatch='recompile' (or 'fallback')"
)


def check_loadable(ctx: EpContext, target: tvm.target.Target) -> EpContext:
    """The context to load (of a fat one, the CPU variant chosen for this host); raise a `ContextRejected`
    subclass saying what differs and what to do where nothing in it may load here."""
    name = ctx.partition_name
    if ctx.format_version not in (FORMAT_VERSION, FAT_FORMAT_VERSION):
        raise ContextVersionMismatch(
            name,
            f"EPContext format version {ctx.format_version}, "
            f"this nxrt-tvm reads {FORMAT_VERSION} and {FAT_FORMAT_VERSION}",
            _RECOMPILE,
        )
    if (ctx.format_version == FAT_FORMAT_VERSION) != bool(ctx.variants):
        raise ContextIntegrityError(
            name,
            f"format version {ctx.format_version} with {len(ctx.variants)} CPU variants listed",
            "restore the artifact from the compile output, or recompile",
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
    if ctx.variants:  # the bundle is intact: check and load the one variant this host runs
        return check_loadable(choose_variant(ctx), target)
    if built_kind == "cuda":
        _check_gpu(name, ctx)
    else:
        _check_cpu(name, ctx)
    problem = blob_problem(ctx.blob)
    if (
        problem is not None
    ):  # sha256 and size agree with notes that were rewritten with the blob: a forged artifact
        raise ContextIntegrityError(
            name,
            f"blob is not a loadable shared library: {problem}",
            "restore the artifact from the compile output, or recompile",
        )
    return ctx


def compatibility_info(ctx: EpContext) -> str:
    """What a host must have to run `ctx` (any partition of a compile: they share format, TVM and CPU
    targets), as the JSON onnxruntime hands the plugin's `ValidateCompiledModelCompatibilityInfo`."""
    builds = ctx.variants or (
        BlobVariant(
            ctx.hardware_architecture.split("/", 1)[-1],
            ctx.target,
            ctx.hardware_architecture,
            ctx.cpu_features,
            0,
            ctx.size,
            ctx.sha256,
        ),
    )
    info = {
        "ep": "nxrt-tvm",
        "format_version": ctx.format_version,
        "tvm": ctx.ep_sdk_version,
        "kind": json.loads(ctx.target).get("kind", ""),
        "variants": [
            {"hardware_architecture": v.hardware_architecture, "cpu_features": list(v.cpu_features)}
            for v in builds
        ],
    }
    return json.dumps(info, sort_keys=True, separators=(",", ":"))


def judge_compatibility(info: str) -> tuple[str, str]:
    """onnxruntime's verdict on a compatibility string for this host (`optimal`,
    `prefer_recompilation` or `unsupported`), and why; the plugin judges the same way."""
    try:
        value = json.loads(info)
        variants = [(str(v["hardware_architecture"]), set(v["cpu_features"])) for v in value["variants"]]
        fmt, version, kind = value["format_version"], value["tvm"], value["kind"]
    except (ValueError, KeyError, TypeError) as exc:
        return "unsupported", f"unreadable compatibility info ({exc})"
    if value.get("ep") != "nxrt-tvm" or fmt not in (FORMAT_VERSION, FAT_FORMAT_VERSION):
        return (
            "unsupported",
            f"EPContext format {fmt!r}, this nxrt-tvm reads {FORMAT_VERSION} and {FAT_FORMAT_VERSION}",
        )
    if version != tvm.__version__:
        return "unsupported", f"built by TVM {version}, this host runs TVM {tvm.__version__}"
    if kind != "llvm":
        return "unsupported", f"built for target {kind!r}; compatibility is judged for CPU (llvm) builds"
    have = cpu_features(host_cpu())
    fits = [
        (hw, needs)
        for hw, needs in variants
        if hw.split("/", 1)[0] == host_arch() and not any(requires_hardware(f) for f in needs - have)
    ]
    if not fits:
        built = ", ".join(hw for hw, _ in variants)
        return "unsupported", f"no CPU variant ({built}) runs on this {host_cpu()}"
    best = max(fits, key=lambda hw_needs: closeness(hw_needs[0].split("/", 1)[-1], hw_needs[1]))[0]
    own = f"{host_arch()}/{host_cpu()}"
    if best == own:
        return "optimal", f"built for this CPU ({own})"
    return "prefer_recompilation", f"runs its build for {best}; recompiling here would target {own}"


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
