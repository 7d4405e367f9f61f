"""Where a partition fails to build, the node that breaks it is found by imports where an import shows the
failure (a shape Relax loses), by builds otherwise; every claim left is still proven by a build."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from parity import assert_parity, ort_run

import nxrt_tvm as nx


def _upsample_and_add() -> onnx.ModelProto:
    """An FPN step: a map upsampled 2x and combined with a map whose size Relax cannot relate to it, by an op
    whose operand sizes the frontend does not check at run time (`Mod`; `Add` and `Concat` it does)."""
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["coarse"], ["c"], name="relu_in"),
            helper.make_node("Resize", ["c", "", "scales"], ["up"], mode="nearest", name="resize"),
            helper.make_node("Mod", ["up", "fine"], ["sum"], name="mod", fmod=1),
            helper.make_node("Sigmoid", ["sum"], ["y"], name="sigmoid"),
        ],
        "fpn_step",
        [
            helper.make_tensor_value_info("coarse", TensorProto.FLOAT, [1, 8, "h", "w"]),
            helper.make_tensor_value_info("fine", TensorProto.FLOAT, [1, 8, "H", "W"]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, "H", "W"])],
        [scales],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_a_shape_relax_loses_is_bisected_by_imports():
    model = _upsample_and_add()
    session = nx.InferenceSession(model)
    stats = session.provider("TvmExecutionProvider").stats
    assert stats["bisections"] == 1 and stats["bisections_by_import"] == 1, dict(stats)
    (decline,) = session.plan.declines
    assert decline.node == "mod" and "cannot tell the shape of relax.mod" in decline.detail, decline
    rng = np.random.default_rng(0)
    feeds = {
        "coarse": rng.standard_normal((1, 8, 3, 5)).astype(np.float32),
        "fine": rng.standard_normal((1, 8, 6, 10)).astype(np.float32),
    }
    assert_parity(session.run(None, feeds), ort_run(model, feeds))
