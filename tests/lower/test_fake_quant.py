"""nxrt_tvm.lower.fake_quant: a quantize/dequantize pair as float arithmetic, bit for bit what onnxruntime
computes (ties to even, saturation, either sign of zero point)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tvm
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

import nxrt_tvm as nx
from nxrt_tvm.frontend import import_onnx
from nxrt_tvm.lower import pipeline
from nxrt_tvm.lower.target import make_target

SCALE = 0.25
#: in quantisation steps: ties both ways, just under a tie, zero, saturation at both ends
STEPS = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49, 3.5, 4.5, 0.0, 100.0, -100.0, 1e9, -1e9, 7.5, -7.5]


def _pair(dtype: int, zero: int, scale: float = SCALE, per_channel: bool = False) -> onnx.ModelProto:
    n = len(STEPS)
    shape = (n,) if per_channel else ()
    inits = [
        numpy_helper.from_array(np.full(shape, scale, np.float32), "s"),
        numpy_helper.from_array(np.full(shape, zero, onnx.helper.tensor_dtype_to_np_dtype(dtype)), "z"),
    ]
    axis = {"axis": 0} if per_channel else {}
    nodes = [
        h.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], **axis),
        h.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], **axis),
    ]
    graph = h.make_graph(
        nodes,
        "pair",
        [h.make_tensor_value_info("x", T.FLOAT, [n])],
        [h.make_tensor_value_info("y", T.FLOAT, [n])],
        inits,
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("dtype,zero", [(T.INT8, 3), (T.INT8, -128), (T.UINT8, 128), (T.UINT8, 0)])
def test_the_pair_as_float_math_is_what_onnxruntime_computes(dtype, zero):
    model = _pair(dtype, zero)
    x = np.asarray(STEPS, np.float32) * SCALE
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    session = nx.InferenceSession(model, provider_options=[{"target": "llvm", "claim_policy": "all"}, {}])
    assert [str(p.ep) for p in session.plan.partitions] == ["TvmExecutionProvider"]
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], want)


def _kernel_text(model: onnx.ModelProto) -> str:
    lowered = pipeline.lowering_pipeline(make_target("llvm"), pipeline.Lowering())(import_onnx(model))
    return "\n".join(f.script() for _, f in lowered.functions_items() if isinstance(f, tvm.tirx.PrimFunc))


def test_the_pair_has_no_integer_casts():
    """TVM's lowering went float -> 8 bits -> int32 -> float in the epilogue; the rewrite stays in float."""
    text = _kernel_text(_pair(T.UINT8, 128))
    assert "round" in text and "int8" not in text and "int32" not in text, text


def test_a_pair_per_channel_keeps_tvms_lowering():
    """One scale per channel is left to TVM's quantize/dequantize (the rewrite takes one constant)."""
    assert "uint8" in _kernel_text(_pair(T.UINT8, 128, per_channel=True))
