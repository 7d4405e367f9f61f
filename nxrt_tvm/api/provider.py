"""The ExecutionProvider contract: identity, capability, compilation, context, optimizer passes."""

from __future__ import annotations

import abc
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import onnx

from .claim import ClaimResult, SubgraphClaim
from .device import DeviceId, EpId
from .errors import UnsupportedContext
from .kernel import Kernel

__all__ = ["BlobStore", "EpConfig", "ExecutionProvider", "Graph", "inlined_ops"]


@runtime_checkable
class Graph(Protocol):
    """What an EP reads of the model it claims from: nodes in topological order, indexed as in claims.

    `nxrt_tvm.graph.GraphView` implements it; the contract names only what every EP may rely on.
    """

    nodes: Sequence[onnx.NodeProto]
    initializers: Mapping[str, onnx.TensorProto]
    producer: Mapping[str, int]  #: value name -> index of the node that computes it
    consumers: Mapping[str, Sequence[int]]  #: value name -> indices of the nodes that read it

    def opset_of(self, index: int) -> int: ...

    def boundary(self, nodes: Iterable[int]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Values a node set reads from outside (initializers excluded) and values it must export."""
        ...


class BlobStore(Protocol):
    """Bytes by content key, kept across sessions (`ExecutionProvider.inference_store`)."""

    def get(self, key: str) -> bytes | None: ...

    def put(self, key: str, data: bytes) -> None: ...


@dataclass(frozen=True)
class EpConfig:
    """What the session tells every EP through `initialize` (the contract's `EpConfig`)."""

    #: session.disable_model_compile: any compile is an error (deploy from EPContext models only)
    compile_disabled: bool = False
    #: whether another EP's kernels run between this EP's (a spinning thread pool would starve them)
    shares_cores: bool = True
    #: progress bars for long compiles: None shows them on a terminal only
    show_progress: bool | None = None
    #: SessionOptions.intra_op_num_threads: threads per kernel (0: every core the process may use)
    intra_op_num_threads: int = 0


class ExecutionProvider(abc.ABC):
    """One backend. The session asks it, in priority order, which subgraphs it takes,
    compiles each claim once, and calls the resulting kernels on every run."""

    ep_id: EpId
    device: DeviceId
    config: EpConfig = EpConfig()

    def initialize(self, config: EpConfig) -> None:
        """Take the session's settings: called before `claim`, and again before `compile` where the
        plan changes one (`shares_cores`)."""
        self.config = config

    @abc.abstractmethod
    def claim(self, graph: Graph, taken: Sequence[Collection[int]] = ()) -> ClaimResult:
        """Claim whole subgraphs among the nodes not in `taken` (claims of earlier EPs).

        Claims must be acyclic when fused together with `taken`; every node seen
        and refused gets a `Decline`.
        """

    @abc.abstractmethod
    def compile(self, graph: Graph, claim: SubgraphClaim) -> Kernel:
        """Build the kernel for one claim; runs once per session, never on the hot path."""

    def save_context(self, kernel: Kernel) -> Any:
        raise UnsupportedContext(str(self.ep_id))

    def load_context(
        self, context: Any, initializers: Mapping[str, onnx.TensorProto] | None = None
    ) -> Kernel:
        """A kernel from a saved context; `initializers` are the model's, for blobs built weightless."""
        raise UnsupportedContext(str(self.ep_id))

    def judges_by_speed(self) -> bool:
        """Whether this EP keeps a partition only where it measured faster than the fallback: the session
        may then run a model with symbolic input dims on the fallback until its input shapes are known
        (`nxrt.symbolic_compile`), since any partition this EP would keep is judged at those shapes."""
        return False

    def optimizer_passes(self) -> list[Any]:
        """EP-specific graph passes (TVM passes for the TVM EP) run while lowering."""
        return []

    def function_ops(self) -> frozenset[str]:
        """Ops ONNX defines as functions that this EP compiles through their bodies, not whole: the
        session inlines them before claims, so the EP fuses across them (onnxruntime inlines a
        function op no EP takes whole the same way)."""
        return frozenset()

    def inference_store(self) -> BlobStore | None:
        """Where the session may keep what shape inference found in a model, keyed by its content (a
        compile cache): a session on a model compiled before then needs no inference (sympy's import
        alone is 0.2 s)."""
        return None

    def recall(self, name: str, what: str) -> Any:
        """The JSON value `remember` kept about this EP's partition `name` under `what`; None where none
        is kept (no compile cache, or the partition's code changed since)."""
        return None

    def remember(self, name: str, what: str, value: Any) -> None:
        """Keep a JSON value about partition `name` (a measurement) with its compile result, so that
        later sessions on this host read it instead of measuring again; a no-op where nothing is kept."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={self.device})"


def inlined_ops(providers: Iterable[ExecutionProvider]) -> frozenset[str]:
    """The function ops any of `providers` asks to have inlined (`ExecutionProvider.function_ops`)."""
    return frozenset().union(*(ep.function_ops() for ep in providers))
