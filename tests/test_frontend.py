"""Our converters where TVM's are unsafe: Slice clamps symbolic bounds, run-time indices are guarded.

Each test fails on TVM's own converter: TVM's Slice reads past the data (garbage values, shape
[1, 128] from a [1, 64] table), TVM's gathers and scatters read and write out of bounds.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from onnx.reference import ReferenceEvaluator
from parity import assert_parity, ort_run
from relax_calls import called, matmul_dtypes

import nxrt_tvm as nx
from nxrt_tvm.api.device import DeviceId, DeviceType
from nxrt_tvm.api.tensor import TensorView
from nxrt_tvm.frontend import EARLIER_VERSIONS, convert_map, import_onnx, parse_guard_failure
from nxrt_tvm.graph.model import ValueInfo
from nxrt_tvm.lower.build import build_executable
from nxrt_tvm.lower.target import make_target
from nxrt_tvm.runtime.artifact import Library
from nxrt_tvm.runtime.kernel import TvmKernel

TVM = "TvmExecutionProvider"
TABLE = np.arange(64, dtype=np.int64)[None]  # a position-id buffer, as BERT exports carry


def _model(nodes, inputs, outputs, inits=()) -> onnx.ModelProto:
    model = h.make_model(
        h.make_graph(nodes, "g", inputs, outputs, list(inits)), opset_imports=[h.make_opsetid("", 17)]
    )
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


def _seq_len_nodes() -> list:
    """n = Shape(x)[1], as an Unsqueezed [1] tensor: a size computed from the input's shape."""
    return [
        h.make_node("Shape", ["x"], ["s"]),
        h.make_node("Gather", ["s", "one"], ["n"], axis=0),
        h.make_node("Unsqueeze", ["n", "zero"], ["e"]),
    ]


_SEQ_INITS = [nh.from_array(np.array(1, np.int64), "one"), nh.from_array(np.array([0], np.int64), "zero")]


def _position_slice() -> onnx.ModelProto:
    nodes = [*_seq_len_nodes(), h.make_node("Slice", ["P", "zero", "e", "one1"], ["y"])]
    inits = [*_SEQ_INITS, nh.from_array(TABLE, "P"), nh.from_array(np.array([1], np.int64), "one1")]
    return _model(
        nodes,
        [h.make_tensor_value_info("x", T.INT64, [1, "s"])],
        [h.make_tensor_value_info("y", T.INT64, [1, None])],
        inits,
    )


@pytest.mark.parametrize("seq", [1, 30, 64, 65, 128])
def test_slice_with_a_symbolic_end_past_the_data_is_clamped(seq):
    model = _position_slice()
    sess = nx.InferenceSession(model)
    assert sess.plan.nodes_by_ep() == {TVM: 4}, sess.plan.format(sess.graph)
    feeds = {"x": np.ones((1, seq), np.int64)}
    (got,), (want,) = sess.run(None, feeds), ort_run(model, feeds)
    assert got.shape == want.shape == (1, min(seq, 64))
    np.testing.assert_array_equal(got, want)


INT64_MAX = np.iinfo(np.int64).max


def _stft_slices() -> onnx.ModelProto:
    """Silero VAD's STFT in small: a strided Conv over a signal of symbolic length, its 16 channels split
    in halves by slices "to the end" (INT64_MAX) along every axis, magnitude, then a Conv over frames."""
    rng = np.random.default_rng(0)

    def sliced(x, axis, start, end, name):
        return h.make_node("Slice", [x, start, end, axis], [name])

    nodes = [
        h.make_node("Unsqueeze", ["x", "ax1"], ["u"]),
        h.make_node("Conv", ["u", "basis"], ["spec"], kernel_shape=[16], strides=[8]),
        sliced("spec", "ax0", "b0", "end", "s0"),
        sliced("s0", "ax1", "b0", "b8", "s1"),
        sliced("s1", "ax2", "b0", "end", "s2"),
        h.make_node("Cast", ["s2"], ["re"], to=T.FLOAT),
        sliced("s0", "ax1", "b8", "end", "s3"),
        sliced("s3", "ax2", "b0", "end", "s4"),
        h.make_node("Cast", ["s4"], ["im"], to=T.FLOAT),
        h.make_node("Pow", ["re", "two"], ["re2"]),
        h.make_node("Pow", ["im", "two"], ["im2"]),
        h.make_node("Add", ["re2", "im2"], ["power"]),
        h.make_node("Sqrt", ["power"], ["mag"]),
        h.make_node("Conv", ["mag", "w", "bias"], ["y"], kernel_shape=[3], pads=[1, 1]),
    ]
    ints = {"b0": 0, "b8": 8, "end": INT64_MAX, "ax0": 0, "ax1": 1, "ax2": 2}
    inits = [
        nh.from_array(rng.standard_normal((16, 1, 16)).astype(np.float32), "basis"),
        nh.from_array(rng.standard_normal((4, 8, 3)).astype(np.float32), "w"),
        nh.from_array(rng.standard_normal(4).astype(np.float32), "bias"),
        nh.from_array(np.array(2.0, np.float32), "two"),
        *(nh.from_array(np.array([v], np.int64), k) for k, v in ints.items()),
    ]
    return _model(
        nodes,
        [h.make_tensor_value_info("x", T.FLOAT, ["n", "samples"])],
        [h.make_tensor_value_info("y", T.FLOAT, ["n", 4, None])],
        inits,
    )


@pytest.mark.parametrize("samples", [64, 200])
def test_slices_to_int64_max_build_before_a_conv_over_a_symbolic_length(samples):
    """TVM's bound analysis reads an INT64_MAX end as +infinity: the Conv after such a slice failed to
    build ("Check failed: y != kPosInf") until ours drops a whole-axis slice and ends others at the dim."""
    model = _stft_slices()
    sess = nx.InferenceSession(model)
    assert sess.plan.nodes_by_ep() == {TVM: 14}, sess.plan.format(sess.graph)
    feeds = {"x": np.random.default_rng(samples).standard_normal((2, samples)).astype(np.float32)}
    assert_parity(sess.run(None, feeds), ort_run(model, feeds))


def _jax2tf_conv_gelu() -> onnx.ModelProto:
    """Magika's conv block as jax2tf writes it: slices "to the end" as ends of 10**9 (masked) and of
    INT32_MAX around a Conv over a symbolic batch, then a tanh GELU and a max over positions."""
    rng = np.random.default_rng(1)
    ints = {
        "b4": [0, 0, 0, 0],
        "e_masked": [10**9] * 4,
        "ax_masked": [0, 2, 1, 3],
        "one4": [1, 1, 1, 1],
        "e_int32": [2**31 - 1, 2**31 - 1, 2**31 - 1, 1],
        "ax4": [0, 1, 2, 3],
        "ax3": [3],
    }
    floats = {"c": 0.044715, "k": 0.7978846, "one": 1.0, "half": 0.5}
    nodes = [
        h.make_node("Unsqueeze", ["x", "ax3"], ["u"]),
        h.make_node("Slice", ["u", "b4", "e_masked", "ax_masked", "one4"], ["s"]),
        h.make_node("Transpose", ["s"], ["t"], perm=[0, 2, 1, 3]),
        h.make_node("Conv", ["t", "w"], ["conv"], kernel_shape=[3, 1]),
        h.make_node("Slice", ["conv", "b4", "e_int32", "ax4"], ["s2"]),
        h.make_node("Squeeze", ["s2", "ax3"], ["sq"]),
        h.make_node("Add", ["sq", "bias"], ["v"]),
        h.make_node("Mul", ["c", "v"], ["g0"]),
        h.make_node("Mul", ["v", "g0"], ["g1"]),
        h.make_node("Mul", ["v", "g1"], ["g2"]),
        h.make_node("Add", ["v", "g2"], ["g3"]),
        h.make_node("Mul", ["k", "g3"], ["g4"]),
        h.make_node("Tanh", ["g4"], ["g5"]),
        h.make_node("Add", ["one", "g5"], ["g6"]),
        h.make_node("Mul", ["half", "g6"], ["g7"]),
        h.make_node("Mul", ["v", "g7"], ["gelu"]),
        h.make_node("GlobalMaxPool", ["gelu"], ["y"]),
    ]
    inits = [
        nh.from_array(rng.standard_normal((8, 6, 3, 1)).astype(np.float32), "w"),
        nh.from_array(rng.standard_normal((1, 8, 1)).astype(np.float32), "bias"),
        *(nh.from_array(np.array(v, np.int64), k) for k, v in ints.items()),
        *(nh.from_array(np.array(v, np.float32), k) for k, v in floats.items()),
    ]
    return _model(
        nodes,
        [h.make_tensor_value_info("x", T.FLOAT, ["n", 10, 6])],
        [h.make_tensor_value_info("y", T.FLOAT, ["n", 8, 1])],
        inits,
    )


def test_jax2tf_ends_of_int32_max_and_a_billion_build_before_a_gelu_over_a_symbolic_batch():
    """An INT32_MAX or 10**9 end left the batch as `min(2147483647, n)`, which FuseTIR then met in two
    forms for one tensor ("Inconsistent buffers ... mapped to the same relax var"): Magika's symbolic
    build bisected its GELU's Tanh out. A whole-axis slice is now no slice."""
    model = _jax2tf_conv_gelu()
    sess = nx.InferenceSession(model)
    assert sess.plan.nodes_by_ep() == {TVM: 17}, sess.plan.format(sess.graph)
    for n in (1, 3):
        feeds = {"x": np.random.default_rng(n).standard_normal((n, 10, 6)).astype(np.float32)}
        assert_parity(sess.run(None, feeds), ort_run(model, feeds))


def _position_gather() -> onnx.ModelProto:
    """Embedding rows for the first `seq` position ids of a 64-entry buffer, from a 32-row table: in range
    up to seq 32 only. The indices are computed from the input's shape and a constant."""
    nodes = [
        *_seq_len_nodes(),
        h.make_node("Slice", ["P", "zero", "e", "one1"], ["pos"]),
        h.make_node("Gather", ["E", "pos"], ["y"], axis=0, name="position_embeddings"),
    ]
    inits = [
        *_SEQ_INITS,
        nh.from_array(TABLE, "P"),
        nh.from_array(np.array([1], np.int64), "one1"),
        nh.from_array(np.arange(32 * 4, dtype=np.float32).reshape(32, 4), "E"),
    ]
    return _model(
        nodes,
        [h.make_tensor_value_info("x", T.INT64, [1, "s"])],
        [h.make_tensor_value_info("y", T.FLOAT, [1, None, 4])],
        inits,
    )


def test_indices_computed_from_shapes_are_bounds_checked():
    model = _position_gather()
    sess = nx.InferenceSession(model)
    assert sess.plan.nodes_by_ep() == {TVM: 5}, sess.plan.format(sess.graph)
    ok = {"x": np.ones((1, 32), np.int64)}
    np.testing.assert_array_equal(sess.run(None, ok)[0], ort_run(model, ok)[0])
    too_long = {"x": np.ones((1, 40), np.int64)}
    with pytest.raises(Exception, match="out of data bounds"):
        ort_run(model, too_long)
    with pytest.raises(
        nx.IndexOutOfBounds,
        match=r"Gather node 'position_embeddings': an index in 'pos' is outside .* n = \[32\]",
    ) as err:
        sess.run(None, too_long)
    assert err.value.node == "position_embeddings"


# -- the guard itself, on indices fed at run time (the claim rules keep those on the fallback today) --

_X = np.arange(12, dtype=np.float32).reshape(4, 3)
_U = np.ones((1, 3), np.float32)

#: op, node, extra inputs, indices shape, good indices, bad indices, the bad one reported
_GUARD = "nxrt_index_guard"
GUARDED = {
    "Gather": (
        h.make_node("Gather", ["x", "i"], ["y"], axis=0, name="g"),
        [],
        [2],
        [0, -4],
        [0, 4],
        (4, (1,)),
    ),
    "Gather-int32": (
        h.make_node("Gather", ["x", "i"], ["y"], axis=1, name="g"),
        [],
        [2],
        [2, -3],
        [-4, 0],
        (-4, (0,)),
    ),
    "Gather-huge": (
        h.make_node("Gather", ["x", "i"], ["y"], axis=0, name="g"),
        [],
        [2],
        [3, 1],
        [0, 1 << 40],
        (1 << 40, (1,)),
    ),
    "GatherElements": (
        h.make_node("GatherElements", ["x", "i"], ["y"], axis=0, name="g"),
        [],
        [1, 3],
        [[0, 3, -1]],
        [[0, 1 << 40, 2]],
        (1 << 40, (0, 1)),
    ),
    "GatherND": (
        h.make_node("GatherND", ["x", "i"], ["y"], name="g"),
        [],
        [2, 2],
        [[0, 2], [-1, -3]],
        [[0, 0], [1, 3]],
        None,
    ),
    "ScatterElements": (
        h.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=0, name="g"),
        ["u"],
        [1, 3],
        [[0, 1, -1]],
        [[0, 7, 2]],
        (7, (0, 1)),
    ),
    "ScatterND": (
        h.make_node("ScatterND", ["x", "i", "u"], ["y"], name="g"),
        ["u"],
        [1, 1],
        [[-1]],
        [[4]],
        (4, (0, 0)),
    ),
}


def _guarded_kernel(case: str):
    node, extra, ishape, *_ = GUARDED[case]
    idtype = np.int32 if case.endswith("int32") else np.int64
    inputs = [
        h.make_tensor_value_info("x", T.FLOAT, [4, 3]),
        h.make_tensor_value_info("i", T.INT32 if idtype is np.int32 else T.INT64, ishape),
    ]
    inputs += [h.make_tensor_value_info("u", T.FLOAT, [1, 3])] if extra else []
    model = _model([node], inputs, [h.make_tensor_value_info("y", T.FLOAT, None)])
    target = make_target("llvm")
    ex = build_executable(import_onnx(model), target)
    ins = [
        ValueInfo("x", T.FLOAT, (4, 3)),
        ValueInfo("i", T.INT32 if idtype is np.int32 else T.INT64, tuple(ishape)),
    ]
    ins += [ValueInfo("u", T.FLOAT, (1, 3))] if extra else []
    kernel = TvmKernel(Library(ex), DeviceId(DeviceType.CPU, 0), "k", ins, [ValueInfo("y", T.FLOAT, None)])
    return model, kernel, idtype


@pytest.mark.parametrize("case", sorted(GUARDED))
def test_run_time_indices_are_guarded(case):
    _, _, _, good, bad, reported = GUARDED[case]
    model, kernel, idtype = _guarded_kernel(case)
    feeds = {"x": _X, "i": np.array(good, idtype), **({"u": _U} if GUARDED[case][1] else {})}
    got = kernel.compute([TensorView(feeds[n]) for n in kernel.input_names])[0].numpy()
    np.testing.assert_array_equal(got, ort_run(model, feeds)[0])
    feeds["i"] = np.array(bad, idtype)
    with pytest.raises(Exception):
        ort_run(model, feeds)
    with pytest.raises(
        nx.IndexOutOfBounds, match=f"{GUARDED[case][0].op_type} node 'g': an index in 'i'"
    ) as err:
        kernel.compute([TensorView(feeds[n]) for n in kernel.input_names])
    assert err.value.node == "g"
    if reported is not None:
        value, where = reported
        assert f"index {value} at position {where}" in str(err.value)


@pytest.mark.parametrize("case", sorted(GUARDED))
def test_guarded_indices_are_not_normalised_twice(case):
    """The guard makes indices non-negative: TVM's converters' own ``where(i < 0, i + n, i)`` (and the
    shape reads that feed it) are gone from the import."""
    calls = called(import_onnx(_guarded_kernel(case)[0]))
    # one shape read left: the bounds the guard checks against
    assert _GUARD in calls and "relax.where" not in calls and calls.count("relax.shape_to_tensor") == 1, calls


@pytest.mark.parametrize("index", [2, -1, [[0, -4], [3, -2]]])
def test_constant_indices_into_a_static_dim_are_normalised_at_import(index):
    """A constant index into a dim of static size (torch's unbind of q, k and v) is counted from the end
    at import: no run-time normalisation, no guard, and onnxruntime's result."""
    model = _model(
        [
            h.make_node("Constant", [], ["i"], value=nh.from_array(np.array(index, np.int64))),
            h.make_node("Gather", ["x", "i"], ["y"], axis=0),
        ],
        [h.make_tensor_value_info("x", T.FLOAT, [4, "b", 3])],
        [h.make_tensor_value_info("y", T.FLOAT, None)],
    )
    calls = called(import_onnx(model))
    assert calls == ["relax.take"], calls
    x = np.random.default_rng(0).standard_normal((4, 5, 3)).astype(np.float32)
    session = nx.InferenceSession(model, providers=[TVM])
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], ort_run(model, {"x": x})[0])


def test_guard_failures_parse_back():
    said = parse_guard_failure(
        "IndexError: nxrt-index-guard: Gather node 'a/b': an index in 'ids' is outside "
        "[-n, n) of the data dims n = [1000, s]"
    )
    assert (said.node, said.indices, said.extents) == ("a/b", "ids", (1000, None))
    assert parse_guard_failure("some other TVM error") is None


def test_the_convert_map_is_tvms_with_our_overrides():
    from tvm.relax.frontend.onnx import onnx_frontend

    ours = convert_map()
    added = {"LSTM", "GRU"}  # ops TVM has no converter for (nxrt_tvm.recurrence)
    assert set(ours) == set(onnx_frontend._get_convert_map()) | added
    assert not added & set(onnx_frontend._get_convert_map())
    tvms = onnx_frontend._get_convert_map()
    assert {op for op, conv in ours.items() if op not in added and conv is not tvms[op]} == {
        "Slice",
        "Range",
        *("Add", "Sub", "Mul", "Div", "Pow", "Where"),
        *("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor"),
        "BitShift",
        "MatMulInteger",
        "Gather",
        "GatherElements",
        "GatherND",
        "Scatter",
        "ScatterElements",
        "ScatterND",
        "Resize",
        "Clip",
        "Squeeze",
        "Dropout",
        *("Max", "Min", "Sum", "Mean"),
        *("MaxPool", "AveragePool"),
        *EARLIER_VERSIONS,
    }
    assert onnx_frontend._get_convert_map()["Slice"] is onnx_frontend.Slice  # installed only while importing


@pytest.mark.parametrize("dtype, opset", [(np.uint8, 17), (np.uint32, 17), (np.int8, 28)])
@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_bitshift_by_amounts_outside_the_width_is_defined(dtype, opset, direction):
    """Shifts by >= the bit width (and negative ones, for signed types) fed at run time: LLVM leaves them
    undefined (AVX2 gave int8 4 >> 9 == 4); ONNX gives 0, or the sign fill for a signed right shift."""
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = h.make_graph(
        [h.make_node("BitShift", ["x", "y"], ["z"], direction=direction)],
        "g",
        [h.make_tensor_value_info("x", elem, [8]), h.make_tensor_value_info("y", elem, [8])],
        [h.make_tensor_value_info("z", elem, [8])],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])
    model.ir_version = 8 if opset < 21 else 10
    bits = np.dtype(dtype).itemsize * 8
    x = np.array([1, 4, 7, 100, 3, 1, 2, 5], dtype)
    if np.dtype(dtype).kind == "i":
        x[::2] = -x[::2]
    amounts = [0, 1, bits - 1, bits, bits + 1, 2 * bits - 1, 3, np.iinfo(dtype).max]
    y = np.array(amounts, dtype)
    if np.dtype(dtype).kind == "i":
        y[6] = -1
    sess = nx.InferenceSession(model)
    assert sess.plan.nodes_by_ep() == {TVM: 1}, sess.plan.format(sess.graph)
    np.testing.assert_array_equal(sess.run(None, {"x": x, "y": y})[0], ort_run(model, {"x": x, "y": y})[0])


@pytest.mark.parametrize(
    "op, attrs", [("MaxPool", {}), ("AveragePool", {}), ("AveragePool", {"count_include_pad": 1})]
)
def test_pools_of_inputs_shorter_than_the_window_are_sized_as_onnxruntime_sizes_them(op, attrs):
    """onnxruntime pools what is there of a window longer than the input (trunc, not floor, of the
    output-size division): a 1x1 map through a 4x2 pool is 1x1 there, and was 0x0 (then NaN after a mean)
    on TVM. One symbolic build at every size, each against onnxruntime."""
    pool = h.make_node(op, ["x"], ["y"], kernel_shape=[4, 2], strides=[4, 2], pads=[1, 0, 0, 1], **attrs)
    model = _model(
        [pool],
        [h.make_tensor_value_info("x", T.FLOAT, [1, 3, "h", "w"])],
        [h.make_tensor_value_info("y", T.FLOAT, [1, 3, "oh", "ow"])],
    )
    sess = nx.InferenceSession(model)
    assert sess.plan.nodes_by_ep() == {TVM: 1}, sess.plan.format(sess.graph)
    rng = np.random.default_rng(0)
    for size in [(1, 1), (2, 1), (3, 3), (4, 2), (9, 5), (16, 16)]:
        x = rng.standard_normal((1, 3, *size)).astype(np.float32)
        want = ort_run(model, {"x": x})[0]
        got = sess.run(None, {"x": x})[0]
        assert got.shape == want.shape, size
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=str(size))


# -- sizes derived from shapes, broadcast against the size they came from -------------------------
# TVM's Range gives its length as a fresh var, and `min(seq, 8)` (a slice clamped to a table) is not
# provably `seq`: with TVM's converters both Adds below fail to build ("range_len ... has not been
# computed", "prim.if_then_else FInferType") and were declined.

ALL_TVM = [(TVM, {"claim_policy": "all"}), "CPUExecutionProvider"]


def _int64(name: str, value) -> onnx.TensorProto:
    return nh.from_array(np.asarray(value, dtype=np.int64), name)


def _float_feeds(batch: int, seq: int) -> dict:
    return {"x": np.random.default_rng(batch * 31 + seq).standard_normal((batch, seq)).astype(np.float32)}


def _range_plus(width: int | None = None) -> onnx.ModelProto:
    """y = x + Range(0, seq, 1) (transformers' position ids), or x + table[:seq] with a table of `width`."""
    nodes = [
        h.make_node("Shape", ["x"], ["shape"], name="shape"),
        h.make_node("Gather", ["shape", "i1"], ["s"], name="g1"),
    ]
    if width is None:
        nodes += [
            h.make_node("Range", ["zero_s", "s", "one_s"], ["pos"], name="range"),
            h.make_node("Cast", ["pos"], ["f"], to=T.FLOAT, name="cast"),
        ]
    else:
        nodes += [
            h.make_node("Unsqueeze", ["s", "ax0"], ["s1"], name="u1"),
            h.make_node("Slice", ["table", "zero", "s1", "ax0"], ["f"], name="slice"),
        ]
    nodes.append(h.make_node("Add", ["x", "f"], ["y"], name="add"))
    table = np.arange(width or 1, dtype=np.float32) * 0.5
    graph = h.make_graph(
        nodes,
        "range_plus",
        [h.make_tensor_value_info("x", T.FLOAT, ["batch", "seq"])],
        [h.make_tensor_value_info("y", T.FLOAT, ["batch", "seq"])],
        [
            _int64("i1", 1),
            _int64("zero_s", 0),
            _int64("one_s", 1),
            _int64("ax0", [0]),
            _int64("zero", [0]),
            nh.from_array(table, "table"),
        ],
    )
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


@pytest.mark.parametrize("width", [None, 8], ids=["range", "clamped-slice"])
def test_a_size_derived_operand_broadcasts_against_the_size_it_came_from(width):
    """Range(0, seq) has length seq, and table[:seq] (min(seq, 8)) equals seq wherever the Add is valid:
    both build on TVM with the Add, and match onnxruntime at every size the model accepts."""
    model = _range_plus(width)
    sess = nx.InferenceSession(model, providers=ALL_TVM)
    assert not sess.plan.declines and len(sess.plan.partitions) == 1, sess.plan.format(sess.graph)
    for batch, seq in [(1, 1), (2, 3), (1, 8)]:
        feeds = _float_feeds(batch, seq)
        assert_parity(sess.run(None, feeds), ort_run(model, feeds), atol=0)


def test_a_sequence_longer_than_the_table_raises_as_onnxruntime_does():
    """seq 9 against an 8-wide table: onnxruntime refuses the broadcast; the size check raises a typed
    error instead of reading past the table."""
    model = _range_plus(8)
    with pytest.raises(Exception, match="broadcast|shape|Incompatible"):
        ort_run(model, _float_feeds(1, 9))
    sess = nx.InferenceSession(model, providers=ALL_TVM)
    with pytest.raises(nx.KernelFailed, match="nxrt-size-check|too long"):
        sess.run(None, _float_feeds(1, 9))


def _fpn(op: str) -> onnx.ModelProto:
    """An FPN junction: x [1, 4, h, w] pooled by 2, upsampled by 2 (Resize, whole-number scales) and joined
    with x (`Concat` on channels or `Add`): valid only where h and w are even, as in onnxruntime."""
    nodes = [
        h.make_node("MaxPool", ["x"], ["p"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
        h.make_node("Resize", ["p", "", "scales"], ["up"], mode="nearest", name="up"),
        h.make_node(op, ["up", "x"], ["y"], name="join", **({"axis": 1} if op == "Concat" else {})),
    ]
    channels = 8 if op == "Concat" else 4
    graph = h.make_graph(
        nodes,
        "fpn",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 4, "h", "w"])],
        [h.make_tensor_value_info("y", T.FLOAT, [1, channels, None, None])],
        [nh.from_array(np.array([1, 1, 2, 2], np.float32), "scales")],
    )
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


@pytest.mark.parametrize("op", ["Concat", "Add"])
def test_an_upsampled_map_joins_its_skip_connection_on_tvm(op):
    """`2 * (h // 2)` against `h`: Relax cannot prove them equal (they are not, for odd h), so the join's
    shape was unknown and it was declined (ppocr det, YOLOv8). Checked at run time, it builds with the rest,
    matches onnxruntime at even sizes and raises a typed error naming the node at odd ones, where
    onnxruntime refuses the input too."""
    model = _fpn(op)
    sess = nx.InferenceSession(model, providers=ALL_TVM)
    assert not sess.plan.declines and len(sess.plan.partitions) == 1, sess.plan.format(sess.graph)
    rng = np.random.default_rng(5)
    for size in [(2, 2), (4, 6), (8, 16)]:
        feeds = {"x": rng.standard_normal((1, 4, *size)).astype(np.float32)}
        assert_parity(sess.run(None, feeds), ort_run(model, feeds), atol=0)
    odd = {"x": rng.standard_normal((1, 4, 5, 6)).astype(np.float32)}
    with pytest.raises(Exception):
        ort_run(model, odd)
    with pytest.raises(nx.KernelFailed, match=f"nxrt-size-check: {op} node 'join'"):
        sess.run(None, odd)


def test_sizes_neither_side_decides_broadcast_by_onnx_rules():
    """x [n] + y [m]: either may be 1 at run time, so the result's size is ONNX's rule as an expression
    (`select(n == 1, m, n)`): every valid pair matches onnxruntime, an invalid one raises as it does."""
    model = _model(
        [h.make_node("Add", ["x", "y"], ["z"], name="add")],
        [h.make_tensor_value_info("x", T.FLOAT, ["n"]), h.make_tensor_value_info("y", T.FLOAT, ["m"])],
        [h.make_tensor_value_info("z", T.FLOAT, [None])],
    )
    sess = nx.InferenceSession(model, providers=ALL_TVM)
    assert not sess.plan.declines and len(sess.plan.partitions) == 1, sess.plan.format(sess.graph)
    rng = np.random.default_rng(6)
    for n, m in [(3, 3), (1, 3), (3, 1), (1, 1), (0, 1), (1, 0)]:
        feeds = {
            "x": rng.standard_normal(n).astype(np.float32),
            "y": rng.standard_normal(m).astype(np.float32),
        }
        assert_parity(sess.run(None, feeds), ort_run(model, feeds), atol=0)
    bad = {"x": np.ones(2, np.float32), "y": np.ones(3, np.float32)}
    with pytest.raises(Exception):
        ort_run(model, bad)
    with pytest.raises(nx.KernelFailed, match="nxrt-size-check: Add node 'add'"):
        sess.run(None, bad)


@pytest.mark.parametrize("seq", [0, 3])
def test_a_constant_index_into_a_symbolic_dim_is_guarded(seq):
    """BERT's pooler reads token 0 of the sequence (Gather axis 1, constant index 0): in range for every
    sequence but an empty one, where TVM's take would read past the data. onnxruntime refuses it."""
    nodes = [h.make_node("Gather", ["x", "i0"], ["y"], axis=1, name="pooler")]
    model = _model(
        nodes,
        [h.make_tensor_value_info("x", T.FLOAT, ["batch", "seq"])],
        [h.make_tensor_value_info("y", T.FLOAT, ["batch"])],
        [_int64("i0", 0)],
    )
    sess = nx.InferenceSession(model)
    assert sess.plan.nodes_by_ep() == {TVM: 1}, sess.plan.format(sess.graph)
    feeds = _float_feeds(2, seq)
    if seq:
        np.testing.assert_array_equal(sess.run(None, feeds)[0], ort_run(model, feeds)[0])
        return
    with pytest.raises(Exception, match="out of bounds|indices"):
        ort_run(model, feeds)
    with pytest.raises(nx.IndexOutOfBounds, match="'pooler'.*seq"):
        sess.run(None, feeds)


def _paddle_reshape() -> onnx.ModelProto:
    """Paddle's way to a Reshape's shape: Shape -> Cast int32 -> Slice -> Cast int64 -> Concat with a
    constant; x [n, 3, 4] to [n, 12]."""
    nodes = [
        h.make_node("Shape", ["x"], ["s"]),
        h.make_node("Cast", ["s"], ["s32"], to=T.INT32),
        h.make_node("Slice", ["s32", "zero", "one"], ["n32"]),
        h.make_node("Cast", ["n32"], ["n"], to=T.INT64),
        h.make_node("Concat", ["n", "minus_one"], ["shape"], axis=0),
        h.make_node("Reshape", ["x", "shape"], ["y"], name="flatten"),
    ]
    inits = [
        nh.from_array(np.array(v, np.int32 if k != "minus_one" else np.int64), k)
        for k, v in (("zero", [0]), ("one", [1]), ("minus_one", [-1]))
    ]
    return _model(
        nodes,
        [h.make_tensor_value_info("x", T.FLOAT, ["n", 3, 4])],
        [h.make_tensor_value_info("y", T.FLOAT, None)],
        inits,
    )


def test_a_shape_cast_to_int32_and_back_stays_a_shape():
    """TVM's Cast turns a symbolic shape into a tensor, and the Reshape it feeds failed to build ("Reshape
    requires the input new shape to be Shape"): ppocr rec's bisection. Ours keeps it a shape."""
    model = _paddle_reshape()
    sess = nx.InferenceSession(model, providers=ALL_TVM)
    assert not sess.plan.declines and len(sess.plan.partitions) == 1, sess.plan.format(sess.graph)
    for n in (1, 5):
        feeds = {"x": np.random.default_rng(n).standard_normal((n, 3, 4)).astype(np.float32)}
        assert_parity(sess.run(None, feeds), ort_run(model, feeds), atol=0)


def _jax2tf_shapes(computed: bool) -> onnx.ModelProto:
    """jax2tf's way to a Reshape's shape: Shape -> Slice -> Cast int32 -> Concat with int32 vectors ->
    Cast int64; x [n, 12] to [n, 3, 4]. `computed`: the vector is computed from a feed (Abs), so the
    Concat is of tensors, its result the output."""
    nodes = [
        h.make_node("Shape", ["x"], ["s"]),
        h.make_node("Slice", ["s", "zero", "one"], ["n64"]),
        h.make_node("Cast", ["n64"], ["n"], to=T.INT32),
    ]
    inits = [
        nh.from_array(np.array([0], np.int64), "zero"),
        nh.from_array(np.array([1], np.int64), "one"),
        nh.from_array(np.array([3, 4], np.int32), "rest"),
    ]
    if computed:
        nodes += [
            h.make_node("Abs", ["k"], ["rest2"]),
            h.make_node("Concat", ["n", "rest2"], ["y"], axis=0),
        ]
        inputs = [
            h.make_tensor_value_info("x", T.FLOAT, ["n", 12]),
            h.make_tensor_value_info("k", T.INT32, [2]),
        ]
        return _model(nodes, inputs, [h.make_tensor_value_info("y", T.INT32, [3])], inits)
    nodes += [
        h.make_node("Concat", ["n", "rest"], ["shape32"], axis=0),
        h.make_node("Cast", ["shape32"], ["shape"], to=T.INT64),
        h.make_node("Reshape", ["x", "shape"], ["y"]),
    ]
    inputs = [h.make_tensor_value_info("x", T.FLOAT, ["n", 12])]
    return _model(nodes, inputs, [h.make_tensor_value_info("y", T.FLOAT, None)], inits)


@pytest.mark.parametrize("computed", [False, True], ids=["into-a-reshape", "with-a-computed-vector"])
def test_a_shape_concatenated_with_int32_vectors_builds(computed):
    """TVM's Concat refused a shape value among int32 tensors ("expects the input to be a Tuple of
    Tensors": Magika's BroadcastTo shapes, bisected in its symbolic build). With constants it is a shape
    (what the Reshape needs); with a computed vector, a tensor."""
    model = _jax2tf_shapes(computed)
    sess = nx.InferenceSession(model, providers=ALL_TVM)
    assert not sess.plan.declines and len(sess.plan.partitions) == 1, sess.plan.format(sess.graph)
    for n in (1, 5):
        feeds = {"x": np.random.default_rng(n).standard_normal((n, 12)).astype(np.float32)}
        if computed:
            feeds["k"] = np.array([-3, 4], np.int32)
        assert_parity(sess.run(None, feeds), ort_run(model, feeds), atol=0)


@pytest.mark.parametrize("op", ["Equal", "Less", "Or"])
def test_comparisons_of_sizes_neither_side_decides_build_and_broadcast(op):
    """jax2tf's one-hot compares an iota [n] with labels [m]: Relax cannot tell the result's size, and
    the build failed; ours checks the sizes when it runs, as Add's (onnxruntime's rules)."""
    dtype, np_dtype = (T.BOOL, np.bool_) if op == "Or" else (T.INT32, np.int32)
    model = _model(
        [h.make_node(op, ["x", "y"], ["z"], name="compare")],
        [h.make_tensor_value_info("x", dtype, ["n"]), h.make_tensor_value_info("y", dtype, ["m"])],
        [h.make_tensor_value_info("z", T.BOOL, [None])],
    )
    sess = nx.InferenceSession(model, providers=ALL_TVM)
    assert not sess.plan.declines and len(sess.plan.partitions) == 1, sess.plan.format(sess.graph)
    rng = np.random.default_rng(8)
    for n, m in [(3, 3), (1, 4), (4, 1)]:
        feeds = {"x": rng.integers(0, 2, n).astype(np_dtype), "y": rng.integers(0, 2, m).astype(np_dtype)}
        assert_parity(sess.run(None, feeds), ort_run(model, feeds), atol=0)
    bad = {"x": np.ones(2, np_dtype), "y": np.ones(3, np_dtype)}
    with pytest.raises(Exception):
        ort_run(model, bad)
    with pytest.raises(nx.KernelFailed, match=f"nxrt-size-check: {op} node 'compare'"):
        sess.run(None, bad)


def test_a_squeezed_symbolic_axis_is_checked_to_be_one_when_it_runs():
    """TVM's Squeeze refuses an axis it cannot prove to be 1 (a Paddle recogniser's collapsed height).
    Checked at run time instead, it builds, matches onnxruntime where the axis is 1 and raises naming the
    node where it is not, where onnxruntime refuses too."""
    nodes = [
        h.make_node("Relu", ["x"], ["r"]),
        h.make_node("Squeeze", ["r", "axes"], ["y"], name="collapse"),
    ]
    model = _model(
        nodes,
        [h.make_tensor_value_info("x", T.FLOAT, [2, 3, "h", "w"])],
        [h.make_tensor_value_info("y", T.FLOAT, None)],
        [nh.from_array(np.array([2], np.int64), "axes")],
    )
    sess = nx.InferenceSession(model, providers=ALL_TVM)
    assert not sess.plan.declines and len(sess.plan.partitions) == 1, sess.plan.format(sess.graph)
    rng = np.random.default_rng(7)
    for w in (1, 9):
        feeds = {"x": rng.standard_normal((2, 3, 1, w)).astype(np.float32)}
        assert_parity(sess.run(None, feeds), ort_run(model, feeds), atol=0)
    tall = {"x": rng.standard_normal((2, 3, 2, 4)).astype(np.float32)}
    with pytest.raises(Exception):
        ort_run(model, tall)
    with pytest.raises(nx.KernelFailed, match="nxrt-size-check: Squeeze node 'collapse'"):
        sess.run(None, tall)


def _matmul_integer(depth: int, zero_points: bool) -> onnx.ModelProto:
    rng = np.random.default_rng(depth)
    weights = rng.integers(-128, 128, (depth, 24)).astype(np.int8)
    weights[0, 0], weights[1, 1] = -128, 127  # the extremes, so the bound is what the types allow
    inits = [nh.from_array(weights, "b")]
    inputs = ["a", "b"]
    if zero_points:
        inits += [
            nh.from_array(np.array(131, np.uint8), "a_zp"),
            nh.from_array(np.array(-3, np.int8), "b_zp"),
        ]
        inputs += ["a_zp", "b_zp"]
    return _model(
        [h.make_node("MatMulInteger", inputs, ["y"])],
        [h.make_tensor_value_info("a", T.UINT8, ["rows", depth])],
        [h.make_tensor_value_info("y", T.INT32, None)],
        inits,
    )


@pytest.mark.parametrize(
    ("depth", "zero_points", "form"), [(64, True, "float32"), (512, False, "uint8"), (2048, True, "int32")]
)
def test_matmul_integer_runs_in_float32_where_every_sum_is_exact(depth, zero_points, form):
    """uint8 x int8 products summed over `depth` with a weight zero point: in float32 where no partial
    sum can reach 2^24 (64 terms), in int32 past it (2048). Without one (512 terms), the 8-bit operands
    stay for the target to decide (`lower.integer_matmul`, tested there). Exactly the ONNX reference's
    integers either way, at the extremes of the types. Not onnxruntime's: without AVX-512 VNNI its
    u8 x s8 kernel sums pairs of products in saturating int16 (`vpmaddubsw`), so on an AVX2 host
    255 x -128 twice gives -32768, not -65280."""
    model = _matmul_integer(depth, zero_points)
    ((operand, _, _),) = matmul_dtypes(import_onnx(model))
    assert operand == form
    rng = np.random.default_rng(1)
    a = rng.integers(0, 256, (5, depth)).astype(np.uint8)
    a[0] = 255  # a row of the largest values against the weights' extremes
    session = nx.InferenceSession(model, providers=[TVM])
    want = ReferenceEvaluator(model).run(None, {"a": a})[0]
    np.testing.assert_array_equal(session.run(None, {"a": a})[0], want)


def test_a_dropout_between_convolutions_leaves_them_in_one_layout():
    """TVM's Dropout is a tuple its layout conversion fails on; ours is the data (and an all-true mask),
    so the convolutions around it convert to NHWC together, not each between its own transposes."""
    from tvm import relax

    from nxrt_tvm.lower.schedules import CONV_LAYOUT

    w = nh.from_array(np.ones((4, 4, 1, 1), np.float32), "w")
    model = _model(
        [
            h.make_node("Conv", ["x", "w"], ["y"]),
            h.make_node("Dropout", ["y"], ["d", "mask"]),
            h.make_node("Conv", ["d", "w"], ["z"]),
        ],
        [h.make_tensor_value_info("x", T.FLOAT, [1, 4, 6, 6])],
        [h.make_tensor_value_info("z", T.FLOAT, [1, 4, 6, 6])],
        [w],
    )
    converted = relax.transform.ConvertLayout(CONV_LAYOUT)(import_onnx(model))
    assert called(converted).count("relax.permute_dims") == 4  # x and z, and the two weights
