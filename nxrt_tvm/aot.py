"""Ahead-of-time compile: a model in, a model with EPContext nodes out, no device needed."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from .api.errors import InvalidProviderOptions
from .api.provider import EpConfig, inlined_ops
from .epcontext.record import EpContext
from .epcontext.signing import PrivateKey, load_private_key, sign_model
from .epcontext.variants import check_cpu_names, fat_context
from .epcontext.writer import write_context_model
from .graph.model import ModelSource, load_model
from .partition.plan import PartitionPlan, make_plan
from .providers import CPUExecutionProvider, TvmExecutionProvider

__all__ = ["compile_model", "CompileReport"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CompileReport:
    """What `compile_model` wrote and how long it took."""

    output: Path
    files: tuple[Path, ...]
    plan: PartitionPlan
    compiled_partitions: int
    seconds: float
    signature: Path | None = None

    @property
    def bytes_written(self) -> int:
        return sum(f.stat().st_size for f in self.files)


def compile_model(
    model: ModelSource,
    output: str | os.PathLike,
    *,
    target: Any = "llvm",
    embed: bool = True,
    weightless: bool = False,
    keep_source: bool = True,
    tuning_logs: str | os.PathLike | None = None,
    provider_options: Mapping[str, Any] | None = None,
    progress: bool | None = None,
    sign: str | os.PathLike | PrivateKey | None = None,
    cpus: Sequence[str] | None = None,
    free_dims: Mapping[str, int] | None = None,
) -> CompileReport:
    """Compile every partition the TVM EP claims and write `output` with EPContext nodes.

    Fallback partitions stay ONNX nodes. `embed=False` writes each blob beside
    `output` (paths relative to it). `weightless` keeps weights out of the
    blobs (bound from the model's initializers at load). `keep_source` keeps
    each partition's ONNX subgraph as a model-local function, so hosts that
    cannot load a blob can recompile or fall back. `tuning_logs` applies the
    records of this target's device key (see `nxrt_tvm.tuning`). `sign` (a PEM private key file or
    key object, ECDSA P-256 or Ed25519) writes `OUTPUT.sig`, a signature over the model and its blob
    files that hosts with `nxrt.trusted_keys` check before loading any blob. `cpus` (LLVM CPU names,
    e.g. ``["x86-64-v3", "znver4"]``) builds every partition once per CPU into one "fat" node; a host
    loads the variant it runs best (`epcontext.variants`). The plan is this host's either way.
    `free_dims` fixes symbolic input dims by name (onnxruntime's free-dimension overrides): the
    partitions build static, so records tuned at those sizes apply, and the written model declares them.
    """
    started = time.perf_counter()
    key = load_private_key(sign) if sign is not None else None  # a bad key fails before the compile
    names = check_cpu_names(cpus) if cpus is not None else ()
    options = dict(provider_options or {})
    if tuning_logs is not None:
        options["tuning_logs"] = tuning_logs
    config = EpConfig(show_progress=progress)
    tvm_ep = TvmExecutionProvider(target=target, weightless=weightless, **options)
    tvm_ep.initialize(config)
    builders = _cpu_builders(tvm_ep, names, weightless, options, config)
    providers = [tvm_ep, CPUExecutionProvider()]
    graph = load_model(model, free_dims=dict(free_dims or {}), inline=inlined_ops(providers))
    plan = make_plan(graph, providers)
    compiled = [p for p in plan.partitions if p.ep == tvm_ep.ep_id]
    contexts: dict[str, EpContext] = {}
    bar = tqdm(
        total=len(compiled) * max(len(builders), 1),
        desc="exporting partitions",
        unit="build",
        disable=None if progress is None else not progress,
    )
    with bar:
        for partition in compiled:
            sizes = tvm_ep.tuned_sizes(graph, partition)
            if sizes:
                log.warning(
                    "partition %s: records were tuned at %s, but an EPContext holds one build per CPU: it "
                    "keeps the symbolic build; fix the dims (--dim NAME=SIZE) to save a tuned static build",
                    partition.name,
                    "; ".join(",".join(f"{d}={n}" for d, n in dims.items()) for dims in sizes),
                )
            if not builders:
                kernel = tvm_ep.compile(graph, partition, size_builds=False)
                contexts[partition.name] = tvm_ep.save_context(kernel)
                bar.update()
                continue
            builds = []
            for mcpu, ep in builders:
                builds.append((mcpu, ep.save_context(ep.compile(graph, partition, size_builds=False))))
                bar.update()
            contexts[partition.name] = fat_context(builds)
    files = write_context_model(
        graph, plan, contexts, output, embed_mode=1 if embed else 0, keep_source=keep_source
    )
    signature = None
    if key is not None:
        signature = sign_model(Path(output), [f for f in files if f != Path(output)], key)
        files.append(signature)
    seconds = time.perf_counter() - started
    return CompileReport(Path(output), tuple(files), plan, len(compiled), seconds, signature)


def _cpu_builders(
    host: TvmExecutionProvider,
    cpus: tuple[str, ...],
    weightless: bool,
    options: dict[str, Any],
    config: EpConfig,
) -> list[tuple[str, TvmExecutionProvider]]:
    """An EP per CPU of a fat compile (the host's own EP where its CPU is listed); none for a plain one."""
    if not cpus:
        return []
    if host.target.kind.name != "llvm":
        raise InvalidProviderOptions(
            f"cpus builds CPU variants; the target is {host.target.kind.name!r}: "
            "drop cpus, or use target llvm"
        )
    spec = dict(host.target.export())
    builders = []
    for mcpu in cpus:
        if mcpu == str(host.target.attrs.get("mcpu", "")):
            builders.append((mcpu, host))
            continue
        ep = TvmExecutionProvider(target=spec | {"mcpu": mcpu}, weightless=weightless, **options)
        ep.initialize(config)
        builders.append((mcpu, ep))
    return builders
