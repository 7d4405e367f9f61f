"""uint8 x int8 matmuls (MatMulInteger): AVX-512 VNNI dot products where the CPU has them and the shape
fits, float32 where every partial sum is exact, int32 otherwise; every result exactly the ONNX
reference's integers (tolerance 0)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tvm
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from onnx.reference import ReferenceEvaluator
from relax_calls import matmul_dtypes

import nxrt_tvm as nx
from nxrt_tvm.frontend import import_onnx
from nxrt_tvm.lower import pipeline
from nxrt_tvm.lower.integer_matmul import IntegerMatmul
from nxrt_tvm.lower.schedules import RULE_ATTR
from nxrt_tvm.lower.schedules.vnni import has_vnni
from nxrt_tvm.lower.target import make_target

VNNI_CPU = {"kind": "llvm", "mcpu": "znver4"}  # AVX-512 VNNI
AVX2_CPU = {"kind": "llvm", "mcpu": "haswell"}  # neither AVX-512 nor VNNI; runs on every host here
HOST_HAS_VNNI = has_vnni(make_target("llvm"))


def _onnx(nodes: list, inputs: list, output: int, inits: list) -> onnx.ModelProto:
    """An opset-17 model of `nodes` whose output ``y`` is of type `output`."""
    graph = h.make_graph(nodes, "g", inputs, [h.make_tensor_value_info("y", output, None)], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _model(depth: int, cols: int, rows: int | str = "rows", a_zero: bool = True) -> onnx.ModelProto:
    """MatMulInteger as `quantize_dynamic` writes it: uint8 activations with a zero point fed at run
    time, constant int8 weights (the extremes of the type in the first rows)."""
    rng = np.random.default_rng(depth * cols)
    weights = rng.integers(-128, 128, (depth, cols)).astype(np.int8)
    weights[0], weights[1] = -128, 127
    inputs = [h.make_tensor_value_info("a", T.UINT8, [rows, depth])]
    names = ["a", "w"]
    if a_zero:
        inputs.append(h.make_tensor_value_info("a_zero", T.UINT8, []))
        names.append("a_zero")
    return _onnx([h.make_node("MatMulInteger", names, ["y"])], inputs, T.INT32, [nh.from_array(weights, "w")])


def test_the_import_keeps_the_8_bit_operands():
    assert matmul_dtypes(import_onnx(_model(128, 48))) == [("uint8", "int8", "int32")]


@pytest.mark.parametrize(
    ("cpu", "depth", "cols", "form"),
    [
        (VNNI_CPU, 128, 48, ("uint8", "int8", "int32")),  # VNNI: kept
        (VNNI_CPU, 130, 48, ("float32", "float32", "float32")),  # depth not whole groups of 4
        (VNNI_CPU, 128, 40, ("uint8", "int8", "int32")),  # columns padded to whole 16-lane vectors
        (AVX2_CPU, 128, 48, ("float32", "float32", "float32")),  # no VNNI: float32, exact
        (AVX2_CPU, 512, 16, ("float32", "float32", "float32")),  # 512 x 255 x 128 < 2^24: still exact
        (AVX2_CPU, 1024, 16, ("int32", "int32", "int32")),  # past 2^24: int32
    ],
)
def test_the_target_decides_how_the_products_are_computed(cpu, depth, cols, form):
    mod = IntegerMatmul(make_target(cpu))(import_onnx(_model(depth, cols)))
    (found,) = matmul_dtypes(mod)
    assert found == form


@pytest.mark.parametrize(
    ("depth", "cols", "rows", "packed"),
    [
        (128, 512, 128, (16, 32, 32, 4)),
        (132, 48, 5, (3, 33, 16, 4)),  # 3 vectors a row, not 2 x 2 padded
        (64, 40, "rows", (3, 16, 16, 4)),  # 40 columns padded to 48
        (1280, 1000, 1, (32, 320, 32, 4)),  # a classifier: 1000 padded to 1024
    ],
)
def test_the_vnni_rule_tiles_the_kernel_and_packs_the_weight(depth, cols, rows, packed):
    """Lowered for a VNNI CPU whatever the host: the kernel runs `vpdpbusd` on the weight packed
    [cols / tile, depth / 4, tile, 4] at compile time (columns padded to whole tiles); rows no tile
    divides (5, symbolic) are padded."""
    target = make_target(VNNI_CPU)
    lowered = pipeline.lowering_pipeline(target, pipeline.Lowering())(import_onnx(_model(depth, cols, rows)))
    funcs = [f for f in lowered.functions.values() if isinstance(f, tvm.tirx.PrimFunc) and f.attrs]
    kernels = [f for f in funcs if f.attrs.get(RULE_ATTR) == "matmul-vnni"]
    assert len(kernels) == 1
    assert "llvm.x86.avx512.vpdpbusd.512" in kernels[0].script()
    shapes = [
        tuple(int(d) if isinstance(d, tvm.tirx.IntImm) else None for d in b.shape)
        for b in kernels[0].params
        if hasattr(b, "shape")
    ]
    assert packed in shapes, shapes


def _session(model: onnx.ModelProto, cpu) -> nx.InferenceSession:
    return nx.InferenceSession(model, provider_options=[{"target": cpu, "claim_policy": "all"}, {}])


@pytest.mark.parametrize(
    ("depth", "cols", "a_zero"),
    [(132, 48, True), (128, 512, False), (1024, 40, True), (516, 16, True), (130, 24, True)],
)
@pytest.mark.parametrize("cpu", ["vnni", "avx2"])
def test_products_are_the_reference_integers(cpu, depth, cols, a_zero):
    """Any row count (1, 37, 128 fed to a symbolic one), the extremes of both types: on a VNNI host its
    dot products (where the shape fits), and AVX2's float32 or int32 form on any host."""
    if cpu == "vnni" and not HOST_HAS_VNNI:
        pytest.skip("the host has no AVX-512 VNNI")
    model = _model(depth, cols, a_zero=a_zero)
    session = _session(model, "llvm" if cpu == "vnni" else AVX2_CPU)
    reference = ReferenceEvaluator(model)
    rng = np.random.default_rng(3)
    for rows in (1, 37, 128):
        feeds = {"a": rng.integers(0, 256, (rows, depth)).astype(np.uint8)}
        feeds["a"][0] = 255  # the largest values against the weights' extremes
        if a_zero:
            feeds["a_zero"] = np.array(rng.integers(0, 256), np.uint8)
        np.testing.assert_array_equal(session.run(None, feeds)[0], reference.run(None, feeds)[0])
    rules = {v.variant for kernels in session.kernel_variants().values() for v in kernels}
    assert ("default:matmul-vnni" in rules) == (cpu == "vnni" and depth % 4 == 0), rules


def _qdq_dense(depth: int, cols: int, per_column: bool, gemm: bool) -> onnx.ModelProto:
    """A QDQ dense layer as onnxruntime's static quantisation writes it: the activation quantized to
    uint8 and back, int8 weights dequantized (one scale, or one per output column), a float bias."""
    rng = np.random.default_rng(cols)
    weights = rng.integers(-127, 128, (cols, depth) if gemm else (depth, cols)).astype(np.int8)
    scales = (rng.random(cols if per_column else 1) * 0.01 + 0.001).astype(np.float32).reshape(-1)
    inits = [
        nh.from_array(weights, "w_q"),
        nh.from_array(scales if per_column else scales.reshape(()), "w_scale"),
        nh.from_array(np.zeros(cols if per_column else (), np.int8), "w_zero"),
        nh.from_array(np.array(0.02, np.float32), "x_scale"),
        nh.from_array(np.array(131, np.uint8), "x_zero"),
        nh.from_array(rng.standard_normal(cols).astype(np.float32), "bias"),
    ]
    axis = 0 if gemm else 1
    nodes = [
        h.make_node("QuantizeLinear", ["x", "x_scale", "x_zero"], ["x_q"]),
        h.make_node("DequantizeLinear", ["x_q", "x_scale", "x_zero"], ["x_dq"]),
        h.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zero"], ["w"], axis=axis),
        h.make_node("Gemm", ["x_dq", "w", "bias"], ["y"], transB=1)
        if gemm
        else h.make_node("MatMul", ["x_dq", "w"], ["y"]),
    ]
    return _onnx(nodes, [h.make_tensor_value_info("x", T.FLOAT, ["rows", depth])], T.FLOAT, inits)


@pytest.mark.parametrize(
    ("per_column", "gemm", "depth"),
    [(True, True, 256), (False, True, 256), (True, False, 256), (True, True, 254)],
)
def test_a_qdq_dense_layer_runs_on_vnni(per_column, gemm, depth):
    """Lowered for a VNNI CPU whatever the host, the QDQ layer is one uint8 x int8 kernel where VNNI takes
    it (not 254 deep: not whole groups of 4); on an AVX2 CPU it stays float arithmetic. Both match
    onnxruntime (rtol=atol=1e-5) where the host runs them."""
    model = _qdq_dense(depth, 40, per_column, gemm)
    vnni = depth % 4 == 0
    assert matmul_dtypes(IntegerMatmul(make_target(VNNI_CPU))(import_onnx(model))) == [
        ("uint8", "int8", "int32") if vnni else ("float32", "float32", "None")
    ]
    assert matmul_dtypes(IntegerMatmul(make_target(AVX2_CPU))(import_onnx(model))) == [
        ("float32", "float32", "None")
    ]
    x = np.random.default_rng(5).standard_normal((37, depth)).astype(np.float32) * 2
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    for cpu in ("llvm", AVX2_CPU):
        session = _session(model, cpu)
        np.testing.assert_allclose(session.run(None, {"x": x})[0], want, rtol=1e-5, atol=1e-5)
        rules = {v.variant for kernels in session.kernel_variants().values() for v in kernels}
        assert ("default:matmul-vnni" in rules) == (cpu == "llvm" and HOST_HAS_VNNI and vnni), rules


def _qdq_conv(in_channels: int, out_channels: int, kernel: int, pads: int) -> onnx.ModelProto:
    """A QDQ convolution: the input quantized to uint8 and back, per-channel int8 weights, a bias."""
    rng = np.random.default_rng(out_channels)
    shape = (out_channels, in_channels, kernel, kernel)
    inits = [
        nh.from_array(rng.integers(-127, 128, shape).astype(np.int8), "w_q"),
        nh.from_array((rng.random(out_channels) * 0.01 + 0.001).astype(np.float32), "w_scale"),
        nh.from_array(np.zeros(out_channels, np.int8), "w_zero"),
        nh.from_array(np.array(0.02, np.float32), "x_scale"),
        nh.from_array(np.array(128, np.uint8), "x_zero"),
        nh.from_array(rng.standard_normal(out_channels).astype(np.float32), "bias"),
    ]
    nodes = [
        h.make_node("QuantizeLinear", ["x", "x_scale", "x_zero"], ["x_q"]),
        h.make_node("DequantizeLinear", ["x_q", "x_scale", "x_zero"], ["x_dq"]),
        h.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zero"], ["w"], axis=0),
        h.make_node("Conv", ["x_dq", "w", "bias"], ["y"], pads=[pads] * 4),
    ]
    inputs = [h.make_tensor_value_info("x", T.FLOAT, ["batch", in_channels, 9, 11])]
    return _onnx(nodes, inputs, T.FLOAT, inits)


@pytest.mark.parametrize(
    ("in_channels", "out_channels", "kernel", "pads", "taken"),
    [
        (32, 48, 1, 0, True),  # a pointwise convolution
        (16, 32, 3, 0, True),  # any kernel without padding: the input channels are the inner reduction
        (32, 40, 1, 0, False),  # output channels not whole vectors (a convolution's are not padded)
        (30, 48, 1, 0, False),  # input channels not whole groups of 4
        (16, 32, 3, 1, False),  # padding would be the zero point, not 0
    ],
)
def test_a_qdq_convolution_runs_on_vnni_where_it_fits(in_channels, out_channels, kernel, pads, taken):
    """Lowered for a VNNI CPU whatever the host: a QDQ convolution the VNNI rule takes is a uint8 x int8
    kernel, others stay float arithmetic; on the host both match onnxruntime (rtol=atol=1e-4)."""
    model = _qdq_conv(in_channels, out_channels, kernel, pads)
    target = make_target(VNNI_CPU)
    lowered = pipeline.lowering_pipeline(target, pipeline.Lowering())(import_onnx(model))
    funcs = [f for f in lowered.functions.values() if isinstance(f, tvm.tirx.PrimFunc) and f.attrs]
    assert any(f.attrs.get(RULE_ATTR) == "matmul-vnni" for f in funcs) == taken
    x = np.random.default_rng(6).standard_normal((2, in_channels, 9, 11)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    session = _session(model, "llvm")
    np.testing.assert_allclose(session.run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-4)
    rules = {v.variant for kernels in session.kernel_variants().values() for v in kernels}
    assert ("default:matmul-vnni" in rules) == (taken and HOST_HAS_VNNI), rules
