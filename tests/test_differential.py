"""Differential tests: hypothesis-generated small models through nxrt-tvm (TVM EP first) and onnxruntime.

Four families: elementwise chains with broadcasting, reductions, matmul / conv, shape ops.
Every example must be (at least partly) claimed by the TVM EP, so TVM's code is what is
compared. Tolerances: float32 results within rtol 1e-4 / atol 1e-5 (elementwise,
shape ops), rtol 1e-4 / atol 1e-4 (reductions, matmul, conv: accumulation order
differs); integer and bool results, and every shape op, must be exact; dtypes and shapes
always equal. Example counts are bounded and derandomized (same examples every run), so
the module stays under a minute on 2 cores.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from onnx import TensorProto as T  # noqa: E402
from onnx import helper as h  # noqa: E402
from onnx import numpy_helper as nh  # noqa: E402
from parity import ort_run  # noqa: E402

import nxrt_tvm as nx  # noqa: E402

OPSET = 17
EXAMPLES = 15

SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _model(nodes, inputs, outputs, inits=()) -> onnx.ModelProto:
    graph = h.make_graph(nodes, "diff", inputs, outputs, list(inits))
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", OPSET)])
    model.ir_version = 8
    model = onnx.shape_inference.infer_shapes(
        model, strict_mode=True
    )  # fills the output shapes the checker wants
    onnx.checker.check_model(model)
    return model


def _vi(name, elem, shape):
    return h.make_tensor_value_info(name, elem, list(shape) if shape is not None else None)


def compare(model: onnx.ModelProto, feeds: dict, rtol: float, atol: float) -> None:
    sess = nx.InferenceSession(model)
    assert sess.plan.nodes_by_ep().get("TvmExecutionProvider", 0) > 0, sess.plan.format(sess.graph)
    got = sess.run(None, feeds)
    want = ort_run(model, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
        else:
            np.testing.assert_array_equal(g, w)


shapes = st.lists(st.integers(1, 5), min_size=1, max_size=4).map(tuple)


def _broadcast_partner(draw, shape):
    """A shape that broadcasts against `shape`: a suffix, with some dims set to 1."""
    k = draw(st.integers(0, len(shape)))
    return tuple(1 if draw(st.booleans()) else d for d in shape[len(shape) - k :])


def _array(draw, shape, dtype, lo=-3.0, hi=3.0):
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        return rng.uniform(lo, hi, size=shape).astype(dtype)
    return rng.integers(int(lo), int(hi) + 1, size=shape).astype(dtype)


# -- elementwise ------------------------------------------------------------------------------

UNARY = ["Abs", "Neg", "Relu", "Sigmoid", "Tanh", "Exp", "Erf", "Softsign", "Floor", "Ceil", "Sin", "Cos"]
BINARY = ["Add", "Sub", "Mul", "Max", "Min", "Div"]


@st.composite
def elementwise_models(draw):
    dtype = draw(st.sampled_from([np.float32, np.float32, np.int32]))
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    shape = draw(shapes)
    feeds = {"x0": _array(draw, shape, dtype)}
    inputs = [_vi("x0", elem, shape)]
    nodes, cur = [], "x0"
    for k in range(draw(st.integers(1, 4))):
        float_ok = dtype == np.float32
        op = draw(st.sampled_from(BINARY + (UNARY if float_ok else ["Abs", "Neg"])))
        out = f"v{k}"
        if op in BINARY:
            other = f"y{k}"
            oshape = _broadcast_partner(draw, shape)
            value = _array(draw, oshape, dtype, 0.5, 3.0) if op == "Div" else _array(draw, oshape, dtype)
            if op == "Div" and dtype == np.int32:
                op = "Mul"  # integer division rounds differently for negatives in the two runtimes' specs
            feeds[other] = value
            inputs.append(_vi(other, elem, oshape))
            nodes.append(h.make_node(op, [cur, other], [out]))
        else:
            nodes.append(h.make_node(op, [cur], [out]))
        cur = out
    nodes.append(h.make_node("Identity", [cur], ["out"]))
    return _model(nodes, inputs, [_vi("out", elem, None)]), feeds


@SETTINGS
@given(elementwise_models())
def test_elementwise(case):
    model, feeds = case
    compare(model, feeds, rtol=1e-4, atol=1e-5)


# -- reductions -------------------------------------------------------------------------------

REDUCE = [
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSumExp",
    "ReduceSumSquare",
]


@st.composite
def reduction_models(draw):
    shape = draw(st.lists(st.integers(1, 5), min_size=1, max_size=4).map(tuple))
    rank = len(shape)
    x = _array(draw, shape, np.float32, -1.5, 1.5)
    kind = draw(st.sampled_from(REDUCE + ["ArgMax", "ArgMin", "Softmax", "LogSoftmax"]))
    inits = []
    if kind in REDUCE:
        axes = sorted(
            draw(
                st.sets(st.integers(-rank, rank - 1), min_size=1, max_size=rank).filter(
                    lambda s: len({a % rank for a in s}) == len(s)
                )
            )
        )
        keepdims = draw(st.integers(0, 1))
        if kind == "ReduceSum":  # axes is an input since opset 13
            inits.append(nh.from_array(np.array(axes, np.int64), "axes"))
            node = h.make_node(kind, ["x", "axes"], ["out"], keepdims=keepdims)
        else:
            node = h.make_node(kind, ["x"], ["out"], axes=axes, keepdims=keepdims)
        elem = T.FLOAT
    elif kind in ("ArgMax", "ArgMin"):
        node = h.make_node(
            kind, ["x"], ["out"], axis=draw(st.integers(-rank, rank - 1)), keepdims=draw(st.integers(0, 1))
        )
        elem = T.INT64
    else:
        node = h.make_node(kind, ["x"], ["out"], axis=draw(st.integers(-rank, rank - 1)))
        elem = T.FLOAT
    return _model([node], [_vi("x", T.FLOAT, shape)], [_vi("out", elem, None)], inits), {"x": x}


@SETTINGS
@given(reduction_models())
def test_reductions(case):
    model, feeds = case
    compare(model, feeds, rtol=1e-4, atol=1e-4)


# -- matmul / conv ----------------------------------------------------------------------------


@st.composite
def matmul_conv_models(draw):
    kind = draw(st.sampled_from(["MatMul", "Gemm", "Conv"]))
    if kind == "MatMul":
        batch = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
        m, k, n = (draw(st.integers(1, 17)) for _ in range(3))
        a, b = _array(draw, batch + (m, k), np.float32), _array(draw, (k, n), np.float32)
        weight_const = draw(st.booleans())
        nodes = [h.make_node("MatMul", ["a", "b"], ["out"])]
        inputs = [_vi("a", T.FLOAT, a.shape)]
        feeds, inits = {"a": a}, []
        if weight_const:
            inits.append(nh.from_array(b, "b"))
        else:
            inputs.append(_vi("b", T.FLOAT, b.shape))
            feeds["b"] = b
        return _model(nodes, inputs, [_vi("out", T.FLOAT, None)], inits), feeds
    if kind == "Gemm":
        m, k, n = (draw(st.integers(1, 17)) for _ in range(3))
        ta, tb = draw(st.integers(0, 1)), draw(st.integers(0, 1))
        a = _array(draw, (k, m) if ta else (m, k), np.float32)
        w = _array(draw, (n, k) if tb else (k, n), np.float32)
        c = _array(draw, (n,), np.float32)
        node = h.make_node(
            "Gemm",
            ["a", "w", "c"],
            ["out"],
            transA=ta,
            transB=tb,
            alpha=draw(st.sampled_from([1.0, 0.5])),
            beta=draw(st.sampled_from([1.0, 2.0])),
        )
        return _model(
            [node],
            [_vi("a", T.FLOAT, a.shape)],
            [_vi("out", T.FLOAT, None)],
            [nh.from_array(w, "w"), nh.from_array(c, "c")],
        ), {"a": a}
    group = draw(st.sampled_from([1, 1, 2]))
    cin, cout = group * draw(st.integers(1, 3)), group * draw(st.integers(1, 3))
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    stride, dil = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    pad = draw(st.integers(0, 1))
    hh = draw(st.integers((kh - 1) * dil + 1, 9))
    ww = draw(st.integers((kw - 1) * dil + 1, 9))
    x = _array(draw, (1, cin, hh, ww), np.float32)
    w = _array(draw, (cout, cin // group, kh, kw), np.float32)
    b = _array(draw, (cout,), np.float32)
    nodes = [
        h.make_node(
            "Conv",
            ["x", "w", "b"],
            ["c"],
            group=group,
            strides=[stride, stride],
            dilations=[dil, dil],
            pads=[pad] * 4,
        )
    ]
    if draw(st.booleans()):
        nodes.append(h.make_node("Relu", ["c"], ["out"]))
    else:
        nodes.append(h.make_node("Identity", ["c"], ["out"]))
    return _model(
        nodes,
        [_vi("x", T.FLOAT, x.shape)],
        [_vi("out", T.FLOAT, None)],
        [nh.from_array(w, "w"), nh.from_array(b, "b")],
    ), {"x": x}


@SETTINGS
@given(matmul_conv_models())
def test_matmul_and_conv(case):
    model, feeds = case
    compare(model, feeds, rtol=1e-4, atol=1e-4)


# -- shape ops --------------------------------------------------------------------------------


@st.composite
def shape_models(draw):
    shape = draw(st.lists(st.integers(1, 4), min_size=2, max_size=4).map(tuple))
    rank = len(shape)
    dtype = draw(st.sampled_from([np.float32, np.int64]))
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    x = _array(draw, shape, dtype)
    kind = draw(
        st.sampled_from(
            ["Transpose", "Reshape", "Flatten", "Slice", "Concat", "Unsqueeze", "Squeeze", "Expand"]
        )
    )
    inits, inputs, feeds = [], [_vi("x", elem, shape)], {"x": x}
    if kind == "Transpose":
        perm = draw(st.permutations(list(range(rank))))
        node = h.make_node("Transpose", ["x"], ["out"], perm=perm)
    elif kind == "Reshape":
        total = int(np.prod(shape))
        target = [total] if draw(st.booleans()) else [-1, shape[-1]]
        inits.append(nh.from_array(np.array(target, np.int64), "s"))
        node = h.make_node("Reshape", ["x", "s"], ["out"])
    elif kind == "Flatten":
        node = h.make_node("Flatten", ["x"], ["out"], axis=draw(st.integers(0, rank)))
    elif kind == "Slice":
        axis = draw(st.integers(0, rank - 1))
        d = shape[axis]
        step = draw(st.sampled_from([1, 1, 2, -1]))
        if step > 0:
            start, end = draw(st.integers(0, d - 1)), draw(st.integers(1, d + 2))
            end = max(end, start + 1)
        else:
            start, end = draw(st.integers(0, d - 1)), -d - 1
        for name, v in (("st", start), ("en", end), ("ax", axis), ("sp", step)):
            inits.append(nh.from_array(np.array([v], np.int64), name))
        node = h.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["out"])
    elif kind == "Concat":
        axis = draw(st.integers(-rank, rank - 1))
        other = list(shape)
        other[axis % rank] = draw(st.integers(1, 3))
        y = _array(draw, tuple(other), dtype)
        inputs.append(_vi("y", elem, y.shape))
        feeds["y"] = y
        node = h.make_node("Concat", ["x", "y"], ["out"], axis=axis)
    elif kind == "Unsqueeze":
        inits.append(nh.from_array(np.array([draw(st.integers(-rank - 1, rank))], np.int64), "ax"))
        node = h.make_node("Unsqueeze", ["x", "ax"], ["out"])
    elif kind == "Squeeze":
        shape1 = shape[:1] + (1,) + shape[1:]
        x = x.reshape(shape1)
        feeds["x"], inputs[0] = x, _vi("x", elem, shape1)
        inits.append(nh.from_array(np.array([1], np.int64), "ax"))
        node = h.make_node("Squeeze", ["x", "ax"], ["out"])
    else:  # Expand
        target = [draw(st.sampled_from([1, 2])) if d == 1 else d for d in shape]
        target = [2] + target if draw(st.booleans()) else target
        inits.append(nh.from_array(np.array(target, np.int64), "s"))
        node = h.make_node("Expand", ["x", "s"], ["out"])
    nodes = [node, h.make_node("Identity", ["out"], ["y_out"])]
    return _model(nodes, inputs, [_vi("y_out", elem, None)], inits), feeds


@SETTINGS
@given(shape_models())
def test_shape_ops(case):
    model, feeds = case
    compare(model, feeds, rtol=0, atol=0)
