"""ONNX partition -> Relax -> optimizer passes -> compiled Relax VM executable."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

import numpy as np
import onnx
import tvm
from tvm import relax

from ..api.errors import CompileFailed, InternalError
from ..api.kernel import KernelVariant
from ..frontend import import_onnx
from ..graph.extract import extract_model
from ..graph.model import GraphView, ValueInfo
from ..timing import phase
from .pipeline import Lowering, lowering_pipeline
from .strict import own_failure, raised_by_us, take_failure
from .tir_pipeline import tir_pipeline_for

__all__ = [
    "partition_model",
    "imported",
    "weight_names",
    "locate_failure",
    "build_executable",
    "compile_partition",
    "ShardCodegen",
    "KERNELS_PER_SHARD",
]

#: fewest kernels worth a codegen process of their own (each module pays LLVM's set-up once)
KERNELS_PER_SHARD = 8


class ShardCodegen(Protocol):
    """Builds TIR modules into object files elsewhere (other processes), for the export to link in."""

    #: how many modules to build at once (the caller only links: every module is built by this)
    jobs: int

    def __call__(self, modules: Sequence[tvm.IRModule], target: tvm.target.Target) -> Callable[[], None]:
        """Start building `modules` for `target`; the returned call waits until their objects are written."""


log = logging.getLogger(__name__)


@contextlib.contextmanager
def native_log_to_logging() -> Iterator[None]:
    """Send what TVM's C++ code writes to stderr while compiling into `logging` (debug level).

    TVM warns on stderr for ordinary events ("BlockBuilder destroyed with
    remaining blocks"); a library should stay quiet unless asked.
    """
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # no real stderr (e.g. captured by a test runner)
        yield
        return
    sys.stderr.flush()
    saved = os.dup(fd)
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), fd)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, fd)
            os.close(saved)
            sink.seek(0)
            for line in sink.read().decode(errors="replace").splitlines():
                log.debug("tvm: %s", line)


#: Initializers at least this large (elements, floating point) become inputs of weightless builds;
#: smaller ones (shapes, axes, scales) stay constants, which the frontend needs to see.
WEIGHT_MIN_ELEMENTS = 256


def weight_names(graph: GraphView, nodes: Sequence[int]) -> tuple[str, ...]:
    """The initializers a weightless build of `nodes` takes as inputs, in first-use order."""
    names: dict[str, None] = {}
    for i in sorted(nodes):
        for name in graph.node_inputs[i]:
            tensor = graph.initializers.get(name)
            if tensor is None:
                continue
            info = graph.info(name)
            dtype = info.dtype
            count = 1
            for d in tensor.dims:
                count *= d
            if dtype is not None and dtype.kind == "f" and count >= WEIGHT_MIN_ELEMENTS:
                names[name] = None
    return tuple(names)


def partition_model(
    graph: GraphView, nodes: Sequence[int], name: str, weights: Sequence[str] = ()
) -> onnx.ModelProto:
    """The standalone model of a node set; unknown input dims get names so TVM treats them as symbolic.

    `weights` become trailing graph inputs instead of initializers (weightless builds).
    """
    inputs, outputs = graph.boundary(nodes)
    inputs = (*inputs, *weights)
    named = {}
    for value in inputs:
        info = graph.info(value)
        if info.shape is not None and any(d is None for d in info.shape):
            dims = tuple(
                d if d is not None else f"{name}_{len(named)}_d{k}" for k, d in enumerate(info.shape)
            )
            named[value] = ValueInfo(value, info.elem_type, dims)
    return extract_model(graph, nodes, inputs, outputs, name, input_infos=named, exclude_initializers=weights)


def imported(model: onnx.ModelProto) -> tvm.IRModule:
    """`frontend.import_onnx`, where a failure inside one of our converters (the innermost frame ours) is
    our bug (`strict.own_failure`: raised in strict mode, a warning then a decline otherwise), not a model
    TVM cannot import: a converter that raised AttributeError was taken for a decline before."""
    try:
        return import_onnx(model)
    except CompileFailed as exc:
        if exc.__cause__ is not None and raised_by_us(exc.__cause__):
            where = f"an ONNX converter of nxrt_tvm.frontend (partition {model.graph.name!r})"
            own_failure(where, exc.__cause__)
        raise


def check_shapes(graph: GraphView, nodes: Sequence[int], name: str) -> None:
    """Import a node set and raise `CompileFailed` where Relax loses a tensor's shape (or the import itself
    fails): a binding of unknown shape is not legalised, so its build fails ("CodeGenVM cannot emit this
    Relax operator directly"). Costs an import, not a build: `PartitionBuilder.prove` bisects such
    failures with it (ppocr_det_v4: 29 builds, 81 of 116 s, for 5 culprits)."""
    try:
        mod = imported(partition_model(graph, nodes, name))
    except CompileFailed:
        raise
    except Exception as exc:  # the frontend's converters raise what they raise
        raise CompileFailed(f"TVM could not import it: {str(exc).strip().splitlines()[0]}") from None
    for func in mod.functions.values():
        if not isinstance(func, relax.Function):
            continue
        for block in getattr(func.body, "blocks", ()):
            for binding in block.bindings:
                ty = binding.var.ty
                if (
                    isinstance(ty, relax.TensorType)
                    and ty.shape is None
                    and isinstance(binding.value, relax.Call)
                ):
                    op = getattr(binding.value.op, "name", "a call")
                    raise CompileFailed(
                        f"Relax cannot tell the shape of {op}'s result (operand sizes it cannot prove "
                        "equal), so it is not lowered"
                    )


def locate_failure(
    nodes: Sequence[int], attempt: Callable[[list[int]], object], guess: int | None = None
) -> tuple[int, str]:
    """The first node whose addition makes `attempt` (import, build, ...) fail, and the failure.

    `attempt(nodes)` must already fail for the whole set. Bisects over topological prefixes, so it costs
    O(log n) attempts; a `guess` (a node found by a cheaper attempt) is tried first, and where it is the
    culprit two attempts confirm it.
    """
    order = sorted(nodes)
    lo, hi = 1, len(order)  # the prefix of length hi fails; find the shortest failing prefix
    failure = ""
    if guess is not None:
        for k in (
            order.index(guess) + 1,
            order.index(guess),
        ):  # the prefix ending at the guess, then before it
            if not lo <= k < hi:
                continue
            try:
                attempt(order[:k])
                lo = k + 1
                break
            except CompileFailed as exc:
                hi, failure = k, str(exc)
    while lo < hi:
        mid = (lo + hi) // 2
        try:
            attempt(order[:mid])
            lo = mid + 1
        except CompileFailed as exc:
            hi, failure = mid, str(exc)
    if not failure:
        try:
            attempt(order[:hi])
        except CompileFailed as exc:
            failure = str(exc)
    return order[hi - 1], failure or "compilation failed"


def build_executable(
    mod: tvm.IRModule,
    target: tvm.target.Target,
    lowering: Lowering = Lowering(),
    variants: list[KernelVariant] | None = None,
    codegen: ShardCodegen | None = None,
    constants: list[np.ndarray] | None = None,
) -> relax.VMExecutable:
    """Run the lowering pipeline and build for `target` (`variants` collects each kernel's implementation).

    With `codegen` (CPU targets), the kernels are split into up to `codegen.jobs` modules, all built by it
    while this process links the VM executable: the executable then runs only once exported with their
    objects (`runtime.artifact.export_executable`). With `constants` (CPU targets), the large constants
    are lifted out of the executable into that list: its `main` takes them after its inputs."""
    take_failure()  # drop one left by a strict-mode failure that reached its caller directly (tuning's rules)
    try:
        with phase("lower"):  # steps marked by the pipeline: relax passes, schedules, codegen
            pipeline = lowering_pipeline(target, lowering, variants, constants)
            if codegen is not None and target.kind.name == "llvm":
                return _build_sharded(mod, target, pipeline, codegen)
            return tvm.compile(
                mod,
                target,
                relax_pipeline=pipeline,
                tir_pipeline=tir_pipeline_for(target),
            )
    except InternalError:
        raise
    except Exception as exc:
        bug = take_failure()  # our pass or rule failed in strict mode, and TVM's FFI dropped the error's type
        if bug is not None:
            raise bug from exc
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CompileFailed(f"TVM could not build for {target.kind.name}: {message}") from exc


def _build_sharded(
    mod: tvm.IRModule, target: tvm.target.Target, pipeline: tvm.transform.Pass, codegen: ShardCodegen
) -> relax.VMExecutable:
    """`relax.build`'s steps, with the kernels' LLVM code generation (most of a build) split across
    processes: the kernels are independent functions, and the export links their objects into one
    library as it links a multi-module build's."""
    with target:
        mod = pipeline(mod)
    attrs = dict(mod.attrs) if mod.attrs else {}
    builder = relax.ExecBuilder()
    mod = relax.vm_build._vmcodegen(builder, mod, "bytecode")
    kernels = [(gv, f) for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    count = max(1, min(codegen.jobs, len(kernels) // KERNELS_PER_SHARD))
    shards = [tvm.IRModule({gv: f for gv, f in kernels[k::count]}, attrs=mod.attrs) for k in range(count)]
    wait = codegen(shards, target)
    executable = relax.vm_build._vmlink(
        builder,
        target,
        None,
        tir_pipeline_for(target),
        list(attrs.get("external_mods", [])),
        dict(attrs.get("const_name_to_constant", {})),
    )
    wait()
    return executable


def compile_partition(
    graph: GraphView,
    nodes: Sequence[int],
    name: str,
    target: tvm.target.Target,
    lowering: Lowering = Lowering(),
    weights: Sequence[str] = (),
    variants: list[KernelVariant] | None = None,
    codegen: ShardCodegen | None = None,
    constants: list[np.ndarray] | None = None,
) -> relax.VMExecutable:
    """Extract, import and build one node set (`weights` as trailing inputs, see `partition_model`;
    `codegen`, `constants`: see `build_executable`)."""
    with native_log_to_logging():
        try:
            with phase("extract"):
                model = partition_model(graph, nodes, name, weights)
            with phase("relax import"):
                mod = imported(model)
            return build_executable(mod, target, lowering, variants, codegen, constants)
        except CompileFailed as exc:
            message = str(exc)  # keep the text only: the traceback pins TVM objects that log when freed
        gc.collect()  # free them here, while their destructors' warnings are still captured
    raise CompileFailed(message)
