"""The lowering pipeline's own passes, through real builds."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper
from parity import assert_parity, ort_run

import nxrt_tvm as nx


def test_a_constant_with_no_elements_loads_and_runs():
    # A causal conv's zero-size pad (ConstantOfShape [2, 4, 0], folded to a constant): TVM wrote it into
    # the executable and failed to read it back ("Invalid DLTensor file format") when the session loaded.
    pad = numpy_helper.from_array(np.zeros((2, 4, 0), np.float32), "pad")
    graph = helper.make_graph(
        [helper.make_node("Concat", ["pad", "x"], ["c"], axis=2), helper.make_node("Relu", ["c"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 8])],
        [pad],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    sess = nx.InferenceSession(model, providers=["TvmExecutionProvider"])
    assert [str(p.ep) for p in sess.plan.partitions] == ["TvmExecutionProvider"]
    x = np.random.default_rng(0).standard_normal((2, 4, 8)).astype(np.float32)
    assert_parity(sess.run(None, {"x": x}), ort_run(model, {"x": x}))
