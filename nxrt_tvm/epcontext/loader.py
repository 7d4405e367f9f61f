"""Open an EPContext model: route each EPContext node by `source`, check its blob, apply the mismatch policy.

Runs on the raw model, before it is analysed, because a refused blob under
the 'recompile' or 'fallback' policy is replaced by its source subgraph.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from ..api.errors import ContextRejected
from ..api.kernel import Kernel
from ..api.provider import ExecutionProvider
from .codec import decode_node, is_ep_context
from .record import EpContext
from .registry import EpContextRegistry
from .signing import ModelTrust
from .writer import PLANNED_KEY, SOURCE_DOMAIN

__all__ = ["ResolvedContexts", "resolve_contexts", "source_nodes", "restore_sources"]

log = logging.getLogger(__name__)


@dataclass
class ResolvedContexts:
    """Kernels of the EPContext nodes that loaded (by node name), and which nodes came back as source."""

    loaded: dict[str, tuple[EpContext, ExecutionProvider, Kernel]] = field(default_factory=dict)
    #: node names restored from source functions that must run on the fallback EP ('fallback' policy)
    fallback_nodes: set[str] = field(default_factory=set)
    #: the plain nodes of a model whose plan was made when it was compiled (`writer.PLANNED_KEY`): they
    #: stay on the fallback EP, as that compile decided (a deployment with compiling disabled runs them)
    planned_fallback: set[str] = field(default_factory=set)
    refused: list[ContextRejected] = field(default_factory=list)


def source_nodes(model: onnx.ModelProto, partition: str) -> list[onnx.NodeProto] | None:
    """The original nodes of a compiled partition, from the model-local function kept beside it."""
    for function in model.functions:
        if function.domain == SOURCE_DOMAIN and function.name == partition:
            return [onnx.NodeProto.FromString(n.SerializeToString()) for n in function.node]
    return None


def restore_sources(model: onnx.ModelProto) -> onnx.ModelProto:
    """A plain ONNX model: every EPContext node replaced by
    its source subgraph (e.g. to run it in onnxruntime)."""
    restored = onnx.ModelProto.FromString(model.SerializeToString())
    nodes: list[onnx.NodeProto] = []
    for node in restored.graph.node:
        if not is_ep_context(node):
            nodes.append(node)
            continue
        partition = next((a.s.decode() for a in node.attribute if a.name == "partition_name"), node.name)
        source = source_nodes(restored, partition)
        if source is None:
            raise ValueError(
                f"EPContext node {node.name!r} keeps no source subgraph (compiled with --no-source)"
            )
        nodes.extend(source)
    del restored.graph.node[:]
    restored.graph.node.extend(nodes)
    return restored


def resolve_contexts(
    model: onnx.ModelProto,
    model_dir: Path | None,
    registry: EpContextRegistry,
    on_mismatch: str,
    trust: ModelTrust,
) -> ResolvedContexts:
    """Load every EPContext node through its EP; rewrite `model` in place where the policy restores source.

    Each blob is checked against the model's signature (`trust`), then by `load_context` against the
    host, before it is loaded, so a refusal here means no native code was loaded.
    """
    initializers = {t.name: t for t in model.graph.initializer}
    resolved = ResolvedContexts()
    if any(entry.key == PLANNED_KEY for entry in model.metadata_props):
        resolved.planned_fallback = {n.name for n in model.graph.node if not is_ep_context(n)}
    new_nodes: list[onnx.NodeProto] = []
    for node in model.graph.node:
        if not is_ep_context(node):
            new_nodes.append(node)
            continue
        ctx = decode_node(node, model_dir)
        ep = registry.route(ctx.source)
        try:
            trust.check(ctx)
            resolved.loaded[node.name] = (ctx, ep, ep.load_context(ctx, initializers))
            new_nodes.append(node)
            continue
        except ContextRejected as exc:
            source = source_nodes(model, ctx.partition_name)
            if on_mismatch == "error" or source is None:
                if source is None and on_mismatch != "error":
                    remedy = "this model keeps no source subgraph for it; " + exc.remedy
                    raise exc.with_remedy(remedy) from None
                raise
            log.warning("%s; running its source subgraph instead (%s)", exc, on_mismatch)
            resolved.refused.append(exc)
            new_nodes.extend(source)
            if on_mismatch == "fallback":
                resolved.fallback_nodes.update(n.name for n in source)
    if resolved.refused:  # rewrite only when source came back: it copies every node, blobs included
        del model.graph.node[:]
        model.graph.node.extend(new_nodes)
    return resolved
