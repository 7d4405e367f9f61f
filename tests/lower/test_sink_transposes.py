"""nxrt_tvm.lower.sink_transposes: the elementwise ops between NHWC convs (a QDQ model's
quantize/dequantize pairs, hardswish and affine maps by one-element operands) run in NHWC, fused into
the conv before them, with the results onnxruntime computes."""

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

RNG = np.random.default_rng(7)
SCALE = 0.05  #: every activation's quantisation step


def _model(nodes: list, shape: list[int], inits: list) -> onnx.ModelProto:
    """`x` in, `y` out, both of `shape`."""
    graph = h.make_graph(
        nodes,
        "g",
        [h.make_tensor_value_info("x", T.FLOAT, shape)],
        [h.make_tensor_value_info("y", T.FLOAT, shape)],
        inits,
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _qdq_model(per_channel: bool) -> onnx.ModelProto:
    """conv -> Q/DQ -> conv -> Q/DQ, their residual sum -> Q/DQ -> conv: a QDQ export's shape (the first
    pair per channel, on axis 1, where `per_channel`)."""
    c = 8
    inits = [
        numpy_helper.from_array(RNG.standard_normal((c, c, 3, 3)).astype(np.float32) * 0.2, f"w{k}")
        for k in range(3)
    ]
    steps = np.linspace(0.03, 0.08, c).astype(np.float32) if per_channel else np.float32(SCALE)
    inits += [
        numpy_helper.from_array(np.asarray(steps), "s0"),
        numpy_helper.from_array(np.full(np.shape(steps), 128, np.uint8), "z0"),
        numpy_helper.from_array(np.float32(SCALE), "s"),
        numpy_helper.from_array(np.uint8(128), "z"),
    ]
    axis = {"axis": 1} if per_channel else {}
    nodes = [
        h.make_node("Conv", ["x", "w0"], ["a"], pads=[1] * 4),
        h.make_node("QuantizeLinear", ["a", "s0", "z0"], ["aq"], **axis),
        h.make_node("DequantizeLinear", ["aq", "s0", "z0"], ["ad"], **axis),
        h.make_node("Conv", ["ad", "w1"], ["b"], pads=[1] * 4),
        h.make_node("QuantizeLinear", ["b", "s", "z"], ["bq"]),
        h.make_node("DequantizeLinear", ["bq", "s", "z"], ["bd"]),
        h.make_node("Add", ["ad", "bd"], ["r"]),
        h.make_node("QuantizeLinear", ["r", "s", "z"], ["rq"]),
        h.make_node("DequantizeLinear", ["rq", "s", "z"], ["rd"]),
        h.make_node("Conv", ["rd", "w2"], ["y"], pads=[1] * 4),
    ]
    return _model(nodes, [1, c, 9, 7], inits)


@pytest.mark.parametrize("per_channel", [False, True], ids=["per-tensor", "per-channel"])
def test_qdq_pairs_match_onnxruntime(per_channel):
    """Against onnxruntime running the Q/DQ nodes as written (no QLinearConv fusion, which computes in
    int8 and rounds elsewhere): within one quantisation step of the last conv's input, as a value at a
    rounding half-point lands on either side whatever sums the conv before it."""
    model = _qdq_model(per_channel)
    x = RNG.standard_normal((1, 8, 9, 7)).astype(np.float32)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ref = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    want = ref.run(None, {"x": x})[0]
    session = nx.InferenceSession(model, provider_options=[{"target": "llvm", "claim_policy": "all"}, {}])
    assert [str(p.ep) for p in session.plan.partitions] == ["TvmExecutionProvider"]
    got = session.run(None, {"x": x})[0]
    step = SCALE * float(np.abs(numpy_helper.to_array(model.graph.initializer[2])).sum(axis=(1, 2, 3)).max())
    np.testing.assert_allclose(got, want, rtol=0, atol=step)
    assert np.mean(np.isclose(got, want, rtol=1e-5, atol=1e-5)) > 0.95  # most elements agree exactly


@pytest.mark.parametrize("per_channel", [False, True], ids=["per-tensor", "per-channel"])
def test_qdq_pairs_fuse_into_the_nhwc_convs_before_them(per_channel):
    """Each pair was a kernel of its own between two transposes (NHWC -> NCHW, the pair, back); the
    residual sum too. Now only the model's own NCHW input and output are transposed."""
    target = make_target("llvm")
    lowered = pipeline.lowering_pipeline(target, pipeline.Lowering())(import_onnx(_qdq_model(per_channel)))
    kernels = [gv.name_hint for gv, f in lowered.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert sum("transpose" in n for n in kernels) <= 2, kernels
    if per_channel:  # the three convs, the pairs (and the sum) in their epilogues
        assert sum("conv2d" in n for n in kernels) == 3 and len(kernels) == 5, kernels
    else:  # the sum of two per-tensor pairs is onnxruntime's QLinearAdd (`qlinear`), in the second
        # conv's epilogue; the first pair (as float math, `fake_quant`) is a kernel of its own, since the
        # sum reads the 8-bit values too; the first and last convs share one kernel
        assert sum("conv2d" in n for n in kernels) == 2 and len(kernels) == 5, kernels


def _hardswish_affine_model() -> onnx.ModelProto:
    """PP-OCR's block: conv, hardswish (``x * clip(x + 3, 0, 6) / 6``) and a learnable affine map
    (``a * x + b``), its divisor and affine parameters one-element tensors (not the tensor's rank)."""
    c = 16
    inits = [
        numpy_helper.from_array(RNG.standard_normal((c, c, 3, 3)).astype(np.float32) * 0.1, f"w{k}")
        for k in range(2)
    ]
    scalars = [("three", 3.0), ("lo", 0.0), ("hi", 6.0), ("six", [6.0]), ("a", [1.5]), ("b", [0.25])]
    inits += [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in scalars]
    nodes = [
        h.make_node("Conv", ["x", "w0"], ["y0"], pads=[1] * 4),
        h.make_node("Add", ["y0", "three"], ["t"]),
        h.make_node("Clip", ["t", "lo", "hi"], ["r"]),
        h.make_node("Mul", ["y0", "r"], ["m"]),
        h.make_node("Div", ["m", "six"], ["hs"]),
        h.make_node("Mul", ["a", "hs"], ["s"]),
        h.make_node("Add", ["s", "b"], ["z"]),
        h.make_node("Conv", ["z", "w1"], ["y"], pads=[1] * 4),
    ]
    return _model(nodes, [1, c, 10, 9], inits)


def test_ops_with_one_element_operands_fuse_into_the_conv_before_them():
    """Layout conversion kept the division and the affine map in NCHW (their one-element operands are
    not of the tensor's rank): a kernel of two transposes after the conv. Moved past the transpose, the
    whole chain is the conv's epilogue, and the results are onnxruntime's."""
    model = _hardswish_affine_model()
    lowered = pipeline.lowering_pipeline(make_target("llvm"), pipeline.Lowering())(import_onnx(model))
    kernels = [gv.name_hint for gv, f in lowered.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert sum("transpose" in n for n in kernels) <= 2 and len(kernels) == 4, kernels
    x = RNG.standard_normal((1, 16, 10, 9)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )
    session = nx.InferenceSession(model, provider_options=[{"target": "llvm", "claim_policy": "all"}, {}])
    np.testing.assert_allclose(session.run(None, {"x": x})[0], want[0], rtol=1e-4, atol=1e-4)
