"""TvmExecutionProvider: the claim loop and the contract's methods, composed from this package's parts."""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

import onnx
import tvm
from tqdm import tqdm

from ...api.claim import ClaimResult, Cost, Decline, DeclineSignal, Rejected, SubgraphClaim
from ...api.device import DeviceType, EpId
from ...api.errors import CompileDisabled, CompileFailed, UnsupportedContext
from ...api.kernel import Kernel, KernelVariant
from ...api.provider import BlobStore, ExecutionProvider
from ...epcontext.record import EpContext
from ...graph.model import GraphView
from ...lower.build import weight_names
from ...lower.pipeline import Lowering
from ...lower.target import hardware_of, target_device
from ...lower.tuned import open_records
from ...partition.claims import make_claims, partition_name
from ...partition.grouping import group_nodes
from ...partition.node_context import NodeContext
from ...partition.tvm_rules import FUNCTION_OPS, check_group, check_node
from ...runtime.artifact import Library
from ...runtime.dispatch import SizeDispatchKernel
from ...runtime.kernel import TvmKernel
from ...runtime.measure import measure_partition, ort_alone_us, ort_run_floor_us, writes_much
from ...timing import phase
from .builder import PartitionBuilder
from .context import context_of, kernel_of
from .cost import cannot_win, judge_cost
from .options import TvmOptions
from .sizes import size_combinations, specialised_kernels
from .weights import DeviceWeights

__all__ = ["TvmExecutionProvider"]

log = logging.getLogger(__name__)


class TvmExecutionProvider(ExecutionProvider):
    """Compiles maximal acyclic subgraphs through TVM Relax for `llvm` (host CPU) or `cuda`."""

    ep_id = EpId("TvmExecutionProvider")
    OPTIONS = TvmOptions.names()

    def __init__(self, **options: Any):
        """Options as keywords (`TvmOptions` lists them; onnxruntime-style strings are accepted)."""
        self.options = TvmOptions.parse(str(self.ep_id), options)
        self.target = self.options.target
        self.device = target_device(self.target)
        self.target_features = frozenset(hardware_of(self.target)[1])
        tuning_logs = self.options.tuning_logs
        with phase("tuning records"):
            records = None if tuning_logs is None else open_records(tuning_logs, self.target)
        self.lowering = Lowering(
            self.options.passes, self.options.schedule_passes, records, self.options.conv_algorithm
        )
        self.builder = PartitionBuilder(self.options, self.lowering, self.device)
        self.weights = DeviceWeights(self.device)

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> TvmExecutionProvider:
        return cls(**options)

    @property
    def stats(self):
        """Counts of builds, cache hits, compiled and loaded partitions."""
        return self.builder.stats

    @property
    def variants(self) -> dict[str, list[KernelVariant]]:
        return self.builder.variants

    def judges_by_speed(self) -> bool:
        return self.options.claim_policy != "all" and self.device.type is DeviceType.CPU

    def optimizer_passes(self) -> list[tvm.transform.Pass]:
        return list(self.lowering.user_passes)

    def recall(self, name: str, what: str) -> Any:
        return self.builder.recall(name, what)

    def remember(self, name: str, what: str, value: Any) -> None:
        self.builder.remember(name, what, value)

    def inference_store(self) -> BlobStore | None:
        """The compile cache (`cache_dir`), where one is set."""
        return None if self.builder.cache is None else _InferenceStore(self.builder)

    # -- capability ------------------------------------------------------------------
    def function_ops(self) -> frozenset[str]:
        """Function ops TVM compiles through their bodies (`tvm_rules.FUNCTION_OPS`), unless excluded."""
        return FUNCTION_OPS - set(self.options.op_types_to_exclude)

    def check_node(self, ctx: NodeContext) -> None:
        """Raise `DeclineSignal` unless TVM can import, build and run this node (`partition.tvm_rules`)."""
        check_node(ctx, self.options.op_types_to_exclude)

    def claim(self, graph: GraphView, taken: Sequence[Collection[int]] = ()) -> ClaimResult:
        skip = {n for group in taken for n in group}
        accepted: set[int] = set()
        declines: list[Decline] = []
        with phase("claim checks"):
            for i in range(len(graph.nodes)):
                if i in skip:
                    continue
                ctx = NodeContext(graph, i, self.target_features)
                try:
                    self.check_node(ctx)
                    accepted.add(i)
                except DeclineSignal as signal:
                    declines.append(self._decline(ctx, signal))
        if accepted and self.config.compile_disabled:
            first = graph.nodes[min(accepted)]
            raise CompileDisabled(
                f"{len(accepted)} node(s) (first: {first.name!r}, "
                f"{first.op_type}) would be compiled by {self.ep_id}, "
                "but model compilation is disabled; compile the model ahead of time (nxrt-tvm compile) "
                "or drop session.disable_model_compile"
            )
        # Node checks cannot see context: verify each group builds as a whole, decline the
        # node that breaks it, regroup, and repeat until every group is honest.
        verified: set[tuple[int, ...]] = set()
        while True:
            groups = group_nodes(graph, accepted, taken)
            rejected: dict[int, DeclineSignal] = {}
            pending = [g for g in groups if g not in verified]
            show = self.config.show_progress
            bar = tqdm(
                pending,
                desc="compiling partitions",
                unit="partition",
                leave=False,
                disable=True if len(pending) < 2 else (None if show is None else not show),
            )
            for group in bar:
                if group not in verified:
                    problems = (
                        check_group(graph, group)
                        or self._hopeless(graph, group, taken)
                        or self.builder.prove(graph, group)
                    )
                    rejected.update(problems)
                    if not problems:
                        verified.add(group)
            if not rejected:
                break
            for i, signal in sorted(rejected.items()):
                accepted.discard(i)
                declines.append(self._decline(NodeContext(graph, i), signal))
        kept = []
        costs: dict[tuple[int, ...], Cost] = {}
        minimum = self.options.min_subgraph_size
        for group in groups:
            if len(group) >= minimum:
                whole = len(group) + sum(len(t) for t in taken) >= len(graph.nodes)
                slower = (
                    self._cost(graph, group, costs, whole) if self.options.claim_policy != "all" else None
                )
                if slower is None:
                    kept.append(group)
                    continue
                declines.extend(self._decline(NodeContext(graph, i), slower) for i in group)
                continue
            for i in group:
                signal = DeclineSignal(
                    Rejected.PARTITION,
                    f"its partition has {len(group)} node(s), below min_subgraph_size={minimum}",
                    f"partitions of at least {minimum} nodes",
                    "lower min_subgraph_size to compile small partitions",
                )
                declines.append(self._decline(NodeContext(graph, i), signal))
        claims = tuple(
            replace(c, cost=costs.get(c.nodes, Cost())) for c in make_claims(graph, self.ep_id, kept, "tvm")
        )
        return ClaimResult(claims, tuple(declines))

    def _hopeless(
        self, graph: GraphView, group: tuple[int, ...], taken: Sequence[Collection[int]]
    ) -> dict[int, DeclineSignal]:
        """Each node of a partition the claim policy would decline whatever TVM measured (`cannot_win`),
        found before building it; none where it may win or is not judged by timing."""
        if not self.judges_by_speed() or writes_much(graph, group):
            return {}
        name, threads = partition_name(graph, group, "tvm"), self.config.intra_op_num_threads
        with phase("measure against onnxruntime"):
            alone = ort_alone_us(graph, group, name, self.options.cost_budget_s / 4, threads)
        if alone is None:
            return {}
        whole = len(group) + sum(len(t) for t in taken) >= len(graph.nodes)
        signal = cannot_win(self.options.claim_policy, len(group), alone, ort_run_floor_us(), whole)
        return {} if signal is None else {i: signal for i in group}

    def _cost(
        self, graph: GraphView, group: tuple[int, ...], costs: dict, whole: bool
    ) -> DeclineSignal | None:
        """Judge a verified partition by its timing: remembered with its compile result, else measured."""
        name, threads = partition_name(graph, group, "tvm"), self.config.intra_op_num_threads
        remembered, timing = self.builder.remembered_timing(name, threads)
        if not remembered and name in self.builder.built and self.device.type is DeviceType.CPU:
            library = self.builder.library(name)
            if library is not None:
                with phase("measure against onnxruntime"):
                    budget = self.options.cost_budget_s
                    timing = measure_partition(graph, group, name, library, budget, threads)
                self.builder.remember_timing(name, timing, threads)
        costs[group], slower = judge_cost(self.options.claim_policy, len(group), timing, remembered, whole)
        return slower

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
    def build(
        self, graph: GraphView, claim: SubgraphClaim
    ) -> tuple[Library | None, tuple[str, ...], bytes | None]:
        """The library for a claim, the weights it takes as
        inputs (weightless builds only), and its blob if known."""
        if self.config.compile_disabled:
            raise CompileDisabled(
                f"partition {claim.name} ({len(claim.nodes)} nodes) "
                "needs compiling but model compilation is disabled; "
                "compile the model ahead of time (nxrt-tvm compile) or drop session.disable_model_compile"
            )
        weights = weight_names(graph, claim.nodes) if self.options.weightless else ()
        built = None if weights else self.builder.take(claim.name)
        if built is None:
            variants: list[KernelVariant] = []
            built = self.builder.build(graph, claim.nodes, claim.name, weights, variants)
            self.builder.variants[claim.name] = variants
        self.builder.stats["compiled"] += 1
        return built[0], weights, built[1]

    def tuned_sizes(self, graph: GraphView, claim: SubgraphClaim) -> list[dict[str, int]]:
        """The sizes a claim over symbolic dims is also built at: those its tuning records were made at
        (`sizes`); none for weightless builds, whose static builds would each need the weights again."""
        sizes = self.lowering.database.sizes if self.lowering.database is not None else {}
        return size_combinations(graph, claim, sizes) if sizes and not self.options.weightless else []

    def compile(
        self, graph: GraphView, claim: SubgraphClaim, *, size_builds: bool = True
    ) -> TvmKernel | SizeDispatchKernel:
        """The claim's kernel; with `size_builds`, static builds beside it at its `tuned_sizes`, each run
        where a call has its sizes."""
        kernel = self._compile(graph, claim)
        combinations = self.tuned_sizes(graph, claim) if size_builds else []
        if not combinations:
            return kernel
        with phase("size builds"):
            static, labels = specialised_kernels(graph, claim, combinations, self._static_kernel)
        return SizeDispatchKernel(kernel, static, labels) if static else kernel

    def _static_kernel(self, graph: GraphView, nodes: tuple[int, ...]) -> TvmKernel:
        """A kernel of the whole node set of a static graph, checked and built as a claim's would be."""
        problems: dict[int, DeclineSignal] = {}
        for i in nodes:
            try:
                self.check_node(NodeContext(graph, i, self.target_features))
            except DeclineSignal as signal:
                problems[i] = signal
        problems = problems or check_group(graph, nodes) or self.builder.prove(graph, nodes)
        if problems:
            i, signal = min(problems.items())
            raise CompileFailed(f"{graph.nodes[i].op_type} {graph.nodes[i].name!r}: {signal.detail}")
        name = partition_name(graph, nodes, "tvm")
        library, blob = self.builder.take(name)
        inputs, outputs = graph.boundary(nodes)
        return TvmKernel(
            library,
            self.device,
            name,
            [graph.info(i) for i in inputs],
            [graph.info(o) for o in outputs],
            blob=blob,
            variants=self.builder.variants.get(name, ()),
        )

    def _compile(self, graph: GraphView, claim: SubgraphClaim) -> TvmKernel:
        library, weights, blob = self.build(graph, claim)
        return TvmKernel(
            library,
            self.device,
            claim.name,
            [graph.info(i) for i in claim.inputs],
            [graph.info(o) for o in claim.outputs],
            [(w, self.weights.bind(w, graph.initializers)) for w in weights],
            blob=blob,
            variants=self.builder.variants.get(claim.name, ()),
        )

    # -- EPContext -------------------------------------------------------------------
    def save_context(self, kernel: Kernel) -> EpContext:
        if isinstance(kernel, SizeDispatchKernel):
            log.warning(
                "partition %s: its builds at tuned sizes (%s) are not saved in the EPContext, only its "
                "symbolic build; fix the dims (--dim NAME=SIZE) to save a tuned static build",
                kernel.name,
                "; ".join(kernel.labels),
            )
            kernel = kernel.generic
        if not isinstance(kernel, TvmKernel):
            raise UnsupportedContext(str(self.ep_id), f"cannot save a {type(kernel).__name__}")
        database = self.lowering.database
        return context_of(
            kernel,
            str(self.ep_id),
            self.target,
            database.digest if database is not None else "",
            database.sources if database is not None else (),
        )

    def load_context(
        self, context: EpContext, initializers: Mapping[str, onnx.TensorProto] | None = None
    ) -> TvmKernel:
        """Check the blob fits this host (raising `ContextRejected`
        before any native code loads), then load it."""
        kernel = kernel_of(context, self.target, self.device, self.weights, initializers or {})
        self.builder.stats["loaded"] += 1
        return kernel


class _InferenceStore:
    """A compile cache as the session's `BlobStore` for shape inference: an entry of its own per model."""

    def __init__(self, builder: PartitionBuilder):
        self.builder = builder

    def get(self, key: str) -> bytes | None:
        entry = self.builder.cache.get(key)
        return bytes(entry.blob) if entry is not None and entry.blob else None

    def put(self, key: str, data: bytes) -> None:
        self.builder.keep(key, data, {"kind": "shape inference"})
