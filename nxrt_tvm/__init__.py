"""nxrt-tvm: a compiling execution provider for ONNX models on Apache TVM."""

import os as _os

# TVM's thread pool starts with half the cores on x86 and reads this once: give it all of them.
_os.environ.setdefault("TVM_NUM_THREADS", str(len(_os.sched_getaffinity(0))))
# Its workers spin (sched_yield) this many times waiting for the next job before they sleep: TVM's default,
# 300000, kept a core busy for 170 ms after every run, taking it from onnxruntime's partitions and from
# onnxruntime timed against TVM (which then read slower than it is). 20000 is about 10 ms: the kernels of
# one run, and runs back to back, still find the workers awake.
_os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "20000")

from .no_torch import without_torch as _without_torch  # noqa: E402

with _without_torch():  # tvm_ffi would import torch (1.2 s)
    import tvm  # noqa: E402, F401

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
