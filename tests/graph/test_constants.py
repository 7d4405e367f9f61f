"""Small computations on constants evaluated before claims (`nxrt_tvm.graph.constants`)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from parity import assert_parity, ort_run

import nxrt_tvm as nx
from nxrt_tvm.graph.constants import MAX_ELEMENTS, branch_inputs
from nxrt_tvm.graph.model import load_model

TVM = nx.EpId("TvmExecutionProvider")
ALL = [("TvmExecutionProvider", {"claim_policy": "all"}), "CPUExecutionProvider"]


def _ints(name: str, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype=np.int64), name)


def _constant(name: str, value) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=_ints(f"{name}_value", value))


def _torch_pad(ir_version: int | None = None) -> onnx.ModelProto:
    """torch's ``F.pad(x, (2, 3), mode="reflect")`` of a [1, 1, 16] signal as opset-16 exports write it
    (Silero VAD's STFT): the pads come out of Constant nodes through ConstantOfShape, Concat,
    Reshape, Slice (reversed), Transpose, Reshape and Cast, then the model convolves the padded signal."""
    nodes = [
        _constant("lead", [2, 3]),
        _constant("rest", [4]),
        helper.make_node("ConstantOfShape", ["rest"], ["zeros"], value=_ints("zero", [0])),
        helper.make_node("Concat", ["lead", "zeros"], ["flat"], axis=0),
        _constant("pairs", [-1, 2]),
        helper.make_node("Reshape", ["flat", "pairs"], ["paired"]),
        _constant("start", [-1]),
        _constant("end", [-(2**63)]),
        _constant("axis", [0]),
        _constant("step", [-1]),
        helper.make_node("Slice", ["paired", "start", "end", "axis", "step"], ["reversed"]),
        helper.make_node("Transpose", ["reversed"], ["columns"], perm=[1, 0]),
        _constant("line", [-1]),
        helper.make_node("Reshape", ["columns", "line"], ["pads64"]),
        helper.make_node("Cast", ["pads64"], ["pads"], to=TensorProto.INT64),
        helper.make_node("Pad", ["x", "pads"], ["padded"], mode="reflect"),
        helper.make_node("Conv", ["padded", "w"], ["y"]),
    ]
    w = np.random.default_rng(0).standard_normal((4, 1, 5)).astype(np.float32)
    graph = helper.make_graph(
        nodes,
        "torch_pad",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 17])],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)])
    if ir_version is not None:
        model.ir_version = ir_version
        if ir_version < 4:
            model.graph.input.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, w.shape))
    return model


def _feeds() -> dict:
    return {"x": np.random.default_rng(1).standard_normal((1, 1, 16)).astype(np.float32)}


def test_pads_computed_from_constants_become_one_initializer():
    graph = load_model(_torch_pad())
    assert [n.op_type for n in graph.nodes] == ["Pad", "Conv"]
    pad = graph.nodes[0]
    assert numpy_helper.to_array(graph.initializers[pad.input[1]]).tolist() == [0, 0, 2, 0, 0, 3]
    assert_parity(ort_run(graph.model, _feeds()), ort_run(_torch_pad(), _feeds()), atol=0)


def test_the_pad_is_claimed_with_its_conv_and_matches_onnxruntime():
    """Unevaluated, the TVM EP declined the Pad (its pads computed at run time) and the model split."""
    sess = nx.InferenceSession(_torch_pad(), providers=ALL)
    assert [str(p.ep) for p in sess.plan.partitions] == [str(TVM)], sess.plan.format(sess.graph)
    assert not [d for d in sess.plan.declines if d.op_type == "Pad"]
    assert_parity(sess.run(None, _feeds()), ort_run(_torch_pad(), _feeds()))


def test_an_old_ir_version_declares_what_was_evaluated_as_inputs():
    """Before IR 4 an initializer is typed only by a graph input: undeclared, ONNX's inference lost every
    shape after it (DenseNet-121 from onnx's test data went to symbolic inference)."""
    graph = load_model(_torch_pad(ir_version=3))
    pads = graph.nodes[0].input[1]
    assert pads in {i.name for i in graph.model.graph.input}
    assert graph.info("padded").shape == (1, 1, 21)
    assert [i.name for i in nx.InferenceSession(_torch_pad(ir_version=3), providers=ALL).get_inputs()] == [
        "x"
    ]


def test_large_results_and_graph_outputs_stay_computed():
    """A result of more than `MAX_ELEMENTS` (a weight: the compiler folds it itself) is not evaluated,
    nor a node whose value is a graph output."""
    half = MAX_ELEMENTS // 2 + 1
    nodes = [
        helper.make_node("Concat", ["a", "a"], ["big"], axis=0),
        helper.make_node("Add", ["x", "big"], ["y"]),
        helper.make_node("Concat", ["b", "b"], ["bb"], axis=0),
    ]
    graph = helper.make_graph(
        nodes,
        "kept",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2 * half])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [2 * half]),
            helper.make_tensor_value_info("bb", TensorProto.INT64, [2]),
        ],
        [numpy_helper.from_array(np.ones(half, dtype=np.float32), "a"), _ints("b", [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert [n.op_type for n in load_model(model).nodes] == ["Concat", "Add", "Concat"]


def _scripted_branch(dims, clash: bool = False) -> onnx.ModelProto:
    """torch.jit.script's ``if x.dim() == 3: y = relu(x) * 2 else: y = -x`` as exported: an If on
    Cast(Not(Equal(Size(Shape(x)), 2))), then a Mul after it. With `clash`, the then-branch names a value
    as the outer graph does ("scaled")."""
    inner = "scaled" if clash else "inner"
    then = helper.make_graph(
        [
            helper.make_node("Constant", [], ["two"], value=numpy_helper.from_array(np.float32(2.0), "two")),
            helper.make_node("Relu", ["x"], ["r"]),
            helper.make_node("Mul", ["r", "two"], [inner]),
        ],
        "then",
        [],
        [helper.make_tensor_value_info(inner, TensorProto.FLOAT, None)],
    )
    otherwise = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["negated"])],
        "else",
        [],
        [helper.make_tensor_value_info("negated", TensorProto.FLOAT, None)],
    )
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["batch"], axis=0),
        helper.make_node("Size", ["shape"], ["rank"]),
        helper.make_node("Equal", ["rank", "two_dims"], ["is_2d"]),
        helper.make_node("Not", ["is_2d"], ["not_2d"]),
        helper.make_node("Equal", ["batch", "one"], ["single"]),
        helper.make_node("And", ["not_2d", "single"], ["cond"]),
        helper.make_node("If", ["cond"], ["branched"], then_branch=then, else_branch=otherwise),
        helper.make_node("Mul", ["branched", "x"], ["scaled"]),
        helper.make_node("Sigmoid", ["scaled"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "scripted",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)],
        [_ints("two_dims", 2), _ints("zero", 0), _ints("one", 1)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _x(batch: int = 1) -> dict:
    return {"x": np.random.default_rng(batch).standard_normal((batch, 3, 8)).astype(np.float32)}


def test_a_branch_on_known_shapes_is_inlined_and_claimed_with_its_neighbours():
    """The condition folds once the shapes are known: the If becomes the then-branch's nodes, and the
    whole model one TVM partition (the If was declined as control flow, the model split around it)."""
    model = _scripted_branch([1, 3, 8])
    graph = load_model(model)
    assert "If" not in [n.op_type for n in graph.nodes]
    sess = nx.InferenceSession(model, providers=ALL)
    assert [str(p.ep) for p in sess.plan.partitions] == [str(TVM)], sess.plan.format(sess.graph)
    assert_parity(sess.run(None, _x()), ort_run(model, _x()))


def test_a_branch_on_a_size_known_only_at_run_time_stays_control_flow():
    """With a symbolic batch, ``batch == 1`` is not known before the run: the If stays, declined as
    control flow, and the model still runs (the fallback runs the If)."""
    model = _scripted_branch(["batch", 3, 8])
    assert "If" in [n.op_type for n in load_model(model).nodes]
    sess = nx.InferenceSession(model, providers=ALL)
    assert any(d.op_type == "If" and "control flow" in d.detail for d in sess.plan.declines)
    for batch in (1, 2):
        assert_parity(sess.run(None, _x(batch)), ort_run(model, _x(batch)))


def test_a_branch_value_named_as_an_outer_one_is_renamed():
    model = _scripted_branch([1, 3, 8], clash=True)
    graph = load_model(model)
    assert "If" not in [n.op_type for n in graph.nodes]
    produced = [o for n in graph.nodes for o in n.output]
    assert len(produced) == len(set(produced)), produced
    assert_parity(ort_run(graph.model, _x()), ort_run(model, _x()))
    sess = nx.InferenceSession(model, providers=ALL)
    assert_parity(sess.run(None, _x()), ort_run(model, _x()))


def _rank_branches() -> onnx.ModelProto:
    """torch.jit.script's ``if x.size(0) == 1: y = x.squeeze(0) else: y = x``, then ``if y.dim() == 2:
    z = y.unsqueeze(0) else: z = y`` (Silero VAD 16k's decoder): the first If's output has rank 2 or 3
    by the batch, so the second If's condition is not known before the run."""

    def branch(name: str, node: onnx.NodeProto, out: str) -> onnx.GraphProto:
        return helper.make_graph(
            [node], name, [], [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)]
        )

    squeeze = branch("squeeze", helper.make_node("Squeeze", ["x", "zeros"], ["sq"]), "sq")
    keep_x = branch("keep_x", helper.make_node("Identity", ["x"], ["x_kept"]), "x_kept")
    unsqueeze = branch("unsqueeze", helper.make_node("Unsqueeze", ["y", "zeros"], ["unsq"]), "unsq")
    keep_y = branch("keep_y", helper.make_node("Identity", ["y"], ["y_kept"]), "y_kept")
    squeeze.output[0].type.tensor_type.shape.dim.add().dim_value = 3  # the exporter's ranks: 2 ...
    squeeze.output[0].type.tensor_type.shape.dim.add().dim_value = 8
    for d in ("batch", 3, 8):  # ... and 3
        dim = keep_x.output[0].type.tensor_type.shape.dim.add()
        dim.CopyFrom(helper.make_tensor_value_info("d", TensorProto.FLOAT, [d]).type.tensor_type.shape.dim[0])
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["batch"], axis=0),
        helper.make_node("Equal", ["batch", "one"], ["single"]),
        helper.make_node("If", ["single"], ["y"], then_branch=squeeze, else_branch=keep_x),
        helper.make_node("Shape", ["y"], ["y_shape"]),
        helper.make_node("Size", ["y_shape"], ["rank"]),
        helper.make_node("Equal", ["rank", "two_dims"], ["is_2d"]),
        helper.make_node("If", ["is_2d"], ["z"], then_branch=unsqueeze, else_branch=keep_y),
        helper.make_node("Relu", ["z"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes,
        "rank_branches",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 8])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        [_ints("zero", 0), _ints("one", 1), _ints("two_dims", 2), _ints("zeros", [0])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_branch_after_an_if_whose_rank_depends_on_the_run_stays_control_flow():
    """onnxruntime's symbolic inference gave the first If's output one branch's rank, and the second If
    was taken on it: Silero VAD 16k's LSTM then got a rank-4 input and the session could not be made."""
    model = _rank_branches()
    assert [n.op_type for n in load_model(model).nodes].count("If") == 2
    sess = nx.InferenceSession(model, providers=ALL)
    for batch in (1, 2):
        x = {"x": np.random.default_rng(batch).standard_normal((batch, 3, 8)).astype(np.float32)}
        assert_parity(sess.run(None, x), ort_run(model, x))


def _deciding(sr_type: int, sr_dims: list, via: str) -> onnx.ModelProto:
    """``If(<via>(sr, 16000) and True)`` choosing between two Identity branches of ``x``; with `via`
    "Mul", sr's product is cast to an output and the If reads the bool input ``flag`` instead."""
    branch = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["b"])], "b", [], [helper.make_tensor_value_info("b", 1, [2])]
    )
    rate = numpy_helper.from_array(np.array(16000, dtype=helper.tensor_dtype_to_np_dtype(sr_type)), "rate")
    nodes = [helper.make_node("Constant", [], ["limit"], value=numpy_helper.from_array(np.array(True), "l"))]
    if via == "Mul":
        nodes += [
            helper.make_node("Mul", ["sr", "rate"], ["m"]),
            helper.make_node("Cast", ["m"], ["s"], to=1),
        ]
        cond = "flag"
    else:
        nodes += [
            helper.make_node(via, ["sr", "rate"], ["eq"]),
            helper.make_node("And", ["eq", "limit"], ["c"]),
        ]
        cond = "c"
    nodes.append(helper.make_node("If", [cond], ["y"], then_branch=branch, else_branch=branch))
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
        helper.make_tensor_value_info("sr", sr_type, sr_dims),
        helper.make_tensor_value_info("flag", TensorProto.BOOL, []),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])]
    if via == "Mul":
        outputs.append(helper.make_tensor_value_info("s", TensorProto.FLOAT, sr_dims))
    return helper.make_model(helper.make_graph(nodes, "deciding", inputs, outputs, [rate]))


@pytest.mark.parametrize(
    ("sr_type", "sr_dims", "via", "found"),
    [
        (TensorProto.INT64, [], "Equal", ("sr",)),  # through a Constant node and And
        (TensorProto.INT32, [1, 1], "Greater", ("sr",)),  # one element of any rank
        (TensorProto.INT64, [2], "Equal", ()),  # two elements: not a value to build for
        (TensorProto.INT64, ["n"], "Equal", ()),  # a size known only at run time
        (TensorProto.FLOAT, [], "Equal", ()),  # floats are not build keys
        (TensorProto.INT64, [], "Mul", ("flag",)),  # sr reaches no If; a bool input that is the condition
    ],
)
def test_branch_inputs_are_one_element_integer_inputs_an_if_condition_follows_from(
    sr_type, sr_dims, via, found
):
    assert branch_inputs(_deciding(sr_type, sr_dims, via)) == found
