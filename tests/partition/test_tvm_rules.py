"""TVM claim rules: each declines a case that really fails
in TVM 0.27, and lets the neighbouring case through.

The declined cases were found by `tools/probe_frontend.py`; each decline test checks which check
fired (its `Rejected` kind and what it says). The accepted neighbours run through an
`InferenceSession` (our frontend, passes and schedules) and are compared with onnxruntime.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from nxrt_tvm.api.claim import DeclineSignal, Rejected
from nxrt_tvm.graph.model import load_model
from nxrt_tvm.partition.node_context import NodeContext
from nxrt_tvm.partition.tvm_rules import TVM_OP_RULES

vi = h.make_tensor_value_info


def vo(name: str, elem: int, rank: int) -> onnx.ValueInfoProto:
    """An output of known rank whose dims shape inference fills in."""
    return vi(name, elem, [f"{name}{k}" for k in range(rank)])


def model(nodes, inputs, outputs, inits=(), opset=18):
    graph = h.make_graph(nodes, "g", inputs, outputs, list(inits))
    return h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])


def check(m: onnx.ModelProto, node: int = -1) -> None:
    """Run the rule of one node (the last by default); raises DeclineSignal on decline."""
    gv = load_model(m)
    ctx = NodeContext(gv, node % len(gv.nodes))
    rule = TVM_OP_RULES.lookup(ctx.domain, ctx.op_type, ctx.opset)
    if rule is not None:
        rule(ctx)


def declined(m: onnx.ModelProto, rejected: Rejected, match: str, node: int = -1) -> DeclineSignal:
    """The rule of one node declines it with the check `rejected`, saying `match` (and how to fix it)."""
    with pytest.raises(DeclineSignal) as info:
        check(m, node)
    sig = info.value
    assert sig.rejected is rejected, (sig.rejected, sig.detail)
    assert match in sig.detail, sig.detail
    assert sig.accepts and sig.remediation
    return sig


def runs_like_ort(m: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    """Every node passes its rule, the session runs it all on TVM through our own pipeline (frontend,
    passes, schedules), and the result matches onnxruntime's."""
    import onnxruntime as ort

    import nxrt_tvm as nx

    gv = load_model(m)
    for i in range(len(gv.nodes)):
        check(m, i)
    sess = nx.InferenceSession(m)
    assert {p.ep for p in sess.plan.partitions} == {"TvmExecutionProvider"}, sess.plan.declines
    got = sess.run(None, feeds)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


X34 = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)


# -- operands that must be constant -------------------------------------------------------


def test_reshape_needs_a_known_shape():
    shape = vi("s", T.INT64, [2])
    sig = declined(
        model(
            [h.make_node("Reshape", ["x", "s"], ["y"])],
            [vi("x", T.FLOAT, [3, 4]), shape],
            [vi("y", T.FLOAT, [4, 3])],
        ),
        Rejected.INPUT,
        "is read from tensor data at run time",
    )
    assert "run time" in sig.detail
    runs_like_ort(
        model(
            [h.make_node("Reshape", ["x", "s"], ["y"])],
            [vi("x", T.FLOAT, [3, 4])],
            [vi("y", T.FLOAT, [4, 3])],
            [nh.from_array(np.array([4, 3], np.int64), "s")],
        ),
        {"x": X34},
    )


def test_reshape_from_shape_ops_with_symbolic_batch_is_accepted():
    nodes = [
        h.make_node("Shape", ["x"], ["sh"]),
        h.make_node("Gather", ["sh", "zero"], ["n"], axis=0),
        h.make_node("Unsqueeze", ["n", "zero1"], ["n1"]),
        h.make_node("Concat", ["n1", "rest"], ["s"], axis=0),
        h.make_node("Reshape", ["x", "s"], ["y"]),
    ]
    inits = [
        nh.from_array(np.array(0, np.int64), "zero"),
        nh.from_array(np.array([0], np.int64), "zero1"),
        nh.from_array(np.array([2, 2], np.int64), "rest"),
    ]
    m = model(nodes, [vi("x", T.FLOAT, ["N", 4])], [vi("y", T.FLOAT, ["N", 2, 2])], inits)
    runs_like_ort(m, {"x": X34})


def test_reduce_axes_must_be_constant():
    m = model(
        [h.make_node("ReduceSum", ["x", "a"], ["y"], keepdims=0)],
        [vi("x", T.FLOAT, [3, 4]), vi("a", T.INT64, [1])],
        [vo("y", T.FLOAT, 1)],
    )
    assert "axes" in declined(m, Rejected.INPUT, "axes (input 1, 'a') is computed at run time").detail
    m = model(
        [h.make_node("ReduceSum", ["x", "a"], ["y"], keepdims=0)],
        [vi("x", T.FLOAT, [3, 4])],
        [vo("y", T.FLOAT, 1)],
        [nh.from_array(np.array([1], np.int64), "a")],
    )
    runs_like_ort(m, {"x": X34})


def test_reduce_of_an_empty_tensor_is_declined():
    m = model(
        [h.make_node("ReduceSum", ["x", "a"], ["y"], keepdims=1)],
        [vi("x", T.FLOAT, [2, 0, 4])],
        [vo("y", T.FLOAT, 3)],
        [nh.from_array(np.array([1], np.int64), "a")],
    )
    declined(m, Rejected.SHAPE, "is empty (a zero-size dim)")


def test_topk_k_must_be_constant():
    outs = [vo("v", T.FLOAT, 2), vo("i", T.INT64, 2)]
    m = model(
        [h.make_node("TopK", ["x", "k"], ["v", "i"])], [vi("x", T.FLOAT, [3, 4]), vi("k", T.INT64, [1])], outs
    )
    declined(m, Rejected.INPUT, "k (input 1, 'k') is computed at run time")
    m = model(
        [h.make_node("TopK", ["x", "k"], ["v", "i"])],
        [vi("x", T.FLOAT, [3, 4])],
        outs,
        [nh.from_array(np.array([2], np.int64), "k")],
    )
    runs_like_ort(m, {"x": X34})


def test_pad_pads_must_be_constant():
    m = model(
        [h.make_node("Pad", ["x", "p"], ["y"], mode="reflect")],
        [vi("x", T.FLOAT, [3, 4]), vi("p", T.INT64, [4])],
        [vo("y", T.FLOAT, 2)],
    )
    declined(m, Rejected.INPUT, "pads (input 1, 'p') is computed at run time")
    m = model(
        [h.make_node("Pad", ["x", "p"], ["y"], mode="reflect")],
        [vi("x", T.FLOAT, [3, 4])],
        [vo("y", T.FLOAT, 2)],
        [nh.from_array(np.array([1, 1, 1, 1], np.int64), "p")],
    )
    runs_like_ort(m, {"x": X34})


def test_constant_of_shape_from_data_is_declined():
    m = model([h.make_node("ConstantOfShape", ["s"], ["y"])], [vi("s", T.INT64, [2])], [vo("y", T.FLOAT, 2)])
    declined(m, Rejected.INPUT, "output shape (input 0, 's') is read from tensor data")


def test_split_sizes():
    outs = [vo("a", T.FLOAT, 2), vo("b", T.FLOAT, 2)]
    m = model(
        [h.make_node("Split", ["x", "s"], ["a", "b"], axis=1)],
        [vi("x", T.FLOAT, [3, 4])],
        outs,
        [nh.from_array(np.array([0, 4], np.int64), "s")],
    )
    assert "zero-size" in declined(m, Rejected.INPUT, "contain a zero-size part").detail
    m = model(
        [h.make_node("Split", ["x", "s"], ["a", "b"], axis=1)],
        [vi("x", T.FLOAT, [3, 4])],
        outs,
        [nh.from_array(np.array([1, 3], np.int64), "s")],
    )
    runs_like_ort(m, {"x": X34})


# -- attributes and dtypes ----------------------------------------------------------------


def test_resize_scale_with_fractional_output_is_declined():
    x = vi("x", T.FLOAT, [1, 1, 4, 4])
    m = model(
        [h.make_node("Resize", ["x", "", "sc"], ["y"], mode="linear")],
        [x],
        [vo("y", T.FLOAT, 4)],
        [nh.from_array(np.array([1, 1, 0.6, 0.6], np.float32), "sc")],
    )
    assert "fractional" in declined(m, Rejected.INPUT, "fractional output size").detail
    m = model(
        [h.make_node("Resize", ["x", "", "sc"], ["y"], mode="linear")],
        [x],
        [vo("y", T.FLOAT, 4)],
        [nh.from_array(np.array([1, 1, 0.5, 0.5], np.float32), "sc")],
    )
    runs_like_ort(m, {"x": np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)})


RESIZE_CASES = [  # (attributes, scales or None, sizes or None): what torch and Paddle export
    (
        {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
        [1, 1, 2, 2],
        None,
    ),
    ({"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"}, [1, 1, 2, 2], None),
    ({"mode": "linear", "coordinate_transformation_mode": "half_pixel"}, [1, 1, 0.5, 0.5], None),
    ({"mode": "linear", "coordinate_transformation_mode": "align_corners"}, None, [1, 3, 9, 7]),
    ({"mode": "cubic", "coordinate_transformation_mode": "half_pixel"}, [1, 1, 2, 3], None),
    ({"mode": "nearest"}, None, [1, 3, 3, 5]),
]


@pytest.mark.parametrize("opset", [11, 13, 17])
@pytest.mark.parametrize("attrs,scales,sizes", RESIZE_CASES)
def test_resize_before_opset_18_runs_like_ort(opset, attrs, scales, sizes):
    """TVM's converter starts at Resize-18; ours runs 11..17 (most torch exports are opset 17)."""
    inits, ins = [], ["x", "", ""]
    if scales is not None:
        inits.append(nh.from_array(np.array(scales, np.float32), "sc"))
        ins[2] = "sc"
    else:
        inits.append(nh.from_array(np.array(sizes, np.int64), "sz"))
        ins.append("sz")
    if opset == 11:  # roi and scales are not optional at 11: empty tensors where unused
        inits.append(nh.from_array(np.zeros(0, np.float32), "roi"))
        ins[1] = "roi"
        if scales is None:
            inits.append(nh.from_array(np.zeros(0, np.float32), "sc"))
            ins[2] = "sc"
    m = model(
        [h.make_node("Resize", ins, ["y"], **attrs)],
        [vi("x", T.FLOAT, [1, 3, 6, 8])],
        [vo("y", T.FLOAT, 4)],
        inits,
        opset=opset,
    )
    x = np.random.default_rng(1).standard_normal((1, 3, 6, 8)).astype(np.float32)
    runs_like_ort(m, {"x": x})


def test_resize_10_and_tf_half_pixel_for_nn_are_declined():
    import nxrt_tvm as nx

    x = vi("x", T.FLOAT, [1, 1, 4, 4])
    sc = nh.from_array(np.array([1, 1, 2, 2], np.float32), "sc")
    m = model([h.make_node("Resize", ["x", "sc"], ["y"])], [x], [vo("y", T.FLOAT, 4)], [sc], opset=10)
    (decline,) = nx.InferenceSession(m).plan.declines
    assert decline.rejected is Rejected.OPSET and "lowest version 11" in decline.detail, decline
    m = model(
        [
            h.make_node(
                "Resize", ["x", "roi", "sc"], ["y"], coordinate_transformation_mode="tf_half_pixel_for_nn"
            )
        ],
        [x],
        [vo("y", T.FLOAT, 4)],
        [sc, nh.from_array(np.zeros(0, np.float32), "roi")],
        opset=11,
    )
    declined(m, Rejected.ATTRIBUTE, "tf_half_pixel_for_nn")


def test_opset_9_cnn_runs_on_tvm_through_the_lowest_converters():
    """The ONNX model zoo's CNNs are opset 8/9: Conv-1, BatchNormalization-9, Relu-6, Concat-4, Reshape-5,
    Gemm-9 mean what TVM's lowest converters (11-15) implement, so they are claimed, not declined."""
    r = np.random.default_rng(2)
    inits = [
        nh.from_array(r.standard_normal((6, 3, 3, 3)).astype(np.float32), "w"),
        *(nh.from_array(np.abs(r.standard_normal(6)).astype(np.float32) + 0.1, n) for n in "gbmv"),
        nh.from_array(np.array([1, -1], np.int64), "flat"),
        nh.from_array(r.standard_normal((10, 12 * 5 * 5)).astype(np.float32), "fc"),
        nh.from_array(r.standard_normal(10).astype(np.float32), "fcb"),
    ]
    nodes = [
        h.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
        h.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["n"]),
        h.make_node("Relu", ["n"], ["r"]),
        h.make_node("Sigmoid", ["c"], ["s"]),
        h.make_node("Concat", ["r", "s"], ["cat"], axis=1),
        h.make_node("Reshape", ["cat", "flat"], ["f"]),
        h.make_node("Gemm", ["f", "fc", "fcb"], ["y"], transB=1),
    ]
    m = model(nodes, [vi("x", T.FLOAT, [1, 3, 5, 5])], [vi("y", T.FLOAT, [1, 10])], inits, opset=9)
    m.ir_version = 4
    runs_like_ort(m, {"x": r.standard_normal((1, 3, 5, 5)).astype(np.float32)})


def test_pow_needs_matching_float_types():
    m = model(
        [h.make_node("Pow", ["x", "e"], ["y"])],
        [vi("x", T.FLOAT, [3, 4]), vi("e", T.INT64, [3, 4])],
        [vi("y", T.FLOAT, [3, 4])],
    )
    declined(m, Rejected.DTYPE, "base float and exponent int64")
    m = model(
        [h.make_node("Pow", ["x", "e"], ["y"])],
        [vi("x", T.FLOAT, [3, 4]), vi("e", T.FLOAT, [3, 4])],
        [vi("y", T.FLOAT, [3, 4])],
    )
    runs_like_ort(m, {"x": np.abs(X34) + 0.5, "e": X34})


def test_isinf_one_sided_is_declined():
    m = model(
        [h.make_node("IsInf", ["x"], ["y"], detect_negative=0)],
        [vi("x", T.FLOAT, [3, 4])],
        [vi("y", T.BOOL, [3, 4])],
    )
    declined(m, Rejected.ATTRIBUTE, "detect_negative=0")
    m = model([h.make_node("IsInf", ["x"], ["y"])], [vi("x", T.FLOAT, [3, 4])], [vi("y", T.BOOL, [3, 4])])
    runs_like_ort(m, {"x": np.where(X34 > 1, np.inf, X34).astype(np.float32)})


def test_layernorm_extra_outputs_are_declined():
    inputs = [vi("x", T.FLOAT, [3, 4])]
    inits = [nh.from_array(np.ones(4, np.float32), "g"), nh.from_array(np.zeros(4, np.float32), "b")]
    m = model(
        [h.make_node("LayerNormalization", ["x", "g", "b"], ["y", "mean"])],
        inputs,
        [vi("y", T.FLOAT, [3, 4]), vo("mean", T.FLOAT, 2)],
        inits,
    )
    declined(m, Rejected.ATTRIBUTE, "optional output(s) [1] of LayerNormalization")
    m = model(
        [h.make_node("LayerNormalization", ["x", "g", "b"], ["y"])], inputs, [vi("y", T.FLOAT, [3, 4])], inits
    )
    runs_like_ort(m, {"x": X34})


def test_maxpool_indices_output_is_declined():
    x = vi("x", T.FLOAT, [1, 1, 4, 4])
    m = model(
        [h.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2])],
        [x],
        [vo("y", T.FLOAT, 4), vo("i", T.INT64, 4)],
    )
    declined(m, Rejected.ATTRIBUTE, "optional output(s) [1] of MaxPool")
    m = model([h.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2])], [x], [vo("y", T.FLOAT, 4)])
    runs_like_ort(m, {"x": np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)})


def test_optional_outputs_named_but_read_by_nothing_are_claimed():
    """An optional output that is named but neither read nor a graph output is unused, as onnxruntime
    treats it (SqueezeNet's Dropout names its mask): the rule takes the node, and the partition drops
    the name so TVM's converter, which computes only the first output, imports it."""
    x = vi("x", T.FLOAT, [1, 1, 4, 4])
    m = model(
        [
            h.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2]),
            h.make_node("Relu", ["y"], ["z"]),
        ],
        [x],
        [vo("z", T.FLOAT, 4)],
    )
    runs_like_ort(m, {"x": np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)})


@pytest.mark.parametrize("mask_out", [False, True], ids=["mask-unread", "mask-output"])
def test_inference_dropout_is_the_identity_and_an_all_true_mask(mask_out):
    x = vi("x", T.FLOAT, [1, 2, 4, 4])
    w = nh.from_array(np.random.default_rng(1).standard_normal((2, 2, 1, 1)).astype(np.float32), "w")
    outputs = [vo("z", T.FLOAT, 4), *([vo("mask", T.BOOL, 4)] if mask_out else [])]
    m = model(
        [
            h.make_node("Conv", ["x", "w"], ["y"]),
            h.make_node("Dropout", ["y"], ["d", "mask"], seed=0),
            h.make_node("Conv", ["d", "w"], ["z"]),
        ],
        [x],
        outputs,
        [w],
    )
    runs_like_ort(m, {"x": np.random.default_rng(2).standard_normal((1, 2, 4, 4)).astype(np.float32)})


def test_training_dropout_is_declined():
    x = vi("x", T.FLOAT, [2, 3])
    mode = nh.from_array(np.array(True), "mode")
    m = model([h.make_node("Dropout", ["x", "", "mode"], ["y"])], [x], [vo("y", T.FLOAT, 2)], [mode])
    declined(m, Rejected.INPUT, "training_mode is true")


def test_elu_float16_is_declined():
    m = model([h.make_node("Elu", ["x"], ["y"])], [vi("x", T.FLOAT16, [3, 4])], [vi("y", T.FLOAT16, [3, 4])])
    declined(m, Rejected.DTYPE, "float16 input to Elu")


def test_conv_transpose_output_shape_must_match_pads():
    w = nh.from_array(np.ones((1, 2, 3, 3), np.float32), "w")
    x = vi("x", T.FLOAT, [1, 1, 3, 3])
    node = h.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[3, 2], output_shape=[10, 8])
    declined(model([node], [x], [vo("y", T.FLOAT, 4)], [w]), Rejected.ATTRIBUTE, "differs from the [9, 7]")
    node = h.make_node(
        "ConvTranspose",
        ["x", "w"],
        ["y"],
        strides=[3, 2],
        output_shape=[10, 8],
        output_padding=[1, 1],
        kernel_shape=[3, 3],
    )
    runs_like_ort(model([node], [x], [vo("y", T.FLOAT, 4)], [w]), {"x": np.ones((1, 1, 3, 3), np.float32)})


def test_shape_output_into_arithmetic_is_declined():
    """A symbolic dim: a static one folds the Shape and the Div to a constant before any claim."""
    nodes = [h.make_node("Shape", ["x"], ["s"]), h.make_node("Div", ["s", "two"], ["y"])]
    m = model(
        nodes,
        [vi("x", T.FLOAT, ["n", 4])],
        [vi("y", T.INT64, [2])],
        [nh.from_array(np.array(2, np.int64), "two")],
    )
    assert "Shape" in declined(m, Rejected.INPUT, "is the output of a Shape op").detail


def test_ai_onnx_attention_is_declined():
    q = vi("q", T.FLOAT, [1, 2, 3, 4])
    m = model([h.make_node("Attention", ["q", "q", "q"], ["y"])], [q], [vo("y", T.FLOAT, 4)], opset=23)
    declined(m, Rejected.OP, "com.microsoft's Attention")


# -- indices fed at run time --------------------------------------------------------------------
# TVM does not bounds-check indices: an out-of-range one reads garbage, a large one (2**40) kills the
# process with SIGSEGV. Run-time indices (token ids from the feeds included) go through the index
# guard kernel, which raises IndexOutOfBounds instead (tests/test_faults.py feeds bad ones).


@pytest.mark.parametrize(
    "op, ishape, good",
    [
        ("Gather", [2], [0, 2]),
        ("GatherElements", [2, 4], [[0, 1, 2, 0], [2, 2, 1, -3]]),
        ("GatherND", [2, 1], [[0], [-1]]),
    ],
)
def test_runtime_indices_are_claimed_behind_the_index_guard(op, ishape, good):
    m = model(
        [h.make_node(op, ["x", "i"], ["y"])],
        [vi("x", T.FLOAT, [3, 4]), vi("i", T.INT64, ishape)],
        [vo("y", T.FLOAT, 2)],
    )
    runs_like_ort(m, {"x": X34, "i": np.array(good, np.int64)})


@pytest.mark.parametrize("op", ["ScatterElements", "ScatterND"])
def test_runtime_scatter_indices_are_claimed_behind_the_index_guard(op):
    ishape, ushape, good = (
        ([1, 4], [1, 4], [[2, 0, 1, 2]]) if op == "ScatterElements" else ([1, 1], [1, 4], [[1]])
    )
    m = model(
        [h.make_node(op, ["x", "i", "u"], ["y"])],
        [vi("x", T.FLOAT, [3, 4]), vi("i", T.INT64, ishape), vi("u", T.FLOAT, ushape)],
        [vo("y", T.FLOAT, 2)],
    )
    runs_like_ort(m, {"x": X34, "i": np.array(good, np.int64), "u": np.ones(ushape, np.float32)})


def test_constant_gather_indices_in_range_are_accepted():
    m = model(
        [h.make_node("Gather", ["x", "i"], ["y"], axis=1)],
        [vi("x", T.FLOAT, [3, 4])],
        [vo("y", T.FLOAT, 2)],
        [nh.from_array(np.array([0, 3, -4], np.int64), "i")],
    )
    runs_like_ort(m, {"x": X34})


@pytest.mark.parametrize("values", [[0, 4], [-5]])
def test_constant_gather_indices_out_of_range_are_declined(values):
    m = model(
        [h.make_node("Gather", ["x", "i"], ["y"], axis=1)],
        [vi("x", T.FLOAT, [3, 4])],
        [vo("y", T.FLOAT, 2)],
        [nh.from_array(np.array(values, np.int64), "i")],
    )
    assert "not all within [-4, 4)" in declined(m, Rejected.INPUT, "are not all within [-4, 4)").detail


def test_constant_gathernd_indices_checked_per_component():
    inits = [nh.from_array(np.array([[2, 3]], np.int64), "i")]
    m = model(
        [h.make_node("GatherND", ["x", "i"], ["y"])], [vi("x", T.FLOAT, [3, 4])], [vo("y", T.FLOAT, 1)], inits
    )
    runs_like_ort(m, {"x": X34})
    inits = [nh.from_array(np.array([[3, 0]], np.int64), "i")]
    m = model(
        [h.make_node("GatherND", ["x", "i"], ["y"])], [vi("x", T.FLOAT, [3, 4])], [vo("y", T.FLOAT, 1)], inits
    )
    declined(m, Rejected.INPUT, "are not all within [-3, 3)")


def test_a_constant_index_on_a_symbolic_dim_is_left_to_the_index_guard():
    """Gather checks constant indices into a dim the run decides when it runs (`frontend._needs_guard`)."""
    for values in ([0], [-1], [1]):
        m = model(
            [h.make_node("Gather", ["x", "i"], ["y"], axis=0)],
            [vi("x", T.FLOAT, ["N", 4])],
            [vo("y", T.FLOAT, 2)],
            [nh.from_array(np.array(values, np.int64), "i")],
        )
        check(m)


def test_unguarded_constant_indices_on_a_symbolic_dim_only_first():
    """RoiAlign's batch_indices have no run-time guard: into a symbolic batch only 0 is safe."""
    for values, ok in (([0, 0], True), ([0, 1], False)):
        m = model(
            [h.make_node("RoiAlign", ["x", "rois", "b"], ["y"])],
            [vi("x", T.FLOAT, ["N", 2, 8, 8]), vi("rois", T.FLOAT, [2, 4])],
            [vo("y", T.FLOAT, 4)],
            [nh.from_array(np.array(values, np.int64), "b")],
        )
        if ok:
            check(m)
        else:
            declined(m, Rejected.INPUT, "a dim of unknown size 'N'")


# -- recurrent cells ---------------------------------------------------------------------------
# The recurrence kernel (nxrt_tvm.recurrence) is ONNX's equations with their defaults: anything else
# must be declined, never built into a kernel that computes something else.


def _cell(op: str = "LSTM", names=("X", "W", "R"), elem: int = T.FLOAT, **attrs) -> onnx.ModelProto:
    g = 4 if op == "LSTM" else 3
    rng = np.random.default_rng(0)
    arrays = {
        "W": rng.standard_normal((1, g * 4, 3)),
        "R": rng.standard_normal((1, g * 4, 4)),
        "lens": np.array([5, 5]),
        "P": rng.standard_normal((1, 12)),
    }
    dtype = np.float64 if elem == T.DOUBLE else np.float32
    inits = [
        nh.from_array(arrays[n].astype(np.int32 if n == "lens" else dtype), n) for n in names if n in arrays
    ]
    node = h.make_node(op, list(names), ["Y"], hidden_size=4, **attrs)
    return model([node], [vi("X", elem, [5, 2, 3])], [vo("Y", elem, 4)], inits, opset=14)


@pytest.mark.parametrize(
    "kwargs,rejected,match",
    [
        ({"names": ("X", "W", "R", "", "lens")}, Rejected.INPUT, "sequence_lens"),
        ({"names": ("X", "W", "R", "", "", "", "", "P")}, Rejected.INPUT, "peephole"),
        ({"layout": 1}, Rejected.ATTRIBUTE, "layout=1"),
        ({"clip": 3.0}, Rejected.ATTRIBUTE, "clip"),
        ({"input_forget": 1}, Rejected.ATTRIBUTE, "input_forget=1"),
        ({"activations": ["Relu", "Tanh", "Tanh"]}, Rejected.ATTRIBUTE, "activations"),
        ({"op": "GRU", "activations": ["Sigmoid", "Relu"]}, Rejected.ATTRIBUTE, "activations"),
        ({"elem": T.DOUBLE}, Rejected.DTYPE, "X is float64"),
    ],
    ids=["sequence_lens", "peepholes", "layout", "clip", "input_forget", "lstm-acts", "gru-acts", "double"],
)
def test_recurrent_cells_beyond_the_kernel_are_declined(kwargs, rejected, match):
    declined(_cell(**kwargs), rejected, match)


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_default_activations_named_explicitly_are_claimed(op):
    acts = ["Sigmoid", "Tanh", "Tanh"] if op == "LSTM" else ["Sigmoid", "Tanh"]
    x = np.random.default_rng(1).standard_normal((5, 2, 3)).astype(np.float32)
    runs_like_ort(_cell(op, activations=acts), {"X": x})
