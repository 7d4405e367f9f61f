"""onnxruntime sessions as nxrt-tvm makes them: quiet (errors reach the caller as exceptions), CPU,
with the thread count and spinning the caller decides. The fallback EP, partition timing and the CLI's
reference run all use it.

A partition's large initializers reach onnxruntime as arrays beside its model (`partition_for_ort`),
not inside the model's bytes: serialised, parsed and copied again by onnxruntime, VGG-19's 548 MB
took 2.3 s of a session's creation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import onnxruntime as ort

from ..graph.extract import extract_model
from ..graph.model import GraphView

__all__ = ["EXTERNAL_MIN_BYTES", "ort_session", "ort_session_options", "partition_for_ort"]

#: initializers at least this large reach onnxruntime as arrays beside the model (`partition_for_ort`)
EXTERNAL_MIN_BYTES = 1 << 20


def ort_session_options(
    threads: int = 0, spinning: bool | None = None, weights: Mapping[str, ort.OrtValue] | None = None
) -> ort.SessionOptions:
    """Options for a session; `weights` are the initializers `partition_for_ort` took out of its model."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3  # onnxruntime would print its errors too; ours say them once
    if spinning is not None:
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    if weights:
        options.add_external_initializers(list(weights), list(weights.values()))
    return options


def ort_session(
    model: bytes,
    threads: int = 0,
    spinning: bool | None = None,
    weights: Mapping[str, ort.OrtValue] | None = None,
) -> ort.InferenceSession:
    return ort.InferenceSession(
        model, ort_session_options(threads, spinning, weights), providers=["CPUExecutionProvider"]
    )


def partition_for_ort(
    graph: GraphView, nodes: Sequence[int], inputs: Sequence[str], outputs: Sequence[str], name: str
) -> tuple[onnx.ModelProto, dict[str, ort.OrtValue]]:
    """A partition as onnxruntime runs it (`extract_model`, no inner shapes), its initializers of
    `EXTERNAL_MIN_BYTES` or more left as placeholders the returned values fill (`ort_session_options`);
    the values hold the weights' memory and must outlive every session made with them."""
    used = {n for i in nodes for n in graph.node_inputs[i]}
    arrays = {}
    for n in sorted(used & graph.initializers.keys()):
        tensor = graph.initializers[n]
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type))
        if dtype.kind in "fiub" and dtype.itemsize * math.prod(tensor.dims) >= EXTERNAL_MIN_BYTES:
            arrays[n] = np.ascontiguousarray(graph.constant(n))
    model = extract_model(
        graph, nodes, inputs, outputs, name, exclude_initializers=list(arrays), internal_shapes=False
    )
    for n, array in arrays.items():
        model.graph.initializer.append(_placeholder(graph.initializers[n], array.nbytes))
    return model, {n: ort.OrtValue.ortvalue_from_numpy(a) for n, a in arrays.items()}


def _placeholder(tensor: onnx.TensorProto, nbytes: int) -> onnx.TensorProto:
    """An initializer's name and type, its data outside the model (an external value fills it; onnx's
    `set_external_data` wants the data it moves out)."""
    placeholder = onnx.TensorProto(name=tensor.name, data_type=tensor.data_type, dims=tensor.dims)
    placeholder.data_location = onnx.TensorProto.EXTERNAL
    external = {"location": "nxrt-tvm-external-initializer", "offset": "0", "length": str(nbytes)}
    for key, value in external.items():
        placeholder.external_data.add(key=key, value=value)
    return placeholder
