"""TvmExecutionProvider: claims what the Relax ONNX frontend can compile, builds it with TVM."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

import onnx
import tvm
from onnx import numpy_helper
from tqdm import tqdm

from ..api.claim import ClaimResult, Cost, Decline, DeclineSignal, Rejected, SubgraphClaim
from ..api.device import DeviceType, EpId
from ..api.errors import (
    CompileDisabled,
    CompileFailed,
    EpLoadFailed,
    InvalidProviderOptions,
    UnsupportedContext,
)
from ..api.kernel import Kernel, KernelVariant
from ..api.provider import ExecutionProvider
from ..api.tensor import aligned_empty
from ..epcontext.cache import CompileCache, cache_key
from ..epcontext.compat import check_loadable
from ..epcontext.record import FORMAT_VERSION, EpContext, TensorSignature, sha256_hex
from ..graph.model import GraphView
from ..lower.build import compile_partition, locate_failure, partition_model, weight_names
from ..lower.pipeline import Lowering, codegen_digest
from ..lower.schedules import CONV_ALGORITHMS
from ..lower.target import hardware_of, make_target, target_device, tvm_device
from ..lower.tuned import open_database
from ..partition.claims import make_claims, partition_name
from ..partition.grouping import group_nodes
from ..partition.node_context import NodeContext
from ..partition.tvm_rules import check_group, check_node
from ..runtime.artifact import export_executable, load_executable
from ..runtime.isolate import fork_available, run_isolated
from ..runtime.kernel import TvmKernel
from ..runtime.measure import measure_partition, ort_run_floor_us
from .options import as_int, as_seconds, as_str_list, reject_unknown

__all__ = ["TvmExecutionProvider"]

#: claim_policy="cost": how much faster than the fallback a partition must measure on TVM (timing noise).
COST_MARGIN = 0.05


class TvmExecutionProvider(ExecutionProvider):
    """Compiles maximal acyclic subgraphs through TVM Relax for `llvm` (host CPU) or `cuda`."""

    ep_id = EpId("TvmExecutionProvider")
    OPTIONS = (
        "target",
        "min_subgraph_size",
        "op_types_to_exclude",
        "passes",
        "schedule_passes",
        "conv_algorithm",
        "tuning_logs",
        "weightless",
        "cache_dir",
        "cache_max_bytes",
        "claim_policy",
        "cost_budget_s",
        "compile_isolation",
        "compile_timeout_s",
    )

    def __init__(
        self,
        target: Any = "llvm",
        min_subgraph_size: int = 1,
        op_types_to_exclude: Sequence[str] | str = (),
        passes: Sequence[tvm.transform.Pass] = (),
        schedule_passes: Sequence[tvm.transform.Pass] | None = None,
        conv_algorithm: str = "auto",
        tuning_logs: str | os.PathLike | None = None,
        weightless: bool | str = False,
        cache_dir: str | os.PathLike | None = None,
        cache_max_bytes: int | None = 2 * 1024**3,
        claim_policy: str = "all",
        cost_budget_s: float = 0.2,
        compile_isolation: str = "process",
        compile_timeout_s: float = 600.0,
    ):
        self.target = make_target(target)
        self.device = target_device(self.target)
        self.target_features = frozenset(hardware_of(self.target)[1])
        self.min_subgraph_size = as_int("min_subgraph_size", min_subgraph_size, minimum=1)
        self.op_types_to_exclude = frozenset(as_str_list("op_types_to_exclude", op_types_to_exclude))
        for option, value in (("passes", passes), ("schedule_passes", schedule_passes or ())):
            if any(not isinstance(p, tvm.transform.Pass) for p in value):
                raise InvalidProviderOptions(
                    f"option {option!r} must be a list of tvm.transform.Pass objects"
                )
        if conv_algorithm not in CONV_ALGORITHMS:
            raise InvalidProviderOptions(
                "conv_algorithm must be one of "
                f"{', '.join(map(repr, CONV_ALGORITHMS))}, got {conv_algorithm!r}"
            )
        database = None if tuning_logs is None else open_database(tuning_logs, self.target)
        self.lowering = Lowering(
            tuple(passes),
            None if schedule_passes is None else tuple(schedule_passes),
            database,
            conv_algorithm,
        )
        #: per partition, which implementation each of its kernels runs (tuned, default rule, ...) and why
        self.variants: dict[str, list[KernelVariant]] = {}
        self.weightless = str(weightless).lower() in ("1", "true")
        if claim_policy not in ("all", "cost"):
            raise InvalidProviderOptions(f"claim_policy must be 'all' or 'cost', got {claim_policy!r}")
        self.claim_policy = claim_policy
        self.cost_budget_s = as_seconds("cost_budget_s", cost_budget_s)
        if compile_isolation not in ("process", "none"):
            raise InvalidProviderOptions(
                f"compile_isolation must be 'process' or 'none', got {compile_isolation!r}"
            )
        # Compile in a forked child (where the OS can fork), so a TVM crash costs a decline, not the process.
        self.isolate = compile_isolation == "process" and fork_available()
        self.compile_timeout_s = as_seconds("compile_timeout_s", compile_timeout_s)
        # Set by the session from `session.disable_model_compile`: any compile is then an error.
        self.compile_disabled = False
        self.cache = (
            None
            if cache_dir is None
            else CompileCache(
                cache_dir, None if cache_max_bytes is None else as_int("cache_max_bytes", cache_max_bytes, 1)
            )
        )
        # Claims are proven by building them (or by a cache hit); compile() picks the module
        # (and its blob, when one exists) up from here.
        self._built: dict[str, tuple[Any, bytes | None]] = {}
        self._weights: dict[str, tvm.runtime.Tensor] = {}
        self.stats: Counter[str] = Counter()
        #: progress bar while partitions compile: None shows it on a terminal only
        self.show_progress: bool | None = None

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> "TvmExecutionProvider":
        reject_unknown(str(cls.ep_id), options, cls.OPTIONS)
        return cls(**options)

    def optimizer_passes(self) -> list[tvm.transform.Pass]:
        return list(self.lowering.user_passes)

    # -- capability ------------------------------------------------------------------
    def check_node(self, ctx: NodeContext) -> None:
        """Raise `DeclineSignal` unless TVM can import, build and run this node (`partition.tvm_rules`)."""
        check_node(ctx, self.op_types_to_exclude)

    def claim(self, graph: GraphView, taken: Sequence[Collection[int]] = ()) -> ClaimResult:
        skip = {n for group in taken for n in group}
        accepted: set[int] = set()
        declines: list[Decline] = []
        for i in range(len(graph.nodes)):
            if i in skip:
                continue
            ctx = NodeContext(graph, i, self.target_features)
            try:
                self.check_node(ctx)
                accepted.add(i)
            except DeclineSignal as signal:
                declines.append(self._decline(ctx, signal))
        if accepted and self.compile_disabled:
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
            bar = tqdm(
                pending,
                desc="compiling partitions",
                unit="partition",
                leave=False,
                disable=True
                if len(pending) < 2
                else (None if self.show_progress is None else not self.show_progress),
            )
            for group in bar:
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
        costs: dict[tuple[int, ...], Cost] = {}
        for group in groups:
            if len(group) >= self.min_subgraph_size:
                slower = self._cost(graph, group, costs) if self.claim_policy == "cost" else None
                if slower is None:
                    kept.append(group)
                    continue
                declines.extend(self._decline(NodeContext(graph, i), slower) for i in group)
                continue
            for i in group:
                signal = DeclineSignal(
                    Rejected.PARTITION,
                    (
                        f"its partition has {len(group)} node(s), below "
                        f"min_subgraph_size={self.min_subgraph_size}"
                    ),
                    f"partitions of at least {self.min_subgraph_size} nodes",
                    "lower min_subgraph_size to compile small partitions",
                )
                declines.append(self._decline(NodeContext(graph, i), signal))
        claims = tuple(
            replace(c, cost=costs.get(c.nodes, Cost())) for c in make_claims(graph, self.ep_id, kept, "tvm")
        )
        return ClaimResult(claims, tuple(declines))

    def _cost(self, graph: GraphView, group: tuple[int, ...], costs: dict) -> DeclineSignal | None:
        """claim_policy='cost': measure the built partition
        against onnxruntime; a decline if TVM is slower."""
        name = partition_name(graph, group, "tvm")
        built = self._built.get(name)
        timing = None
        if built is not None and self.device.type is DeviceType.CPU:
            timing = measure_partition(graph, group, name, built[0], self.cost_budget_s)
        if timing is None:
            costs[group] = Cost(None, "unmeasured (symbolic sizes); kept")
            return None
        tvm_us, ort_us = timing
        costs[group] = Cost(tvm_us, f"measured; fallback {ort_us:.1f} us")
        # TVM must win by the timing noise and by the fallback run that splitting the graph adds: the bundled
        # model's conv partition measured level with onnxruntime, and taking it made the session 1.35x slower.
        if tvm_us * (1 + COST_MARGIN) + ort_run_floor_us() <= ort_us:
            return None
        return DeclineSignal(
            Rejected.PARTITION,
            f"claim_policy='cost': its partition ({len(group)} nodes) measured {tvm_us:.1f} us on TVM "
            f"vs {ort_us:.1f} us on the fallback (net of its per-run cost); TVM must be {COST_MARGIN:.0%} "
            "faster, plus one fallback run",
            "partitions expected to run faster on TVM than on the fallback",
            "tune it (nxrt-tvm tune) or use claim_policy='all' to compile it anyway",
        )

    def _verify(self, graph: GraphView, group: tuple[int, ...]) -> dict[int, DeclineSignal]:
        """Nodes to decline so that `group` compiles: the group checks' culprits, or the import culprit."""
        problems = check_group(graph, group)
        if problems:
            return problems
        name = partition_name(graph, group, "tvm")
        key = self._cache_key(graph, group, name) if self.cache is not None else None
        if key is not None:
            entry = self.cache.get(key)
            if entry is not None:  # built and proven before; the cache verified its sha256
                self._built[name] = (load_executable(entry.blob, name), entry.blob)
                self.variants[name] = [KernelVariant(*v) for v in entry.meta.get("variants", [])]
                self.stats["cache_hits"] += 1
                return {}

        def attempt(
            nodes: list[int], variants: list[KernelVariant] | None = None
        ) -> tuple[Any, bytes | None]:
            return self._compile(graph, nodes, name, (), variants)

        variants: list[KernelVariant] = []
        try:
            executable, blob = attempt(list(group), variants)
        except CompileFailed:
            culprit, message = locate_failure(group, attempt)
        else:
            if key is not None:
                blob = blob if blob is not None else export_executable(executable)
                meta = {
                    "partition": name,
                    "target": self.target.kind.name,
                    "variants": [list(_v(v)) for v in variants],
                }
                self.cache.put(key, blob, meta)
            self._built[name] = (executable, blob)
            self.variants[name] = variants
            return {}
        return {
            culprit: DeclineSignal(
                Rejected.BUILD,
                f"TVM cannot compile it in this context: {message}",
                (
                    "what tvm.relax.frontend.onnx imports and TVM builds (shape-like "
                    "inputs must be constants or computed in the same partition)"
                ),
                (
                    "runs on the fallback EP; fold run-time shapes to "
                    "constants (onnxsim) or export with static shapes"
                ),
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
    def build(self, graph: GraphView, claim: SubgraphClaim) -> tuple[Any, tuple[str, ...], bytes | None]:
        """The module for a claim, the weights it takes as
        inputs (weightless builds only), and its blob if known."""
        if self.compile_disabled:
            raise CompileDisabled(
                f"partition {claim.name} ({len(claim.nodes)} nodes) "
                "needs compiling but model compilation is disabled; "
                "compile the model ahead of time (nxrt-tvm compile) or drop session.disable_model_compile"
            )
        weights = weight_names(graph, claim.nodes) if self.weightless else ()
        built = None if weights else self._built.pop(claim.name, None)
        if built is None:
            variants: list[KernelVariant] = []
            built = self._compile(graph, claim.nodes, claim.name, weights, variants)
            self.variants[claim.name] = variants
        self.stats["compiled"] += 1
        return built[0], weights, built[1]

    def _compile(
        self,
        graph: GraphView,
        nodes: Sequence[int],
        name: str,
        weights: Sequence[str],
        variants: list[KernelVariant] | None,
    ) -> tuple[Any, bytes | None]:
        """(module, blob) of a node set: built in a forked child
        and loaded here when isolated (blob set), else in process."""
        self.stats["builds"] += 1
        if not self.isolate:
            return compile_partition(graph, nodes, name, self.target, self.lowering, weights, variants), None

        def child() -> tuple[bytes, list[KernelVariant]]:
            notes: list[KernelVariant] = []
            executable = compile_partition(graph, nodes, name, self.target, self.lowering, weights, notes)
            return export_executable(executable), notes

        blob, notes = run_isolated(child, f"partition {name} ({len(nodes)} nodes)", self.compile_timeout_s)
        if variants is not None:
            variants[:] = notes
        # A compile-only host (CUDA code, no GPU) cannot load
        # the library; the blob still goes into EPContexts.
        return (load_executable(blob, name) if tvm_device(self.device).exist else None), blob

    def compile(self, graph: GraphView, claim: SubgraphClaim) -> TvmKernel:
        module, weights, blob = self.build(graph, claim)
        kernel = TvmKernel(
            module,
            self.device,
            claim.name,
            [graph.info(i) for i in claim.inputs],
            [graph.info(o) for o in claim.outputs],
            [(w, self._bound_weight(w, graph.initializers)) for w in weights],
            blob=blob,
            variants=self.variants.get(claim.name, ()),
        )
        return kernel

    def _cache_key(self, graph: GraphView, group: tuple[int, ...], name: str) -> str:
        """Everything that shapes the compiled code: partition
        graph and weights, target, TVM, passes, our code."""
        model = partition_model(graph, group, name)
        return cache_key(
            model.SerializeToString(deterministic=True),
            json.dumps(dict(self.target.export()), sort_keys=True, default=str),
            tvm.__version__,
            f"nxrt-tvm/{FORMAT_VERSION}",
            self.lowering.digest(),
            codegen_digest(),
        )

    def _bound_weight(self, name: str, initializers: Mapping[str, onnx.TensorProto]) -> tvm.runtime.Tensor:
        """One device copy of each weight, shared by every partition of this EP."""
        tensor = self._weights.get(name)
        if tensor is None:
            if name not in initializers:
                raise EpLoadFailed(
                    name, "a weightless blob needs this initializer, but the model has none of that name"
                )
            array = numpy_helper.to_array(initializers[name])
            host = aligned_empty(array.shape, array.dtype)
            host[...] = array
            tensor = self._weights[name] = tvm.runtime.tensor(host, tvm_device(self.device))
        return tensor

    # -- EPContext -------------------------------------------------------------------
    def save_context(self, kernel: Kernel) -> EpContext:
        if not isinstance(kernel, TvmKernel):
            raise UnsupportedContext(str(self.ep_id), f"cannot save a {type(kernel).__name__}")
        blob = kernel.blob if kernel.blob is not None else export_executable(kernel.module)
        hardware, features = hardware_of(self.target)
        return EpContext(
            source=str(self.ep_id),
            partition_name=kernel.name,
            blob=blob,
            embed_mode=1,
            target=json.dumps(dict(self.target.export()), sort_keys=True, default=str),
            hardware_architecture=hardware,
            cpu_features=features,
            ep_sdk_version=tvm.__version__,
            sha256=sha256_hex(blob),
            size=len(blob),
            inputs=tuple(TensorSignature.of(i) for i in kernel.inputs),
            outputs=tuple(TensorSignature.of(o) for o in kernel.outputs),
            weights=kernel.weight_names,
            tuning_digest=self.lowering.database.digest if self.lowering.database is not None else "",
        )

    def load_context(
        self, context: EpContext, initializers: Mapping[str, onnx.TensorProto] | None = None
    ) -> TvmKernel:
        """Check the blob fits this host (raising `ContextRejected`
        before any native code loads), then load it."""
        check_loadable(context, self.target)
        module = load_executable(context.blob, context.partition_name)
        self.stats["loaded"] += 1
        return TvmKernel(
            module,
            self.device,
            context.partition_name,
            [s.to_info() for s in context.inputs],
            [s.to_info() for s in context.outputs],
            [(w, self._bound_weight(w, initializers or {})) for w in context.weights],
            blob=context.blob,
        )


def _v(variant: KernelVariant) -> tuple[str, str, str]:
    return (variant.name, variant.variant, variant.reason)
