"""The ExecutionProvider contract: identity, capability, compilation, context, optimizer passes."""

from __future__ import annotations

import abc
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

from .claim import ClaimResult, SubgraphClaim
from .device import DeviceId, EpId
from .errors import UnsupportedContext
from .kernel import Kernel

if TYPE_CHECKING:  # the graph view lives outside the contract package
    from ..graph.model import GraphView

__all__ = ["ExecutionProvider"]


class ExecutionProvider(abc.ABC):
    """One backend. The session asks it, in priority order, which subgraphs it takes,
    compiles each claim once, and calls the resulting kernels on every run."""

    ep_id: EpId
    device: DeviceId

    @abc.abstractmethod
    def claim(self, graph: "GraphView", taken: Sequence[Collection[int]] = ()) -> ClaimResult:
        """Claim whole subgraphs among the nodes not in `taken` (claims of earlier EPs).

        Claims must be acyclic when fused together with `taken`; every node seen
        and refused gets a `Decline`.
        """

    @abc.abstractmethod
    def compile(self, graph: "GraphView", claim: SubgraphClaim) -> Kernel:
        """Build the kernel for one claim; runs once per session, never on the hot path."""

    def save_context(self, kernel: Kernel) -> Any:
        raise UnsupportedContext(str(self.ep_id))

    def load_context(self, context: Any) -> Kernel:
        raise UnsupportedContext(str(self.ep_id))

    def optimizer_passes(self) -> list[Any]:
        """EP-specific graph passes (TVM passes for the TVM EP) run while lowering."""
        return []

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={self.device})"
