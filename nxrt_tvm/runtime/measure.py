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
The two are not interleaved, so drift between them is limited by the short budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from ..api.device import DeviceId, DeviceType
from ..api.tensor import TensorView, aligned_empty
from ..graph.model import GraphView
from ..lower.build import partition_model
from ..timing import median_seconds
from .kernel import TvmKernel
from .ort_session import ort_session

__all__ = ["measure_partition", "ort_run_floor_us"]


def _inputs(graph: GraphView, names: Sequence[str]) -> list[np.ndarray] | None:
    rng = np.random.default_rng(0)
    arrays = []
    for name in names:
        info = graph.info(name)
        if not info.is_static or info.dtype is None:
            return None  # symbolic sizes: no representative shape to measure
        array = aligned_empty(tuple(info.shape), info.dtype)
        if info.dtype.kind == "f":
            array[...] = rng.standard_normal(info.shape)
        else:  # zeros are valid indices, masks and shapes alike
            array[...] = 0
        arrays.append(array)
    return arrays


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort_session(model.SerializeToString())


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
    graph: GraphView, nodes: Sequence[int], name: str, module: object, budget_s: float
) -> tuple[float, float] | None:
    """(TVM us, onnxruntime us net of its run floor) per
    call on static random inputs; None for symbolic sizes."""
    inputs, outputs = graph.boundary(nodes)
    arrays = _inputs(graph, inputs)
    if arrays is None:
        return None
    kernel = TvmKernel(
        module,
        DeviceId(DeviceType.CPU, 0),
        name,
        [graph.info(i) for i in inputs],
        [graph.info(o) for o in outputs],
    )
    views = [TensorView(a) for a in arrays]
    ort_s = _ort_seconds(partition_model(graph, nodes, name), dict(zip(inputs, arrays)), budget_s / 2)
    tvm_s = median_seconds(lambda: kernel.compute(views), 100, warmup=3, budget_s=budget_s / 2)
    return 1e6 * tvm_s, max(1e6 * ort_s - ort_run_floor_us(), 0.0)


def _ort_seconds(model: onnx.ModelProto, feeds: dict, budget_s: float) -> float:
    """onnxruntime's median time on `model`; its session
    (and its spinning threads) is gone when this returns."""
    session = _session(model)
    return median_seconds(lambda: session.run(None, feeds), 100, warmup=3, budget_s=budget_s)
