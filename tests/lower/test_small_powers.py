"""``pow`` by 2, 3 or 4 becomes products, by 0.75 or 1.5 square roots; other exponents stay ``pow``;
results match onnxruntime.

Tolerance: exact on signs, zeros, infinities and NaN; finite values within rtol 1e-6 (onnxruntime
multiplies for 2 and 3 too; ``powf`` is within an ulp, the square roots within 2).
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import te

import nxrt_tvm as nx
from nxrt_tvm.lower.small_powers import SmallPowers


@pytest.mark.parametrize(
    "exponent, rewritten",
    [
        (2.0, True),
        (3.0, True),
        (4.0, True),
        (0.75, True),
        (1.5, True),
        (0.5, False),
        (2.5, False),
        (5.0, False),
    ],
)
def test_small_exponents_become_products_and_square_roots(exponent, rewritten):
    x = te.placeholder((16,), "float32", name="x")
    y = te.compute((16,), lambda i: tvm.tirx.pow(x[i], tvm.tirx.const(exponent, "float32")), name="y")
    mod = SmallPowers(tvm.IRModule({"main": te.create_prim_func([x, y])}))
    assert ("T.pow" in mod["main"].script()) != rewritten


@pytest.mark.parametrize("exponent", [2.0, 3.0, 4.0, 0.75, 1.5, 2.5])
def test_pow_matches_onnxruntime(exponent):
    graph = helper.make_graph(
        [helper.make_node("Pow", ["x", "e"], ["p"]), helper.make_node("Mul", ["p", "e"], ["out"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 37])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["n", 37])],
        initializer=[numpy_helper.from_array(np.array(exponent, np.float32), "e")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    x = np.random.default_rng(0).uniform(-3, 3, (5, 37)).astype(np.float32)
    x[0, :6] = [0.0, -0.0, np.inf, -np.inf, np.nan, -1.0]
    session = nx.InferenceSession(model, providers=["TvmExecutionProvider"])
    got = session.run(None, {"x": x})[0]
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


def test_the_cpu_pipeline_calls_no_pow_for_a_cube():
    from nxrt_tvm.lower.target import make_target
    from nxrt_tvm.lower.tir_pipeline import CPU_TIR_PIPELINE

    x = te.placeholder((64,), "float32", name="x")
    y = te.compute((64,), lambda i: tvm.tirx.pow(x[i], tvm.tirx.const(3.0, "float32")), name="y")
    mod = tvm.IRModule({"main": te.create_prim_func([x, y])})
    target = make_target("llvm")
    assert "llvm.pow" in tvm.tirx.build(mod, target).inspect_source("ll")  # TVM's own: lane by lane powf
    assert "pow" not in tvm.tirx.build(mod, target, pipeline=CPU_TIR_PIPELINE).inspect_source("ll")
