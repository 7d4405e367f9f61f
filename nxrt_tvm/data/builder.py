"""The one model-builder library: the bundled model, the test zoo and the benchmark models use it.

Models are built from ``onnx.helper`` nodes at opset 17 / IR version 8, with deterministic weights,
and pass ``onnx.checker.check_model(full_check=True)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["OPSET", "IR_VERSION", "GraphBuilder", "finish_model", "initializer", "value_info"]

OPSET = 17
IR_VERSION = 8  # the IR version that goes with opset 17: keeps older runtimes happy


def initializer(name: str, arr, dtype=None) -> onnx.TensorProto:
    array = np.asarray(arr) if dtype is None else np.asarray(arr, dtype=dtype)
    return numpy_helper.from_array(np.ascontiguousarray(array), name=name)


def value_info(name: str, shape, elem: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    """A tensor's declared type; `shape` None leaves the rank unknown."""
    return helper.make_tensor_value_info(name, elem, list(shape) if shape is not None else None)


def finish_model(
    graph: onnx.GraphProto,
    producer: str,
    opset: int = OPSET,
    extra_opsets: Sequence[tuple[str, int]] = (),
    doc: str = "",
) -> onnx.ModelProto:
    """The model around `graph`, checked."""
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in extra_opsets]
    model = helper.make_model(graph, opset_imports=opsets, producer_name=producer)
    if doc:
        model.doc_string = doc
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    return model


class GraphBuilder:
    """Accumulates nodes and initializers; hands out unique names."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._names: set[str] = set()

    def init(self, name: str, arr, dtype=np.float32) -> str:
        assert name not in self._names, name
        self._names.add(name)
        self.inits.append(initializer(name, arr, dtype))
        return name

    def op(self, op_type: str, inputs, name: str, n_out: int = 1, **attrs):
        """Add one node named ``name``; outputs are ``name`` (or ``name:i``)."""
        assert name not in self._names, name
        self._names.add(name)
        outs = [name] if n_out == 1 else [f"{name}:{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=name, **attrs))
        return outs[0] if n_out == 1 else outs

    def normal(self, shape, std: float) -> np.ndarray:
        return (self.rng.standard_normal(shape) * std).astype(np.float32)

    def model(self, name: str, inputs, outputs, producer: str) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, initializer=self.inits)
        return finish_model(graph, producer)
