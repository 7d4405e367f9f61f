"""3x3 stride-1 convolutions as Winograd F(4x4, 3x3): same results as onnxruntime, and only where they fit.

Tolerance: within rtol=1e-4 and atol=1e-4 x max|y| of onnxruntime (the transforms
round in fp32; F(4x4)'s error measured ~3e-6 of the largest output).
"""

from __future__ import annotations

import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper

import nxrt_tvm as nx
from nxrt_tvm.api.errors import InvalidProviderOptions
from nxrt_tvm.frontend import import_onnx
from nxrt_tvm.lower import pipeline
from nxrt_tvm.lower.schedules import RULE_ATTR
from nxrt_tvm.lower.target import make_target
from nxrt_tvm.lower.tir_pipeline import tir_pipeline_for
from nxrt_tvm.lower.winograd import _matrices, transform_weight, winograd_tile

TARGET = make_target("llvm")
RNG = np.random.default_rng(0)


def _conv_model(n, c, h, w, k, *, pads=(1, 1, 1, 1), stride=1, kernel=3, residual=False) -> onnx.ModelProto:
    nodes = [
        helper.make_node(
            "Conv", ["x", "w", "b"], ["y"], kernel_shape=[kernel] * 2, strides=[stride] * 2, pads=list(pads)
        )
    ]
    last = "y"
    if residual:  # a ResNet block's tail: + shortcut, then ReLU, all in the output transform's write-back
        nodes.append(helper.make_node("Add", ["y", "x"], ["s"]))
        last = "s"
    nodes.append(helper.make_node("Relu", [last], ["out"]))
    inits = [
        numpy_helper.from_array(
            (RNG.standard_normal((k, c, kernel, kernel)) / (3 * c**0.5)).astype(np.float32), "w"
        ),
        numpy_helper.from_array(RNG.standard_normal(k).astype(np.float32), "b"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, c, h, w])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


def _rules(model: onnx.ModelProto, conv_algorithm: str = "auto") -> list[str]:
    lowered = pipeline.lowering_pipeline(TARGET, pipeline.Lowering(conv_algorithm=conv_algorithm))(
        import_onnx(model)
    )
    return [
        str(f.attrs[RULE_ATTR])
        for _, f in lowered.functions_items()
        if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and RULE_ATTR in f.attrs
    ]


def test_transforms_compute_the_convolution():
    """``A^T [(G g G^T) * (B^T d B)] A`` is the 4x4 correlation
    of a 6x6 tile (the math the kernels run), in numpy."""
    amat, bmat, gmat = _matrices(4)
    tile = RNG.standard_normal((6, 6))
    g = RNG.standard_normal((3, 3))
    u = transform_weight(g.reshape(3, 3, 1, 1), 4).astype(np.float64).reshape(6, 6)
    y = amat.T @ (u * (bmat.T @ tile @ bmat)) @ amat
    direct = np.array([[np.sum(tile[i : i + 3, j : j + 3] * g) for j in range(4)] for i in range(4)])
    np.testing.assert_allclose(y, direct, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "shape,pads,residual",
    [
        ((1, 16, 12, 12, 32), (1, 1, 1, 1), False),
        (
            (2, 24, 13, 17, 16),
            (1, 0, 0, 1),
            False,
        ),  # batch 2, asymmetric padding, maps that 4 does not divide
        ((1, 32, 16, 20, 32), (0, 0, 0, 0), False),  # no padding: 14 x 18 outputs
        ((1, 32, 14, 14, 32), (1, 1, 1, 1), True),  # + shortcut + ReLU fused into the output transform
    ],
)
def test_winograd_matches_onnxruntime(shape, pads, residual):
    n, c, h, w, k = shape
    model = _conv_model(n, c, h, w, k, pads=pads, residual=residual)
    x = RNG.standard_normal((n, c, h, w)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    got = nx.InferenceSession(model).run(None, {"x": x})[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
    rules = _rules(model)
    assert rules.count("winograd") == 2 and "conv" not in rules, (
        rules
    )  # input and output transforms, no direct conv
    assert "matmul" in rules


def test_a_broadcast_constant_weight_is_transformed_too():
    """A weight written as ConstantOfShape (onnx's VGG-19 and SqueezeNet model data) is a constant all the
    same: the convolution runs as Winograd (VGG-19 1.16x -> 0.77x onnxruntime), matching onnxruntime."""
    model = _conv_model(1, 16, 12, 12, 16)
    del model.graph.initializer[0]  # w, now computed: ConstantOfShape([16, 16, 3, 3]) of 0.02
    shape = numpy_helper.from_array(np.array([16, 16, 3, 3], np.int64), "w_shape")
    model.graph.initializer.append(shape)
    fill = numpy_helper.from_array(np.array([0.02], np.float32))
    model.graph.node.insert(0, helper.make_node("ConstantOfShape", ["w_shape"], ["w"], value=fill))
    x = RNG.standard_normal((1, 16, 12, 12)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    np.testing.assert_allclose(nx.InferenceSession(model).run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-4)
    rules = _rules(model)
    assert rules.count("winograd") == 2 and "conv" not in rules, rules


def _vector_flops(kernel: tvm.tirx.PrimFunc, name: str) -> int:
    """The 16-lane float adds, subtracts and multiply-adds in a kernel's optimised LLVM IR."""
    gv = tvm.ir.GlobalVar(name)
    built = tvm.tirx.build(tvm.IRModule({gv: kernel}), target=TARGET, pipeline=tir_pipeline_for(TARGET))
    ll = built.inspect_source("ll")
    return len(re.findall(r"= (?:fadd|fsub|fmul)[^\n]*<16 x float>|@llvm\.(?:fma|fmuladd)\.v16f32\(", ll))


def test_transforms_run_separably():
    """``B^T d B`` as ``(B^T d) B`` and ``A^T M A`` as ``A^T (M A)``: each stage sums alpha terms where the
    transform in one step sums alpha^2, so the unrolled kernels are about half the size, to run and (most
    of a CNN's compile time: 3.5 of SqueezeNet's 4.7 s of kernel builds) to build. Before, 671 and 297
    vector operations per channel vector and tile."""
    amat, bmat, _ = _matrices(4)
    lowered = pipeline.lowering_pipeline(TARGET, pipeline.Lowering())(
        import_onnx(_conv_model(1, 16, 12, 12, 32))
    )
    kernels = {gv.name_hint: f for gv, f in lowered.functions_items() if "winograd" in gv.name_hint}
    (input_name,) = [n for n in kernels if "input" in n]
    (output_name,) = [n for n in kernels if "output" in n]
    alpha, m = amat.shape
    assert _vector_flops(kernels[input_name], input_name) <= 2 * alpha * np.count_nonzero(bmat)  # 312
    # + the bias add fused into the store of each of the m x m outputs
    assert _vector_flops(kernels[output_name], output_name) <= (alpha + m) * np.count_nonzero(amat) + m * m


def test_transformed_weights_are_packed_at_compile_time():
    """The 36 matmuls read ``U`` as [K / tile, 36, C, tile] column panels, folded on the constant (tiles
    of two 16-lane vectors: lowered for AVX-512 on any host)."""
    model = _conv_model(1, 16, 12, 12, 32)
    avx512 = make_target({"kind": "llvm", "mcpu": "znver4"})
    lowered = pipeline.lowering_pipeline(avx512, pipeline.Lowering())(import_onnx(model))
    shapes = {
        tuple(int(d) for d in p.shape)
        for _, f in lowered.functions_items()
        if isinstance(f, tvm.tirx.PrimFunc)
        for p in f.params
    }
    assert (1, 36, 16, 32) in shapes, shapes


@pytest.mark.parametrize(
    "model",
    [
        _conv_model(1, 16, 12, 12, 32, stride=2),  # strided
        _conv_model(1, 32, 7, 7, 32),  # a 7x7 map: too few tiles
        _conv_model(1, 8, 16, 16, 32),  # too few input channels for the transforms to pay
        _conv_model(1, 16, 16, 16, 16, kernel=5, pads=(2, 2, 2, 2)),  # 5x5
    ],
    ids=["stride2", "map7x7", "channels8", "kernel5x5"],
)
def test_other_convolutions_stay_direct(model):
    rules = _rules(model)
    assert "winograd" not in rules and "conv" in rules, rules


def test_direct_option_keeps_every_convolution_direct():
    model = _conv_model(1, 16, 12, 12, 32)
    rules = _rules(model, conv_algorithm="direct")
    assert "winograd" not in rules and "conv" in rules, rules
    x = RNG.standard_normal((1, 16, 12, 12)).astype(np.float32)
    got = nx.InferenceSession(model, provider_options=[{"conv_algorithm": "direct"}, {}]).run(None, {"x": x})[
        0
    ]
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_unknown_conv_algorithm_is_a_typed_error():
    with pytest.raises(
        InvalidProviderOptions, match="conv_algorithm must be one of 'auto', 'direct', got 'fft'"
    ):
        nx.InferenceSession(_conv_model(1, 16, 12, 12, 32), provider_options=[{"conv_algorithm": "fft"}, {}])


def test_tile_choice():
    assert [winograd_tile(s, s) for s in (56, 28, 14, 12, 11, 7)] == [4, 4, 4, 4, None, None]
    assert winograd_tile(56, 7) is None


def test_winograd_partition_deploys_from_an_epcontext_model(tmp_path):
    """Compiled ahead of time, the Winograd kernels (and their
    folded, packed weights) load and run without a compile."""
    model = _conv_model(1, 16, 12, 12, 32, residual=False)
    source = tmp_path / "conv.onnx"
    onnx.save(model, source)
    nx.compile_model(source, tmp_path / "conv_ctx.onnx", progress=False)
    options = nx.SessionOptions()
    options.add_session_config_entry("session.disable_model_compile", "1")
    session = nx.InferenceSession(str(tmp_path / "conv_ctx.onnx"), options)
    x = RNG.standard_normal((1, 16, 12, 12)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    np.testing.assert_allclose(
        session.run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max())
    )
    blobs = [
        a.s
        for n in onnx.load(tmp_path / "conv_ctx.onnx").graph.node
        if n.op_type == "EPContext"
        for a in n.attribute
        if a.name == "ep_cache_context"
    ]
    assert (
        len(blobs) == 1 and b"winograd_input" in blobs[0] and b"winograd_output" in blobs[0]
    )  # the kernels' symbols
