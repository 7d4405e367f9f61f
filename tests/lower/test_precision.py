"""The precision policy: each approximation's measured error, and where the policy allows it.

Errors are measured against float64 math over each approximation's documented domain (2**18
evenly spaced float32 points, plus the domain's ends); the bound is `Approximation.max_error`.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper
from parity import ort_run
from relax_calls import called
from tvm import relax, te, topi

import nxrt_tvm as nx
from nxrt_tvm.frontend import import_onnx
from nxrt_tvm.lower.precision import APPROXIMATIONS, PreciseFastMath, fast_sigmoid, fast_softmax

_REFERENCE = {
    "relax.exp": (topi.fast_exp, np.exp),
    "relax.erf": (topi.fast_erf, np.vectorize(math.erf)),
    "relax.tanh": (topi.fast_tanh, np.tanh),
    "relax.sigmoid": (fast_sigmoid, lambda x: 1.0 / (1.0 + np.exp(-x))),
}


def _run_te(fn, x: np.ndarray) -> np.ndarray:
    placeholder = te.placeholder(x.shape, "float32", "x")
    func = te.create_prim_func([placeholder, fn(placeholder)])
    lib = tvm.compile(tvm.IRModule({"main": func}), target="llvm")
    out = tvm.runtime.empty(x.shape, "float32")
    lib(tvm.runtime.tensor(x), out)
    return out.numpy()


@pytest.mark.parametrize("approx", APPROXIMATIONS, ids=lambda a: a.op)
def test_each_approximation_stays_within_its_documented_error(approx):
    lo, hi = approx.domain
    if approx.op == "relax.nn.softmax":
        x = np.random.default_rng(0).uniform(lo, hi, (1024, 256)).astype(np.float32)
        got = _run_te(lambda t: fast_softmax(t, -1), x)
        e = np.exp(x.astype(np.float64) - x.max(-1, keepdims=True))
        error = np.abs(got - e / e.sum(-1, keepdims=True)).max()
    else:
        fast, exact = _REFERENCE[approx.op]
        x = np.linspace(lo, hi, 1 << 18, dtype=np.float32)
        want = exact(x.astype(np.float64)).astype(np.float64)
        error = (np.abs(_run_te(fast, x) - want) / np.maximum(np.abs(want), np.finfo(np.float32).tiny)).max()
    assert approx.error in ("relative", "absolute")
    assert error <= approx.max_error, (
        f"{approx.op}: measured {approx.error} error {error:.3g} > {approx.max_error:g}"
    )


def _model(nodes, outputs, shape=(2, 8)) -> onnx.ModelProto:
    graph = h.make_graph(
        nodes,
        "g",
        [h.make_tensor_value_info("x", T.FLOAT, list(shape))],
        [h.make_tensor_value_info(n, e, None) for n, e in outputs],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


#: (nodes after the approximable op `a = Op(x)`, the discrete output) for each kind of discrete consumer
DISCRETE = {
    "cast-to-int": ([h.make_node("Cast", ["a"], ["y"], to=T.INT64)], T.INT64),
    "floor": ([h.make_node("Floor", ["a"], ["y"])], T.FLOAT),
    "round-after-arithmetic": (
        [h.make_node("Mul", ["a", "a"], ["b"]), h.make_node("Round", ["b"], ["y"])],
        T.FLOAT,
    ),
    "comparison": ([h.make_node("Less", ["a", "x"], ["y"])], T.BOOL),
    "argmax": ([h.make_node("ArgMax", ["a"], ["y"], axis=1)], T.INT64),
    "topk-indices": ([h.make_node("TopK", ["a", "k"], ["v", "y"], axis=1)], T.INT64),
    "where-mask": (
        [h.make_node("Greater", ["a", "x"], ["m"]), h.make_node("Where", ["m", "x", "a"], ["y"])],
        T.FLOAT,
    ),
}


@pytest.mark.parametrize("op", ["Exp", "Erf", "Tanh", "Sigmoid", "Softmax"])
@pytest.mark.parametrize("consumer", sorted(DISCRETE))
def test_values_that_reach_a_discrete_consumer_stay_exact(op, consumer):
    nodes, elem = DISCRETE[consumer]
    model = _model([h.make_node(op, ["x"], ["a"]), *nodes], [("y", elem)])
    if consumer == "topk-indices":
        model.graph.initializer.append(onnx.numpy_helper.from_array(np.array([3], np.int64), "k"))
    ops = called(PreciseFastMath()(import_onnx(model)))
    exact = {"Softmax": "relax.nn.softmax"}.get(op, f"relax.{op.lower()}")
    assert exact in ops and not any(o.startswith("fast_") for o in ops), ops


@pytest.mark.parametrize("op", ["Exp", "Erf", "Tanh", "Sigmoid", "Softmax"])
def test_values_that_only_reach_float_outputs_are_approximated(op):
    model = _model([h.make_node(op, ["x"], ["a"]), h.make_node("Relu", ["a"], ["y"])], [("y", T.FLOAT)])
    ops = called(PreciseFastMath()(import_onnx(model)))
    assert any(o.startswith("fast_") for o in ops) and f"relax.{op.lower()}" not in ops, ops


def test_one_value_approximated_for_its_float_use_stays_exact_for_its_discrete_use():
    """exp(x) feeding a float output and, through a Mul, an integer cast: exact (the discrete use wins)."""
    nodes = [
        h.make_node("Exp", ["x"], ["a"]),
        h.make_node("Relu", ["a"], ["f"]),
        h.make_node("Mul", ["a", "x"], ["b"]),
        h.make_node("Cast", ["b"], ["i"], to=T.INT32),
        h.make_node("Exp", ["x"], ["c"]),
        h.make_node("Neg", ["c"], ["g"]),
    ]
    ops = called(
        PreciseFastMath()(import_onnx(_model(nodes, [("f", T.FLOAT), ("i", T.INT32), ("g", T.FLOAT)])))
    )
    assert ops.count("relax.exp") == 1 and ops.count("fast_exp") == 1, ops


def _floor_flips() -> np.ndarray:
    """float32 x near log(k) where floor(exp(x)) is k exactly, but fast_exp(x) falls below k."""
    ks = np.arange(2, 4000, dtype=np.float64)
    x = np.log(ks).astype(np.float32)
    candidates = np.concatenate([np.nextafter(x, np.float32(np.inf)), x])
    exact = np.floor(np.exp(candidates.astype(np.float64)).astype(np.float32))
    fast = np.floor(_run_te(topi.fast_exp, candidates))
    return candidates[exact != fast]


def test_an_integer_cast_of_exp_matches_onnxruntime_where_fast_exp_would_flip_it():
    """The regression: TVM's FastMathTransform made floor/int(exp(x)) one less at these x."""
    x = _floor_flips()
    assert x.size >= 8, "no input where fast_exp flips floor(exp(x)): the test lost its teeth"
    model = _model(
        [h.make_node("Exp", ["x"], ["a"]), h.make_node("Cast", ["a"], ["y"], to=T.INT64)],
        [("y", T.INT64)],
        shape=[x.size],
    )
    want = ort_run(model, {"x": x})[0]
    exact = np.exp(x.astype(np.float64)).astype(np.float32).astype(np.int64)
    agree = want == exact  # keep the points where onnxruntime's own exp is exact too
    assert agree.mean() > 0.5
    sess = nx.InferenceSession(model)
    assert sess.plan.nodes_by_ep() == {"TvmExecutionProvider": 2}
    got = sess.run(None, {"x": x})[0]
    np.testing.assert_array_equal(got[agree], want[agree])


def test_quantisation_is_not_a_discrete_consumer():
    """DynamicQuantizeLinear rounds its input and its zero point, but both only come back as floats:
    the softmax and GELU before it stay approximated (their tolerance is a quantisation step)."""
    nodes = [
        h.make_node("Softmax", ["x"], ["a"]),
        h.make_node("Erf", ["a"], ["b"]),
        h.make_node("DynamicQuantizeLinear", ["b"], ["q", "s", "z"]),
        h.make_node("DequantizeLinear", ["q", "s", "z"], ["y"]),
    ]
    ops = called(PreciseFastMath()(import_onnx(_model(nodes, [("y", T.FLOAT)]))))
    assert "fast_softmax" in ops and "fast_erf" in ops and "relax.nn.softmax" not in ops, ops
    cast = [
        h.make_node("Softmax", ["x"], ["a"]),
        h.make_node("DynamicQuantizeLinear", ["a"], ["q", "s", "z"]),
        h.make_node("Cast", ["s"], ["y"], to=T.INT32),
    ]  # the scale itself cast to an integer: exact
    ops = called(PreciseFastMath()(import_onnx(_model(cast, [("y", T.INT32)]))))
    assert "relax.nn.softmax" in ops, ops


def test_a_zero_point_into_an_integer_matmul_is_a_quantisation_parameter():
    """MatMulInteger's import casts DynamicQuantizeLinear's zero point to int32 and subtracts it, and
    casts its (float) product back to int32: both looked discrete, so the softmax and GELU before every
    quantised matmul of a dynamic-int8 BERT ran exact (erf in libm: its GELU kernels 2x the time)."""
    nodes = [
        h.make_node("Softmax", ["x"], ["a"]),
        h.make_node("Erf", ["a"], ["b"]),
        h.make_node("DynamicQuantizeLinear", ["b"], ["q", "s", "z"]),
        h.make_node("Constant", [], ["w"], value=numpy_helper.from_array(np.ones((8, 4), np.int8))),
        h.make_node("Constant", [], ["wz"], value=numpy_helper.from_array(np.array(0, np.int8))),
        h.make_node("MatMulInteger", ["q", "w", "z", "wz"], ["i"]),
        h.make_node("Cast", ["i"], ["f"], to=T.FLOAT),
        h.make_node("Mul", ["f", "s"], ["y"]),
    ]
    ops = called(PreciseFastMath()(import_onnx(_model(nodes, [("y", T.FLOAT)]))))
    assert "fast_softmax" in ops and "fast_erf" in ops and "relax.nn.softmax" not in ops, ops


def test_a_tensor_of_unknown_shape_stays_exact_instead_of_failing_the_pass():
    """The fast ops are TE, which needs a shape expression: a rank-only tensor (a value whose shape TVM
    cannot name, as in the transformers BERT export) keeps the exact op. Strict mode found this one."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(ndim=2, dtype="float32"))
    with bb.function("main", [x]):
        y = bb.emit(relax.op.exp(x))
        bb.emit_func_output(relax.op.tanh(y))
    mod = PreciseFastMath()(bb.get())
    text = mod.script()
    assert "R.exp(" in text and "R.tanh(" in text and "fast" not in text
