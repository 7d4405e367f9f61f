"""InferenceSession: load, partition, compile once; run the partitions in order on every call."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from .api.claim import Cost, Decline, Rejected, SubgraphClaim
from .api.device import EpId
from .api.errors import (
    InputShapeMismatch,
    InputTypeMismatch,
    InvalidFeed,
    InvalidModel,
    InvalidProviderOptions,
    KernelFailed,
    MissingInput,
    NoEpForOp,
    UnknownInput,
)
from .api.kernel import Kernel
from .api.provider import EpConfig, ExecutionProvider, inlined_ops
from .api.tensor import TensorView
from .epcontext.loader import ResolvedContexts, resolve_contexts
from .epcontext.registry import build_ep_context_registry
from .epcontext.signing import SignaturePolicy, check_model
from .epcontext.writer import write_context_model
from .graph.constants import branch_inputs
from .graph.model import (
    GraphView,
    ModelSource,
    ValueInfo,
    analyse,
    fix_input_shapes,
    fix_input_values,
    override_free_dims,
    read_model,
    specialisable_inputs,
)
from .lower.strict import strict
from .partition.claims import make_claims
from .partition.grouping import group_nodes
from .partition.plan import PartitionPlan, make_plan
from .providers import EP_REGISTRY, FALLBACK_EP
from .providers.cpu import CPUExecutionProvider, OrtKernel
from .runtime.kernel import POOL_THREADS, use_threads
from .runtime.measure import SPIN_DOWN_S, representative_inputs
from .runtime.specialise import ShapeSpecialiser, Signature
from .session_options import SessionConfig
from .timing import PhaseTimes, median_by, median_seconds, phase, record_phases

__all__ = ["InferenceSession", "NodeArg", "PartitionTime", "DEFAULT_PROVIDERS"]

log = logging.getLogger(__name__)

DEFAULT_PROVIDERS = ("TvmExecutionProvider", "CPUExecutionProvider")


@dataclass(frozen=True)
class NodeArg:
    """A model input or output as onnxruntime describes it (`name`, `shape`, `type`)."""

    name: str
    shape: list[int | str | None]
    type: str


def _node_arg(info: ValueInfo) -> NodeArg:
    type_name = (
        "tensor(unknown)"
        if info.elem_type is None
        else f"tensor({onnx.helper.tensor_dtype_to_string(info.elem_type).split('.')[-1].lower()})"
    )
    return NodeArg(info.name, list(info.shape) if info.shape is not None else [], type_name)


def _make_providers(
    providers: Sequence[Any] | None, options: Sequence[dict] | None
) -> list[ExecutionProvider]:
    names = list(providers) if providers is not None else list(DEFAULT_PROVIDERS)
    if options is not None and len(options) != len(names):
        raise InvalidProviderOptions(
            f"{len(names)} providers but {len(options)} provider_options; give one dict per provider"
        )
    made: list[ExecutionProvider] = []
    for k, entry in enumerate(names):
        opts = dict(options[k]) if options is not None else {}
        if isinstance(entry, ExecutionProvider):
            made.append(entry)
            continue
        if isinstance(entry, tuple) and len(entry) == 2:  # onnxruntime's ("Name", {options}) form
            entry, opts = entry[0], {**entry[1], **opts}
        made.append(EP_REGISTRY.create(str(entry), opts))  # type: ignore[arg-type]
    if not any(p.ep_id == FALLBACK_EP for p in made):
        made.append(EP_REGISTRY.create(FALLBACK_EP))  # type: ignore[arg-type]
    return made


@dataclass(frozen=True)
class PartitionTime:
    """One partition's share of a run (`InferenceSession.profile`): its kernel's median seconds per
    call, and where the kernel can see inside itself, each function it calls, slowest first
    (name, median seconds in all per call, calls per call)."""

    partition: str
    ep: str
    seconds: float
    functions: tuple[tuple[str, float, int], ...] = ()


class InferenceSession:
    """Runs an ONNX model with TVM-compiled partitions and an onnxruntime fallback.

    Mirrors `onnxruntime.InferenceSession`: ``run(output_names, input_feed)``,
    ``get_inputs()``, ``get_outputs()``; ``plan`` shows who runs what and why. A model with symbolic
    input dims is also built for the shapes its calls keep having (`runtime.specialise`):
    ``session_for(feeds)`` is the session that serves them. Where its EPs judge claims by speed, such a
    model runs on the fallback until then (``deferred``): its symbolic plan is built only if shapes vary.
    """

    def __init__(
        self,
        path_or_bytes: ModelSource,
        sess_options: Any = None,
        providers: Sequence[Any] | None = None,
        provider_options: Sequence[dict] | None = None,
        *,
        _input_shapes: Mapping[str, tuple[int, ...]] | None = None,
        _input_values: Mapping[str, np.ndarray] | None = None,
        _derived: bool = False,
    ):
        started = time.perf_counter()
        #: builds for recurring input shapes (None: static inputs, a precompiled model, or turned off; and
        #: while the session is made: its whole-model check runs it)
        self._specialiser: ShapeSpecialiser[InferenceSession] | None = None
        #: the one kernel of a fixed-shape plan, called straight from `run` on array feeds that fit it
        self._direct: _Direct | None = None
        #: where session creation spent its time, per phase (`timing.PhaseTimes`; `nxrt-tvm run --timings`)
        self.compile_times = PhaseTimes()
        #: a build the specialiser made: for its calls' shapes, or the symbolic plan a deferred one put off
        derived = _derived or _input_shapes is not None
        #: inputs this build fixed to a value (`runtime.specialise`): a call's feeds may hold them (checked)
        self._fixed_values = {name: np.asarray(v) for name, v in (_input_values or {}).items()}
        with record_phases(self.compile_times):
            self._create(path_or_bytes, sess_options, providers, provider_options, _input_shapes, derived)
        self.load_seconds = time.perf_counter() - started
        log.info("session ready in %.3f s: %s", self.load_seconds, self.plan.nodes_by_ep())
        if not derived and self._specialises():
            args = (sess_options, providers, provider_options)
            self._specialiser = ShapeSpecialiser(
                partial(self._rebuilt, args),
                self.config.shape_specialisations,
                partial(self._rebuilt, args, None) if self.deferred else None,
            )
            self._direct = None  # the specialiser sees every call first

    def _create(
        self,
        path_or_bytes: ModelSource,
        sess_options: Any,
        providers: Sequence[Any] | None,
        provider_options: Sequence[dict] | None,
        input_shapes: Mapping[str, tuple[int, ...]] | None,
        derived: bool,
    ) -> None:
        self.config = SessionConfig.parse(sess_options)
        if self.config.intra_op_num_threads > POOL_THREADS:
            log.warning(
                "intra_op_num_threads=%d, but TVM's pool has %d threads (TVM_NUM_THREADS, read when nxrt_tvm "
                "is imported): TVM kernels run on %d",
                self.config.intra_op_num_threads,
                POOL_THREADS,
                POOL_THREADS,
            )
        with phase("read"):
            path = Path(path_or_bytes) if isinstance(path_or_bytes, (str, os.PathLike)) else None
            data = _read_file(path) if path is not None and path.is_file() else None
            model, model_dir = read_model(path_or_bytes, data)  # the bytes the signature is checked on
            trust = check_model(
                path,
                data,
                SignaturePolicy.from_paths(self.config.trusted_keys, self.config.require_signature),
            )
            # the user's model as they gave it, for a plan that hands it all to the fallback
            source: bytes | str = path_or_bytes if isinstance(path_or_bytes, bytes) else str(path_or_bytes)
            if isinstance(path_or_bytes, onnx.ModelProto):
                source = model.SerializeToString()
                model = onnx.ModelProto.FromString(source)  # never edit the caller's proto
            override_free_dims(model, dict(self.config.free_dimension_overrides))
            fix_input_shapes(model, input_shapes or {})
            #: inputs whose values a call's signature holds: builds for them take the branch they decide
            self._branch_inputs = () if derived else branch_inputs(model)
            fix_input_values(model, self._fixed_values)
            self._open_dims = specialisable_inputs(model)
            #: the model as given, for builds specialised to the shapes calls have
            self._origin: ModelSource = (
                source if isinstance(path_or_bytes, onnx.ModelProto) else path_or_bytes
            )
        ep_config = EpConfig(
            compile_disabled=self.config.disable_model_compile,
            intra_op_num_threads=self.config.intra_op_num_threads,
        )
        with phase("providers"):  # the TVM EP's tuning records are read here
            self._providers = _make_providers(providers, provider_options)
            for ep in self._providers:
                ep.initialize(ep_config)
        with phase("EPContext load"):
            contexts = resolve_contexts(
                model,
                model_dir,
                build_ep_context_registry(self._providers),
                self.config.context_on_mismatch,
                trust,
            )
        self._precompiled = bool(contexts.loaded or contexts.planned_fallback)
        #: the plan waits for the calls' input shapes: the fallback runs the whole model until then
        self.deferred = not derived and self._defers()
        with phase("analyse"):
            self._graph = analyse(
                model,
                inline=inlined_ops(self._providers),
                symbolic=not (
                    self.deferred or self.config.disable_model_compile or _all_fixed(model, contexts)
                ),
                store=next(filter(None, (ep.inference_store() for ep in self._providers)), None),
            )
        if self._fixed_values:  # onnxruntime's whole model: the one this build runs (its branch taken)
            source = self._graph.model.SerializeToString()
        fixed, preloaded = self._context_partitions(contexts)
        with phase("plan"):
            self.plan: PartitionPlan = (
                self._deferred_plan() if self.deferred else make_plan(self._graph, self._providers, fixed)
            )
        by_id = {p.ep_id: p for p in self._providers}
        # A partition none of whose results is read (dead code in the model) is neither compiled nor run.
        self._live = [p for p in self.plan.partitions if p.outputs]
        fallback_only = all(p.ep == FALLBACK_EP for p in self._live)
        if fallback_only:  # no other EP's kernels run between the fallback's: let its pool spin
            for ep in self._providers:
                ep.initialize(replace(ep_config, shares_cores=False))
        whole = fallback_only and len(self._live) == 1 and not (contexts.loaded or contexts.fallback_nodes)
        self._kernels: list[Kernel] = []
        #: the fallback's session over the user's own model, where it runs the whole plan (`run` calls it)
        self._whole: OrtKernel | None = None
        with phase("kernels"):
            for partition in self._live:
                self._kernels.append(self._kernel(partition, preloaded, by_id, source if whole else None))
        self._inputs = {i.name: i for i in self._graph.inputs}
        self._input_dtypes = {i.name: i.dtype for i in self._graph.inputs}  # dtype is computed per call
        self._output_names = [o.name for o in self._graph.outputs]
        self._release_after = self._lifetimes()
        self._direct = self._direct_run()
        if _to_check(self._live) and not contexts.loaded:
            with phase("whole-model check"):
                self._check_against_whole(by_id, ep_config, source)
        self.refused_contexts = list(contexts.refused)
        if self.config.context_enable:
            with phase("EPContext save"):
                self._write_context_model(path_or_bytes)

    def _kernel(
        self,
        partition: SubgraphClaim,
        preloaded: dict[str, Kernel],
        by_id: dict[EpId, ExecutionProvider],
        whole_source: bytes | str | None,
    ) -> Kernel:
        """The partition's kernel, prepared: loaded from its EPContext, the user's own model where the
        fallback runs it all (`whole_source`), else compiled by its EP."""
        kernel = preloaded.get(partition.name)
        if kernel is None and whole_source is not None:
            kernel = self._whole = self._whole_model_kernel(by_id[partition.ep], whole_source)
        if kernel is None:
            try:
                kernel = by_id[partition.ep].compile(self._graph, partition)
            except NoEpForOp as exc:  # the last EP could not run it either: say why every EP refused
                declined = [str(d) for d in self.plan.declines if d.node == exc.node]
                raise NoEpForOp(exc.node, exc.domain, exc.op_type, exc.opset, declined + exc.reasons) from exc
        kernel.prepare()
        return kernel

    def _whole_model_kernel(self, fallback: ExecutionProvider, source: bytes | str) -> OrtKernel | None:
        """The fallback's session over the user's own model (None where onnxruntime refuses it as given,
        e.g. a declared dim of -1 our loader normalises: the extracted partition runs then)."""
        if not isinstance(fallback, CPUExecutionProvider):
            return None
        declared = [o.dtype for o in self._graph.outputs]
        try:
            return fallback.compile_whole(source, dict(self.config.free_dimension_overrides), declared)
        except Exception as exc:  # onnxruntime's errors have no common base
            log.info("onnxruntime refuses the model as given (%s); running the normalised copy", exc)
            return None

    def _check_against_whole(
        self, by_id: dict[EpId, ExecutionProvider], config: EpConfig, source: bytes | str
    ) -> None:
        """Keep a plan whose partitions an EP kept by measuring them (`_to_check`) only where it runs
        faster than the fallback on the user's whole model; else run the whole model there.

        Each partition was measured alone, against onnxruntime running the same nodes alone. That sees
        neither what a split costs the fallback's partitions around it, the fusions onnxruntime makes
        across the cut (Magika: three TVM partitions, each faster alone, split its layer norms, and the
        model ran 1.15x slower than onnxruntime on the whole of it), nor the session's own steps per run
        (a dynamic-int8 BERT, one TVM partition measured faster, ran 1.03x onnxruntime's time). The
        verdict is kept with the first measured partition's compile result (`ExecutionProvider.remember`)
        for this plan and thread count: a later session on this host reads it instead of timing again."""
        fallback = by_id.get(FALLBACK_EP)
        if fallback is None:
            return
        first = next(p for p in self._live if p.ep != FALLBACK_EP and p.cost.latency_us is not None)
        owner, what = by_id[first.ep], f"whole-model check@{config.intra_op_num_threads}"
        plan = "|".join(p.name for p in self._live)
        kept = owner.recall(first.name, what)
        timed = _verdict(kept, plan)
        if timed is not None and timed[0] * (1 + WHOLE_MARGIN) <= timed[1]:
            return  # kept before: no session over the whole model is made
        fallback.initialize(replace(config, shares_cores=False))  # as the whole model would run
        try:
            whole = self._whole_model_kernel(fallback, source)
        finally:
            fallback.initialize(config)
        if whole is None:
            return
        if timed is None:
            timed = self._time_against(whole)
            if timed is None:
                return
            owner.remember(first.name, what, [plan, *timed])
        slower = timed[0] * (1 + WHOLE_MARGIN) > timed[1]
        log.info(
            "whole-model check: the plan %.1f us a run, %s on the whole model %.1f us: %s",
            timed[0] * 1e6,
            FALLBACK_EP,
            timed[1] * 1e6,
            f"{FALLBACK_EP} runs it" if slower else "the plan runs it",
        )
        if slower:
            self._run_whole(whole, *timed)

    def _time_against(self, whole: OrtKernel) -> tuple[float, float] | None:
        """(this plan's, the fallback's) seconds per run of the whole model on representative inputs,
        from the pass whose ratio is the median of `CHECK_PASSES` taking turns (`CHECK_PASSES_UNDECIDED`
        where their median is `UNDECIDED`; this host's speed changes between regimes seconds apart); None
        where onnxruntime takes no representative inputs, or the plan fails on random ones."""
        for feeds in representative_inputs(self._graph, list(self._inputs)):
            started = time.perf_counter()
            try:
                whole.run_host(self._output_names, feeds)
            except Exception:  # onnxruntime refuses these sizes (no common base): try the next
                continue
            once = time.perf_counter() - started  # a side takes about 4 runs a pass (`median_seconds`)
            passes: list[tuple[float, float]] = []
            wanted = max(1, min(CHECK_PASSES, int(CHECK_BUDGET_S / (8 * once))))
            while len(passes) < wanted:
                time.sleep(SPIN_DOWN_S)  # each side after the other's pool has stopped spinning
                try:
                    plan_s = median_seconds(partial(self.run, None, feeds), 50, warmup=1, budget_s=CHECK_S)
                except KernelFailed as exc:  # random inputs a kernel refuses (a value-dependent check)
                    log.warning("whole-model check skipped: the plan failed on random inputs (%s)", exc)
                    return None
                time.sleep(SPIN_DOWN_S)
                run_whole = partial(whole.run_host, self._output_names, feeds)
                passes.append((plan_s, median_seconds(run_whole, 50, warmup=1, budget_s=CHECK_S)))
                if len(passes) == CHECK_PASSES and _undecided(passes):
                    wanted = CHECK_PASSES_UNDECIDED
            return median_by(passes, lambda p: p[0] / p[1])
        return None

    def _run_whole(self, whole: OrtKernel, plan_s: float, whole_s: float) -> None:
        """Replace the plan by the fallback on the whole model, each dropped partition declined."""
        graph = self._graph
        split = any(p.ep == FALLBACK_EP for p in self._live)
        ran = "the model split around it" if split else "the session running it"
        declines = tuple(
            Decline(
                graph.nodes[p.nodes[0]].name,
                graph.nodes[p.nodes[0]].op_type,
                graph.nodes[p.nodes[0]].domain,
                graph.opset_of(p.nodes[0]),
                p.ep,
                Rejected.PARTITION,
                f"its partition ({len(p.nodes)} nodes) was kept on its own ({p.cost}), but {ran} took "
                f"{plan_s * 1e6:.1f} us a run against {whole_s * 1e6:.1f} us on {FALLBACK_EP} whole",
                f"plans that run at least {WHOLE_MARGIN:.0%} faster than {FALLBACK_EP} on the whole model",
                "use claim_policy='all' to keep it anyway",
            )
            for p in self._live
            if p.ep != FALLBACK_EP
        )
        everything = make_claims(graph, FALLBACK_EP, [list(range(len(graph.nodes)))], "cpu")
        self.plan = PartitionPlan(everything, self.plan.declines + declines, self.plan.node_count)
        self._live, self._kernels, self._whole = list(everything), [whole], whole
        self._release_after = self._lifetimes()
        self._direct = None

    def _direct_run(self) -> _Direct | None:
        """The plan's kernel, where it is one kernel that reads only the model's inputs, all of fixed
        shape and tensors, and writes all its outputs (None otherwise, or where onnxruntime runs the
        user's model: `_whole`)."""
        if self._whole is not None or len(self._kernels) != 1:
            return None
        (kernel,) = self._kernels
        inputs = []
        for info in self._graph.inputs:
            shape, dtype = info.shape, self._input_dtypes[info.name]
            if info.name in self._graph.other_types or dtype is None or shape is None:
                return None
            if not all(isinstance(d, int) for d in shape):
                return None
            inputs.append((info.name, tuple(shape), dtype))
        slots = {name: k for k, name in enumerate(kernel.output_names)}
        if not set(kernel.input_names) <= self._inputs.keys() or not set(self._output_names) <= slots.keys():
            return None
        threads = self.config.intra_op_num_threads
        return _Direct(kernel, tuple(inputs), tuple(kernel.input_names), slots, threads)

    def _specialises(self) -> bool:
        """Whether builds for recurring input signatures can help: some input dim is symbolic or some
        input decides a branch, an EP besides the fallback compiles, and neither the options nor a
        precompiled model fix the plan."""
        config = self.config
        if config.shape_specialisations == 0 or config.disable_model_compile or config.context_enable:
            return False
        return bool(
            (self._open_dims or self._branch_inputs)
            and not self._precompiled
            and any(p.ep_id != FALLBACK_EP for p in self._providers)
        )

    def _defers(self) -> bool:
        """Whether to run on the fallback until input shapes are known, rather than build the symbolic
        plan now: builds for shapes come, and every compiling EP keeps a partition only where it measured
        faster (at invented sizes, for a symbolic plan; at the calls' own, for a build for them)."""
        return (
            self.config.symbolic_compile == "deferred"
            and self._specialises()
            and all(p.judges_by_speed() for p in self._providers if p.ep_id != FALLBACK_EP)
        )

    def _deferred_plan(self) -> PartitionPlan:
        """The whole model on the fallback, until the calls' input shapes are known."""
        graph = self._graph
        waiting = Cost(
            source="deferred: built once input shapes recur or vary (nxrt.symbolic_compile='load' builds now)"
        )
        everything = make_claims(graph, FALLBACK_EP, [list(range(len(graph.nodes)))], "cpu", waiting)
        return PartitionPlan(everything, (), len(graph.nodes))

    def _rebuilt(self, args: tuple, signature: Signature | None) -> InferenceSession | None:
        """The model built again: with its inputs fixed to `signature` (their shapes, and the values of
        its branch inputs), or (None) with the symbolic plan a
        deferred session put off, once its calls' shapes vary. None where that gives TVM nothing to run
        and neither does this session's plan (which then serves as well), or fails (logged; raised in
        strict mode). A build that leaves all to onnxruntime where this plan runs TVM serves its shapes:
        the symbolic plan was judged at representative sizes, the build at the feeds' own (Silero VAD's
        symbolic TVM plan ran 1.10x onnxruntime's time at its feeds' shapes)."""
        fixed = values = None
        if signature is None:
            label = "the symbolic plan"
            log.info("input shapes vary: building the model's symbolic plan")
        else:
            fixed = dict(zip(self._inputs, signature))
            given = dict(zip(self._branch_inputs, signature[len(fixed) :]))
            values = {
                name: np.full(fixed[name], v, dtype=self._input_dtypes[name]) for name, v in given.items()
            }
            label = "input shapes " + ", ".join(f"{name} {list(shape)}" for name, shape in fixed.items())
            label += "".join(f", {name} = {value}" for name, value in given.items())
            log.info("%s recur: building the model for them", label)
        try:
            session = InferenceSession(
                self._origin, *args, _input_shapes=fixed, _input_values=values, _derived=True
            )
        except Exception as exc:  # no common base (TVM, onnxruntime, ours): this session's plan serves
            if strict():
                raise
            log.warning("no build for %s (the session's own plan serves): %s", label, exc)
            return None
        if all(p.ep == FALLBACK_EP for p in (*session._live, *self._live)):
            log.info("%s: every partition stays on %s; the session's own plan serves", label, FALLBACK_EP)
            return None
        log.info("%s: built in %.1f s (%s)", label, session.load_seconds, session.plan.nodes_by_ep())
        return session

    def session_for(self, input_feed: dict[str, Any]) -> InferenceSession:
        """The session that runs these feeds: the one built for their shapes where their shapes recurred
        (`runtime.specialise`), else this one. Its `plan` and `kernel_variants()` say what runs them."""
        if self._specialiser is None:
            return self
        checked = self._validate(input_feed)
        return self._specialiser.sessions.get(self._signature(checked)) or self._specialiser.general or self

    def _serve(self, wanted: list[str], feeds: dict[str, np.ndarray]) -> list[Any] | None:
        """A call on array feeds without `_validate`'s walk (a small model's run spent 40 us in the steps
        between `run` and its compiled code): straight to the kernel of a fixed-shape plan, or to the
        session built for the feeds' shapes, or to onnxruntime on the user's model where the feeds'
        shapes stay with this plan (onnxruntime checks array feeds as it would alone). None: the checked
        path runs the call, and says what is wrong with the feeds."""
        if self._fixed_values:
            feeds = self._unfixed(feeds)
            if feeds is None:
                return None
        if self._direct is not None:
            return self._direct.run(wanted, feeds)
        specialiser = self._specialiser
        if specialiser is not None:
            try:
                signature = self._signature(feeds)
            except (KeyError, ValueError):  # a missing input, a branch input of another size: `_validate`
                return None
            built = specialiser.sessions.get(signature)
            if built is not None:
                return built._serve(wanted, feeds)
            if not specialiser.settled(signature):  # counted, maybe built for, on the checked path
                return None
        if self._whole is None:
            return None
        try:
            return self._whole.run_arrays(wanted, feeds)
        except KernelFailed:
            return None

    def _signature(self, feeds: dict[str, Any]) -> Signature:
        """What a build serves: each input's shape, then each branch input's value (ValueError where one
        is not one element)."""
        shapes = tuple(tuple(feeds[name].shape) for name in self._inputs)
        return (*shapes, *(_value_of(feeds[name]) for name in self._branch_inputs))

    def _given(self, feeds: Any) -> Any:
        """`feeds` less the inputs this build fixed to a value, which must hold it (`InvalidFeed`)."""
        if not self._fixed_values:
            return feeds
        unfixed = self._unfixed(feeds) if isinstance(feeds, dict) else None
        if unfixed is None:
            held = ", ".join(f"{name} = {v.tolist()}" for name, v in self._fixed_values.items())
            raise InvalidFeed(
                f"this session was built for {held}; feed those values, or run the session it came from"
            )
        return unfixed

    def _unfixed(self, feeds: dict[str, Any]) -> dict[str, Any] | None:
        """`feeds` without the inputs this build fixed to a value, each checked to hold it where given;
        None where one holds another (the checked path says what is wrong)."""
        for name, value in self._fixed_values.items():
            fed = feeds.get(name)
            if fed is None:
                continue
            if getattr(fed, "shape", None) != value.shape or _value_of(fed) != value.item():
                return None
        return {name: v for name, v in feeds.items() if name not in self._fixed_values}

    def _context_partitions(
        self, contexts: ResolvedContexts
    ) -> tuple[list[SubgraphClaim], dict[str, Kernel]]:
        """Partitions fixed before any EP claims: loaded EPContext nodes, source restored for the fallback,
        and the nodes a compile ahead of time left to the fallback."""
        graph = self._graph
        index = {node.name: i for i, node in enumerate(graph.nodes)}
        fixed: list[SubgraphClaim] = []
        preloaded: dict[str, Kernel] = {}
        for node_name, (ctx, ep, kernel) in contexts.loaded.items():
            i = index[node_name]
            inputs, outputs = graph.boundary([i])
            fixed.append(
                SubgraphClaim(ep.ep_id, ctx.partition_name, (i,), inputs, outputs, Cost(source="precompiled"))
            )
            preloaded[ctx.partition_name] = kernel
        left = [index[n] for n in contexts.fallback_nodes | contexts.planned_fallback if n in index]
        if left:
            groups = group_nodes(graph, left, [c.nodes for c in fixed])
            fixed.extend(make_claims(graph, FALLBACK_EP, groups, "cpu"))
        return fixed, preloaded

    def _write_context_model(self, source: ModelSource) -> None:
        """`ep.context_enable`: save every compiled partition as an EPContext node."""
        if self.config.context_file_path:
            path = Path(self.config.context_file_path)
        elif isinstance(source, (str, Path)):
            path = Path(source).with_name(Path(source).stem + "_ctx.onnx")
        else:
            raise InvalidProviderOptions(
                "ep.context_enable on a model given as bytes needs ep.context_file_path"
            )
        by_id = {p.ep_id: p for p in self._providers}
        contexts = {}
        for partition, kernel in zip(self._live, self._kernels):
            if partition.ep != FALLBACK_EP and partition.cost.source != "precompiled":
                contexts[partition.name] = by_id[partition.ep].save_context(kernel)
        write_context_model(self._graph, self.plan, contexts, path, embed_mode=self.config.context_embed_mode)

    @property
    def graph(self) -> GraphView:
        return self._graph

    def get_inputs(self) -> list[NodeArg]:
        return [_node_arg(i) for i in self._graph.inputs]

    def get_outputs(self) -> list[NodeArg]:
        return [_node_arg(o) for o in self._graph.outputs]

    def get_providers(self) -> list[str]:
        return [str(p.ep_id) for p in self._providers]

    def provider(self, ep_id: str) -> ExecutionProvider:
        """The session's EP named `ep_id` (e.g. to read `TvmExecutionProvider.stats`)."""
        for ep in self._providers:
            if ep.ep_id == ep_id:
                return ep
        raise KeyError(f"this session has no {ep_id}; it has {self.get_providers()}")

    def kernels(self) -> dict[str, Kernel]:
        """Partition name -> its kernel, for the partitions that run (in run order)."""
        return {p.name: k for p, k in zip(self._live, self._kernels)}

    def kernel_variants(self) -> dict[str, list]:
        """Partition name -> the implementation of each of its kernels (`KernelVariant`s), for the partitions
        that run (a partition whose outputs nothing uses has no kernel) and report variants."""
        return {p.name: k.variants() for p, k in zip(self._live, self._kernels) if k.variants()}

    def _lifetimes(self) -> list[list[str]]:
        """For each partition, the values no later partition reads: freed right after it runs."""
        last: dict[str, int] = {}
        for k, p in enumerate(self._live):
            for name in p.inputs:
                last[name] = k
            for name in p.outputs:
                last.setdefault(name, k)
        keep = self._graph.output_names
        release: list[list[str]] = [[] for _ in self._live]
        for name, k in last.items():
            if name not in keep:
                release[k].append(name)
        return release

    # -- feeds -------------------------------------------------------------------------
    def _validate(self, feeds: dict[str, Any]) -> dict[str, Any]:
        """The feeds checked against the model's inputs: numpy arrays stay arrays (C-contiguous), other
        DLPack tensors become `TensorView`s, sequences and optionals pass as they are."""
        if not isinstance(feeds, dict):
            raise InvalidFeed(f"input_feed must be a dict of input name -> array, got {type(feeds).__name__}")
        if len(feeds) != len(self._inputs) or not all(n in self._inputs for n in feeds):
            unknown = sorted(set(feeds) - set(self._inputs))
            if unknown:
                raise UnknownInput(
                    f"unknown input name(s) {unknown}; the model's inputs are {list(self._inputs)}"
                )
            missing = [n for n in self._inputs if n not in feeds]
            raise MissingInput(f"missing input(s) {missing}; feed every input of {list(self._inputs)}")
        bound: dict[str, int] = {}
        checked: dict[str, Any] = {}
        for name, value in feeds.items():
            info = self._inputs[name]
            if name in self._graph.other_types:  # a sequence or optional: onnxruntime checks it where used
                checked[name] = value
                continue
            if type(value) is np.ndarray:  # the common feed: checked without a view
                if not value.flags.c_contiguous:
                    value = np.ascontiguousarray(value)
                dtype, shape = value.dtype, value.shape
            elif hasattr(value, "__dlpack__"):
                value = TensorView(value)
                dtype, shape = value.dtype, value.shape
            else:
                value = _as_array(name, value)
                dtype, shape = value.dtype, value.shape
            want = self._input_dtypes[name]
            if want is not None and dtype != want:
                raise InputTypeMismatch(
                    f"input {name!r}: expected element type {info.dtype} "
                    f"({_node_arg(info).type}), got {dtype}; "
                    f"convert with .astype(np.{info.dtype})"
                )
            if info.shape is not None:
                _check_shape(name, info.shape, shape, bound)
            checked[name] = value
        return checked

    # -- run ---------------------------------------------------------------------------
    def run(
        self, output_names: Sequence[str] | None, input_feed: dict[str, Any], run_options: Any = None
    ) -> list[np.ndarray]:
        """Compute the requested outputs (all when `output_names` is None) as numpy arrays."""
        wanted = self._output_names if output_names is None else list(output_names)
        if _arrays(input_feed):
            served = self._serve(wanted, input_feed)
            if served is not None:
                return served
        bad = [n for n in wanted if n not in self._output_names] if output_names is not None else []
        if bad:
            raise InvalidFeed(
                f"unknown output name(s) {bad}; the model's outputs "
                f"are {[o.name for o in self._graph.outputs]}"
            )
        checked = self._validate(self._given(input_feed))
        if self._specialiser is not None:
            specialised = self._specialiser.session_for(self._signature(checked))
            if specialised is not None:
                return specialised.run(output_names, checked)
        if self._whole is not None:  # onnxruntime runs the user's model: nothing to hand between kernels
            return self._whole.run_host(wanted, checked)
        env = {n: TensorView.host_array(v) if type(v) is np.ndarray else v for n, v in checked.items()}
        use_threads(self.config.intra_op_num_threads)
        for kernel, release in zip(self._kernels, self._release_after):
            results = kernel.compute([env[name] for name in kernel.input_names])
            env.update(zip(kernel.output_names, results))
            for name in release:
                env.pop(name, None)
        return [self._fetch(name, env) for name in wanted]

    def profile(self, input_feed: dict[str, Any], repeat: int = 20) -> list[PartitionTime]:
        """Where a run's time goes, partition by partition in run order: each kernel timed on its own
        inputs (`repeat` calls after one untimed), with its functions' times where it reports them."""
        env = {
            n: TensorView.host_array(v) if type(v) is np.ndarray else v
            for n, v in self._validate(self._given(input_feed)).items()
        }
        use_threads(self.config.intra_op_num_threads)
        times = []
        for partition, kernel in zip(self._live, self._kernels):
            inputs = [env[name] for name in kernel.input_names]
            seconds = median_seconds(lambda: kernel.compute(inputs), repeat)  # noqa: B023 - called here
            functions = sorted(
                ((name, s, n) for name, (s, n) in kernel.function_times(inputs, repeat).items()),
                key=lambda f: -f[1],
            )
            times.append(PartitionTime(partition.name, partition.ep, seconds, tuple(functions)))
            env.update(zip(kernel.output_names, kernel.compute(inputs)))
        return times

    def _fetch(self, name: str, env: dict[str, Any]) -> Any:
        if name in env:
            value = env[name]
            return value.numpy() if isinstance(value, TensorView) else value  # sequences stay lists
        value = self._graph.constant(name)  # an output that is an initializer
        if value is None:
            raise AssertionError(f"output {name!r} was not computed")
        return value


@dataclass(frozen=True)
class _Direct:
    """A fixed-shape plan's one kernel (`InferenceSession._direct_run`), called on array feeds that fit
    its inputs exactly: the checks `_validate` makes, in the few steps such feeds need."""

    kernel: Kernel
    inputs: tuple[tuple[str, tuple[int, ...], np.dtype], ...]  #: the model's: name, shape, element type
    order: tuple[str, ...]  #: the kernel's inputs
    slots: Mapping[str, int]  #: each model output's place among the kernel's
    threads: int

    def run(self, wanted: list[str], feeds: dict[str, np.ndarray]) -> list[Any] | None:
        """The `wanted` outputs; None where the feeds or names do not fit (the checked path says why)."""
        if len(feeds) != len(self.inputs):
            return None
        for name, shape, dtype in self.inputs:
            value = feeds.get(name)
            if value is None or value.shape != shape or value.dtype != dtype:
                return None
        slots = self.slots
        if not all(name in slots for name in wanted):
            return None
        use_threads(self.threads)
        outputs = self.kernel.compute_arrays([feeds[name] for name in self.order])
        return [outputs[slots[name]] for name in wanted]


#: how much faster than the fallback on the whole model a plan checked against it must run to be kept;
#: the passes that check times both in turn, and each side's budget in a pass: short passes, so that a
#: pass's two sides see one regime of a host whose speed changes seconds apart (three passes of 0.1 s
#: read ShuffleNet's plan at 0.83x and 0.95x onnxruntime's time in two sessions)
WHOLE_MARGIN = 0.02
CHECK_PASSES = 5
CHECK_S = 0.05
#: plan / fallback ratios whose verdict the passes' spread leaves open: `CHECK_PASSES_UNDECIDED` passes
#: decide those. Five passes of SqueezeNet's plan read 0.82-1.05x (medians 0.90-0.99x) in four sessions,
#: and with a 5% margin two corpus runs in a row left it to onnxruntime at 0.99x and 1.01x; measured
#: alone it runs 0.89x. The margin was for noise, which the extra passes now take: 2%.
UNDECIDED = (0.9, 1.05)
CHECK_PASSES_UNDECIDED = 9
#: what the check may spend timing a slow model: fewer passes where one run takes long (VGG-19: 0.1-0.25 s)
CHECK_BUDGET_S = 1.0


def _undecided(passes: Sequence[tuple[float, float]]) -> bool:
    """Whether the median ratio of `passes` (plan, fallback seconds) lies where their spread decides."""
    plan_s, whole_s = median_by(passes, lambda p: p[0] / p[1])
    return UNDECIDED[0] <= plan_s / whole_s <= UNDECIDED[1]


def _all_fixed(model: onnx.ModelProto, contexts: ResolvedContexts) -> bool:
    """Whether every node's EP is decided before claims (a compiled model whose contexts all loaded)."""
    fixed = contexts.loaded.keys() | contexts.fallback_nodes | contexts.planned_fallback
    return all(node.name in fixed for node in model.graph.node)


def _to_check(live: Sequence[SubgraphClaim]) -> bool:
    """Whether to check the plan against the fallback on the whole model: it holds partitions an EP kept
    because they measured faster (claim_policy 'auto' or 'cost'; 'all' keeps its plan as asked). Each was
    measured against onnxruntime on our graph, which may not be the user's (functions inlined for TVM,
    Ifs taken, constants folded: an int8 QDQ MobileNet ran 1115-1179 us on onnxruntime alone as ours,
    870-970 us as exported), and a split costs what no partition's timing sees."""
    return any(p.ep != FALLBACK_EP and p.cost.latency_us is not None for p in live)


def _verdict(kept: Any, plan: str) -> tuple[float, float] | None:
    """The (plan, fallback) seconds a check kept for `plan`; None for another plan's or anything else."""
    if not isinstance(kept, list) or len(kept) != 3 or kept[0] != plan:
        return None
    if not all(isinstance(v, (int, float)) and v > 0 for v in kept[1:]):
        return None
    return float(kept[1]), float(kept[2])


def _arrays(feeds: Any) -> bool:
    """Whether `feeds` is a dict of numpy arrays, which onnxruntime checks as `_validate` does (names,
    element types, ranks, fixed dims; not that a named dim has one size across inputs, which it leaves
    to the ops that use them)."""
    return type(feeds) is dict and all(type(v) is np.ndarray for v in feeds.values())


def _value_of(value: Any) -> Any:
    """The one element of a branch input's feed, as a Python scalar (ValueError where it has more)."""
    array = (
        value
        if type(value) is np.ndarray
        else value.numpy()
        if isinstance(value, TensorView)
        else np.asarray(value)
    )
    if array.size != 1:
        raise ValueError(f"a branch input holds {array.size} elements, not one")
    return array.item()


def _as_array(name: str, value: Any) -> np.ndarray:
    """A feed that is neither an array nor a DLPack tensor (a list, a scalar) as a C-contiguous array."""
    if not isinstance(value, (np.generic, list, tuple, int, float, bool)):
        raise InputTypeMismatch(f"input {name!r}: expected a numpy array, got {type(value).__name__}")
    try:
        return np.asarray(value)
    except ValueError as exc:  # ragged nested lists and the like
        raise InputTypeMismatch(
            f"input {name!r}: cannot be read as an array ({exc}); pass a numpy array"
        ) from exc


def _check_shape(name: str, want_shape: Sequence[Any], shape: tuple[int, ...], bound: dict[str, int]) -> None:
    """`shape` against the declared one: fixed dims equal, a named dim one size across all inputs."""
    if len(shape) != len(want_shape):
        raise InputShapeMismatch(
            f"input {name!r}: expected rank {len(want_shape)} {list(want_shape)}, got shape {list(shape)}"
        )
    for axis, (want, got) in enumerate(zip(want_shape, shape)):
        if want == got:
            continue
        if isinstance(want, int):
            raise InputShapeMismatch(
                f"input {name!r}: dimension {axis} must be {want}, got {got} (shape {list(shape)})"
            )
        if isinstance(want, str) and bound.setdefault(want, got) != got:
            raise InputShapeMismatch(
                f"input {name!r}: dimension {axis} ({want!r}) is {got}, "
                f"but {want!r} was {bound[want]} in another input"
            )


def _read_file(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:  # unreadable (permissions, a vanished file): a bad model path, said as such
        raise InvalidModel(f"cannot read model file {str(path)!r}: {exc}") from exc
