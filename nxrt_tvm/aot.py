"""Ahead-of-time compile: a model in, a model with EPContext nodes out, no device needed."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from .api.provider import EpConfig, inlined_ops
from .epcontext.signing import PrivateKey, load_private_key, sign_model
from .epcontext.writer import write_context_model
from .graph.model import ModelSource, load_model
from .partition.plan import PartitionPlan, make_plan
from .providers import CPUExecutionProvider, TvmExecutionProvider

__all__ = ["compile_model", "CompileReport"]


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
) -> CompileReport:
    """Compile every partition the TVM EP claims and write `output` with EPContext nodes.

    Fallback partitions stay ONNX nodes. `embed=False` writes each blob beside
    `output` (paths relative to it). `weightless` keeps weights out of the
    blobs (bound from the model's initializers at load). `keep_source` keeps
    each partition's ONNX subgraph as a model-local function, so hosts that
    cannot load a blob can recompile or fall back. `tuning_logs` applies the
    records of this target's device key (see `nxrt_tvm.tuning`). `sign` (a PEM private key file or
    key object, ECDSA P-256 or Ed25519) writes `OUTPUT.sig`, a signature over the model and its blob
    files that hosts with `nxrt.trusted_keys` check before loading any blob.
    """
    started = time.perf_counter()
    key = load_private_key(sign) if sign is not None else None  # a bad key fails before the compile
    options = dict(provider_options or {})
    if tuning_logs is not None:
        options["tuning_logs"] = tuning_logs
    tvm_ep = TvmExecutionProvider(target=target, weightless=weightless, **options)
    tvm_ep.initialize(EpConfig(show_progress=progress))
    providers = [tvm_ep, CPUExecutionProvider()]
    graph = load_model(model, inline=inlined_ops(providers))
    plan = make_plan(graph, providers)
    compiled = [p for p in plan.partitions if p.ep == tvm_ep.ep_id]
    contexts = {}
    for partition in tqdm(
        compiled,
        desc="exporting partitions",
        unit="partition",
        disable=None if progress is None else not progress,
    ):
        contexts[partition.name] = tvm_ep.save_context(tvm_ep.compile(graph, partition))
    files = write_context_model(
        graph, plan, contexts, output, embed_mode=1 if embed else 0, keep_source=keep_source
    )
    signature = None
    if key is not None:
        signature = sign_model(Path(output), [f for f in files if f != Path(output)], key)
        files.append(signature)
    seconds = time.perf_counter() - started
    return CompileReport(Path(output), tuple(files), plan, len(compiled), seconds, signature)
