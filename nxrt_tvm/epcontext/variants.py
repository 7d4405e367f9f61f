"""Fat EPContext nodes: one library per CPU target in one node, and the choice of the one to load here.

A vendor ships one model to a fleet of CPU generations. Code built for one CPU runs on any CPU that has
every ISA feature it uses, so a node may carry several builds (`nxrt-tvm compile --cpus ...`); the
loader runs the one this host fits best, closest first: built for this very CPU, then for its family
(znver4 on a znver5), then the one using the most features (AVX-512 over AVX2).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import replace

import tvm

from ..api.errors import ContextTargetMismatch, InvalidProviderOptions
from ..lower.target import cpu_features, host_arch, host_cpu, requires_hardware
from .record import FAT_FORMAT_VERSION, FORMAT_VERSION, BlobVariant, EpContext, sha256_hex

__all__ = ["check_cpu_names", "fat_context", "choose_variant", "closeness", "describe_choice"]

log = logging.getLogger(__name__)


def check_cpu_names(cpus: Sequence[str]) -> tuple[str, ...]:
    """The CPU names as given, refused (typed, with LLVM's nearest names) where LLVM does not know one."""
    names = tuple(c.strip() for c in cpus if c.strip())
    if not names:
        raise InvalidProviderOptions(
            "cpus is empty; name the CPU targets to build for, e.g. x86-64-v3,znver4"
        )
    if len(set(names)) != len(names):
        raise InvalidProviderOptions(f"cpus {list(names)} names a CPU twice; list each once")
    triple = str(tvm.target.codegen.llvm_get_system_triple())
    for name in names:
        if not tvm.target.codegen.llvm_is_valid_cpu(name, triple):
            known = [str(c) for c in tvm.target.codegen.llvm_get_cpu_archlist(tvm.target.Target("llvm"))]
            close = sorted(known, key=lambda c: _distance(c, name))[:4]
            raise InvalidProviderOptions(
                f"cpu {name!r} is not a CPU LLVM knows for {triple}; did you mean {', '.join(close)}? "
                "(`llc -mcpu=help` lists them; x86-64-v2/v3/v4 are the generic levels)"
            )
    return names


def _distance(a: str, b: str) -> int:
    """Edit distance, for suggesting a known CPU name."""
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]


def fat_context(builds: Sequence[tuple[str, EpContext]]) -> EpContext:
    """One context holding each (cpu, context built for it) of one partition, in the order given."""
    first = builds[0][1]
    records, offset = [], 0
    for mcpu, ctx in builds:
        if (ctx.inputs, ctx.outputs, ctx.weights) != (first.inputs, first.outputs, first.weights):
            raise ValueError(f"the builds of partition {first.partition_name} differ in their signature")
        records.append(
            BlobVariant(
                mcpu,
                ctx.target,
                ctx.hardware_architecture,
                ctx.cpu_features,
                offset,
                ctx.size,
                ctx.sha256,
                ctx.tuning_sources,
            )
        )
        offset += ctx.size
    blob = b"".join(ctx.blob for _, ctx in builds)
    arch = first.hardware_architecture.split("/", 1)[0]
    return replace(
        first,
        blob=blob,
        sha256=sha256_hex(blob),
        size=len(blob),
        hardware_architecture=f"{arch}/" + "+".join(mcpu for mcpu, _ in builds),
        cpu_features=(),
        tuning_sources=(),
        format_version=FAT_FORMAT_VERSION,
        variants=tuple(records),
    )


def _family(mcpu: str) -> str:
    """`znver` of znver4, `x86-64-v` of x86-64-v3, `sapphirerapids` of itself."""
    return re.sub(r"\d+$", "", mcpu)


def closeness(mcpu: str, features: Sequence[str]) -> tuple[bool, bool, int]:
    """How well a build for `mcpu` (using `features`) suits this host, among builds it can run: larger
    is closer (this CPU, then its family, then the most ISA features used)."""
    host = host_cpu()
    return mcpu == host, _family(mcpu) == _family(host), sum(1 for f in features if requires_hardware(f))


def _missing(variant: BlobVariant, have: frozenset[str]) -> list[str]:
    return sorted(f for f in set(variant.cpu_features) - have if requires_hardware(f))


def choose_variant(ctx: EpContext) -> EpContext:
    """The single-target context of the variant this host runs best; `ContextTargetMismatch` if none fits.

    The fat blob's own digest is checked by the caller; the variant's is checked when it is loaded.
    """
    host = host_cpu()
    have = cpu_features(host)
    fits = [
        v
        for v in ctx.variants
        if v.hardware_architecture.split("/", 1)[0] == host_arch() and not _missing(v, have)
    ]
    if not fits:
        refused = "; ".join(
            f"{v.mcpu} needs {', '.join(_missing(v, have)[:4]) or v.hardware_architecture.split('/', 1)[0]}"
            for v in ctx.variants
        )
        raise ContextTargetMismatch(
            ctx.partition_name,
            f"none of its {len(ctx.variants)} CPU variants runs on this host "
            f"({host_arch()}/{host}): {refused}",
            "recompile with a --cpus list that includes this CPU or a generic level it has "
            f"(e.g. `nxrt-tvm compile MODEL -o OUT --cpus x86-64-v3,{host}`), or open it with the session "
            "config nxrt.context_on_mismatch='recompile' (or 'fallback')",
        )
    best = max(fits, key=lambda v: closeness(v.mcpu, v.cpu_features))
    log.info("partition %s: %s", ctx.partition_name, describe_choice(ctx, best.mcpu))
    start = best.offset
    return replace(
        ctx,
        blob=ctx.blob[start : start + best.size],
        sha256=best.sha256,
        size=best.size,
        target=best.target,
        hardware_architecture=best.hardware_architecture,
        cpu_features=best.cpu_features,
        tuning_sources=best.tuning_sources,
        format_version=FORMAT_VERSION,
        variants=(),
    )


def describe_choice(fat: EpContext, mcpu: str) -> str:
    """Why variant `mcpu` of `fat` runs on this host, in words (for the plan and the log)."""
    host = host_cpu()
    why = (
        "built for this CPU"
        if mcpu == host
        else f"same family as this {host}"
        if _family(mcpu) == _family(host)
        else f"the most specific one this {host} runs"
    )
    return f"CPU variant {mcpu} of {', '.join(v.mcpu for v in fat.variants)}: {why}"
