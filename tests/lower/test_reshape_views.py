"""A reshape that fusion leaves alone runs as a view (no copy kernel), at any symbolic size.

Numerics: exact against onnxruntime (no arithmetic in a view; the conv within rtol=atol=1e-4).
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import tvm
from onnx import TensorProto, helper, numpy_helper
from relax_calls import called

import nxrt_tvm as nx
from nxrt_tvm.frontend import import_onnx
from nxrt_tvm.lower import pipeline
from nxrt_tvm.lower.reshape_views import VIEW_ATTR
from nxrt_tvm.lower.target import make_target

TARGET = make_target("llvm")
RNG = np.random.default_rng(0)


def _conv_then_flatten():
    """A conv (a reduction: the reshape after it is not fused into it) flattened over symbolic h x w."""
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
            helper.make_node("Reshape", ["y", "shape"], ["out"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, "h", "w"])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 8, None])],
        initializer=[
            numpy_helper.from_array(RNG.standard_normal((8, 4, 3, 3)).astype(np.float32), "w"),
            numpy_helper.from_array(np.array([0, 8, -1], np.int64), "shape"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_a_reshape_left_alone_is_a_view_and_matches_onnxruntime():
    model = _conv_then_flatten()
    with TARGET:
        fused = tvm.transform.Sequential(pipeline.fusion_passes(TARGET))(import_onnx(model))
    kernels = [f for f in fused.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    assert not any(f.attrs is not None and VIEW_ATTR in f.attrs for f in kernels)  # no copy kernel left
    assert "relax.reshape" in called(fused)
    session = nx.InferenceSession(model, providers=["TvmExecutionProvider"])
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for h, w in ((5, 7), (8, 8), (1, 13)):
        feeds = {"x": RNG.standard_normal((1, 4, h, w)).astype(np.float32)}
        got, want = session.run(None, feeds)[0], ref.run(None, feeds)[0]
        assert got.shape == want.shape == (1, 8, h * w)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
