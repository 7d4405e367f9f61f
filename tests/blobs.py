"""Forged blobs for the refusal tests (Python loader and plugin alike)."""

from __future__ import annotations

import json

from nxrt_tvm.runtime.artifact import PACKED_MAGIC


def lying_index(blob: bytes) -> bytes:
    """`blob` (packed with lifted constants) with its index placing the first constant past its end; the
    index keeps its length, so the library and the data stay where they were."""
    assert blob.startswith(PACKED_MAGIC), "the partition has no lifted constants: pick a model with weights"
    at = len(PACKED_MAGIC) + 8
    size = int.from_bytes(blob[len(PACKED_MAGIC) : at], "little")
    index = json.loads(blob[at : at + size])
    index["constants"][0][0] = 8 * len(blob)
    text = json.dumps(index, separators=(",", ":")).encode()
    assert len(text) <= size
    return blob[:at] + text.ljust(size) + blob[at + size :]
