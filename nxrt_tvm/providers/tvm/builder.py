"""Builds partitions: proof builds during claims, the compile cache, bisection to the culprit, the sandbox.

A claim is proven by building it (or by a compile-cache hit); `compile()` later picks the module up
from `built`, so a partition is built once per session.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np
import tvm

from ...api.claim import DeclineSignal, Rejected
from ...api.device import DeviceId
from ...api.errors import CompileFailed, CompileInterrupted
from ...api.kernel import KernelVariant
from ...epcontext.cache import CacheError, CompileCache, cache_key
from ...epcontext.record import FORMAT_VERSION
from ...graph.model import GraphView
from ...lower.build import check_shapes, compile_partition, locate_failure, partition_model
from ...lower.pipeline import Lowering, codegen_digest
from ...lower.target import runtime_threads, tvm_device
from ...partition.claims import partition_name
from ...runtime.artifact import Blob, Library, load_executable, map_blob, write_blob
from ...runtime.codegen import ParallelCodegen
from ...runtime.isolate import fork_available, run_isolated
from ...runtime.measure import PartitionTiming
from ...timing import add_phases, phase, record_phases
from .options import TvmOptions

__all__ = ["PartitionBuilder"]

log = logging.getLogger(__name__)

#: (library, blob): library None on a compile-only host (CUDA, no GPU), blob None for an in-process build
Built = tuple["Library | None", "Blob | None"]


def _blob(built: Built) -> Blob:
    """A build's blob: the one it came with (an isolated build), else its library exported."""
    library, blob = built
    return blob if blob is not None else library.blob()


def _build_rejected(message: str) -> DeclineSignal:
    return DeclineSignal(
        Rejected.BUILD,
        f"TVM cannot compile it in this context: {message}",
        "what tvm.relax.frontend.onnx imports and TVM builds (shape-like inputs must be constants or "
        "computed in the same partition)",
        "runs on the fallback EP; fold run-time shapes to constants (onnxsim) or export with static shapes",
    )


def _timing_field(threads: int) -> str:
    """What a partition's timing for sessions of `threads` intra-op threads is kept as (`recall`)."""
    return "timing" if threads == 0 else f"timing@{threads}"


class PartitionBuilder:
    """One EP's builds: what they produced (`built`), how each kernel was scheduled (`variants`), counts."""

    def __init__(self, options: TvmOptions, lowering: Lowering, device: DeviceId):
        self.target = options.target
        self.device = tvm_device(device)
        self.lowering = lowering
        # Compile in a forked child (where the OS can fork), so a TVM crash costs a decline, not the process.
        self.isolate = options.compile_isolation == "process" and fork_available()
        #: processes an isolated build generates its kernels' code in (the cores the session may use)
        self.jobs = runtime_threads()
        self.timeout_s = options.compile_timeout_s
        self.cache = (
            None if options.cache_dir is None else CompileCache(options.cache_dir, options.cache_max_bytes)
        )
        self.built: dict[str, Built] = {}
        #: cache hits whose blob is not read yet, each with how to read it: read, verified and loaded on
        #: first use (`library`), so a partition the cost policy declines on a remembered timing never is
        self._unloaded: dict[str, Callable[[], tuple[Blob, str | None]]] = {}
        #: per partition proven this session, its compile-cache key and the metadata stored under it
        self.entries: dict[str, tuple[str, dict]] = {}
        #: per partition, which implementation each of its kernels runs (tuned, default rule, ...) and why
        self.variants: dict[str, list[KernelVariant]] = {}
        self.stats: Counter[str] = Counter()
        #: per partition proven this session, the seconds its proof took (cache, build, bisection)
        self.seconds: dict[str, float] = {}

    def prove(self, graph: GraphView, group: tuple[int, ...]) -> dict[int, DeclineSignal]:
        """Build `group` (or find it in the cache); on failure, the node whose addition breaks the build.

        A failure is cached under the same key as a success would be (its culprit and message, no blob),
        so a warm cache neither rebuilds nor re-bisects it; an interrupted build (timeout, killed, no
        compiler) is not a property of the partition and is never remembered."""
        name = partition_name(graph, group, "tvm")
        started = time.perf_counter()
        try:
            with phase("proof builds"):
                return self._prove(graph, group, name)
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started

    def _prove(self, graph: GraphView, group: tuple[int, ...], name: str) -> dict[int, DeclineSignal]:
        with phase("cache lookup"):
            key = self.cache_key(graph, group, name) if self.cache is not None else None
            meta = self.cache.meta(key) if key is not None else None
        order = sorted(group)
        if key is not None:
            if meta is not None and "failure" in meta:
                failure = meta["failure"]
                position = failure.get("position")
                if isinstance(position, int) and 0 <= position < len(order):
                    if graph.nodes[order[position]].op_type == failure.get("op_type"):
                        self.stats["failures_remembered"] += 1
                        return {order[position]: _build_rejected(str(failure.get("message")))}
            elif meta is not None:  # built and proven before: its blob is read and verified on first use
                self.built[name] = (None, None)
                self._unloaded[name] = lambda: self._cached_blob(key, graph, group, name)
                self.variants[name] = [KernelVariant(*v) for v in meta.get("variants", [])]
                self.entries[name] = (key, meta)
                self.stats["cache_hits"] += 1
                return {}
        interrupted = False

        def attempt(nodes: list[int], variants: list[KernelVariant] | None = None) -> Built:
            nonlocal interrupted
            try:
                return self.build(graph, nodes, name, (), variants)
            except CompileInterrupted:
                interrupted = True
                raise

        variants: list[KernelVariant] = []
        try:
            built = attempt(list(group), variants)
        except CompileFailed as failed:
            self.stats["bisections"] += 1
            with phase("bisection"):
                culprit, message = self._locate(graph, group, name, attempt, str(failed))
        else:
            if key is not None:
                built = (built[0], _blob(built))  # exported once: kept for the EPContext and the timing
                meta = {
                    "partition": name,
                    "target": self.target.kind.name,
                    "variants": [[v.name, v.variant, v.reason] for v in variants],
                }
                self.keep(key, built[1], meta)
                self.entries[name] = (key, meta)
            self.built[name] = built
            self.variants[name] = variants
            return {}
        if key is not None and not interrupted:
            failure = {"position": order.index(culprit), "op_type": graph.nodes[culprit].op_type}
            self.keep(key, b"", {"partition": name, "failure": failure | {"message": message}})
        return {culprit: _build_rejected(message)}

    def _locate(self, graph: GraphView, group, name: str, attempt, failure: str) -> tuple[int, str]:
        """The node whose addition breaks the build, and why. Where an import shows the failure (a shape
        Relax loses), imports bisect to a guess, which two builds confirm (the first lost shape is not
        always the first node that breaks the build); else builds bisect."""

        def imports(nodes: list[int]) -> None:
            with phase("shape check"):
                if self.isolate:  # an import can crash TVM too
                    run_isolated(
                        lambda: check_shapes(graph, nodes, name), f"an import of {name}", self.timeout_s
                    )
                else:
                    check_shapes(graph, nodes, name)

        try:
            imports(list(group))
        except CompileInterrupted:  # no answer from the import: bisect by builds
            return locate_failure(group, attempt)
        except CompileFailed:
            self.stats["bisections_by_import"] += 1
            guess, lost = locate_failure(group, imports)
            culprit, message = locate_failure(group, attempt, guess)
            return culprit, f"{message} ({lost})" if culprit == guess else message
        return locate_failure(group, attempt)

    def library(self, name: str) -> Library | None:
        """The library of a partition proven this session (None on a compile-only host: CUDA, no GPU),
        loading a cache hit's on first use."""
        library, blob = self.built[name]
        read = self._unloaded.pop(name, None)
        if read is not None:
            with phase("load"):
                blob, sha256 = read()
                library = load_executable(blob, name, sha256) if self.device.exist else None
            self.built[name] = (library, blob)
        return library

    def _cached_blob(
        self, key: str, graph: GraphView, group: tuple[int, ...], name: str
    ) -> tuple[Blob, str | None]:
        """The blob of a cache hit, verified; built again where the entry went bad or away since its
        metadata was read (another process evicted it, a disk error)."""
        entry = self.cache.get(key)
        if entry is not None and entry.blob:
            return entry.blob, entry.sha256
        self.stats["cache_hits"] -= 1  # not a hit after all
        blob = _blob(self.build(graph, group, name, (), None))
        self.keep(key, blob, self.entries[name][1])
        return blob, None

    def keep(self, key: str, blob: Blob, meta: dict) -> None:
        """Store in the compile cache. One that cannot take it (a full disk, a folder gone read-only) costs
        later sessions a build, not this session its compile."""
        try:
            self.cache.put(key, blob, meta)
        except CacheError as exc:
            log.warning("%s; this session goes on without the compile cache", exc)

    def take(self, name: str) -> Built | None:
        """A proven partition's (library, blob), handed over: the builder keeps it no longer."""
        if name not in self.built:
            return None
        library = self.library(name)
        return library, self.built.pop(name)[1]

    def recall(self, name: str, what: str) -> Any:
        """The JSON value `remember` kept about partition `name` under `what`, None where none is: an
        entry of its own, keyed by the partition's compile key (target and the pool's threads included),
        so what changes the compiled code forgets it."""
        key_meta = self.entries.get(name)
        if key_meta is None or self.cache is None:
            return None
        entry = self.cache.get(cache_key(key_meta[0], what))
        if entry is None or not entry.blob:
            return None
        try:
            return json.loads(bytes(entry.blob))
        except ValueError:  # not ours: measured again, and kept anew
            return None

    def remember(self, name: str, what: str, value: Any) -> None:
        """Keep `value` (JSON) about partition `name` with its compile result (`recall`)."""
        key_meta = self.entries.get(name)
        if key_meta is None or self.cache is None:
            return
        self.keep(cache_key(key_meta[0], what), json.dumps(value).encode(), {"kind": what, "partition": name})

    def remembered_timing(self, name: str, threads: int = 0) -> tuple[bool, PartitionTiming | None]:
        """(found, timing) kept for partition `name` and sessions of `threads` intra-op threads; a timing
        of None means it could not be measured."""
        value = self.recall(name, _timing_field(threads))
        return (False, None) if value is None else (True, PartitionTiming.from_json(value))

    def remember_timing(self, name: str, timing: PartitionTiming | None, threads: int = 0) -> None:
        """Keep a partition's timing with its compile result, so later sessions do not re-measure it."""
        self.remember(name, _timing_field(threads), "unmeasured" if timing is None else timing.to_json())

    def build(
        self,
        graph: GraphView,
        nodes: Sequence[int],
        name: str,
        weights: Sequence[str],
        variants: list[KernelVariant] | None,
    ) -> Built:
        """(library, blob) of a node set: built in a forked child
        and loaded here when isolated (blob set), else in process."""
        self.stats["builds"] += 1
        with phase("build"):
            if not self.isolate:
                constants: list[np.ndarray] = []
                executable = compile_partition(
                    graph, nodes, name, self.target, self.lowering, weights, variants, constants=constants
                )
                return Library.of(executable, constants), None

            what = f"partition {name} ({len(nodes)} nodes)"

            def child(path: str) -> tuple[list[KernelVariant], dict[str, tuple[float, int]]]:
                notes: list[KernelVariant] = []
                with record_phases() as times, tempfile.TemporaryDirectory(prefix="nxrt-tvm-codegen-") as tmp:
                    codegen = ParallelCodegen(self.jobs, tmp, self.timeout_s, what)
                    constants: list[np.ndarray] = []
                    executable = compile_partition(
                        graph, nodes, name, self.target, self.lowering, weights, notes, codegen, constants
                    )
                    with phase("export"), open(path, "wb") as f:
                        write_blob(f, executable, codegen.objects, constants)
                return notes, {p: (s, times.calls[p]) for p, s in times.seconds.items()}

            # The blob comes back as a file the parent maps (`map_blob`): through the pipe, VGG-19's
            # 548 MB of weights were pickled, sent, joined and unpickled (3 s), then copied into TVM. Not in
            # /dev/shm, which a container may cap at 64 MB.
            with tempfile.TemporaryDirectory(prefix="nxrt-tvm-build-") as handoff:
                path = os.path.join(handoff, "partition.blob")
                notes, times = run_isolated(partial(child, path), what, self.timeout_s)
                with open(path, "rb") as f:
                    blob = map_blob(f)
            add_phases(times)  # the child's own phases (import, passes, schedules, codegen, export)
            if variants is not None:
                variants[:] = notes
            # A compile-only host (CUDA code, no GPU) cannot load
            # the library; the blob still goes into EPContexts.
            with phase("load"):
                return (load_executable(blob, name) if self.device.exist else None), blob

    def cache_key(self, graph: GraphView, group: tuple[int, ...], name: str) -> str:
        """Everything that shapes the compiled code: partition graph and weights (by their digests, so the
        weights are not serialised again), target, TVM, passes, our code."""
        weights = tuple(
            dict.fromkeys(n for i in sorted(group) for n in graph.node_inputs[i] if n in graph.initializers)
        )
        model = partition_model(graph, group, name, weights)
        return cache_key(
            model.SerializeToString(deterministic=True),
            *(graph.initializer_digest(w) for w in weights),
            json.dumps(dict(self.target.export()), sort_keys=True, default=str),
            tvm.__version__,
            f"nxrt-tvm/{FORMAT_VERSION}",
            self.lowering.digest(),
            codegen_digest(),
        )
