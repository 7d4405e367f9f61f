"""Imports that load torch only as a side effect, made without it.

`tvm_ffi` imports torch at its own import where torch is installed (to dodge a symbol clash on
Windows), and `onnxruntime.tools` does at its own (for a torch export helper): 1.2 s each time a
process pays it, for nothing nxrt-tvm uses. nxrt-tvm hands TVM numpy arrays and DLPack tensors, which
`tvm_ffi` takes without torch.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

__all__ = ["without_torch"]


@contextlib.contextmanager
def without_torch() -> Iterator[None]:
    """Inside, torch looks uninstalled (`import torch` raises ImportError, `find_spec` finds none),
    unless the process loaded it already; afterwards it imports as usual."""
    if "torch" in sys.modules:
        yield
        return
    sys.modules["torch"] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        if sys.modules.get("torch", 0) is None:
            del sys.modules["torch"]
