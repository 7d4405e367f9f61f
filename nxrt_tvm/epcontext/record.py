"""The EpContext record: a compiled partition plus what proves it may be loaded on a host."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from ..graph.model import ValueInfo

__all__ = ["EpContext", "TensorSignature", "FORMAT_VERSION", "sha256_hex"]

#: Version of what nxrt-tvm writes into EPContext nodes (blob layout and `notes` schema).
FORMAT_VERSION = 1


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class TensorSignature:
    """Name, ONNX element type and shape of one partition input or output."""

    name: str
    elem_type: int
    shape: tuple[int | str | None, ...] | None

    @classmethod
    def of(cls, info: ValueInfo) -> "TensorSignature":
        return cls(info.name, info.elem_type or 0, info.shape)

    def to_info(self) -> ValueInfo:
        return ValueInfo(self.name, self.elem_type or None, self.shape)

    def to_json(self) -> list:
        return [self.name, self.elem_type, None if self.shape is None else list(self.shape)]

    @classmethod
    def from_json(cls, value: list) -> "TensorSignature":
        name, elem, shape = value
        return cls(str(name), int(elem), None if shape is None else tuple(shape))


@dataclass(frozen=True)
class EpContext:
    """One compiled partition as stored in an EPContext node.

    `inputs` are the node's data inputs; `weights` (weightless blobs only) are
    initializer names appended to the node's inputs and bound at load.
    """

    source: str
    partition_name: str
    blob: bytes = field(repr=False)
    embed_mode: int
    target: str
    hardware_architecture: str
    cpu_features: tuple[str, ...]
    ep_sdk_version: str
    sha256: str
    size: int
    inputs: tuple[TensorSignature, ...]
    outputs: tuple[TensorSignature, ...]
    weights: tuple[str, ...] = ()
    tuning_digest: str = ""
    #: the device keys whose tuning records the blob was compiled with (this host's, then transferred ones)
    tuning_sources: tuple[str, ...] = ()
    format_version: int = FORMAT_VERSION
    external_path: str | None = None
