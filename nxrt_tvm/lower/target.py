"""TVM targets for the host CPU (features detected) and CUDA."""

from __future__ import annotations

import json
import os
from functools import lru_cache
from typing import Any

import tvm

from ..api.device import DeviceId, DeviceType
from ..api.errors import InvalidProviderOptions

__all__ = [
    "make_target",
    "target_device",
    "tvm_device",
    "host_cpu",
    "host_arch",
    "runtime_threads",
    "hardware_of",
    "cpu_features",
    "requires_hardware",
]

TargetSpec = str | dict[str, Any] | tvm.target.Target


def host_cpu() -> str:
    """LLVM's name for this CPU (e.g. ``znver5``): the code uses every ISA feature it has."""
    return str(tvm.target.codegen.llvm_get_system_cpu())


def host_arch() -> str:
    """The host's architecture as LLVM's triple names it (e.g. ``x86_64``)."""
    return str(tvm.target.codegen.llvm_get_system_triple()).split("-", 1)[0]


def runtime_threads() -> int:
    """Threads TVM's pool runs with: every core this process may use (TVM's own default is half on x86)."""
    return int(os.environ.get("TVM_NUM_THREADS") or len(os.sched_getaffinity(0)))


def _cuda_arch() -> str:
    dev = tvm.cuda(0)
    if dev.exist:
        return "sm_" + str(dev.compute_version).replace(".", "")
    return "sm_90"  # what to build for when no GPU is visible (compile-only hosts)


def make_target(spec: TargetSpec = "llvm") -> tvm.target.Target:
    """Resolve ``"llvm"``, ``"cuda"``, a JSON/dict target or a `Target` into a concrete target."""
    if isinstance(spec, tvm.target.Target):
        return spec
    if isinstance(spec, str):
        text = spec.strip()
        if text.startswith("{"):
            try:
                spec = json.loads(text)
            except json.JSONDecodeError as exc:
                raise InvalidProviderOptions(f"target {text!r} is not valid JSON: {exc}") from exc
        elif text == "llvm":
            spec = {"kind": "llvm"}
        elif text == "cuda":
            spec = {"kind": "cuda"}
        else:
            raise InvalidProviderOptions(
                f"target {text!r} is not understood; use 'llvm', 'cuda' or a JSON target dict such as "
                '\'{"kind": "llvm", "mcpu": "skylake-avx512"}\''
            )
    if not isinstance(spec, dict) or "kind" not in spec:
        raise InvalidProviderOptions(f"target {spec!r} must name a 'kind' ('llvm' or 'cuda')")
    spec = dict(spec)
    kind = spec["kind"]
    if kind == "llvm":
        spec.setdefault("mcpu", host_cpu())
        spec.setdefault("num-cores", runtime_threads())
        return tvm.target.Target(spec)
    if kind == "cuda":
        spec.setdefault("arch", _cuda_arch())
        host = {"kind": "llvm", "mcpu": host_cpu()}
        return tvm.target.Target(spec, host=host)
    raise InvalidProviderOptions(f"target kind {kind!r} is not supported; use 'llvm' or 'cuda'")


def target_device(target: tvm.target.Target) -> DeviceId:
    return DeviceId(DeviceType.CUDA if target.kind.name == "cuda" else DeviceType.CPU, 0)


def tvm_device(device: DeviceId) -> tvm.runtime.Device:
    return tvm.cuda(device.ordinal) if device.type is DeviceType.CUDA else tvm.cpu(device.ordinal)


#: LLVM "features" that tune code generation rather than
#: require hardware (the plugin's cpu.c keeps the same list).
_TUNING_HINTS = frozenset(
    {
        "64bit-mode",
        "allow-light-256-bit",
        "branchfusion",
        "macrofusion",
        "idivq-to-divl",
        "idivl-to-divb",
        "sbb-dep-breaking",
        "nopl",
        "fsrm",
        "ermsb",
        "lea-sp",
        "lea-uses-ag",
        "pad-short-functions",
        "use-glm-div-sqrt-costs",
        "use-slm-arith-costs",
        "branch-hint",
        "harden-sls-ijmp",
        "harden-sls-ret",
        "retpoline",
        "retpoline-external-thunk",
        "retpoline-indirect-branches",
        "retpoline-indirect-calls",
        "lvi-cfi",
        "lvi-load-hardening",
        "seses",
        "inline-asm-use-gpr32",
        "faster-shift-than-shuffle",
        "vzeroupper",
    }
)
_TUNING_PREFIXES = ("fast-", "slow-", "tuning-", "prefer-", "false-deps-", "avoid-", "no-bypass-delay")
#: ISA features LLVM never emits for TVM's kernels (system, privileged or intrinsic-only
#: instructions): a build for a CPU with them runs on one without (cpu.c's NOT_EMITTED).
_NOT_EMITTED = frozenset(
    """fxsr xsave xsavec xsaveopt xsaves fsgsbase invpcid pku shstk ibt rdpid rdpru mwaitx monitorx
    clzero wbnoinvd movdiri movdir64b prefetchi clflushopt clwb sgx rtm hle waitpkg serialize tsxldtrk
    uintr enqcmd hreset kl widekl cldemote ptwrite pconfig lwp prefetchwt1 cmpccxadd raoint usermsr
    rdrnd rdseed""".split()
)


def requires_hardware(feature: str) -> bool:
    """Whether code built with LLVM feature `feature` needs it in the hardware (not a tuning hint)."""
    return (
        feature not in _TUNING_HINTS
        and feature not in _NOT_EMITTED
        and not feature.startswith(_TUNING_PREFIXES)
    )


@lru_cache(maxsize=None)
def cpu_features(mcpu: str) -> frozenset[str]:
    """The ISA features LLVM enables for `mcpu`."""
    target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu})
    return frozenset(str(f) for f in tvm.target.codegen.llvm_get_cpu_features(target))


def hardware_of(target: tvm.target.Target) -> tuple[str, tuple[str, ...]]:
    """`hardware_architecture` text and the CPU features code built for `target` may use."""
    if target.kind.name == "cuda":
        return f"cuda/{target.attrs['arch']}", ()
    mcpu = str(target.attrs.get("mcpu", "generic"))
    return f"{host_arch()}/{mcpu}", tuple(sorted(cpu_features(mcpu)))
