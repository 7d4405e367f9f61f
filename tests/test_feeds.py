"""Bad feeds get typed errors that say what was wrong and what to do."""

from __future__ import annotations

import model_zoo
import numpy as np
import pytest

import nxrt_tvm as nx


@pytest.fixture(scope="module", params=["N", 2], ids=["symbolic", "fixed"])
def mlp_session(request) -> nx.InferenceSession:
    """A symbolic batch (the checked path) and a fixed one (array feeds that fit go straight to the
    kernel, and what does not fit gets the checked path's errors all the same)."""
    return nx.InferenceSession(model_zoo.mlp(request.param))


def test_missing_input(mlp_session):
    with pytest.raises(nx.MissingInput, match=r"missing input\(s\) \['x'\]"):
        mlp_session.run(None, {})


def test_unknown_input(mlp_session):
    x = np.zeros((2, 64), np.float32)
    with pytest.raises(nx.UnknownInput, match="'y'.*model's inputs are \\['x'\\]"):
        mlp_session.run(None, {"x": x, "y": x})


def test_wrong_dtype(mlp_session):
    with pytest.raises(nx.InputTypeMismatch, match="expected element type float32.*got float64.*astype"):
        mlp_session.run(None, {"x": np.zeros((2, 64))})


def test_wrong_rank(mlp_session):
    with pytest.raises(nx.InputShapeMismatch, match="expected rank 2"):
        mlp_session.run(None, {"x": np.zeros((2, 64, 1), np.float32)})


def test_wrong_fixed_dim(mlp_session):
    with pytest.raises(nx.InputShapeMismatch, match="dimension 1 must be 64, got 63"):
        mlp_session.run(None, {"x": np.zeros((2, 63), np.float32)})


def test_unknown_output_name(mlp_session):
    with pytest.raises(nx.InvalidFeed, match="unknown output"):
        mlp_session.run(["nope"], {"x": np.zeros((2, 64), np.float32)})


def test_errors_share_one_root():
    for cls in (nx.MissingInput, nx.UnknownInput, nx.InputTypeMismatch, nx.InputShapeMismatch):
        assert issubclass(cls, nx.InvalidFeed) and issubclass(cls, nx.EpError)


def test_non_contiguous_and_read_only_feeds_work(mlp_session):
    base = np.random.default_rng(0).standard_normal((2, 128)).astype(np.float32)
    strided = base[:, ::2]
    frozen = np.ascontiguousarray(strided)
    frozen.flags.writeable = False
    want = mlp_session.run(None, {"x": np.ascontiguousarray(strided)})[0]
    np.testing.assert_array_equal(mlp_session.run(None, {"x": strided})[0], want)
    np.testing.assert_array_equal(mlp_session.run(None, {"x": frozen})[0], want)


def test_symbolic_dim_must_agree_across_inputs():
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["y"])],
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 3]) for n in ("a", "b")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
    )
    sess = nx.InferenceSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    with pytest.raises(nx.InputShapeMismatch, match=r"\('N'\) is 3, but 'N' was 2"):
        sess.run(None, {"a": np.zeros((2, 3), np.float32), "b": np.zeros((3, 3), np.float32)})


@pytest.mark.parametrize("unknown", [-1, "?"], ids=["paddle-dim-value-minus-1", "tf2onnx-question-mark"])
def test_exporters_any_size_dims_take_any_size(unknown):
    """Paddle declares a free batch as dim_value -1, tf2onnx names every free dim "?": neither is a size,
    and two dims that carry "?" need not be equal (onnxruntime runs all three feeds below)."""
    from onnx import TensorProto, helper

    inputs = []
    for name in ("a", "b"):
        vi = helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 3])
        dim = vi.type.tensor_type.shape.dim[0]
        dim.Clear()
        if unknown == -1:
            dim.dim_value = -1
        else:
            dim.dim_param = unknown
        inputs.append(vi)
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["a"], ["sa"], keepdims=0), helper.make_node("Relu", ["b"], ["y"])],
        "g",
        inputs,
        [
            helper.make_tensor_value_info("sa", TensorProto.FLOAT, [3]),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", 3]),
        ],
        initializer=[],
    )
    graph.node[0].input.append("axes")
    graph.initializer.append(helper.make_tensor("axes", TensorProto.INT64, [1], [0]))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    sess = nx.InferenceSession(model)
    rng = np.random.default_rng(0)
    for na, nb in ((1, 1), (4, 2), (2, 5)):
        a, b = (
            rng.standard_normal((na, 3)).astype(np.float32),
            rng.standard_normal((nb, 3)).astype(np.float32),
        )
        sa, y = sess.run(None, {"a": a, "b": b})
        np.testing.assert_allclose(sa, a.sum(0), rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(y, np.maximum(b, 0))
