"""EpContext <-> ONNX Runtime's `com.microsoft::EPContext` node.

Attributes follow ORT's contrib-op schema (main_context, ep_cache_context,
embed_mode, ep_sdk_version, hardware_architecture, partition_name, source);
what ORT has no attribute for goes into `notes` as JSON.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx
from onnx import helper

from ..api.errors import ContextIntegrityError, ContextPathError
from ..runtime.artifact import map_blob
from .record import BlobVariant, EpContext, TensorSignature

__all__ = [
    "EP_CONTEXT_DOMAIN",
    "EP_CONTEXT_OP",
    "is_ep_context",
    "encode_node",
    "decode_node",
    "resolve_external",
]

EP_CONTEXT_DOMAIN = "com.microsoft"
EP_CONTEXT_OP = "EPContext"


def is_ep_context(node: onnx.NodeProto) -> bool:
    return node.op_type == EP_CONTEXT_OP and node.domain == EP_CONTEXT_DOMAIN


def encode_node(ctx: EpContext, node_name: str) -> onnx.NodeProto:
    """The EPContext node; embeds the blob (embed_mode 1) or names `ctx.external_path` (embed_mode 0)."""
    notes = {
        "format_version": ctx.format_version,
        "target": ctx.target,
        "sha256": ctx.sha256,
        "size": ctx.size,
        "cpu_features": list(ctx.cpu_features),
        "inputs": [s.to_json() for s in ctx.inputs],
        "outputs": [s.to_json() for s in ctx.outputs],
        "weights": list(ctx.weights),
        "tuning_digest": ctx.tuning_digest,
        "tuning_sources": list(ctx.tuning_sources),
    }
    if ctx.variants:
        notes["variants"] = [v.to_json() for v in ctx.variants]
    if ctx.embed_mode == 1:
        cache_context: bytes | str = bytes(ctx.blob)
    elif ctx.external_path:
        cache_context = ctx.external_path
    else:
        raise ValueError("an external EPContext needs external_path")
    return helper.make_node(
        EP_CONTEXT_OP,
        [s.name for s in ctx.inputs] + list(ctx.weights),
        [s.name for s in ctx.outputs],
        name=node_name,
        domain=EP_CONTEXT_DOMAIN,
        main_context=1,
        ep_cache_context=cache_context,
        embed_mode=ctx.embed_mode,
        source=ctx.source,
        ep_sdk_version=ctx.ep_sdk_version,
        hardware_architecture=ctx.hardware_architecture,
        partition_name=ctx.partition_name,
        notes=json.dumps(notes, sort_keys=True),
    )


def resolve_external(model_dir: Path | None, relative: str, partition: str) -> Path:
    """The blob file for an external EPContext; refuses paths that could load code from elsewhere."""
    if model_dir is None:
        raise ContextPathError(
            partition,
            f"its blob is an external file ({relative!r}) but the model was given as bytes",
            "open the model from its file path so the blob can be found beside it",
        )
    rel = Path(relative)
    if not relative or rel.is_absolute() or relative.startswith(("/", "\\")) or ":" in rel.parts[0]:
        raise ContextPathError(
            partition,
            f"external blob path {relative!r} is absolute",
            "recompile with --external, which writes paths relative to the model",
        )
    base = model_dir.resolve()
    path = (base / rel).resolve()
    if base not in path.parents:
        raise ContextPathError(
            partition,
            f"external blob path {relative!r} leaves the model's folder {str(base)!r}",
            "keep the blob beside the model; recompile with --external to write a safe path",
        )
    if not path.is_file():
        raise ContextPathError(
            partition,
            f"external blob {str(path)!r} does not exist",
            "copy the blob files that `nxrt-tvm compile --external` wrote together with the model",
        )
    return path


def decode_node(node: onnx.NodeProto, model_dir: Path | None) -> EpContext:
    """The record in an EPContext node, with the blob read (from the attribute or the external file)."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    partition = attrs.get("partition_name", b"").decode() or node.name
    try:
        notes = json.loads(attrs.get("notes", b"{}") or b"{}")
        embed_mode = int(attrs.get("embed_mode", 1))
        raw = attrs.get("ep_cache_context", b"")
        external = None
        if embed_mode == 1:
            blob = raw
        else:
            external = raw.decode()
            with open(resolve_external(model_dir, external, partition), "rb") as f:
                # one library, its weights mapped; a fat blob's libraries lie past the first's head: read
                blob = f.read() if "variants" in notes else map_blob(f)
        inputs = tuple(TensorSignature.from_json(v) for v in notes.get("inputs", []))
        return EpContext(
            source=attrs.get("source", b"").decode(),
            partition_name=partition,
            blob=blob,
            embed_mode=embed_mode,
            target=str(notes.get("target", "")),
            hardware_architecture=attrs.get("hardware_architecture", b"").decode(),
            cpu_features=tuple(notes.get("cpu_features", [])),
            ep_sdk_version=attrs.get("ep_sdk_version", b"").decode(),
            sha256=str(notes.get("sha256", "")),
            size=int(notes.get("size", -1)),
            inputs=inputs,
            outputs=tuple(TensorSignature.from_json(v) for v in notes.get("outputs", [])),
            weights=tuple(notes.get("weights", [])),
            tuning_digest=str(notes.get("tuning_digest", "")),
            tuning_sources=tuple(str(k) for k in notes.get("tuning_sources", [])),
            format_version=int(notes.get("format_version", 0)),
            external_path=external,
            variants=tuple(BlobVariant.from_json(v) for v in notes.get("variants", [])),
        )
    except ContextPathError:
        raise
    except (ValueError, TypeError, KeyError, UnicodeDecodeError) as exc:
        raise ContextIntegrityError(
            partition,
            f"its EPContext attributes are malformed ({exc})",
            "recompile the model with `nxrt-tvm compile`",
        ) from exc
