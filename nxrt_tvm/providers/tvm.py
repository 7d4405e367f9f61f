"""TvmExecutionProvider: claims what the Relax ONNX frontend can compile, builds it with TVM."""
from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import onnx
import tvm
from tvm.relax.frontend.onnx import onnx_frontend

from ..api.claim import ClaimResult, Decline, DeclineSignal, Rejected, SubgraphClaim, deny, require
from ..api.device import EpId
from ..api.errors import CompileFailed, InvalidProviderOptions
from ..api.provider import ExecutionProvider
from ..graph.model import GraphView
from ..lower.build import compile_partition, locate_failure
from ..lower.kernel import TvmKernel
from ..lower.target import make_target, target_device
from ..partition.claims import make_claims, partition_name
from ..partition.grouping import group_nodes
from ..partition.node_context import NodeContext
from ..partition.tvm_rules import TVM_OP_RULES
from .options import as_int, as_str_list, reject_unknown

__all__ = ["TvmExecutionProvider", "SUPPORTED_ELEM_TYPES"]

T = onnx.TensorProto
#: Element types TVM imports, computes and returns through DLPack.
SUPPORTED_ELEM_TYPES = frozenset({T.FLOAT, T.FLOAT16, T.DOUBLE, T.INT8, T.INT16, T.INT32, T.INT64, T.UINT8, T.BOOL})
_SUPPORTED_NAMES = ", ".join(sorted(T.DataType.Name(t).lower() for t in SUPPORTED_ELEM_TYPES))

_CONVERTERS = onnx_frontend._get_convert_map()


def _min_opset(op_type: str) -> int:
    converter = _CONVERTERS[op_type]
    return min(int(n[len("_impl_v"):]) for n in dir(converter) if n.startswith("_impl_v"))


class TvmExecutionProvider(ExecutionProvider):
    """Compiles maximal acyclic subgraphs through TVM Relax for `llvm` (host CPU) or `cuda`."""

    ep_id = EpId("TvmExecutionProvider")
    OPTIONS = ("target", "min_subgraph_size", "op_types_to_exclude", "passes")

    def __init__(
        self,
        target: Any = "llvm",
        min_subgraph_size: int = 1,
        op_types_to_exclude: Sequence[str] | str = (),
        passes: Sequence[tvm.transform.Pass] = (),
    ):
        self.target = make_target(target)
        self.device = target_device(self.target)
        self.min_subgraph_size = as_int("min_subgraph_size", min_subgraph_size, minimum=1)
        self.op_types_to_exclude = frozenset(as_str_list("op_types_to_exclude", op_types_to_exclude))
        if any(not isinstance(p, tvm.transform.Pass) for p in passes):
            raise InvalidProviderOptions("option 'passes' must be a list of tvm.transform.Pass objects")
        self.passes = tuple(passes)
        # Claims are proven by building them; compile() picks the executables up from here.
        self._built: dict[str, Any] = {}

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> "TvmExecutionProvider":
        reject_unknown(str(cls.ep_id), options, cls.OPTIONS)
        return cls(**options)

    def optimizer_passes(self) -> list[tvm.transform.Pass]:
        return list(self.passes)

    # -- capability ------------------------------------------------------------------
    def check_node(self, ctx: NodeContext) -> None:
        """Raise `DeclineSignal` unless TVM can import, build and run this node."""
        op = ctx.op_type
        require(
            op not in self.op_types_to_exclude,
            Rejected.OPTION,
            f"{op} is listed in op_types_to_exclude",
            accepts="ops not excluded by the provider options",
            remediation="remove it from op_types_to_exclude to let TVM compile it",
        )
        require(
            ctx.domain == "",
            Rejected.DOMAIN,
            f"domain {ctx.domain!r}",
            accepts="ops of the default ONNX domain (ai.onnx)",
            remediation="runs on the fallback EP; TVM's frontend has no converter for this domain",
        )
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in ctx.node.attribute):
            deny(
                Rejected.OP,
                f"{op} carries subgraphs (control flow)",
                accepts="dataflow ops without subgraph attributes",
                remediation="runs on the fallback EP; fold constant conditions (e.g. onnxsim) to remove the branch",
            )
        require(
            op in _CONVERTERS,
            Rejected.OP,
            f"the Relax ONNX frontend has no converter for {op}",
            accepts=f"the {len(_CONVERTERS)} ops of tvm.relax.frontend.onnx (see `nxrt-tvm plan --json`)",
            remediation="runs on the fallback EP; rewrite it into supported ops to let TVM fuse across it",
        )
        lowest = _min_opset(op)
        require(
            ctx.opset >= lowest,
            Rejected.OPSET,
            f"opset {ctx.opset} predates the converter's lowest version {lowest}",
            accepts=f"{op} at opset >= {lowest}",
            remediation=f"upgrade the model (onnx.version_converter.convert_version(model, {max(lowest, 13)}))",
        )
        for kind, values in (("input", ctx.inputs), ("output", ctx.outputs)):
            for info in values:
                if info is None or info.elem_type is None:
                    continue  # unknown types matter only at a partition boundary (see _verify)
                require(
                    info.elem_type in SUPPORTED_ELEM_TYPES,
                    Rejected.DTYPE,
                    f"{kind} {info.name!r} has element type {info.type_name}",
                    accepts=_SUPPORTED_NAMES,
                    remediation="runs on the fallback EP; cast to a supported type in the model to let TVM take it",
                )
        rule = TVM_OP_RULES.lookup(ctx.domain, op, ctx.opset)
        if rule is not None:
            rule(ctx)

    def claim(self, graph: GraphView, taken: Sequence[Collection[int]] = ()) -> ClaimResult:
        skip = {n for group in taken for n in group}
        accepted: set[int] = set()
        declines: list[Decline] = []
        for i in range(len(graph.nodes)):
            if i in skip:
                continue
            ctx = NodeContext(graph, i)
            try:
                self.check_node(ctx)
                accepted.add(i)
            except DeclineSignal as signal:
                declines.append(self._decline(ctx, signal))
        # Node checks cannot see context: verify each group imports as a whole, decline the
        # node that breaks it, regroup, and repeat until every group is honest.
        verified: set[tuple[int, ...]] = set()
        while True:
            groups = group_nodes(graph, accepted, taken)
            rejected: dict[int, DeclineSignal] = {}
            for group in groups:
                if group not in verified:
                    problems = self._verify(graph, group)
                    rejected.update(problems)
                    if not problems:
                        verified.add(group)
            if not rejected:
                break
            for i, signal in sorted(rejected.items()):
                accepted.discard(i)
                declines.append(self._decline(NodeContext(graph, i), signal))
        kept = []
        for group in groups:
            if len(group) >= self.min_subgraph_size:
                kept.append(group)
                continue
            for i in group:
                signal = DeclineSignal(
                    Rejected.PARTITION,
                    f"its partition has {len(group)} node(s), below min_subgraph_size={self.min_subgraph_size}",
                    f"partitions of at least {self.min_subgraph_size} nodes",
                    "lower min_subgraph_size to compile small partitions",
                )
                declines.append(self._decline(NodeContext(graph, i), signal))
        return ClaimResult(make_claims(graph, self.ep_id, kept, "tvm"), tuple(declines))

    def _verify(self, graph: GraphView, group: tuple[int, ...]) -> dict[int, DeclineSignal]:
        """Nodes to decline so that `group` compiles: consumers of untyped boundary values, or the import culprit."""
        inputs, _ = graph.boundary(group)
        problems: dict[int, DeclineSignal] = {}
        members = set(group)
        for name in inputs:
            info = graph.info(name)
            if info.elem_type is not None and info.shape is not None:
                continue
            what = "element type" if info.elem_type is None else "rank"
            for i in graph.consumers.get(name, ()):
                if i in members:
                    problems[i] = DeclineSignal(
                        Rejected.SHAPE,
                        f"input {name!r} comes from outside the partition with unknown {what}",
                        "partition inputs whose type and rank ONNX shape inference determines",
                        "declare the model's input shapes, or run onnx.shape_inference / onnxsim on the model",
                    )
        if problems:
            return problems
        name = partition_name(graph, group, "tvm")

        def attempt(nodes: list[int]) -> object:
            return compile_partition(graph, nodes, name, self.target, self.passes)

        try:
            self._built[name] = attempt(list(group))
            return {}
        except CompileFailed:
            culprit, message = locate_failure(group, attempt)
        return {
            culprit: DeclineSignal(
                Rejected.BUILD,
                f"TVM cannot compile it in this context: {message}",
                "what tvm.relax.frontend.onnx imports and TVM builds (shape-like inputs must be constants or computed in the same partition)",
                "runs on the fallback EP; fold run-time shapes to constants (onnxsim) or export with static shapes",
            )
        }

    def _decline(self, ctx: NodeContext, signal: DeclineSignal) -> Decline:
        return Decline(
            node=ctx.name,
            op_type=ctx.op_type,
            domain=ctx.domain,
            opset=ctx.opset,
            ep=self.ep_id,
            rejected=signal.rejected,
            detail=signal.detail,
            accepts=signal.accepts,
            remediation=signal.remediation,
        )

    # -- compilation -----------------------------------------------------------------
    def compile(self, graph: GraphView, claim: SubgraphClaim) -> TvmKernel:
        executable = self._built.pop(claim.name, None)
        if executable is None:
            executable = compile_partition(graph, claim.nodes, claim.name, self.target, self.passes)
        return TvmKernel(
            executable,
            self.device,
            claim.inputs,
            claim.outputs,
            [graph.info(o).dtype for o in claim.outputs],
        )
