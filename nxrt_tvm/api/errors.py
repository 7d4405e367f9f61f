"""The EpError family: every error nxrt-tvm raises on purpose derives from `EpError`.

The cases follow the EP contract's `EpError` enum; input validation and model
loading add their own subclasses so callers can catch exactly what they handle.
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "EpError",
    "InternalError",
    "NoEpForOp",
    "KernelFailed",
    "IndexOutOfBounds",
    "EpPanicked",
    "EpLoadFailed",
    "InvalidTensorView",
    "NotInitialized",
    "NoEpForContext",
    "UnsupportedContext",
    "DuplicateContextSource",
    "CompileFailed",
    "CompileInterrupted",
    "InvalidModel",
    "InvalidFeed",
    "MissingInput",
    "UnknownInput",
    "InputTypeMismatch",
    "InputShapeMismatch",
    "InvalidProviderOptions",
    "CompileDisabled",
    "ContextRejected",
    "ContextIntegrityError",
    "ContextTargetMismatch",
    "ContextVersionMismatch",
    "ContextPathError",
    "ContextSignatureError",
]


class EpError(Exception):
    """Root of every error raised by execution providers, kernels and the session."""


class NoEpForOp(EpError):
    """No registered EP can run a node; raised when the session loads, never mid-run."""

    def __init__(self, node: str, domain: str, op_type: str, opset: int, reasons: list[str] | None = None):
        self.node, self.domain, self.op_type, self.opset = node, domain, op_type, opset
        self.reasons = list(reasons or [])
        where = f"{domain or 'ai.onnx'}::{op_type} at opset {opset}"
        detail = "".join(f"\n  - {r}" for r in self.reasons)
        super().__init__(f"no EP handler for node {node!r} ({where}) on any available device{detail}")


class KernelFailed(EpError):
    """A compiled kernel failed while computing."""


class IndexOutOfBounds(KernelFailed, IndexError):
    """An index read from a tensor at run time (a Gather's indices, ...) is outside the dim it indexes.

    Raised before any out-of-range read or write; `node` names the ONNX node whose index it was.
    """

    def __init__(self, message: str, node: str | None = None):
        super().__init__(message)
        self.node = node


class EpPanicked(EpError):
    """An EP failed in a way it did not report as an error (a crash contained by the session)."""


class EpLoadFailed(EpError):
    """An EP, plugin library or compiled artifact could not be loaded."""

    def __init__(self, path: str | Path, reason: str):
        self.path, self.reason = Path(path), reason
        super().__init__(f"EP load failed: {path}: {reason}")


class InvalidTensorView(EpError):
    """A tensor handed across the EP boundary is not what the kernel was built for."""


class NotInitialized(EpError):
    """An EP was used before it was set up (e.g. compute before compile)."""


class NoEpForContext(EpError):
    """An EPContext node names a `source` that no registered EP owns."""

    def __init__(self, source_key: str | None):
        self.source_key = source_key
        super().__init__(
            f"no EP is registered for EPContext source key {source_key!r}; "
            "register the EP that produced this model or recompile it from the source ONNX model"
        )


class UnsupportedContext(EpError):
    """An EP was asked to save or load an EPContext it does not support."""

    def __init__(self, ep: str, reason: str = ""):
        self.ep = ep
        super().__init__(f"EP {ep} does not support EPContext save/load" + (f": {reason}" if reason else ""))


class DuplicateContextSource(EpError):
    """Two EPs tried to own the same EPContext `source` key."""

    def __init__(self, source_key: str, existing: str, new: str):
        self.source_key, self.existing, self.new = source_key, existing, new
        super().__init__(
            f"duplicate EPContext source key {source_key!r}: already registered to {existing!r}, "
            f"cannot re-register to {new!r}"
        )


class CompileFailed(EpError):
    """Compiling a claimed partition failed: a claim-check bug unless the cause is environmental."""


class CompileInterrupted(CompileFailed):
    """The compiler was stopped (timeout), died (a signal) or lacks a tool: not a property of the partition,
    so the same build may succeed another time; a compile cache never remembers it as a failure."""


class InternalError(EpError):
    """A bug in nxrt-tvm's own passes or schedule rules: raised in strict mode (`NXRT_TVM_STRICT=1`, as the
    test suite runs), logged as a warning otherwise. Please report it with the model."""


class InvalidModel(EpError):
    """The input is not a valid ONNX model (unreadable, fails the checker, or is cyclic)."""


class InvalidProviderOptions(EpError, ValueError):
    """Unknown provider or session option, or an option value of the wrong kind."""


class InvalidFeed(EpError, ValueError):
    """A feed given to `InferenceSession.run` does not match the model's inputs."""


class MissingInput(InvalidFeed):
    """A required model input was not fed."""


class UnknownInput(InvalidFeed):
    """A feed names no model input."""


class InputTypeMismatch(InvalidFeed, TypeError):
    """A feed's element type differs from the input's declared type."""


class InputShapeMismatch(InvalidFeed):
    """A feed's rank or a fixed dimension differs from the input's declared shape."""


class CompileDisabled(EpError):
    """The session may not compile (``session.disable_model_compile``) but the model needs it."""


class ContextRejected(EpError):
    """An EPContext blob may not be loaded on this host; raised before any native code is loaded.

    `partition` names the EPContext node's partition; the message says what
    differs and what to do.
    """

    def __init__(self, partition: str, reason: str, remedy: str):
        self.partition, self.reason, self.remedy = partition, reason, remedy
        super().__init__(f"EPContext partition {partition!r} refused: {reason}; {remedy}")

    def with_remedy(self, remedy: str) -> ContextRejected:
        """The same refusal with another remedy (where the mismatch policy cannot rescue it)."""
        return type(self)(self.partition, self.reason, remedy)


class ContextIntegrityError(ContextRejected):
    """The blob's bytes are not the ones that were compiled (sha256 or size differs, truncated, swapped)."""


class ContextTargetMismatch(ContextRejected):
    """The blob was built for another target or for hardware this host lacks."""


class ContextVersionMismatch(ContextRejected):
    """The blob was built by another TVM version or in another EPContext format version."""


class ContextPathError(ContextRejected):
    """An external blob path is absolute, leaves the model's folder, or is missing."""


class ContextSignatureError(ContextRejected):
    """The model's signature does not vouch for the blob, so it may not load (a signed model is refused as
    soon as anything it covers changed). `check` says which check failed: 'unsigned' (no signature file),
    'untrusted' (signed by a key not in nxrt.trusted_keys), 'invalid' (the signature does not verify),
    'digest' (a file differs from the signed manifest), 'unlisted' (the manifest does not list a blob),
    'malformed' (the signature file is unreadable)."""

    def __init__(self, partition: str, reason: str, remedy: str, check: str):
        self.check = check
        super().__init__(partition, reason, remedy)

    def with_remedy(self, remedy: str) -> ContextSignatureError:
        return type(self)(self.partition, self.reason, remedy, self.check)
