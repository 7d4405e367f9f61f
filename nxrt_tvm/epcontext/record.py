"""The EpContext record: a compiled partition plus what proves it may be loaded on a host."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from ..graph.model import ValueInfo
from ..runtime.artifact import Blob

__all__ = [
    "EpContext",
    "BlobVariant",
    "TensorSignature",
    "FORMAT_VERSION",
    "FAT_FORMAT_VERSION",
    "sha256_hex",
]

#: Version of what nxrt-tvm writes into EPContext nodes (blob layout and `notes` schema). 3: a blob may be
#: packed with the constants lifted out of its library (`runtime.artifact`); 1 and 2 held the library alone.
FORMAT_VERSION = 3
#: A node holding one blob per CPU target ("fat"): its blob is the variants' bytes one after another,
#: described by `notes.variants`. A reader of format 3 alone refuses it instead of loading the bundle.
FAT_FORMAT_VERSION = 4


def sha256_hex(data: Blob) -> str:
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
class BlobVariant:
    """One CPU target's library inside a fat blob: `size` bytes from `offset`, and what it needs."""

    mcpu: str
    target: str
    hardware_architecture: str
    cpu_features: tuple[str, ...]
    offset: int
    size: int
    sha256: str
    tuning_sources: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {
            "mcpu": self.mcpu,
            "target": self.target,
            "hardware_architecture": self.hardware_architecture,
            "cpu_features": list(self.cpu_features),
            "offset": self.offset,
            "size": self.size,
            "sha256": self.sha256,
            "tuning_sources": list(self.tuning_sources),
        }

    @classmethod
    def from_json(cls, value: dict) -> "BlobVariant":
        return cls(
            str(value["mcpu"]),
            str(value["target"]),
            str(value["hardware_architecture"]),
            tuple(str(f) for f in value["cpu_features"]),
            int(value["offset"]),
            int(value["size"]),
            str(value["sha256"]),
            tuple(str(k) for k in value.get("tuning_sources", [])),
        )


@dataclass(frozen=True)
class EpContext:
    """One compiled partition as stored in an EPContext node.

    `inputs` are the node's data inputs; `weights` (weightless blobs only) are
    initializer names appended to the node's inputs and bound at load.
    """

    source: str
    partition_name: str
    blob: Blob = field(repr=False)  #: bytes, or a blob file's mapped view (`runtime.artifact.map_blob`)
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
    #: a fat context's libraries, one per CPU target (`blob` holds them all; see `epcontext.variants`)
    variants: tuple[BlobVariant, ...] = ()
