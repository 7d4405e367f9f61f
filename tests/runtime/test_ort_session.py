"""onnxruntime sessions over partitions: large initializers reach onnxruntime beside the model's bytes."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from parity import assert_parity, ort_run

import nxrt_tvm as nx
from nxrt_tvm.graph.model import load_model
from nxrt_tvm.runtime.ort_session import EXTERNAL_MIN_BYTES, ort_session, partition_for_ort

CPU = nx.EpId("CPUExecutionProvider")


def _two_layers() -> onnx.ModelProto:
    """x [4, 512] -> MatMul (2 MiB weight) -> Add (small bias) -> Relu -> MatMul (2 MiB weight)."""
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.standard_normal((512, 1024)).astype(np.float32) / 16, "w1"),
        numpy_helper.from_array(rng.standard_normal(1024).astype(np.float32), "b1"),
        numpy_helper.from_array(rng.standard_normal((1024, 512)).astype(np.float32) / 32, "w2"),
    ]
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["h"]),
            helper.make_node("Add", ["h", "b1"], ["a"]),
            helper.make_node("Relu", ["a"], ["r"]),
            helper.make_node("MatMul", ["r", "w2"], ["y"]),
        ],
        "two_layers",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 512])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 512])],
        weights,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


FEEDS = {"x": np.random.default_rng(1).standard_normal((4, 512)).astype(np.float32)}


def test_large_initializers_reach_onnxruntime_beside_the_model():
    """Weights of EXTERNAL_MIN_BYTES or more are placeholders in the model, filled by values over their
    arrays; the small bias stays inside. onnxruntime computes what it does on the model as given."""
    model = _two_layers()
    graph = load_model(model)
    inputs, outputs = graph.boundary(range(4))
    extracted, weights = partition_for_ort(graph, range(4), inputs, outputs, "all")
    assert sorted(weights) == ["w1", "w2"] and 512 * 1024 * 4 >= EXTERNAL_MIN_BYTES
    kept = {t.name: t for t in extracted.graph.initializer}
    assert kept["w1"].data_location == TensorProto.EXTERNAL and not kept["w1"].raw_data
    assert kept["b1"].data_location == TensorProto.DEFAULT and kept["b1"].raw_data
    assert extracted.ByteSize() < 64 * 1024  # not the 4 MiB of weights
    session = ort_session(extracted.SerializeToString(), weights=weights)
    assert_parity(session.run(None, FEEDS), ort_run(model, FEEDS))


def test_fallback_partitions_with_large_weights_run_as_onnxruntime_does():
    """The fallback's partitions (MatMuls excluded from TVM, the Add and Relu on TVM between them) get
    their weights beside their models too."""
    model = _two_layers()
    sess = nx.InferenceSession(model, provider_options=[{"op_types_to_exclude": "MatMul"}, {}])
    assert [str(p.ep) for p in sess.plan.partitions].count(str(CPU)) == 2
    handed = [name for kernel in sess._kernels for name in getattr(kernel, "_weights", None) or {}]
    assert sorted(handed) == ["w1", "w2"]
    assert_parity(sess.run(None, FEEDS), ort_run(model, FEEDS))
