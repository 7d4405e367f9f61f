"""TVM targets for the host CPU (features detected) and CUDA."""

from __future__ import annotations

import json
import os
from typing import Any

import tvm

from ..api.device import DeviceId, DeviceType
from ..api.errors import InvalidProviderOptions

__all__ = ["make_target", "target_device", "tvm_device", "host_cpu", "host_arch", "runtime_threads"]

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
