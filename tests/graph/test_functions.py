"""Function ops (Celu, Swish, ...) inlined into their ONNX bodies before claims, so TVM fuses across them."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from parity import assert_parity, ort_run

import nxrt_tvm as nx
from nxrt_tvm.api.claim import Rejected
from nxrt_tvm.graph.functions import inline_function_ops
from nxrt_tvm.graph.model import load_model
from nxrt_tvm.partition.tvm_rules import FUNCTION_OPS

TVM = nx.EpId("TvmExecutionProvider")


def _relu_op_sigmoid(op: str, opset: int, shape=(3, 37), **attrs) -> onnx.ModelProto:
    """x -> Relu -> `op` -> Sigmoid -> y: the function op between two ops TVM takes."""
    nodes = [
        helper.make_node("Neg", ["x"], ["a"], name="pre"),
        helper.make_node(op, ["a"], ["b"], name="fn", **attrs),
        helper.make_node("Sigmoid", ["b"], ["y"], name="post"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _feeds(shape=(3, 37)) -> dict:
    return {"x": np.random.default_rng(0).standard_normal(shape).astype(np.float32) * 3}


def test_the_function_ops_are_those_onnx_gives_a_body_and_tvm_no_converter():
    assert {"Celu", "Swish"} <= FUNCTION_OPS
    assert "HardSwish" not in FUNCTION_OPS  # a body in ONNX, and TVM converts it whole


@pytest.mark.parametrize("alpha", [None, 0.5, 2.0])
def test_celu_runs_in_one_tvm_partition_like_onnxruntime(alpha):
    attrs = {} if alpha is None else {"alpha": alpha}
    model = _relu_op_sigmoid("Celu", 17, **attrs)
    sess = nx.InferenceSession(model)
    assert [p.ep for p in sess.plan.partitions] == [TVM] and not sess.plan.declines
    ops = [sess.graph.nodes[i].op_type for i in sess.plan.partitions[0].nodes]
    assert "Celu" not in ops and "Elu" in ops
    feeds = _feeds()
    assert_parity(sess.run(None, feeds), ort_run(model, feeds), rtol=1e-5, atol=1e-6)


def test_the_attribute_reference_takes_the_nodes_value_else_the_default():
    for attrs, want in (({"alpha": 0.25}, 0.25), ({}, 1.0)):
        model = _relu_op_sigmoid("Celu", 17, **attrs)
        assert inline_function_ops(model, {"Celu"}) == 1
        (alpha,) = [n for n in model.graph.node if n.op_type == "Constant"]
        assert helper.get_attribute_value(alpha.attribute[0]) == pytest.approx(want)
        assert all(a.ref_attr_name == "" for n in model.graph.node for a in n.attribute)


def test_inner_names_never_collide_with_the_models():
    model = _relu_op_sigmoid("Celu", 17)
    # A value already named as the inliner would name the body's first result.
    model.graph.node[0].output[0] = "fn/Alpha"
    model.graph.node[1].input[0] = "fn/Alpha"
    inline_function_ops(model, {"Celu"})
    outputs = [o for n in model.graph.node for o in n.output]
    assert len(outputs) == len(set(outputs))
    onnx.checker.check_model(model)
    feeds = _feeds()
    assert_parity(ort_run(model, feeds), ort_run(_relu_op_sigmoid("Celu", 17), feeds), rtol=0, atol=0)


def test_swish_at_opset_24():
    model = _relu_op_sigmoid("Swish", 24, alpha=1.5)
    sess = nx.InferenceSession(model)
    assert [p.ep for p in sess.plan.partitions] == [TVM]
    x = _feeds()["x"]
    a = -x
    b = a / (1 + np.exp(-1.5 * a))
    want = 1 / (1 + np.exp(-b))
    (got,) = sess.run(None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_an_excluded_function_op_is_not_inlined_and_declined_as_excluded():
    model = _relu_op_sigmoid("Celu", 17)
    sess = nx.InferenceSession(model, provider_options=[{"op_types_to_exclude": "Celu"}, {}])
    (decline,) = sess.plan.declines
    assert decline.op_type == "Celu" and decline.rejected is Rejected.OPTION
    feeds = _feeds()
    assert_parity(sess.run(None, feeds), ort_run(model, feeds))


def test_a_body_whose_ops_the_models_opset_lacks_is_left_whole():
    """Celu's body casts with CastLike (opset 15): at opset 13 the node stays and TVM declines it."""
    model = _relu_op_sigmoid("Celu", 13)
    assert inline_function_ops(onnx.ModelProto.FromString(model.SerializeToString()), {"Celu"}) == 0
    graph = load_model(model, inline=FUNCTION_OPS)
    assert [n.op_type for n in graph.nodes] == ["Neg", "Celu", "Sigmoid"]
    sess = nx.InferenceSession(model)
    (decline,) = sess.plan.declines
    assert decline.op_type == "Celu" and decline.rejected is Rejected.OP
    feeds = _feeds()
    assert_parity(sess.run(None, feeds), ort_run(model, feeds))
