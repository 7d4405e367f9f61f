"""nxrt-tvm: a compiling execution provider for ONNX models on Apache TVM."""

import os as _os

# TVM's thread pool starts with half the cores on x86 and reads this once: give it all of them.
_os.environ.setdefault("TVM_NUM_THREADS", str(len(_os.sched_getaffinity(0))))


def _import_tvm_without_torch() -> None:
    """Import TVM without the torch import `tvm_ffi` makes at its own (1.2 s of the 3.3 s
    `import nxrt_tvm` took where torch is installed, paid by every CLI call, session process and tuning
    worker). It imports torch only to dodge a symbol clash on Windows; nxrt-tvm hands TVM numpy arrays
    and DLPack tensors, which `tvm_ffi` takes without it. A torch the process loaded already is kept,
    and torch imports as usual afterwards."""
    import sys

    if "torch" in sys.modules:
        return
    sys.modules["torch"] = None  # type: ignore[assignment] - `import torch` raises ImportError
    try:
        import tvm  # noqa: F401
    finally:
        if sys.modules.get("torch", 0) is None:
            del sys.modules["torch"]


_import_tvm_without_torch()

from .aot import CompileReport, compile_model  # noqa: E402
from .api import *  # noqa: E402,F403 - the contract is the public surface
from .api import __all__ as _api_names  # noqa: E402
from .epcontext.record import EpContext  # noqa: E402
from .epcontext.registry import EpContextRegistry, build_ep_context_registry  # noqa: E402
from .partition.plan import PartitionPlan  # noqa: E402
from .session import InferenceSession, NodeArg  # noqa: E402
from .session_options import SessionOptions  # noqa: E402
from .tuning.tune import TuneReport, tune_model  # noqa: E402

__version__ = "0.1.0"
__all__ = [
    "InferenceSession",
    "SessionOptions",
    "NodeArg",
    "PartitionPlan",
    "compile_model",
    "tune_model",
    "TuneReport",
    "CompileReport",
    "EpContext",
    "EpContextRegistry",
    "build_ep_context_registry",
    *_api_names,
]
