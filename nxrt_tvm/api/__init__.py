"""The EP contract in Python idiom (the `onnx-runtime-ep-api` crate's surfaces)."""

from .claim import ClaimResult, Cost, Decline, DeclineSignal, Rejected, SubgraphClaim, deny, require
from .device import DeviceId, DeviceType, EpId
from .errors import *  # noqa: F403 - the error family is part of the contract
from .errors import __all__ as _error_names
from .kernel import Kernel, KernelVariant
from .provider import EpConfig, ExecutionProvider, Graph, inlined_ops
from .registry import EpRegistry, OpKey, OpRegistry
from .tensor import TensorView

__all__ = [
    "ClaimResult",
    "Cost",
    "Decline",
    "DeclineSignal",
    "Rejected",
    "SubgraphClaim",
    "deny",
    "require",
    "DeviceId",
    "DeviceType",
    "EpId",
    "Kernel",
    "KernelVariant",
    "EpConfig",
    "ExecutionProvider",
    "Graph",
    "inlined_ops",
    "EpRegistry",
    "OpKey",
    "OpRegistry",
    "TensorView",
    *_error_names,
]
