"""Shape computations folded before claims, and exporters' dims named by symbolic inference (issue 18)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from parity import assert_parity, ort_run

import nxrt_tvm as nx
from nxrt_tvm.graph.model import load_model

TVM = nx.EpId("TvmExecutionProvider")
ALL = [("TvmExecutionProvider", {"claim_policy": "all"}), "CPUExecutionProvider"]


def _const(name: str, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype=np.int64), name)


def _torch_expand() -> onnx.ModelProto:
    """torch's `t.expand(batch, seq)` as exported: Where(Equal(shape, -1), ones, shape) -> Expand, where
    the shape is Concat(Unsqueeze(Gather(Shape(x), i))) and `t` a [1, 1] buffer."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"], name="shape"),
        helper.make_node("Gather", ["shape", "i0"], ["b"], name="g0"),
        helper.make_node("Gather", ["shape", "i1"], ["s"], name="g1"),
        helper.make_node("Unsqueeze", ["b", "ax0"], ["b1"], name="u0"),
        helper.make_node("Unsqueeze", ["s", "ax0"], ["s1"], name="u1"),
        helper.make_node("Concat", ["b1", "s1"], ["target"], axis=0, name="cat"),
        helper.make_node("Shape", ["target"], ["len"], name="len"),
        helper.make_node("ConstantOfShape", ["len"], ["ones"], name="ones", value=_const("one", [1])),
        helper.make_node("Mul", ["ones", "minus1"], ["minus"], name="mul"),
        helper.make_node("Equal", ["target", "minus"], ["is_minus"], name="eq"),
        helper.make_node("Where", ["is_minus", "ones", "target"], ["shape2"], name="where"),
        helper.make_node("Expand", ["table", "shape2"], ["expanded"], name="expand"),
        helper.make_node("Cast", ["expanded"], ["f"], to=TensorProto.FLOAT, name="cast"),
        helper.make_node("Add", ["x", "f"], ["y"], name="add"),
    ]
    graph = helper.make_graph(
        nodes,
        "torch_expand",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq"])],
        [
            _const("i0", 0),
            _const("i1", 1),
            _const("ax0", [0]),
            _const("minus1", -1),
            _const("table", [[7]]),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(batch: int, seq: int) -> dict:
    return {"x": np.random.default_rng(batch * 31 + seq).standard_normal((batch, seq)).astype(np.float32)}


def test_a_torch_expand_loses_its_equal_and_where_and_keeps_its_values():
    """Dims are never negative, so Equal(shape, -1) is false and Where picks the shape: both fold, and
    the shape is rebuilt from the Shape of the tensor that holds its dims."""
    model = _torch_expand()
    graph = load_model(model)
    ops = [n.op_type for n in graph.nodes]
    assert "Equal" not in ops and "Where" not in ops and "ConstantOfShape" not in ops, ops
    assert "Expand" in ops
    for batch, seq in [(1, 1), (2, 3), (3, 5)]:
        assert_parity(ort_run(graph.model, _feeds(batch, seq)), ort_run(model, _feeds(batch, seq)))


def test_the_folded_expand_is_one_tvm_partition_that_matches_onnxruntime():
    model = _torch_expand()
    sess = nx.InferenceSession(model, providers=ALL)
    assert [str(p.ep) for p in sess.plan.partitions] == [str(TVM)], sess.plan.format(sess.graph)
    for batch, seq in [(1, 1), (2, 4), (1, 5)]:
        assert_parity(sess.run(None, _feeds(batch, seq)), ort_run(model, _feeds(batch, seq)), atol=0)


def test_a_comparison_that_needs_the_run_time_size_is_not_folded():
    """Equal(dim, 4) depends on the input: it stays, and so does the Where it drives."""
    model = _torch_expand()
    for tensor in model.graph.initializer:
        if tensor.name == "minus1":
            tensor.CopyFrom(_const("minus1", 4))
    ops = [n.op_type for n in load_model(model).nodes]
    assert "Equal" in ops and "Where" in ops, ops


@pytest.mark.parametrize("fmod, want", [(0, [2, 3]), (1, [-1, 3])])
def test_mod_of_known_sizes_folds_with_onnx_sign_rules(fmod, want):
    """torch's MultiheadAttention slices a Shape at `dim % rank`: unfolded, the slice's length and
    every reshape after it were unknown (torch_encoder ran as 12 partitions)."""
    graph = helper.make_graph(
        [
            helper.make_node("Mod", ["a", "b"], ["target"], fmod=fmod),
            helper.make_node("Reshape", ["x", "target"], ["y"]),
        ],
        "mod",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [_const("a", [-1, 3]), _const("b", [3, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    folded = load_model(model)
    assert [n.op_type for n in folded.nodes] == ["Reshape"]
    assert folded.initializers["target"] is not None
    assert numpy_helper.to_array(folded.initializers["target"]).tolist() == want
    x = np.arange(6, dtype=np.float32)
    assert_parity(ort_run(folded.model, {"x": x}), ort_run(model, {"x": x}), atol=0)


def test_symbolic_inference_names_a_transformers_exports_dims_after_its_inputs(data_dir):
    """ONNX's inference calls tiny_bert's hidden state [unk__7, unk__8, 64]; onnxruntime's symbolic
    inference follows the shape values and merges them with the inputs' batch and seq."""
    graph = load_model(str(data_dir / "tiny_bert.onnx"))
    hidden = graph.info("/m/embeddings/LayerNorm/LayerNormalization_output_0")
    assert hidden.shape == ("batch", "seq", 64), hidden


@pytest.mark.parametrize("name", ["tiny_bert", "tiny_t5_int8", "torch_encoder"])
def test_a_dynamic_shape_export_is_one_tvm_partition(name, data_dir, exports_cache):
    """Issue 18's goal: at most 2 partitions with dynamic batch and sequence (tiny_bert was 23, the
    int8 T5 16, torch_encoder 12 before shape folding, symbolic inference, Range and clamped
    broadcasts)."""
    providers = [
        ("TvmExecutionProvider", {"claim_policy": "all", "cache_dir": exports_cache}),
        "CPUExecutionProvider",
    ]
    sess = nx.InferenceSession(str(data_dir / f"{name}.onnx"), providers=providers)
    assert len(sess.plan.partitions) <= 2, sess.plan.format(sess.graph)
    assert not sess.plan.declines, sess.plan.format(sess.graph)


def test_the_shape_of_a_weight_is_known():
    """Silero VAD's reflect padding: its pads come from Shape of a [2] weight, padded to four with
    ConstantOfShape, reshaped to [-1, 2], reversed and flattened. All of it is known at load; unfolded,
    TVM's frontend held it as a shape value its Reshape could not infer the -1 from, and the build was
    bisected. Folded, no Shape is left, and the rest of the chain builds (the Pad itself stays with
    onnxruntime: its pads are still computed, by the 2-D Reshape, Slice and Transpose)."""
    nodes = [
        helper.make_node("Shape", ["w"], ["n"]),
        helper.make_node("Sub", ["four", "n"], ["rest"]),
        helper.make_node("ConstantOfShape", ["rest"], ["zeros"], value=_const("zero", [0])),
        helper.make_node("Concat", ["w", "zeros"], ["flat"], axis=0),
        helper.make_node("Reshape", ["flat", "pairs"], ["by_axis"]),
        helper.make_node("Slice", ["by_axis", "start", "end", "axis0", "step"], ["reversed"]),
        helper.make_node("Transpose", ["reversed"], ["t"], perm=[1, 0]),
        helper.make_node("Reshape", ["t", "minus1"], ["pads"]),
        helper.make_node("Pad", ["x", "pads"], ["y"], mode="reflect"),
    ]
    inits = [
        _const("w", [3, 5]),
        _const("four", [4]),
        _const("pairs", [-1, 2]),
        _const("start", [-1]),
        _const("end", [-(2**62)]),
        _const("axis0", [0]),
        _const("step", [-1]),
        _const("minus1", [-1]),
    ]
    graph = helper.make_graph(
        nodes,
        "reflect_pads",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "samples"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", None])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    assert not any(n.op_type == "Shape" for n in load_model(model).nodes)
    sess = nx.InferenceSession(model, providers=ALL)
    assert [d.op_type for d in sess.plan.declines] == ["Pad"], sess.plan.format(sess.graph)
    assert sess.provider(str(TVM)).stats["bisections"] == 0
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 40)).astype(np.float32)}
    assert_parity(sess.run(None, feeds), ort_run(model, feeds))
