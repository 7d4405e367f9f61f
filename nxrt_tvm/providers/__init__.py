"""The execution providers nxrt-tvm ships, registered by their onnxruntime-style names."""

from ..api.registry import EpRegistry
from .cpu import CPUExecutionProvider
from .tvm import TvmExecutionProvider

__all__ = ["CPUExecutionProvider", "TvmExecutionProvider", "EP_REGISTRY", "FALLBACK_EP"]

EP_REGISTRY = EpRegistry()
EP_REGISTRY.register(TvmExecutionProvider.ep_id, TvmExecutionProvider.from_options)
EP_REGISTRY.register(CPUExecutionProvider.ep_id, CPUExecutionProvider.from_options)

#: Appended when a session's provider list lacks it, as onnxruntime does, so any valid model runs.
FALLBACK_EP = CPUExecutionProvider.ep_id
