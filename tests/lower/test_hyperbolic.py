"""Cosh and Sinh build and run on TVM (its LLVM backend had no lowering for them: every claim was
bisected to the fallback), matching onnxruntime from 1e-6 to 20 in magnitude, on both sides of sinh's
switch from its series to exponentials.

Tolerance: rtol=5e-6 (float32 exp, and the difference of two near 0.1), atol=1e-30 (sinh(0) = 0).
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import nxrt_tvm as nx
from nxrt_tvm.lower.hyperbolic import SINH_SERIES_BELOW


@pytest.mark.parametrize("op", ["Cosh", "Sinh"])
@pytest.mark.parametrize("shape", [[3], [67], [3, 4, 5]])
def test_hyperbolic_functions_run_on_tvm_like_onnxruntime(op, shape):
    model = helper.make_model(
        helper.make_graph(
            [helper.make_node(op, ["x"], ["y"])],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    size = int(np.prod(shape))
    magnitudes = np.concatenate(
        [[0.0, SINH_SERIES_BELOW * (1 - 1e-6), SINH_SERIES_BELOW], np.logspace(-6, np.log10(20), size)]
    )[:size]
    signs = np.where(np.arange(size) % 2, -1.0, 1.0)
    x = (magnitudes * signs).astype(np.float32).reshape(shape)
    session = nx.InferenceSession(model)
    assert session.plan.nodes_by_ep() == {"TvmExecutionProvider": 1}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    np.testing.assert_allclose(session.run(None, {"x": x})[0], want, rtol=5e-6, atol=1e-30)
