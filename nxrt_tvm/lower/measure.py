"""Quick measurements for cost-aware claims: a compiled partition against onnxruntime on the same subgraph."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnxruntime as ort
import tvm
from tvm import relax

from ..api.tensor import aligned_empty
from ..graph.model import GraphView
from ..timing import interleaved_medians
from .build import partition_model

__all__ = ["measure_partition"]


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


def measure_partition(
    graph: GraphView, nodes: Sequence[int], name: str, module: object, budget_s: float
) -> tuple[float, float] | None:
    """(TVM us, onnxruntime us) per call on static random inputs, or None when sizes are symbolic."""
    inputs, _ = graph.boundary(nodes)
    arrays = _inputs(graph, inputs)
    if arrays is None:
        return None
    vm = relax.VirtualMachine(module, tvm.cpu())
    args = [tvm.runtime.from_dlpack(a) for a in arrays]
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(partition_model(graph, nodes, name).SerializeToString(), options, providers=["CPUExecutionProvider"])
    feeds = dict(zip(inputs, arrays))
    times = interleaved_medians({"tvm": lambda: vm["main"](*args), "ort": lambda: session.run(None, feeds)}, 100,
                                rounds=3, budget_s=budget_s)
    return 1e6 * times["tvm"], 1e6 * times["ort"]
