"""Quick measurements for cost-aware claims: a compiled partition against onnxruntime on the same subgraph.

Both sides are timed as the session would pay for them: TVM through the
kernel the session calls (argument conversion included), onnxruntime net of
the fixed cost of one `run` call (a one-node session's time), because nodes
the TVM EP declines join a neighbouring fallback partition instead of running
in a session of their own.

onnxruntime is timed first, as it runs a model it has to itself (intra-op
threads spinning between runs), and its session is closed before TVM is timed:
spinning threads left alive kept both cores busy while TVM ran (an MLP measured
12 ms on TVM instead of 1), and without spinning onnxruntime is slower than a
user running it alone would see (the bundled model's convs: 208 us, not ~150).
The two are timed one after the other in `PASSES` passes, and the pass whose
ratio is the median decides: on a host whose speed changes between regimes
seconds apart, one pass put the two sides in different regimes (the bundled
model declined in 1 of 8 plans on a Zen 3), and each side's faster time of two
passes paired times from different regimes (GPT-2, 0.89x onnxruntime's time at
its feeds' shapes, was declined in a corpus run, a dynamic-int8 BERT claimed at
1.03x).

Symbolic dims are measured at a representative size (`REPRESENTATIVE_SIZES`): batch-like dims (so named,
or leading a tensor of rank 2 or more) at 1, the
rest at 32 (a short sequence, a small map), else at 512 (an audio net's window of 256 samples refuses
32); and where onnxruntime accepts it, at 256 too, the partition judged by the size TVM does worse at.
onnxruntime runs first and must accept the inputs: where no invented sizes fit together (a shape
the partition takes as data, dims that are sums of others), onnxruntime refuses them and the partition
is reported unmeasured, before TVM code ever sees them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper
from onnxruntime.capi.onnxruntime_pybind11_state import Fail as OrtFail
from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument as OrtInvalidArgument
from onnxruntime.capi.onnxruntime_pybind11_state import NotImplemented as OrtNotImplemented
from onnxruntime.capi.onnxruntime_pybind11_state import RuntimeException as OrtRuntimeException

from ..api.device import DeviceId, DeviceType
from ..api.tensor import TensorView, aligned_empty
from ..graph.model import GraphView
from ..timing import median_by, median_seconds
from .artifact import Library
from .kernel import TvmKernel, use_threads
from .ort_session import ort_session, partition_for_ort

__all__ = [
    "PartitionTiming",
    "REPRESENTATIVE_SIZES",
    "SPIN_DOWN_S",
    "measure_partition",
    "median_pass",
    "PASSES",
    "ort_alone_us",
    "writes_much",
    "ort_run_floor_us",
    "representative_inputs",
]

#: sizes symbolic dims are measured at: a dim whose name says batch, and every other one
#: (other dims: the first size onnxruntime accepts; then also at "large", see `measure_partition`)
REPRESENTATIVE_SIZES = {"batch": 1, "other": (32, 512), "large": 256}

#: passes of onnxruntime then TVM on the same inputs (see the module doc)
PASSES = 3
#: how long a pool spins on after its last run, taking a core from whatever runs next (TVM's workers
#: about 10 ms, TVM_THREAD_POOL_SPIN_COUNT as nxrt_tvm sets it, 170 ms at TVM's default; onnxruntime's
#: about 50 ms, both read off the threads' CPU time): the pause before the other side is timed
SPIN_DOWN_S = 0.06


@dataclass(frozen=True)
class PartitionTiming:
    """One partition timed both ways, per call: TVM's kernel, onnxruntime net of its run floor, the floor."""

    tvm_us: float
    ort_us: float
    floor_us: float
    sizes: str  #: the symbolic dims' representative sizes ("" for static shapes)

    @property
    def ort_alone_us(self) -> float:
        """onnxruntime running this partition as a model of its own."""
        return self.ort_us + self.floor_us

    def to_json(self) -> list[Any]:
        return [self.tvm_us, self.ort_us, self.floor_us, self.sizes]

    @classmethod
    def from_json(cls, value: Any) -> PartitionTiming | None:
        """The record `to_json` wrote; None for anything else (an older entry, or none)."""
        if not isinstance(value, list) or len(value) != 4:
            return None
        tvm_us, ort_us, floor_us, sizes = value
        if not all(isinstance(v, (int, float)) for v in (tvm_us, ort_us, floor_us)) or not isinstance(
            sizes, str
        ):
            return None
        return cls(float(tvm_us), float(ort_us), float(floor_us), sizes)


def _size(dim: str | None, other: int, leading: bool) -> int:
    """A batch-like dim's size (named so, or the leading dim of a tensor of rank 2 or more: Paddle names
    its batch `p2o.DynamicDimension.0`), else `other`."""
    batch = leading or (dim is not None and "batch" in dim.lower())
    return REPRESENTATIVE_SIZES["batch"] if batch else other


def _inputs(graph: GraphView, names: Sequence[str], other: int) -> tuple[list[np.ndarray], str] | None:
    """Random inputs (integers: masks all ones, the rest zeros: valid indices), non-batch symbolic dims
    at `other`, and the sizes symbolic dims got; None where a rank or type is unknown."""
    rng = np.random.default_rng(0)
    arrays = []
    sizes: dict[str, int] = {}
    for name in names:
        info = graph.info(name)
        if info.shape is None or info.dtype is None:
            return None
        shape = []
        for k, dim in enumerate(info.shape):
            if isinstance(dim, int):
                shape.append(dim)
                continue
            size = _size(dim, other, k == 0 and len(info.shape) > 1)
            # a named dim has one size in every input (an LSTM's `seq` leads one and follows `batch` in
            # another: sized by position each time, they disagreed and the kernel refused the inputs)
            shape.append(sizes.setdefault(dim, size) if dim else size)
            sizes.setdefault(dim or "?", size)
        array = aligned_empty(tuple(shape), info.dtype)
        if info.dtype.kind == "f":
            array[...] = rng.standard_normal(shape)
        else:  # a mask unmasked, as a user's feeds are (all masked, GPT-2's softmax rows are all -inf and
            # onnxruntime ran 17% faster than on real feeds); other integers 0, a valid index
            array[...] = 1 if "mask" in name.lower() else 0
        arrays.append(array)
    return arrays, ", ".join(f"{k}={v}" for k, v in sizes.items())


def representative_inputs(graph: GraphView, names: Sequence[str]) -> list[dict[str, np.ndarray]]:
    """Random inputs `names` at each representative size of the non-batch symbolic dims (one set for
    static shapes), for a caller that takes the first its reference accepts."""
    made = [_inputs(graph, names, other) for other in REPRESENTATIVE_SIZES["other"]]
    unique = {sizes: arrays for arrays, sizes in (m for m in made if m is not None)}
    return [dict(zip(names, arrays)) for arrays in unique.values()]


def _session(
    model: onnx.ModelProto, threads: int = 0, weights: Mapping[str, ort.OrtValue] | None = None
) -> ort.InferenceSession:
    return ort_session(model.SerializeToString(), threads, weights=weights)


@lru_cache(maxsize=1)
def ort_run_floor_us() -> float:
    """What one onnxruntime `run` costs before any node computes (an Identity of one float), in us."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "floor",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    session = _session(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    feeds = {"x": np.zeros(1, np.float32)}
    return 1e6 * median_seconds(lambda: session.run(None, feeds), 200, warmup=10, budget_s=0.05)


def measure_partition(
    graph: GraphView, nodes: Sequence[int], name: str, library: Library, budget_s: float, threads: int = 0
) -> PartitionTiming | None:
    """The partition timed on random inputs; None where it cannot be (an unknown rank or type, or a
    partition onnxruntime cannot run alone at representative sizes). With symbolic dims, the timing at
    the representative size or at `REPRESENTATIVE_SIZES["large"]`, whichever TVM is slower at against
    onnxruntime (a text detector's symbolic convs beat onnxruntime on 32 x 32 maps and lost on 480 x 480).
    Both run on `threads` threads (0: all), the session's `intra_op_num_threads`."""
    inputs, outputs = graph.boundary(nodes)
    alone = partition_for_ort(graph, nodes, inputs, outputs, name)  # as the fallback runs it
    large = None

    def share(sizes: str, other: int) -> float:
        # the passes of both sides, and a second size only where some dim takes it (not static, not a
        # batch alone), timed once more each way
        nonlocal large
        large = _inputs(graph, inputs, REPRESENTATIVE_SIZES["large"]) if sizes else None
        twice = large is not None and large[1] != sizes and REPRESENTATIVE_SIZES["large"] > other
        large = large if twice else None
        return budget_s / (2 * PASSES + (2 if twice else 0))

    first = _first_accepted(graph, inputs, alone, threads, share)
    if first is None:
        return None
    arrays, sizes, ort_s, share_s = first
    kernel = TvmKernel(
        library,
        DeviceId(DeviceType.CPU, 0),
        name,
        [graph.info(i) for i in inputs],
        [graph.info(o) for o in outputs],
    )
    floor_us = ort_run_floor_us()

    def timed(arrays: list[np.ndarray], ort_s: float, sizes: str) -> PartitionTiming:
        views = [TensorView(a) for a in arrays]
        use_threads(threads)
        tvm_s = median_seconds(lambda: kernel.compute(views), 100, warmup=3, budget_s=share_s)
        return PartitionTiming(1e6 * tvm_s, max(1e6 * ort_s - floor_us, 0.0), floor_us, sizes)

    passes = [timed(arrays, ort_s, sizes)]
    for _ in range(PASSES - 1):
        time.sleep(SPIN_DOWN_S)
        ort_again = _ort_seconds(alone, dict(zip(inputs, arrays)), share_s, threads)
        if ort_again is None:
            break
        passes.append(timed(arrays, ort_again, sizes))
    timing = median_pass(passes)
    if large:
        time.sleep(SPIN_DOWN_S)
    ort_large = _ort_seconds(alone, dict(zip(inputs, large[0])), share_s, threads) if large else None
    if ort_large is not None:
        at_large = timed(large[0], ort_large, large[1])
        if at_large.tvm_us * max(timing.ort_us, 1e-3) > timing.tvm_us * max(at_large.ort_us, 1e-3):
            timing = at_large
    return timing


def median_pass(passes: Sequence[PartitionTiming]) -> PartitionTiming:
    """The pass whose TVM-to-onnxruntime ratio is the median (of two, the one better for TVM)."""
    return median_by(passes, lambda t: t.tvm_us / max(t.ort_alone_us, 1e-3))


#: elements of one value that no partition writes in the few microseconds `providers.tvm.cost.cannot_win`
#: looks for (8 MB of float32 take 40 us at 200 GB/s, twice its bar)
MUCH_ELEMENTS = 1 << 21


def writes_much(graph: GraphView, nodes: Sequence[int]) -> bool:
    """Whether a node of `nodes` writes a value of static shape with `MUCH_ELEMENTS` or more: onnxruntime
    need not be timed on the partition before its build to know it takes longer than a TVM call's floor
    (a session over VGG-19 and runs of 80 ms: about 1 s of its ready time)."""
    for i in nodes:
        for name in graph.nodes[i].output:
            shape = graph.info(name).shape
            static = shape is not None and all(isinstance(d, int) for d in shape)
            if static and math.prod(shape) >= MUCH_ELEMENTS:
                return True
    return False


def ort_alone_us(
    graph: GraphView, nodes: Sequence[int], name: str, budget_s: float, threads: int = 0
) -> tuple[float, str] | None:
    """onnxruntime's time per run (us, its run floor included) on the partition as a model of its own, at
    the first representative sizes it accepts, and those sizes; None where it cannot run it alone. What a
    partition must beat before it is worth building (`providers.tvm.cost.cannot_win`)."""
    inputs, outputs = graph.boundary(nodes)
    alone = partition_for_ort(graph, nodes, inputs, outputs, name)
    first = _first_accepted(graph, inputs, alone, threads, lambda _sizes, _other: budget_s)
    return None if first is None else (1e6 * first[2], first[1])


def _first_accepted(
    graph: GraphView,
    inputs: Sequence[str],
    alone: tuple[onnx.ModelProto, Mapping[str, ort.OrtValue]],
    threads: int,
    share: Callable[[str, int], float],
) -> tuple[list[np.ndarray], str, float, float] | None:
    """Inputs at the first representative size onnxruntime accepts, their sizes, its seconds on them and
    the budget `share(sizes, other)` gave it; None where it accepts none (or a rank or type is unknown)."""
    for other in REPRESENTATIVE_SIZES["other"]:
        made = _inputs(graph, inputs, other)
        if made is None:
            return None
        arrays, sizes = made
        budget_s = share(sizes, other)
        ort_s = _ort_seconds(alone, dict(zip(inputs, arrays)), budget_s, threads)
        if ort_s is not None:
            return arrays, sizes, ort_s, budget_s
        if not sizes:
            return None  # static shapes: other sizes change nothing
    return None


def _ort_seconds(
    alone: tuple[onnx.ModelProto, Mapping[str, ort.OrtValue]], feeds: dict, budget_s: float, threads: int
) -> float | None:
    """onnxruntime's median time on `model`, None where it cannot run it alone: it refuses the feeds,
    has no kernel for a type (int16 Max, QuantizeLinear-28), or its numpy bridge has no such type
    (bfloat16 feeds and outputs: RuntimeError); its session (and its spinning threads) is gone when
    this returns."""
    try:
        session = _session(alone[0], threads, alone[1])
        session.run(None, feeds)
    except (OrtFail, OrtInvalidArgument, OrtNotImplemented, OrtRuntimeException, RuntimeError):
        return None
    return median_seconds(lambda: session.run(None, feeds), 100, warmup=2, budget_s=budget_s)
