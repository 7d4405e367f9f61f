"""nxrt_tvm.lower.qlinear: a QDQ model's conv / matmul / add groups computed as onnxruntime's QLinearConv,
QGemm and QLinearAdd compute them, compared with onnxruntime to the bit (the outputs are the 8-bit
integers: tolerance 0). One layer's float form lands one step off only where a value sits within an ulp
of a tie, rarely; a stack of layers carries each such step on, so the stack's case first checks that
onnxruntime's literal QDQ arithmetic (graph optimisations off) ends elsewhere than its fused kernels on
the same feeds: a float form would fail it."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

import nxrt_tvm as nx
from nxrt_tvm.frontend import import_onnx
from nxrt_tvm.lower import pipeline
from nxrt_tvm.lower.qlinear import QLinearAsOnnxruntime
from nxrt_tvm.lower.schedules.vnni import has_vnni
from nxrt_tvm.lower.target import make_target

AVX2_CPU = {"kind": "llvm", "mcpu": "haswell"}  # no VNNI: every accumulator in float32; runs on any host
VNNI_CPU = {"kind": "llvm", "mcpu": "znver4"}
HOST_HAS_VNNI = has_vnni(make_target("llvm"))
_NP = {T.UINT8: np.uint8, T.INT8: np.int8}


def _model(nodes: list, inputs: list, outputs: list, inits: list) -> onnx.ModelProto:
    model = h.make_model(
        h.make_graph(nodes, "qdq", inputs, outputs, inits), opset_imports=[h.make_opsetid("", 17)]
    )
    model.ir_version = 8
    return model


def _quantized_input(name: str, dtype: int, scale: float, zero: int) -> tuple[list, list]:
    """Nodes and initializers that quantize float input `name` and dequantize it again."""
    inits = [
        nh.from_array(np.array(scale, np.float32), f"{name}_s"),
        nh.from_array(np.array(zero, _NP[dtype]), f"{name}_z"),
    ]
    nodes = [
        h.make_node("QuantizeLinear", [name, f"{name}_s", f"{name}_z"], [f"{name}_q"]),
        h.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"], [f"{name}_dq"]),
    ]
    return nodes, inits


def _conv(cin: int, cout: int, k: int, pads: int, stride: int, group: int, size: int, dtype: int = T.UINT8):
    """Q(Conv(DQ(Q(x)), DQ(W per channel), DQ(int32 bias at sx * sw))), as static quantisation writes it."""
    rng = np.random.default_rng(cin * 100 + cout + k)
    x_scale, y_scale = 0.02, 0.05
    x_zero, y_zero = (128, 117) if dtype == T.UINT8 else (3, -5)
    w_scale = (rng.random(cout) * 0.004 + 0.001).astype(np.float32)
    bias_scale = (np.float32(x_scale) * w_scale).astype(np.float32)
    nodes, inits = _quantized_input("x", dtype, x_scale, x_zero)
    inits += [
        nh.from_array(rng.integers(-127, 128, (cout, cin // group, k, k)).astype(np.int8), "w_q"),
        nh.from_array(w_scale, "w_s"),
        nh.from_array(np.zeros(cout, np.int8), "w_z"),
        nh.from_array(rng.integers(-3000, 3000, cout).astype(np.int32), "b_q"),
        nh.from_array(bias_scale, "b_s"),
        nh.from_array(np.zeros(cout, np.int32), "b_z"),
        nh.from_array(np.array(y_scale, np.float32), "y_s"),
        nh.from_array(np.array(y_zero, _NP[dtype]), "y_z"),
    ]
    nodes += [
        h.make_node("DequantizeLinear", ["w_q", "w_s", "w_z"], ["w"], axis=0),
        h.make_node("DequantizeLinear", ["b_q", "b_s", "b_z"], ["b"], axis=0),
        h.make_node("Conv", ["x_dq", "w", "b"], ["c"], pads=[pads] * 4, strides=[stride] * 2, group=group),
        h.make_node("QuantizeLinear", ["c", "y_s", "y_z"], ["y"]),
    ]
    inputs = [h.make_tensor_value_info("x", T.FLOAT, [1, cin, size, size])]
    return _model(nodes, inputs, [h.make_tensor_value_info("y", dtype, None)], inits)


def _add(dtype: int = T.UINT8):
    """Q(Add(DQ(Q(a)), DQ(Q(b)))): onnxruntime's QLinearAdd."""
    nodes, inits = _quantized_input("a", dtype, 0.031, 121 if dtype == T.UINT8 else -7)
    more_nodes, more_inits = _quantized_input("b", dtype, 0.047, 133 if dtype == T.UINT8 else 9)
    inits += [*more_inits, nh.from_array(np.array(0.059, np.float32), "y_s")]
    inits.append(nh.from_array(np.array(126 if dtype == T.UINT8 else 2, _NP[dtype]), "y_z"))
    nodes += [
        *more_nodes,
        h.make_node("Add", ["a_dq", "b_dq"], ["c"]),
        h.make_node("QuantizeLinear", ["c", "y_s", "y_z"], ["y"]),
    ]
    inputs = [h.make_tensor_value_info(n, T.FLOAT, [2, 64, 40, 40]) for n in ("a", "b")]
    return _model(nodes, inputs, [h.make_tensor_value_info("y", dtype, None)], inits)


def _gemm(depth: int, cols: int):
    """Q(Gemm(DQ(Q(x)), DQ(W [cols, depth] per row), DQ(int32 bias))): onnxruntime's QGemm."""
    rng = np.random.default_rng(depth)
    w_scale = (rng.random(cols) * 0.004 + 0.001).astype(np.float32)
    nodes, inits = _quantized_input("x", T.UINT8, 0.02, 128)
    inits += [
        nh.from_array(rng.integers(-127, 128, (cols, depth)).astype(np.int8), "w_q"),
        nh.from_array(w_scale, "w_s"),
        nh.from_array(np.zeros(cols, np.int8), "w_z"),
        nh.from_array(rng.integers(-3000, 3000, cols).astype(np.int32), "b_q"),
        nh.from_array((np.float32(0.02) * w_scale).astype(np.float32), "b_s"),
        nh.from_array(np.zeros(cols, np.int32), "b_z"),
        nh.from_array(np.array(0.05, np.float32), "y_s"),
        nh.from_array(np.array(120, np.uint8), "y_z"),
    ]
    nodes += [
        h.make_node("DequantizeLinear", ["w_q", "w_s", "w_z"], ["w"], axis=0),
        h.make_node("DequantizeLinear", ["b_q", "b_s", "b_z"], ["b"], axis=0),
        h.make_node("Gemm", ["x_dq", "w", "b"], ["c"], transB=1),
        h.make_node("QuantizeLinear", ["c", "y_s", "y_z"], ["y"]),
    ]
    inputs = [h.make_tensor_value_info("x", T.FLOAT, [512, depth])]
    return _model(nodes, inputs, [h.make_tensor_value_info("y", T.UINT8, None)], inits)


def _stack(blocks: int) -> onnx.ModelProto:
    """A MobileNetV2-like QDQ net: a 3x3 stem, then inverted residual blocks (pointwise 16 -> 32 and a
    Relu, depthwise 3x3 and a ReLU6 (Clip), pointwise 32 -> 16, an add of the block's input), every
    activation uint8."""
    rng = np.random.default_rng(7)
    nodes, inits = _quantized_input("x", T.UINT8, 0.02, 128)
    inits += [nh.from_array(np.array(v, np.float32), n) for n, v in (("zero", 0.0), ("six", 6.0))]
    count = iter(range(1000))

    def requantized(name: str, source: str, zero: int = 128, scale: float | None = None) -> str:
        scale = float(rng.random() * 0.03 + 0.04) if scale is None else scale
        inits.extend(
            [
                nh.from_array(np.array(scale, np.float32), f"{name}_s"),
                nh.from_array(np.array(zero, np.uint8), f"{name}_z"),
            ]
        )
        nodes.append(h.make_node("QuantizeLinear", [source, f"{name}_s", f"{name}_z"], [f"{name}_q"]))
        nodes.append(h.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"], [f"{name}_dq"]))
        return name

    def conv(
        source: str, source_scale: float, cin: int, cout: int, k: int, group: int = 1, act: str = ""
    ) -> str:
        name = f"c{next(count)}"
        w_scale = (rng.random(cout) * 0.004 + 0.001).astype(np.float32)
        inits.extend(
            [
                nh.from_array(
                    rng.integers(-127, 128, (cout, cin // group, k, k)).astype(np.int8), f"{name}_wq"
                ),
                nh.from_array(w_scale, f"{name}_ws"),
                nh.from_array(np.zeros(cout, np.int8), f"{name}_wz"),
                nh.from_array(rng.integers(-2000, 2000, cout).astype(np.int32), f"{name}_bq"),
                nh.from_array((np.float32(source_scale) * w_scale).astype(np.float32), f"{name}_bs"),
                nh.from_array(np.zeros(cout, np.int32), f"{name}_bz"),
            ]
        )
        nodes.extend(
            [
                h.make_node(
                    "DequantizeLinear", [f"{name}_wq", f"{name}_ws", f"{name}_wz"], [f"{name}_w"], axis=0
                ),
                h.make_node(
                    "DequantizeLinear", [f"{name}_bq", f"{name}_bs", f"{name}_bz"], [f"{name}_b"], axis=0
                ),
                h.make_node(
                    "Conv", [f"{source}_dq", f"{name}_w", f"{name}_b"], [name], pads=[k // 2] * 4, group=group
                ),
            ]
        )
        if act == "relu":  # a quantize clamping at 0 makes it redundant
            nodes.append(h.make_node("Relu", [name], [f"{name}_relu"]))
            return requantized(name, f"{name}_relu", zero=0)
        if act == "relu6":  # a quantize to [0, 6] makes it redundant
            nodes.append(h.make_node("Clip", [name, "zero", "six"], [f"{name}_relu6"]))
            return requantized(name, f"{name}_relu6", zero=0, scale=6 / 255)
        return requantized(name, name)

    def scale_of(name: str) -> float:
        return float(next(nh.to_array(i) for i in inits if i.name == f"{name}_s"))

    x = conv("x", 0.02, 3, 16, 3)
    for _ in range(blocks):
        y = conv(x, scale_of(x), 16, 32, 1, act="relu")
        y = conv(y, scale_of(y), 32, 32, 3, group=32, act="relu6")
        y = conv(y, scale_of(y), 32, 16, 1)
        nodes.append(h.make_node("Add", [f"{x}_dq", f"{y}_dq"], [f"a{next(count)}"]))
        x = requantized(nodes[-1].output[0], nodes[-1].output[0])
    outputs = [h.make_tensor_value_info(f"{x}_q", T.UINT8, None)]
    return _model(nodes, [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 24, 24])], outputs, inits)


def _ort(model: onnx.ModelProto, feeds: dict, fused: bool) -> np.ndarray:
    options = ort.SessionOptions()
    if not fused:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(
        None, feeds
    )[0]


def _check(model: onnx.ModelProto, feeds: dict, cpus=("llvm", AVX2_CPU), telling: bool = False) -> None:
    """The model's output on each CPU target equals onnxruntime's; where `telling`, the literal form's
    differs (the case tells the arithmetics apart)."""
    want = _ort(model, feeds, fused=True)
    if telling:
        assert np.any(want != _ort(model, feeds, fused=False)), "the case does not tell the arithmetics apart"
    for cpu in cpus:
        session = nx.InferenceSession(model, provider_options=[{"target": cpu, "claim_policy": "all"}, {}])
        assert [str(p.ep) for p in session.plan.partitions] == ["TvmExecutionProvider"]
        np.testing.assert_array_equal(session.run(None, feeds)[0], want, err_msg=str(cpu))


def _feeds(model: onnx.ModelProto, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in model.graph.input:
        shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
        feeds[value.name] = (rng.standard_normal(shape) * 1.5).astype(np.float32)
    return feeds


def test_a_quantized_net_is_onnxruntimes_integers():
    model = _stack(blocks=4)
    _check(model, _feeds(model), telling=True)


@pytest.mark.parametrize(
    ("cin", "cout", "k", "pads", "stride", "group", "size"),
    [
        (32, 48, 1, 0, 1, 1, 48),  # pointwise: the VNNI kernel where the host has it
        (3, 16, 3, 1, 2, 1, 96),  # a first layer: padded (with the zero point), strided
        (32, 32, 3, 1, 2, 32, 65),  # depthwise, odd map
        (32, 32, 3, 1, 1, 1, 32),  # a Winograd-sized 3x3: must stay a direct convolution to be exact
        (24, 40, 1, 0, 1, 1, 37),  # output channels not whole vectors
    ],
)
def test_a_quantized_convolution_is_onnxruntimes_integers(cin, cout, k, pads, stride, group, size):
    model = _conv(cin, cout, k, pads, stride, group, size)
    _check(model, _feeds(model))


def test_a_winograd_sized_quantized_convolution_stays_direct():
    """Winograd's transforms are not exact: the integer convolution keeps the direct rule."""
    lowered = pipeline.lowering_pipeline(make_target("llvm"), pipeline.Lowering())(
        import_onnx(_conv(32, 32, 3, 1, 1, 1, 32))
    )
    assert not [gv.name_hint for gv in lowered.functions if "winograd" in gv.name_hint]


def test_int8_activations():
    model = _conv(16, 32, 3, 1, 1, 1, 40, dtype=T.INT8)
    _check(model, _feeds(model))


@pytest.mark.parametrize("dtype", [T.UINT8, T.INT8])
def test_a_quantized_add_is_onnxruntimes_fused_multiply_adds(dtype):
    """MLAS adds the raw 8-bit values in two fused multiply-adds: the literal form lands elsewhere."""
    model = _add(dtype)
    _check(model, _feeds(model))


@pytest.mark.parametrize("depth", [256, 254])  # the VNNI kernel (whole groups of 4) and float32 sums
def test_a_quantized_dense_layer_is_onnxruntimes_integers(depth):
    model = _gemm(depth, 48)
    _check(model, _feeds(model))


def _rewritten(model: onnx.ModelProto, cpu) -> bool:
    """Whether the pass took the model's group: no quantize op left after it but its inputs'."""
    inputs = len(model.graph.input)
    return str(QLinearAsOnnxruntime(make_target(cpu))(import_onnx(model))).count("R.quantize(") == inputs


def test_a_contraction_without_an_exact_accumulator_keeps_the_qdq_arithmetic():
    """2048 input channels of weights 127 from uint8 steps of up to 128: partial sums past 2**24, so
    float32 would round them; without VNNI the group is left as the QDQ nodes' float arithmetic."""
    model = _conv(2048, 16, 1, 0, 1, 1, 4)
    weights = next(i for i in model.graph.initializer if i.name == "w_q")
    weights.CopyFrom(nh.from_array(np.full((16, 2048, 1, 1), 127, np.int8), "w_q"))
    assert _rewritten(model, VNNI_CPU) and not _rewritten(model, AVX2_CPU)


def test_a_relu_the_quantize_does_not_make_redundant_is_kept():
    """A Relu before a quantize whose zero point is not 0 changes what it quantizes: the group is left."""
    model = _conv(16, 16, 1, 0, 1, 1, 4)
    conv = next(n for n in model.graph.node if n.op_type == "Conv")
    conv.output[0] = "r"
    model.graph.node.insert(list(model.graph.node).index(conv) + 1, h.make_node("Relu", ["r"], ["c"]))
    assert not _rewritten(model, AVX2_CPU)


def _clipped(scale: float) -> onnx.ModelProto:
    """A quantized conv, then a ReLU6 (Clip to [0, 6]), then the quantize (zero point 0, `scale`)."""
    model = _conv(16, 16, 1, 0, 1, 1, 4)
    conv = next(n for n in model.graph.node if n.op_type == "Conv")
    conv.output[0] = "r"
    clip = h.make_node("Clip", ["r", "lo", "hi"], ["c"])
    model.graph.node.insert(list(model.graph.node).index(conv) + 1, clip)
    model.graph.initializer.extend(
        [nh.from_array(np.array(v, np.float32), n) for n, v in (("lo", 0), ("hi", 6))]
    )
    for name, value, dtype in (("y_s", scale, np.float32), ("y_z", 0, np.uint8)):
        next(i for i in model.graph.initializer if i.name == name).CopyFrom(
            nh.from_array(np.array(value, dtype), name)
        )
    return model


def test_a_clip_the_quantize_does_not_make_redundant_is_kept():
    """A ReLU6 before a quantize whose range reaches past 6 (0.03 * 255) clips what it quantizes: the
    group is left; before one whose range is [0, 6] it is dropped (onnxruntime's test, to float32 eps)."""
    assert not _rewritten(_clipped(0.03), AVX2_CPU)
    assert _rewritten(_clipped(6 / 255), AVX2_CPU)


def test_a_broadcasting_add_keeps_the_qdq_arithmetic():
    """MLAS folds a scalar operand into its constant in another order: left to the QDQ nodes' arithmetic."""
    model = _add()
    model.graph.input[1].type.tensor_type.shape.CopyFrom(
        h.make_tensor_type_proto(T.FLOAT, [1]).tensor_type.shape
    )
    assert not _rewritten(model, AVX2_CPU)
