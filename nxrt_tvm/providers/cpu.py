"""CPUExecutionProvider: the fallback, running what the TVM EP left on onnxruntime's CPU EP."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from ..api.claim import ClaimResult, Decline, Rejected, SubgraphClaim
from ..api.device import DeviceId, DeviceType, EpId
from ..api.errors import KernelFailed, NoEpForOp
from ..api.kernel import Kernel
from ..api.provider import ExecutionProvider
from ..api.tensor import TensorView
from ..graph.model import GraphView
from ..options import as_bool, as_int, reject_unknown
from ..partition.claims import make_claims
from ..partition.grouping import group_nodes
from ..runtime.ort_session import ort_session_options, partition_for_ort

__all__ = ["CPUExecutionProvider", "OrtKernel"]

# Domains onnx ships schemas for; other domains (com.microsoft, custom) are left to onnxruntime itself.
_ONNX_DOMAINS = ("", "ai.onnx.ml", "ai.onnx.preview.training")


class OrtKernel(Kernel):
    """One partition as an onnxruntime session (thread-safe, as `InferenceSession.run` is)."""

    def __init__(
        self,
        model: bytes | str,
        options: ort.SessionOptions,
        device: DeviceId,
        declared: Sequence[np.dtype | None],
        weights: Mapping[str, ort.OrtValue] | None = None,
    ):
        self._session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        # The C++ session's run, without `InferenceSession.run`'s Python checks (10 us a call, 8 % of a
        # 0.13 ms model's): onnxruntime checks the same in C++, and a feed it refuses fails the kernel,
        # whose caller then says what was wrong (`InferenceSession.run`). Its other work, retrying on
        # fallback providers after an EP failure, has nothing to retry on a CPU-only session.
        native = getattr(self._session, "_sess", None)
        self._run = self._session.run if native is None else native.run
        self._weights = weights  # the initializers `options` hands over: they live as long as the session
        # onnxruntime's own lists: the graph's inputs less initializers, its outputs, in the model's order
        self.input_names = tuple(i.name for i in self._session.get_inputs())
        self.output_names = tuple(o.name for o in self._session.get_outputs())
        #: onnxruntime hands float8 outputs back as raw integers: their declared types, to view them as
        self._declared = tuple(declared)
        self._any_view = any(d is not None and d.kind == "V" for d in self._declared)
        self.device = device

    def run_host(self, output_names: Sequence[str], feeds: dict[str, Any]) -> list[Any]:
        """`output_names` from host feeds (arrays, or CPU `TensorView`s), as host arrays: the session's
        path where this kernel is the whole model."""
        return self.run_arrays(
            output_names, {n: v.numpy() if isinstance(v, TensorView) else v for n, v in feeds.items()}
        )

    def run_arrays(self, output_names: Sequence[str], feeds: dict[str, Any]) -> list[Any]:
        """`run_host` of feeds that are numpy arrays already (the session's common call: each step
        of Python here costs a few microseconds after onnxruntime's run has filled the caches)."""
        try:
            outputs = self._run(output_names, feeds, None)
        except Exception as exc:
            raise KernelFailed(f"onnxruntime failed on {self.output_names}: {exc}") from exc
        if not self._any_view:
            return outputs
        declared = dict(zip(self.output_names, self._declared))
        return [
            _as_declared(o, declared[n]) if isinstance(o, np.ndarray) else o
            for o, n in zip(outputs, output_names)
        ]

    def compute(self, inputs: Sequence[TensorView]) -> list[TensorView]:
        # Sequences and optionals (lists, None) pass through as they are; tensors as host arrays.
        feeds = {
            name: view.numpy() if isinstance(view, TensorView) else view
            for name, view in zip(self.input_names, inputs)
        }
        try:
            outputs = self._run(list(self.output_names), feeds, None)
        except Exception as exc:
            raise KernelFailed(f"onnxruntime failed on {self.output_names}: {exc}") from exc
        return [
            TensorView(_as_declared(o, dtype)) if isinstance(o, np.ndarray) else o
            for o, dtype in zip(outputs, self._declared)
        ]


def _declared_dtype(info: onnx.ValueInfoProto) -> np.dtype | None:
    elem = info.type.tensor_type.elem_type if info.type.HasField("tensor_type") else 0
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem)) if elem else None
    except (KeyError, TypeError, ValueError):
        return None


def _as_declared(array: np.ndarray, dtype: np.dtype | None) -> np.ndarray:
    """`array` as its declared ml_dtypes type (float8, ...) where onnxruntime returned the same bytes
    as integers."""
    if (
        dtype is not None
        and dtype.kind == "V"
        and array.dtype.kind in "iu"
        and array.itemsize == dtype.itemsize
    ):
        return array.view(dtype)
    return array


class CPUExecutionProvider(ExecutionProvider):
    """Claims every node left over, as acyclic subgraphs, so any valid model runs."""

    ep_id = EpId("CPUExecutionProvider")
    OPTIONS = ("intra_op_num_threads", "allow_spinning")

    def __init__(self, intra_op_num_threads: int = 0, allow_spinning: bool | str | None = None):
        self.device = DeviceId(DeviceType.CPU, 0)
        self.intra_op_num_threads = as_int("intra_op_num_threads", intra_op_num_threads)
        # onnxruntime's pool spins after each run; between TVM partitions that starves TVM's own pool
        # (a transformers BERT with 23 partitions: 68 ms spinning vs 1.0 ms without), but where onnxruntime
        # runs the whole model spinning is what keeps its small kernels fast. None: decide per session.
        self.allow_spinning = None if allow_spinning is None else as_bool("allow_spinning", allow_spinning)

    @property
    def threads(self) -> int:
        """Its own option where given, else the session's `intra_op_num_threads`."""
        return self.intra_op_num_threads or self.config.intra_op_num_threads

    @property
    def spinning(self) -> bool:
        return self.allow_spinning if self.allow_spinning is not None else not self.config.shares_cores

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> "CPUExecutionProvider":
        reject_unknown(str(cls.ep_id), options, cls.OPTIONS)
        return cls(**options)

    def claim(self, graph: GraphView, taken: Sequence[Collection[int]] = ()) -> ClaimResult:
        skip = {n for group in taken for n in group}
        accepted, declines = [], []
        for i, node in enumerate(graph.nodes):
            if i in skip:
                continue
            if node.domain in _ONNX_DOMAINS and not onnx.defs.has(node.op_type, node.domain):
                declines.append(
                    Decline(
                        node.name,
                        node.op_type,
                        node.domain,
                        graph.opset_of(i),
                        self.ep_id,
                        Rejected.OP,
                        f"{node.domain or 'ai.onnx'} defines no op {node.op_type!r}",
                        "ops with an ONNX schema, or custom-domain ops registered with onnxruntime",
                        "fix the op name or domain, or register the custom op library",
                    )
                )
                continue
            accepted.append(i)
        groups = group_nodes(graph, accepted, taken)
        return ClaimResult(make_claims(graph, self.ep_id, groups, "cpu"), tuple(declines))

    def compile_whole(
        self, model: bytes | str, free_dims: dict[str, int], declared: Sequence[np.dtype | None]
    ) -> OrtKernel:
        """The user's own model as one session, where the plan gives it all to the fallback: onnxruntime
        then runs exactly what it would alone, not our normalised, function-inlined copy (the bundled
        model's extracted partition: 0.242 vs 0.228 ms). Raises what onnxruntime raises."""
        options = ort_session_options(self.threads, self.spinning)
        for name, size in free_dims.items():
            options.add_free_dimension_override_by_name(name, size)
        return OrtKernel(model, options, self.device, declared)

    def compile(self, graph: GraphView, claim: SubgraphClaim) -> OrtKernel:
        model, weights = partition_for_ort(graph, claim.nodes, claim.inputs, claim.outputs, claim.name)
        options = ort_session_options(self.threads, self.spinning, weights)
        declared = [_declared_dtype(o) for o in model.graph.output]
        try:
            return OrtKernel(model.SerializeToString(), options, self.device, declared, weights)
        except Exception as exc:
            node = graph.nodes[claim.nodes[0]]
            bad = next(
                (
                    graph.nodes[i]
                    for i in claim.nodes
                    if f"'{graph.nodes[i].op_type}'" in str(exc) or graph.nodes[i].name in str(exc)
                ),
                node,
            )
            raise NoEpForOp(
                bad.name,
                bad.domain,
                bad.op_type,
                graph.opset_of(graph.nodes.index(bad)),
                [f"onnxruntime: {exc}"],
            ) from exc
