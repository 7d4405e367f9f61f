"""Default CPU schedules: every rule matches onnxruntime on awkward shapes, and actually applies.

Tolerances: fp32 results within rtol=1e-4, atol=1e-4 of onnxruntime; kernels
with exp/erf/tanh (fast-math polynomials) within rtol=atol=1e-3.
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
from nxrt_tvm.frontend import import_onnx
from nxrt_tvm.lower import pipeline
from nxrt_tvm.lower.schedules import RULE_ATTR, CpuRule, base, cpu_schedule_passes, pre_legalize_passes
from nxrt_tvm.lower.schedules.base import ApplySchedules, kernel_work
from nxrt_tvm.lower.target import make_target

TARGET = make_target("llvm")
#: what the tile and packing shapes below are written for (16-lane vectors, 32 registers), whatever the
#: host: those tests only lower
AVX512 = make_target({"kind": "llvm", "mcpu": "znver4"})
RNG = np.random.default_rng(0)


def _model(nodes, inputs, outputs, inits=()) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        initializer=[numpy_helper.from_array(RNG.standard_normal(s).astype(np.float32), n) for n, s in inits],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(model).graph.output}
    for out in model.graph.output:
        out.CopyFrom(inferred[out.name])
    return model


def matmul_bias_relu(m, k, n):
    return _model(
        [
            helper.make_node("MatMul", ["x", "w"], ["y"]),
            helper.make_node("Add", ["y", "b"], ["z"]),
            helper.make_node("Relu", ["z"], ["out"]),
        ],
        [("x", [m, k])],
        ["out"],
        [("w", [k, n]), ("b", [n])],
    )


def gemm_trans_b(m, k, n):
    return _model(
        [helper.make_node("Gemm", ["x", "w", "b"], ["out"], transB=1)],
        [("x", [m, k])],
        ["out"],
        [("w", [n, k]), ("b", [n])],
    )


def batch_matmul(b, m, k, n):
    return _model(
        [helper.make_node("MatMul", ["x", "y"], ["out"])], [("x", [b, m, k]), ("y", [b, k, n])], ["out"]
    )


def conv(n, c, h, w, oc, kernel, stride, pad, group=1, act="Relu"):
    nodes = [
        helper.make_node(
            "Conv",
            ["x", "w", "b"],
            ["y"],
            kernel_shape=[kernel] * 2,
            strides=[stride] * 2,
            pads=[pad] * 4,
            group=group,
        ),
        helper.make_node(act, ["y"], ["out"]),
    ]
    weights = [("w", [oc, c // group, kernel, kernel]), ("b", [oc])]
    return _model(nodes, [("x", [n, c, h, w])], ["out"], weights)


def conv1d(n, c, w, oc, kernel, stride, pads, group=1, dilation=1):
    nodes = [
        helper.make_node(
            "Conv",
            ["x", "w", "b"],
            ["y"],
            kernel_shape=[kernel],
            strides=[stride],
            pads=pads,
            group=group,
            dilations=[dilation],
        ),
        helper.make_node("Relu", ["y"], ["out"]),
    ]
    weights = [("w", [oc, c // group, kernel]), ("b", [oc])]
    return _model(nodes, [("x", [n, c, w])], ["out"], weights)


def pool(op, shape, **attrs):
    return _model([helper.make_node(op, ["x"], ["out"], **attrs)], [("x", shape)], ["out"])


def softmax(shape):
    return _model([helper.make_node("Softmax", ["x"], ["out"], axis=-1)], [("x", shape)], ["out"])


def layer_norm(shape):
    return _model(
        [helper.make_node("LayerNormalization", ["x", "g", "b"], ["out"], axis=-1, epsilon=1e-5)],
        [("x", shape)],
        ["out"],
        [("g", shape[-1:]), ("b", shape[-1:])],
    )


def elementwise(shape):
    nodes = [
        helper.make_node("Add", ["x", "b"], ["y"]),
        helper.make_node("Erf", ["y"], ["z"]),
        helper.make_node("Mul", ["z", "x"], ["out"]),
    ]
    return _model(nodes, [("x", shape)], ["out"], [("b", shape[-1:])])


def transpose(shape):
    return _model([helper.make_node("Transpose", ["x"], ["out"], perm=[0, 2, 1])], [("x", shape)], ["out"])


def _reshape(name, src, dst, shape):
    """A Reshape node and the Constant holding its target shape."""
    target = numpy_helper.from_array(np.array(shape, dtype=np.int64))
    return [
        helper.make_node("Constant", [], [f"{name}_shape"], value=target),
        helper.make_node("Reshape", [src, f"{name}_shape"], [dst]),
    ]


def head_keys(seq, heads, dim):
    """Attention's keys as the scores matmul reads them: [1, seq, heads * dim] -> [1, heads, dim, seq]."""
    return _model(
        [
            *_reshape("r", "x", "r", [1, seq, heads, dim]),
            helper.make_node("Transpose", ["r"], ["out"], perm=[0, 2, 3, 1]),
        ],
        [("x", [1, seq, heads * dim])],
        ["out"],
    )


def head_merge(heads, seq, dim):
    """Attention's heads merged back: [1, heads, seq, dim] -> [1, seq, heads * dim]; the output's inner
    axis reads ``x[c // dim, s, c % dim]``, whole vectors between the divisions."""
    return _model(
        [
            helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1, 3]),
            *_reshape("r", "t", "out", [1, seq, heads * dim]),
        ],
        [("x", [1, heads, seq, dim])],
        ["out"],
    )


def channel_shuffle_nhwc(channels, groups, height, width):
    """ShuffleNet's channel shuffle (NCHW: reshape to groups, swap, reshape back), then NCHW -> NHWC as
    convolutions around it read it: ``out[h, w, c] = x[c % g * (C / g) + c // g, h, w]``."""
    return _model(
        [
            *_reshape("g", "x", "g", [1, groups, channels // groups, height, width]),
            helper.make_node("Transpose", ["g"], ["s"], perm=[0, 2, 1, 3, 4]),
            *_reshape("m", "s", "m", [1, channels, height, width]),
            helper.make_node("Transpose", ["m"], ["out"], perm=[0, 2, 3, 1]),
        ],
        [("x", [1, channels, height, width])],
        ["out"],
    )


def head_split(seq, heads, dim):
    """Attention's head split: [1, seq, heads * dim] -> [1, heads, seq, dim]; the reshape reads through
    (h * dim + d) // (heads * dim), which inlining simplifies away: the copy must still vectorise."""
    shape = helper.make_node(
        "Constant",
        [],
        ["shape"],
        value=numpy_helper.from_array(np.array([1, seq, heads, dim], dtype=np.int64)),
    )
    return _model(
        [
            shape,
            helper.make_node("Reshape", ["x", "shape"], ["r"]),
            helper.make_node("Transpose", ["r"], ["out"], perm=[0, 2, 1, 3]),
        ],
        [("x", [1, seq, heads * dim])],
        ["out"],
    )


def tile(shape, reps):
    reps = helper.make_node(
        "Constant", [], ["reps"], value=numpy_helper.from_array(np.array(reps, dtype=np.int64))
    )
    return _model([reps, helper.make_node("Tile", ["x", "reps"], ["out"])], [("x", shape)], ["out"])


CASES = {
    # name: (model, rule expected to schedule the main kernel, tolerance)
    "matmul_1x7x13": (matmul_bias_relu(1, 7, 13), "matmul", 1e-4),
    "matmul_5x33x17": (matmul_bias_relu(5, 33, 17), "matmul", 1e-4),
    "matmul_64x48x40": (matmul_bias_relu(64, 48, 40), "matmul", 1e-4),
    "gemm_transB_3x19x1000": (gemm_trans_b(3, 19, 1000), "matmul", 1e-4),
    # widths the 32-column tile divides: the constant weight is packed into [N/32, K, 32] panels
    "matmul_packed_1x64x96": (matmul_bias_relu(1, 64, 96), "matmul", 1e-4),
    "matmul_packed_33x100x64": (matmul_bias_relu(33, 100, 64), "matmul", 1e-4),
    "gemm_transB_packed_7x17x32": (gemm_trans_b(7, 17, 32), "matmul", 1e-4),
    "batch_matmul_2x5x7x19": (batch_matmul(2, 5, 7, 19), "matmul", 1e-4),
    # attention scores of a length no full tile divides: both operands padded to full tiles (a copy)
    "batch_matmul_2x50x16x50": (batch_matmul(2, 50, 16, 50), "matmul", 1e-4),
    "conv3x3_1x3x9x11": (conv(1, 3, 9, 11, 5, 3, 1, 1), "conv", 1e-4),
    "conv3x3s2_2x8x15x15": (conv(2, 8, 15, 15, 17, 3, 2, 1), "conv", 1e-4),
    "conv1x1_1x16x7x7": (conv(1, 16, 7, 7, 24, 1, 1, 0), "conv", 1e-4),
    "conv1x1_1x16x7x7_88": (conv(1, 16, 7, 7, 88, 1, 1, 0), "conv", 1e-4),  # 88 channels: padded to 96
    "conv3x3_1x8x14x14": (conv(1, 8, 14, 14, 32, 3, 1, 1), "conv", 1e-4),  # 7-row tiles (14 = 2 x 7)
    # depthwise: every operand read per channel, the tile's rows are output pixels
    "dwconv3x3_1x32x14x14": (conv(1, 32, 14, 14, 32, 3, 1, 1, group=32), "conv", 1e-4),
    "dwconv3x3s2_2x24x15x15": (conv(2, 24, 15, 15, 24, 3, 2, 1, group=24), "conv", 1e-4),
    # grouped: split into one conv per group (AlexNet's 2 5x5 groups, a strided 1x1 conv)
    "groupconv5x5_1x16x9x9_g2": (conv(1, 16, 9, 9, 24, 5, 1, 2, group=2), "conv", 1e-4),
    "groupconv1x1s2_1x24x7x7_g3": (conv(1, 24, 7, 7, 36, 1, 2, 0, group=3), "conv", 1e-4),
    # grouped pointwise (ShuffleNet's 3, 4 or 8 groups): one matmul batched over the groups
    "groupconv1x1_1x24x7x7_g3": (conv(1, 24, 7, 7, 36, 1, 1, 0, group=3), "matmul", 1e-4),
    "groupconv1x1_2x12x5x9_g4": (conv(2, 12, 5, 9, 20, 1, 1, 0, group=4), "matmul", 1e-4),
    "dwconv5x5_1x40x9x9": (conv(1, 40, 9, 9, 40, 5, 1, 2, group=40, act="Sigmoid"), "conv", 1e-4),
    # 1-D: as 1xK 2-D convolutions, NHWC (an audio front end's 80 taps at stride 4; grouped; dilated)
    "conv1d_k80s4_1x1x1000": (conv1d(1, 1, 1000, 32, 80, 4, [38, 38]), "conv", 1e-4),
    "conv1d_k5d2_2x7x33": (conv1d(2, 7, 33, 9, 5, 1, [3, 1], dilation=2), "conv", 1e-4),
    "conv1d_k3_1x12x50_g3": (conv1d(1, 12, 50, 6, 3, 2, [1, 1], group=3), "conv", 1e-4),
    # one output pixel (Silero VAD's encoder at its last strides): no rows, a GEMV over taps x channels,
    # not a depthwise conv (its input is broadcast over the channels); it ran the generic rule's loops
    "conv1d_k3s2_1x64x2": (conv1d(1, 64, 2, 64, 3, 2, [1, 1]), "conv", 1e-4),
    "conv1d_k3_1x64x1": (conv1d(1, 64, 1, 128, 3, 1, [1, 1]), "conv", 1e-4),
    "conv3x3_1x8x3x3_1pixel": (conv(1, 8, 3, 3, 24, 3, 1, 0), "conv", 1e-4),
    # depthwise 1-D: one reduction axis left (the taps), the matmul rule's tile: channels x positions
    "dwconv1d_k5_1x16x40": (conv1d(1, 16, 40, 16, 5, 1, [2, 2], group=16), "matmul", 1e-4),
    # a whole tensor to one value (DynamicQuantizeLinear's min and max): vector lanes, chunks in parallel
    "reducemax_all_1x128x128": (pool("ReduceMax", [1, 128, 128], keepdims=0), "full-reduction", 1e-6),
    "reducemin_all_2x6x24": (pool("ReduceMin", [2, 6, 24], keepdims=1), "full-reduction", 1e-6),
    "reducesum_all_4x3x40": (pool("ReduceSum", [4, 3, 40], keepdims=0), "full-reduction", 1e-4),
    # rows of 20: quarter vectors on AVX-512 and half ones on AVX2 (whole ones divide neither)
    "reducesum_all_2x3x20": (pool("ReduceSum", [2, 3, 20], keepdims=0), "full-reduction", 1e-4),
    "maxpool3x3s2_1x5x13x13": (
        pool("MaxPool", [1, 5, 13, 13], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4),
        "pooling",
        1e-4,
    ),
    "avgpool2x2_2x3x9x9": (
        pool("AveragePool", [2, 3, 9, 9], kernel_shape=[2, 2], strides=[2, 2]),
        "pooling",
        1e-4,
    ),
    "globalavgpool_1x19x7x7": (pool("GlobalAveragePool", [1, 19, 7, 7]), "normalization", 1e-4),
    "softmax_3x5": (softmax([3, 5]), "normalization", 1e-3),  # rows shorter than a vector (8 or 16 lanes)
    # layer norm reduces squared deviations, which no padding of its input leaves at 0
    "layernorm_5x37": (layer_norm([5, 37]), "normalization", 1e-4),
    # vector partial reductions inside one parallel row loop; rows that end in part of a vector
    # reduce what they read copied into whole vectors, padded with the reduction's identity
    "softmax_2x3x64": (softmax([2, 3, 64]), "row-reduction", 1e-3),
    "layernorm_6x128": (layer_norm([6, 128]), "row-reduction", 1e-4),
    "softmax_3x17": (softmax([3, 17]), "row-reduction", 1e-3),
    "softmax_5x12": (softmax([5, 12]), "row-reduction", 1e-3),  # narrower than an AVX-512 vector
    "softmax_2x4x33": (softmax([2, 4, 33]), "row-reduction", 1e-3),
    "softmax_1x3x5x197": (softmax([1, 3, 5, 197]), "row-reduction", 1e-3),  # ViT's 197 patches
    "elementwise_3x17x19": (elementwise([3, 17, 19]), "injective", 1e-3),
    "transpose_2x3x40": (transpose([2, 3, 40]), "injective", 1e-4),  # 3 columns: shorter than a vector
    "transpose_2x17x33": (transpose([2, 17, 33]), "transpose", 0),  # no tile divides: guarded last tiles
    # read in tiles along the input's contiguous axis, written along the output's
    "transpose_2x32x48": (transpose([2, 32, 48]), "transpose", 0),
    "head_keys_1x64x4x32": (head_keys(64, 4, 32), "transpose", 0),
    "head_keys_1x50x4x32": (head_keys(50, 4, 32), "transpose", 0),  # ViT's ragged sequence (197)
    "channel_shuffle_nhwc_1x24x6x8": (channel_shuffle_nhwc(24, 4, 6, 8), "transpose", 0),
    "head_merge_1x4x20x32": (head_merge(4, 20, 32), "injective", 0),
    "tile_3x5": (tile([3, 5], [2, 7]), "injective", 1e-4),
    "head_split_1x16x2x32": (head_split(16, 2, 32), "injective", 1e-4),
}


def _feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    inits = {t.name for t in model.graph.initializer}
    return {
        i.name: RNG.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
        for i in model.graph.input
        if i.name not in inits
    }


def _lowered(model: onnx.ModelProto, schedule_passes=None, target=TARGET) -> tvm.IRModule:
    """The Relax module after the whole lowering pipeline, before TIR codegen."""
    lowering = pipeline.Lowering(schedule_passes=None if schedule_passes is None else tuple(schedule_passes))
    return pipeline.lowering_pipeline(target, lowering)(import_onnx(model))


def _fused(model: onnx.ModelProto) -> tvm.IRModule:
    """The Relax module after fusion: the kernels as the schedule rules first see them."""
    with TARGET:
        return tvm.transform.Sequential(pipeline.fusion_passes(TARGET))(import_onnx(model))


def _prim_funcs(mod: tvm.IRModule) -> dict[str, tvm.tirx.PrimFunc]:
    return {gv.name_hint: f for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}


def _run_both(model: onnx.ModelProto, tol: float, schedule_passes=None):
    feeds = _feeds(model)
    session = nx.InferenceSession(
        model, provider_options=[{"target": "llvm", "schedule_passes": schedule_passes}, {}]
    )
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    got = session.run(None, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol)
    return session


@pytest.mark.parametrize("case", sorted(CASES))
def test_rule_matches_onnxruntime_and_applies(case, monkeypatch):
    model, rule, tol = CASES[case]
    _run_both(model, tol)
    monkeypatch.setattr(base, "MIN_PARALLEL_WORK", 0)  # these kernels are small: see that rules parallelise
    funcs = _prim_funcs(_lowered(model))
    applied = {
        str(f.attrs[RULE_ATTR]) for f in funcs.values() if f.attrs is not None and RULE_ATTR in f.attrs
    }
    assert rule in applied, (case, applied)
    scheduled = [f for f in funcs.values() if f.attrs is not None and f.attrs.get(RULE_ATTR) == rule]
    script = "\n".join(f.script() for f in scheduled)
    assert "T.parallel" in script
    if (
        rule != "normalization" and case != "tile_3x5"
    ):  # dlight's Reduction keeps short rows scalar; Tile stays scalar
        assert "T.vectorized" in script


@pytest.mark.parametrize(
    "case", ["reducemin_all_2x6x24", "reducesum_all_4x3x40", "reducesum_all_2x3x20", "softmax_5x12"]
)
def test_rules_take_widths_whole_avx512_vectors_do_not_divide(case, monkeypatch):
    """16-lane vectors divide fewer widths than 8-lane ones: these ran the generic rule on a Zen 4 host
    (half or quarter vectors now). Lowered for AVX-512 whatever the host, so an AVX2 host tests it too;
    `test_rule_matches_onnxruntime_and_applies` runs them on the host's own ISA."""
    model, rule, _ = CASES[case]
    monkeypatch.setattr(base, "MIN_PARALLEL_WORK", 0)
    funcs = _prim_funcs(_lowered(model, target=AVX512))
    applied = {
        str(f.attrs[RULE_ATTR]) for f in funcs.values() if f.attrs is not None and RULE_ATTR in f.attrs
    }
    assert rule in applied, (case, applied)


@pytest.mark.parametrize(
    "case,rule,weight",
    [
        ("matmul_packed_1x64x96", "matmul", (3, 64, 32)),
        ("matmul_packed_33x100x64", "matmul", (2, 100, 32)),
        ("gemm_transB_packed_7x17x32", "matmul", (1, 17, 32)),
        ("matmul_64x48x40", "matmul", (2, 48, 20)),  # the 20-wide column tile that divides 40
        # columns no wide tile divides: padded to whole 32-wide tiles in the packing (1000 ran 20-wide
        # tiles of 10 lanes, 88 11-wide ones)
        ("gemm_transB_3x19x1000", "matmul", (32, 19, 32)),
        ("conv1x1_1x16x7x7_88", "conv", (3, 1, 1, 16, 32)),
        (
            "conv1x1_1x16x7x7",
            "conv",
            (1, 1, 1, 16, 24),
        ),  # NHWC: HWIO weights, one 24-wide panel of output channels
        (
            "conv3x3s2_2x8x15x15",
            "conv",
            (3, 3, 8, 17),
        ),  # 17 output channels: a checked tail, so HWIO as it is
        ("batch_matmul_2x5x7x19", "matmul", (2, 7, 19)),  # both operands are inputs: nothing constant to pack
    ],
)
def test_constant_weights_are_packed_at_compile_time(case, rule, weight):
    """The kernel reads a [J/tile, r..., tile] constant; the
    repacking itself was folded away (no copy at run time)."""
    funcs = _prim_funcs(_lowered(CASES[case][0], target=AVX512))
    kernel = next(f for f in funcs.values() if f.attrs is not None and f.attrs.get(RULE_ATTR) == rule)
    shapes = [tuple(int(d) for d in b.shape) for b in kernel.params]
    assert weight in shapes, shapes
    assert not any("layout_rewrite_preproc" in f.script() for f in funcs.values())


@pytest.mark.parametrize(("cpu", "panel"), [("haswell", (63, 64, 16)), ("znver4", (32, 64, 32))])
def test_columns_only_narrow_tiles_divide_are_padded_to_full_tiles_on_avx2(cpu, panel):
    """1000 columns: on AVX2 8-wide tiles divide them, one vector a row and a row value loaded for each
    FMA (a [168, 512] x [512, 1000] layer ran 1.7x slower than in full 16-wide tiles over 1008
    columns); the weight is packed into full tiles instead. AVX-512 pads to 32-wide tiles as before."""
    target = make_target({"kind": "llvm", "mcpu": cpu})
    lowered = pipeline.lowering_pipeline(target, pipeline.Lowering())(
        import_onnx(matmul_bias_relu(12, 64, 1000))
    )
    (kernel,) = [f for f in _prim_funcs(lowered).values() if f.attrs.get(RULE_ATTR) == "matmul"]
    assert panel in [tuple(int(d) for d in b.shape) for b in kernel.params]


HASWELL = {"kind": "llvm", "mcpu": "haswell"}  # AVX2: tiles of 6 rows, which 7 and 14 leave ragged


@pytest.mark.parametrize(
    ("target", "accumulator"),
    [(HASWELL, (1, 49, 16)), ({"kind": "llvm", "mcpu": "znver4"}, (1, 7, 7, 16))],
)
def test_ragged_rows_of_pixels_tile_the_whole_image(target, accumulator):
    """A 7-pixel row in 6-row tiles ran as 6 + 1 (58 % of the FMAs doing work; a 7x7 512-channel conv
    1.39x onnxruntime on a Zen 3, 1.05x as 49 pixels); the register tile runs over the image's pixels
    as one axis. With AVX-512's 8-row tiles 7 rows divide: nothing merged."""
    lowered = pipeline.lowering_pipeline(make_target(target), pipeline.Lowering())(
        import_onnx(conv(1, 8, 7, 7, 16, 3, 1, 1))
    )
    (kernel,) = [f for f in _prim_funcs(lowered).values() if f.attrs.get(RULE_ATTR) == "conv"]
    assert f'T.sblock_alloc_buffer({_shape(accumulator)}, scope="local")' in kernel.script()


def _shape(dims: tuple[int, ...]) -> str:
    return "(" + ", ".join(f"T.int64({d})" for d in dims) + ")"


@pytest.mark.parametrize(
    "model",
    [
        conv(2, 8, 7, 7, 16, 3, 1, 1),  # batch 2: each image's 49 pixels, the batch outside
        conv(1, 16, 27, 27, 24, 3, 2, 1),  # 14x14 out of a stride-2 conv
        conv(1, 8, 13, 13, 40, 3, 1, 1, act="Sigmoid"),  # 40 channels: a checked column tail
    ],
    ids=["7x7_batch2", "14x14_stride2", "13x13_40ch"],
)
def test_ragged_rows_of_pixels_match_onnxruntime(model):
    """Numerics of the merged pixel rows (built for AVX2 on any x86 host) against onnxruntime."""
    feeds = _feeds(model)
    session = nx.InferenceSession(model, provider_options=[{"target": HASWELL}, {}])
    assert session.plan.nodes_by_ep().get("TvmExecutionProvider")
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    np.testing.assert_allclose(session.run(None, feeds)[0], want[0], rtol=1e-4, atol=1e-4)


def test_a_1d_convolution_runs_as_a_2d_one_over_a_symbolic_length():
    """Conv1d in NCW vectorised over output positions: at stride 4 every vector load was a gather (an
    audio model 6x onnxruntime). As a 1xK conv2d it runs NHWC; a max pool after it over the symbolic
    length (clamped extents) builds, and every length matches onnxruntime."""
    model = _model(
        [
            helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[80], strides=[4], pads=[40, 40]),
            helper.make_node("Relu", ["y"], ["r"]),
            helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[4], strides=[4]),
            helper.make_node("Conv", ["p", "w2", "b2"], ["y2"], kernel_shape=[3], pads=[1, 1]),
            helper.make_node("MaxPool", ["y2"], ["out"], kernel_shape=[4], strides=[4]),
        ],
        [("x", ["n", 1, "t"])],
        ["out"],
        [("w", [32, 1, 80]), ("b", [32]), ("w2", [32, 32, 3]), ("b2", [32])],
    )
    funcs = _prim_funcs(_lowered(model))
    convs = [name for name, f in funcs.items() if f.attrs is not None and f.attrs.get(RULE_ATTR) == "conv"]
    assert convs and all("conv2d" in name for name in convs), sorted(funcs)
    session = nx.InferenceSession(model, providers=["TvmExecutionProvider"])
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for n, t in ((1, 20), (2, 61), (1, 100), (3, 1001)):  # 20, 61: shorter than the second pool's window
        feeds = {"x": RNG.standard_normal((n, 1, t)).astype(np.float32)}
        np.testing.assert_allclose(session.run(None, feeds)[0], ref.run(None, feeds)[0], rtol=1e-4, atol=1e-4)


def test_weights_are_packed_beside_a_size_check():
    """A run-time size check (an Add of two symbolic dims that must match) is a kernel whose root holds
    an assert outside any block; TVM's layout split failed on the whole module for it, and every matmul
    of a BERT export's partition repacked its weight at each call."""
    model = _model(
        [helper.make_node("Add", ["x", "p"], ["h"]), helper.make_node("MatMul", ["h", "w"], ["out"])],
        [("x", ["n", 64]), ("p", ["m", 64])],
        ["out"],
        [("w", [64, 96])],
    )
    funcs = _prim_funcs(_lowered(model, target=AVX512))
    assert any(f.attrs is not None and f.attrs.get(RULE_ATTR) == "SizeCheck" for f in funcs.values())
    (kernel,) = [f for name, f in funcs.items() if name.endswith("_prepacked")]  # the original is gone
    assert "T.Buffer((T.int64(3), T.int64(64), T.int64(32))" in kernel.script()  # the packed weight
    assert not any("layout_rewrite_preproc" in f.script() for f in funcs.values())
    session = nx.InferenceSession(model, providers=["TvmExecutionProvider"])
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for n, m in ((5, 5), (7, 1)):
        feeds = {
            "x": RNG.standard_normal((n, 64)).astype(np.float32),
            "p": RNG.standard_normal((m, 64)).astype(np.float32),
        }
        np.testing.assert_allclose(session.run(None, feeds)[0], ref.run(None, feeds)[0], rtol=1e-4, atol=1e-4)


def test_packing_kernels_run_at_compile_time_are_not_built():
    """A constant weight's packing kernel runs once, on the constant, while lowering: it is dropped from
    the module, not compiled (MobileNetV3 built 43 such kernels of its 112)."""
    funcs = _prim_funcs(_lowered(CASES["matmul_packed_1x64x96"][0]))
    assert any(name.endswith("_prepacked") for name in funcs), sorted(funcs)
    assert not any(name.endswith("_weight_prepack") for name in funcs), sorted(funcs)


def test_weightless_builds_keep_weights_unpacked():
    """Weights bound at load are inputs, not constants:
    nothing to fold, so the kernel reads them as they are."""
    model = CASES["matmul_packed_1x64x96"][0]
    feeds = _feeds(model)
    session = nx.InferenceSession(model, provider_options=[{"weightless": True}, {}])
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    np.testing.assert_allclose(session.run(None, feeds)[0], want[0], rtol=1e-4, atol=1e-4)


def test_row_tiles_divide_the_rows_when_they_can():
    from nxrt_tvm.lower.schedules.core import pick_i_tile

    assert [pick_i_tile(n, 8) for n in (14, 28, 56, 7, 5, 13, 1)] == [7, 7, 8, 7, 5, 8, 1]
    assert pick_i_tile(None, 8) == 8 and pick_i_tile(14, 16) == 14


def test_rows_that_can_be_padded_take_the_full_tile_where_it_keeps_more_fmas_busy():
    """An einsum's rows are padded (pad_einsum) where the full tile over the padded rows does more useful
    work than the dividing tile: 500 rows in 5 of AVX2's 6 (83 %) against 6 over 504 (99 %); 128 rows in
    4 (67 %) against 6 over 132 (97 %). Ties keep the dividing tile, as do convolutions' pixel rows."""
    from nxrt_tvm.lower.schedules.core import pick_i_tile

    assert [pick_i_tile(n, 6, paddable=True) for n in (500, 128, 10, 3, 60, 14)] == [6, 6, 5, 3, 6, 6]
    assert [pick_i_tile(n, 6) for n in (500, 128, 10, 3, 60, 14)] == [5, 4, 5, 3, 6, 6]
    assert [pick_i_tile(n, 8, paddable=True) for n in (500, 14, 56, 196)] == [8, 7, 8, 8]


@pytest.mark.parametrize(("cpu", "lanes"), [("haswell", 8), ("znver4", 16)])
def test_activation_columns_no_full_tile_divides_are_padded_not_split_into_odd_vectors(cpu, lanes):
    """Attention scores over 50 (Whisper's 500) positions: a 10-wide tile divides the columns, but as two
    5-lane vectors a row (62 % of the lanes); the key operand is copied padded to full tiles instead (its
    copy is K x N elements against the M x K x N FMAs): Whisper's [4, 500, 32] x [4, 32, 500] scores
    862 -> 490 us on a Zen 3, interleaved in one process. Every vector is the target's width."""
    target = make_target({"kind": "llvm", "mcpu": cpu})
    lowered = pipeline.lowering_pipeline(target, pipeline.Lowering())(
        import_onnx(batch_matmul(2, 50, 16, 50))
    )
    (kernel,) = [f for f in _prim_funcs(lowered).values() if f.attrs.get(RULE_ATTR) == "matmul"]
    script = kernel.script()
    widths = set(re.findall(r"T\.vectorized\(T\.int64\((\d+)\)\)", script))
    assert widths == {str(lanes)}, widths
    assert 'sblock("y_pad")' in script


@pytest.mark.parametrize(
    ("target", "lanes", "rows"),
    [
        ({"mcpu": "haswell"}, 8, 6),
        ({"mcpu": "znver3"}, 8, 6),
        ({"mcpu": "znver4"}, 16, 8),
        ({"mcpu": "x86-64"}, 4, 6),
        ({"mtriple": "aarch64-linux-gnu", "mcpu": "neoverse-n1"}, 4, 8),
    ],
)
def test_vector_width_and_tile_rows_follow_the_target_cpu(target, lanes, rows):
    """From the CPU's ISA features: LLVM's `llvm_get_vector_width` says 512 bits for any x86 CPU."""
    from nxrt_tvm.lower.schedules.base import vector_lanes
    from nxrt_tvm.lower.schedules.core import tile_rows

    target = make_target({"kind": "llvm", **target})
    assert (vector_lanes(target), tile_rows(target)) == (lanes, rows)


#: a vector register stored to or loaded from the stack (x86 AT&T syntax)
_STACK_VECTOR = re.compile(r"mm\d+.*\(%rsp\)|\(%rsp\).*mm\d+")


@pytest.mark.parametrize("cpu", ["haswell", "znver4"])
@pytest.mark.parametrize(
    ("case", "model"),
    [("matmul", lambda: matmul_bias_relu(48, 256, 256)), ("conv", lambda: conv(1, 32, 28, 28, 64, 3, 2, 1))],
)
def test_register_tiles_fit_in_registers(cpu, case, model):
    """Each tile's accumulators stay in registers: the kernel's assembly moves no more vectors through
    the stack than its entry does (6). With 16-lane vectors on AVX2 (twice the registers it has) the
    matmul moved 115 and the convolution 204. 48 rows are whole tiles of 6 and of 8 (rows padded to a
    tile read their padding behind a branch, which keeps two rows' accumulators on the stack)."""
    target = make_target({"kind": "llvm", "mcpu": cpu})
    lowered = pipeline.lowering_pipeline(target, pipeline.Lowering())(import_onnx(model()))
    (func,) = [f for f in _prim_funcs(lowered).values() if f.attrs.get(RULE_ATTR) == case]
    asm = tvm.tirx.build(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target)
    assert len(_STACK_VECTOR.findall(asm.inspect_source("asm"))) <= 8


def test_tile_gathers_stay_scalar():
    funcs = _prim_funcs(_lowered(CASES["tile_3x5"][0]))
    script = "\n".join(f.script() for f in funcs.values())
    assert "T.vectorized" not in script  # modulo gathers: AVX-512 codegen miscompiles them vectorised


def test_no_rules_builds_tvm_default_and_matches():
    for case in ("matmul_5x33x17", "conv3x3s2_2x8x15x15", "softmax_3x17"):
        model, _, tol = CASES[case]
        session = _run_both(model, tol, schedule_passes=[])
        kernels = [v for k in session.kernels().values() for v in k.variants()]
        assert kernels and all(v.variant == "tvm-default" for v in kernels)
        funcs = _prim_funcs(_lowered(model, schedule_passes=[]))
        assert not any(f.attrs is not None and RULE_ATTR in f.attrs for f in funcs.values())


class _Broken(CpuRule):
    name = "broken"

    def schedule(self, sch, blocks, target):
        sch.vectorize(sch.get_loops(blocks[0].block_rv)[0])  # not a legal schedule for reductions
        sch.decompose_reduction(blocks[0].block_rv, sch.get_loops(blocks[0].block_rv)[0])
        raise RuntimeError("a rule bug")


def test_failing_rule_keeps_default_and_build_succeeds():
    passes = [ApplySchedules([_Broken()])]
    model, _, tol = CASES["matmul_5x33x17"]
    _run_both(model, tol, schedule_passes=passes)
    funcs = _prim_funcs(_lowered(model, schedule_passes=passes))
    assert not any(f.attrs is not None and RULE_ATTR in f.attrs for f in funcs.values())


class _Partial(CpuRule):
    """Schedules part of a kernel, then finds it does not fit: its steps must not reach the next rule."""

    name = "partial"

    def schedule(self, sch, blocks, target):
        sch.parallel(sch.get_loops(blocks[0].block_rv)[0])
        return None


def test_rules_tried_in_turn_share_one_normalised_start():
    """`schedule_with_rules` normalises a kernel once and hands each rule a copy: every kernel of every
    case gets the rule and the schedule it gets when each rule starts from scratch."""
    import tvm_ffi

    from nxrt_tvm.lower.schedules import default_rules
    from nxrt_tvm.lower.schedules.base import schedule_with_rules

    rules = [_Partial(), *default_rules()]
    for model, _, _ in CASES.values():
        for func in _prim_funcs(_lowered(model, schedule_passes=[])).values():
            shared = schedule_with_rules(func, TARGET, rules)
            alone = next(
                ((r.name, s) for r in rules if (s := r.apply(func, TARGET, False)) is not None), None
            )
            assert (shared is None) == (alone is None)
            if shared is not None:
                assert shared[0] == alone[0] != "partial"
                assert tvm_ffi.structural_equal(shared[1].mod, alone[1].mod)
                assert str(shared[1].trace) == str(alone[1].trace)


def test_schedule_phase_sits_after_fusion_and_only_on_llvm():
    # (the `nxrt_tvm.step.*` passes only mark the steps `plan --timings` reports)
    names = [
        p.info.name for p in pipeline.lowering_passes(TARGET) if not p.info.name.startswith("nxrt_tvm.step.")
    ]
    assert (
        names.index("nxrt_tvm.PreciseFastMath") < names.index("LegalizeOps")
        and "FastMathTransform" not in names
    )
    after_fusion = names[names.index("FuseTIR") + 1 :]
    assert after_fusion[:11] == [
        "nxrt_tvm.SizeParamsInOrder",  # fused kernels' size parameters in one order (`lower.size_params`)
        "nxrt_tvm.ReshapeKernelsAsViews",  # reshapes fusion left alone: views, not kernels to schedule
        "AttachAttrLayoutFreeBuffers",
        "nxrt_tvm.NameCompoundSizes",  # the rules tile `size0`, not an expression of the input dims
        "nxrt_tvm.MergeNamedKernels",  # kernels equal once their sizes are named: scheduled once
        "nxrt_tvm.ApplyCpuSchedules",
        "nxrt_tvm.SplitLayoutRewrites",
        "nxrt_tvm.FoldConstantCalls",  # packed weights evaluated in one build; FoldConstant finds none left
        "FoldConstant",
        "DeadCodeElimination",  # the packing kernels FoldConstant ran: not built
        "nxrt_tvm.record_variants",  # under the names the kernels run by (layout rewrites rename them)
    ]
    cuda = make_target("cuda")
    assert not cpu_schedule_passes(cuda) and not pre_legalize_passes(cuda)
    cuda_names = [p.info.name for p in pipeline.lowering_passes(cuda)]
    assert "nxrt_tvm.ApplyCpuSchedules" not in cuda_names and "FastMathTransform" not in cuda_names
    assert "nxrt_tvm.NameCompoundSizes" not in cuda_names
    custom = [tvm.relax.transform.FoldConstant()]
    custom_names = [
        p.info.name
        for p in pipeline.lowering_passes(TARGET, pipeline.Lowering(schedule_passes=tuple(custom)))
    ]
    assert custom_names.count("FastMathTransform") == 0


#: a MaxPool's -inf fill for an input shorter than its window, moved to NHWC (conv1d_audio's first pool)
_CLAMPED_FILL = """
# from tvm.script import tirx as T

@T.prim_func(s_tir=True)
def main(batch: T.int64, samples: T.int64, out: T.Buffer((batch, LEN, T.int64(32)), "float32")):
    T.func_attr({"tirx.noalias": True})
    full = T.sblock_alloc_buffer((batch, T.int64(32), LEN))
    for ax0, ax1, ax2 in T.grid(batch, T.int64(32), LEN):
        with T.sblock("T_full"):
            v_ax0, v_ax1, v_ax2 = T.axis.remap("SSS", [ax0, ax1, ax2])
            full[v_ax0, v_ax1, v_ax2] = T.float32(-1.0)
    for ax0, ax1, ax2 in T.grid(batch, LEN, T.int64(32)):
        with T.sblock("T_transpose"):
            v_ax0, v_ax1, v_ax2 = T.axis.remap("SSS", [ax0, ax1, ax2])
            out[v_ax0, v_ax1, v_ax2] = full[v_ax0, v_ax2, v_ax1]
""".replace(
    "LEN",
    "T.max(T.int64(3) - T.max(T.int64(0), samples // T.int64(4) - T.int64(3)) // T.int64(4), T.int64(0))",
)


def test_a_clamped_extent_is_not_fused_with_the_loops_after_it():
    """A loop whose extent holds a max (a pooled length clamped at 0) fused with the channel vectors
    after it failed TVM's index analysis at build time ("padding factor ... is not divisible"): the
    partition was bisected and its pools declined."""
    from nxrt_tvm.lower.schedules.generic import Generic
    from nxrt_tvm.lower.tir_pipeline import CPU_TIR_PIPELINE

    sch = Generic().apply(tvm.script.from_source(_CLAMPED_FILL), TARGET, False)
    lib = tvm.tirx.build(sch.mod, TARGET, pipeline=CPU_TIR_PIPELINE)
    for samples, rows in ((4, 3), (28, 2), (44, 1)):
        out = tvm.runtime.tensor(np.zeros((2, rows, 32), np.float32))
        lib["main"](2, samples, out)
        np.testing.assert_array_equal(out.numpy(), np.full((2, rows, 32), -1.0, np.float32))


def test_symbolic_injective_kernels_get_the_generic_rule():
    """Symbolic extents: the injective rule steps aside (its bounds-checked tails ran 100x slower); the
    generic rule runs the leading loops in parallel, the static inner one vectorised, never TVM's default."""
    graph = helper.make_graph(
        [helper.make_node("Transpose", ["x"], ["y"], perm=[1, 0, 2])],
        "t",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 12, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [12, "N", 64])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = nx.InferenceSession(model)
    variants = [v.variant for k in session.kernels().values() for v in k.variants()]
    assert variants == ["default:generic"]
    script = "\n".join(f.script() for f in _prim_funcs(_lowered(model)).values())
    assert "T.parallel" in script and "T.vectorized" in script
    for n in (1, 3, 17):
        x = RNG.standard_normal((n, 12, 64)).astype(np.float32)
        np.testing.assert_array_equal(session.run(None, {"x": x})[0], x.transpose(1, 0, 2))


@pytest.mark.parametrize("axis,op", [(1, "ReduceMean"), (0, "ReduceSum"), (1, "ReduceSum")])
def test_symbolic_reductions_over_any_axis_have_a_rule(axis, op):
    """Reductions over a leading or middle axis of symbolic rows, widths not a multiple of the vector."""
    graph = helper.make_graph(
        [helper.make_node(op, ["x", "axes"], ["y"], keepdims=0)],
        "r",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 33, 19])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 19] if axis == 1 else [33, 19])],
        initializer=[numpy_helper.from_array(np.array([axis], np.int64), "axes")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    session = nx.InferenceSession(model)
    variants = [v.variant for k in session.kernels().values() for v in k.variants()]
    assert variants and "tvm-default" not in variants
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for n in (1, 5):
        x = RNG.standard_normal((n, 33, 19)).astype(np.float32)
        np.testing.assert_allclose(
            session.run(None, {"x": x})[0], ref.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5
        )


def test_a_transformers_export_has_no_tvm_default_kernel(exports_cache):
    """tiny_bert (a transformers export with dynamic batch and sequence): every kernel has a rule."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "data" / "tiny_bert.onnx"
    providers = [("TvmExecutionProvider", {"cache_dir": exports_cache}), "CPUExecutionProvider"]
    session = nx.InferenceSession(str(path), providers=providers)
    variants = [v.variant for vs in session.kernel_variants().values() for v in vs]
    assert variants and "tvm-default" not in variants


def test_convolutions_run_nhwc_where_tvm_cannot_convert_the_module():
    """TVM 0.27's ConvertLayout fails on a module whose batch is a Slice of a symbolic dim ("DataflowBlock
    Pass should not rewrite or delete any global-scope Var": jax2tf's Magika, before its slices "to the
    end" became no slice; here one that keeps at most 100000 items). Each conv is then converted alone,
    between transposes, so it still runs the NHWC conv rule (NCHW with a width of 1 ran 50x slower than
    onnxruntime)."""
    ends = [("s", [0]), ("e", [100_000]), ("a", [0])]
    nodes = [
        helper.make_node("Slice", ["x", "s", "e", "a"], ["xs"]),
        helper.make_node("Conv", ["xs", "w"], ["out"], kernel_shape=[5, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16, 20, 1])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["M", 24, 16, 1])],
        initializer=[
            numpy_helper.from_array(RNG.standard_normal((24, 16, 5, 1)).astype(np.float32), "w"),
            *(numpy_helper.from_array(np.array(v, np.int64), n) for n, v in ends),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(tvm.error.InternalError, match="global-scope Var"):
        tvm.relax.transform.ConvertLayout({"relax.nn.conv2d": ["NHWC", "HWIO"]})(import_onnx(model))
    funcs = _prim_funcs(_lowered(model))
    assert any(f.attrs is not None and f.attrs.get(RULE_ATTR) == "conv" for f in funcs.values())
    session = nx.InferenceSession(model)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for batch in (1, 3):
        x = {"x": RNG.standard_normal((batch, 16, 20, 1)).astype(np.float32)}
        np.testing.assert_allclose(session.run(None, x)[0], ref.run(None, x)[0], rtol=1e-4, atol=1e-4)


def test_clip_between_convolutions_stays_nhwc():
    """TVM imports Clip as TE kernels, opaque to layout conversion (each ReLU6 was transpose, clip,
    transpose); ours are Relax maximum/minimum, fused into the conv before them."""
    model = conv(1, 16, 8, 8, 16, 3, 1, 1, act="Relu")
    model.graph.node[1].op_type = "Clip"
    model.graph.node[1].input.extend(["lo", "hi"])
    model.graph.initializer.extend(
        [numpy_helper.from_array(np.float32(0), "lo"), numpy_helper.from_array(np.float32(6), "hi")]
    )
    _run_both(model, 1e-4)
    names = list(_prim_funcs(_lowered(model)))
    assert any("conv2d" in n and "maximum" in n and "minimum" in n for n in names), names
    assert sum("transpose" in n for n in names) <= 2, names  # the model's own NCHW input and output


def test_a_grouped_pointwise_conv_is_one_matmul_over_its_groups():
    """ShuffleNet's grouped 1x1 convs: split per group they were 4 convs, a split and a concat each (32
    units: 128 kernels); one matmul batched over the groups ran the model in 0.73x the time."""
    model = conv(1, 24, 7, 7, 36, 1, 1, 0, group=3)
    names = list(_prim_funcs(_lowered(model)))
    assert sum("matmul" in n for n in names) == 1, names
    assert not any("split" in n or "concat" in n or "conv2d" in n for n in names), names


def test_a_grouped_conv_past_the_split_limit_is_not_dlights_reduction():
    """A contraction is never the normalisation rule's: dlight's reduction ran AlexNet's grouped 5x5 conv
    at 230 ms (the conv rule: 2 ms). Past MAX_GROUPS groups the conv stays whole, on the generic rule."""
    from nxrt_tvm.lower.grouped_conv import MAX_GROUPS

    groups = 2 * MAX_GROUPS
    model = conv(1, 2 * groups, 5, 5, 2 * groups, 3, 1, 1, group=groups)
    _run_both(model, 1e-4)
    rules = {str(f.attrs[RULE_ATTR]) for n, f in _prim_funcs(_lowered(model)).items() if "conv2d" in n}
    assert rules == {"generic"}, rules


def test_single_row_softmax_is_not_parallel_over_its_reduced_axis():
    """dlight's reduction rule on a [1, 1000] softmax (every classifier's head) ran its 1000 columns as
    parallel iterations, each reducing the whole row into one shared scalar: 1000x the work and a race."""
    model = softmax([1, 1000])
    _run_both(model, 1e-5)
    funcs = _prim_funcs(_lowered(model))
    softmax_kernel = next(f for n, f in funcs.items() if "softmax" in n)
    assert str(softmax_kernel.attrs[RULE_ATTR]) != "normalization"
    assert "T.parallel(T.int64(1000))" not in softmax_kernel.script()


@pytest.mark.parametrize("with_matmul", [False, True], ids=["alone", "next-to-a-packed-matmul"])
def test_index_kernels_on_constants_build_whether_or_not_a_weight_is_packed(with_matmul):
    """Unsqueeze/Slice with run-time axes import as gathers and scans over
    constant index tables, which TVM marks layout-free; SplitLayoutRewritePreproc
    fails on them, so only kernels with a rewrite block go through it."""
    nodes = [
        helper.make_node("Unsqueeze", ["x", "axes"], ["u"]),
        helper.make_node("Slice", ["u", "starts", "ends"], ["out"]),
    ]
    inputs, outputs, inits = [("x", [3, 64])], [("out", [2, 3, 64])], []
    if with_matmul:  # an independent branch in the same partition: one module with both kinds of kernel
        nodes.append(helper.make_node("MatMul", ["x0", "w"], ["y"]))
        inputs, outputs, inits = inputs + [("x0", [3, 32])], outputs + [("y", [3, 64])], [("w", [32, 64])]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs]
        + [helper.make_tensor_value_info(n, TensorProto.INT64, [1]) for n in ("axes", "starts", "ends")],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
        initializer=[numpy_helper.from_array(RNG.standard_normal(s).astype(np.float32), n) for n, s in inits],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    feeds = {n: RNG.standard_normal(s).astype(np.float32) for n, s in inputs}
    feeds |= {"axes": np.array([0]), "starts": np.array([1]), "ends": np.array([3])}
    session = nx.InferenceSession(model)
    assert session.plan.nodes_by_ep() == {"TvmExecutionProvider": len(nodes)}, [
        str(d) for d in session.plan.declines
    ]
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    for got, ref in zip(session.run(None, feeds), want):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op", ["Tanh", "Erf"])
def test_a_chain_of_approximated_ops_is_not_inlined_into_itself(op):
    """fast tanh/erf read their input several times: inlining each into the next grew the expression
    exponentially (four Tanh -> Mul steps compiled in 196 s, eight never finished)."""
    nodes, y = [], "x"
    for k in range(8):
        nodes += [helper.make_node(op, [y], [f"t{k}"]), helper.make_node("Mul", [f"t{k}", "x"], [f"m{k}"])]
        y = f"m{k}"
    model = _model(nodes, [("x", [64, 256])], [y])
    lowered = pipeline.lowering_pipeline(TARGET, pipeline.Lowering())(import_onnx(model))
    funcs = [f for _, f in lowered.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert funcs and max(len(str(f)) for f in funcs) < 60_000  # the exponential chain: megabytes of TIR
    x = np.random.default_rng(3).uniform(-1.5, 1.5, (64, 256)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )
    got = nx.InferenceSession(model, provider_options=[{"compile_isolation": "none"}, {}]).run(None, {"x": x})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)


def _symbolic_matmuls():
    dense = _model(  # symbolic rows, a constant weight, a bias
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Add", ["y", "b"], ["out"])],
        [("x", [1, "s", 128])],
        ["out"],
        [("w", [128, 96]), ("b", [96])],
    )
    scores = _model(  # attention scores: symbolic rows and columns, a scale and a mask, no constant
        [
            helper.make_node("MatMul", ["q", "k"], ["m"]),
            helper.make_node("Mul", ["m", "c"], ["ms"]),
            helper.make_node("Add", ["ms", "mask"], ["out"]),
        ],
        [("q", ["b", 4, "s", 32]), ("k", ["b", 4, 32, "s"]), ("mask", ["b", 1, "s", "s"])],
        ["out"],
        [("c", [])],
    )
    bare = _model(  # no epilogue: the padded copy out is the kernel's last block
        [helper.make_node("MatMul", ["q", "k"], ["out"])],
        [("q", ["s", 24]), ("k", [24, "s"])],
        ["out"],
    )
    odd = _model(  # static, but no tile divides 37 x 37 (ViT's 197 patches)
        [helper.make_node("MatMul", ["q", "k"], ["m"]), helper.make_node("Relu", ["m"], ["out"])],
        [("q", [2, 37, 24]), ("k", [2, 24, 37])],
        ["out"],
    )
    rows = _model(  # a torch export's dense layer: [batch x 16, 64] rows, a multiple of the tile
        [
            helper.make_node(
                "Constant", [], ["flat"], value=numpy_helper.from_array(np.array([-1, 64], np.int64))
            ),
            helper.make_node("Reshape", ["x", "flat"], ["x2"]),
            helper.make_node("MatMul", ["x2", "w"], ["y"]),
            helper.make_node("Add", ["y", "bias"], ["out"]),
        ],
        [("x", ["b", 16, 64])],
        ["out"],
        [("w", [64, 64]), ("bias", [64])],
    )
    return {"dense": dense, "scores": scores, "bare": bare, "odd": odd, "rows": rows}


@pytest.mark.parametrize("case", ["dense", "scores", "bare", "odd", "rows"])
def test_symbolic_matmuls_keep_a_static_register_tile(case):
    """Symbolic rows/columns (and static ones no tile divides) are padded to whole tiles (pad_einsum):
    the accumulator compacts to the static tile (a predicated split kept a buffer of every row,
    5-10x slower than the static shape), the padding is never written (the epilogue keeps the
    real domain), and every size matches."""
    model = _symbolic_matmuls()[case]
    kernels = {
        name: f
        for name, f in _prim_funcs(_lowered(model)).items()
        if f.attrs is not None and f.attrs.get(RULE_ATTR) == "matmul"
    }
    assert kernels
    compact = tvm.transform.Sequential(
        [
            tvm.s_tir.transform.LowerInitBlock(),
            tvm.s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
            tvm.s_tir.transform.ConvertBlocksToOpaque(),
            tvm.s_tir.transform.CompactBufferAllocation(),
        ]
    )(tvm.IRModule(kernels))
    scripts = [f.script() for _, f in compact.functions_items()]
    local = [line for script in scripts for line in script.splitlines() if 'scope="local"' in line]
    shapes = [re.search(r"alloc_buffer\((.*), scope=", line).group(1) for line in local]
    assert shapes and all(re.fullmatch(r"\((T\.int64\(\d+\)(, )?)+\)", shape) for shape in shapes), shapes
    # the tile's update is unpredicated (a per-lane bounds check made TVM scalarise it)
    updates = [
        u
        for f in kernels.values()
        for u in re.findall(r'sblock\("matmul_update"\)(.*?)T\.reads', f.script(), re.S)
    ]
    assert updates and not any("T.where" in u for u in updates)
    session = nx.InferenceSession(model, providers=["TvmExecutionProvider"])
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for s in (1, 5, 13, 33, 100):
        shapes = {
            i.name: [
                s if d.dim_param == "s" else 2 if d.dim_param == "b" else d.dim_value
                for d in i.type.tensor_type.shape.dim
            ]
            for i in model.graph.input
        }
        feeds = {n: RNG.standard_normal(shape).astype(np.float32) for n, shape in shapes.items()}
        np.testing.assert_allclose(session.run(None, feeds)[0], ref.run(None, feeds)[0], rtol=1e-4, atol=1e-4)


def test_symbolic_batch_rows_tile_the_static_axis():
    """A seq-first torch export's dense layer, [16, batch, 64] x [64, 64]: the rows are tiled over the
    16 positions, not the symbolic batch padded to a tile (a batch of 1 then did 8x the work: 15 us
    against 3 us for the QKV projection of tests/data/torch_encoder.onnx)."""
    model = _model(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Add", ["y", "bias"], ["out"])],
        [("x", [16, "b", 64])],
        ["out"],
        [("w", [64, 64]), ("bias", [64])],
    )
    (update,) = [
        u
        for f in _prim_funcs(_lowered(model)).values()
        for u in re.findall(r'sblock\("matmul_update"\)(.*?)T\.reads', f.script(), re.S)
    ]
    # the 16 positions are the rows (padded to 18 in AVX2's 6-row tiles); the batch is not padded
    assert re.search(r"v0 = T\.axis\.spatial\(T\.int64\((16|18)\)", update), update
    assert "v1 = T.axis.spatial(b, " in update and "+ T.int64(7)" not in update, update
    session = nx.InferenceSession(model, providers=["TvmExecutionProvider"])
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for b in (1, 3, 8):
        feeds = {"x": RNG.standard_normal((16, b, 64)).astype(np.float32)}
        np.testing.assert_allclose(session.run(None, feeds)[0], ref.run(None, feeds)[0], rtol=1e-4, atol=1e-4)


def _check_batches(model: onnx.ModelProto, batches) -> None:
    """The model's one symbolic-batch input at each batch size, against onnxruntime."""
    (x,) = model.graph.input
    session = nx.InferenceSession(model, providers=["TvmExecutionProvider"])
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for b in batches:
        shape = [b, *(d.dim_value for d in x.type.tensor_type.shape.dim[1:])]
        feeds = {x.name: RNG.standard_normal(shape).astype(np.float32)}
        np.testing.assert_allclose(session.run(None, feeds)[0], ref.run(None, feeds)[0], rtol=1e-4, atol=1e-4)


def test_a_symbolic_batch_is_not_padded_to_a_row_tile():
    """A classifier's dense layer over a symbolic batch, [batch, 1024] x [1024, 1000]: one-row tiles in a
    loop over the batch, not the batch padded to 8 rows (MobileNetV3's head: 106 us at batch 1, 40 us
    now, 42 us built for batch 1). Every batch size matches."""
    model = gemm_trans_b("batch", 256, 200)
    (update,) = [
        u
        for f in _prim_funcs(_lowered(model)).values()
        for u in re.findall(r'sblock\("(?:matmul|T_matmul_NT)_update"\)(.*?)T\.reads', f.script(), re.S)
    ]
    assert "+ T.int64(7)" not in update, update
    _check_batches(model, (1, 3, 9))


def _padding_loops(model: onnx.ModelProto) -> list[str | None]:
    """Per kernel with a padded copy, the extent of the parallel loop around the copy (None: none)."""
    scripts = [f.script() for f in _prim_funcs(_lowered(model)).values() if "pad_temp" in f.script()]
    found = [re.search(r"T\.parallel\((.*?)\):(?:\n.*){0,3}?sblock\(\"pad_temp\"\)", s) for s in scripts]
    return [None if loop is None else loop.group(1) for loop in found]


def test_a_symbolic_batch_does_not_serialise_a_padding_loop():
    """A conv's padded copy over a symbolic batch ran in parallel over the batch alone: one thread at
    batch 1 (MobileNetV3's stride-2 convs 2-4x slower than built for batch 1). The batch is fused with
    the static rows after it."""
    model = conv("batch", 16, 20, 20, 16, 3, 2, 1)
    loops = _padding_loops(model)
    assert loops and all(loop is not None and loop != "batch" for loop in loops), loops
    _check_batches(model, (1, 2, 5))


def test_symbolic_maps_fuse_no_second_symbolic_loop():
    """A padded copy over a symbolic batch and a symbolic map: the batch is not fused with the map's
    symbolic rows (fused, their index arithmetic took YOLOv8n's build past 300 s)."""
    model = conv("b", 8, "h", "w", 8, 3, 1, 1)
    loops = _padding_loops(model)
    assert loops and all(loop == "b" for loop in loops), loops


@pytest.mark.parametrize("stride", [1, 2])
def test_a_depthwise_conv_reads_its_padding_in_place(stride):
    """A depthwise conv does 9 FMAs per input value, too few to pay for copying its input into a padded
    buffer first: the padding is read in place, per row of the tile (MobileNetV2's stride-2 3x3 over a
    64x64x48 map: 47 -> 12 us). Both strides match onnxruntime."""
    model = conv(1, 48, 17, 17, 48, 3, stride, 1, group=48)
    scripts = [f.script() for f in _prim_funcs(_lowered(model)).values() if f.attrs.get(RULE_ATTR) == "conv"]
    assert scripts and not any('sblock("pad_temp")' in s for s in scripts), scripts
    _run_both(model, 1e-4)


@pytest.mark.parametrize("stride", [1, 2])
def test_a_conv_without_padding_reads_its_input_in_place(stride):
    """A conv that pads nothing legalises with a plain copy of its input (`pad_temp`): it is inlined,
    not run as its own loop (ResNet-50's 1x1 convs copied their whole input, up to 3.2 MB, per call).
    A 3x3 conv with padding keeps its padded copy."""
    model = conv(1, 32, 9, 9, 32, 1, stride, 0)
    scripts = [f.script() for f in _prim_funcs(_lowered(model)).values() if f.attrs.get(RULE_ATTR) == "conv"]
    assert scripts and not any('sblock("pad_temp")' in s for s in scripts), scripts
    _run_both(model, 1e-4)
    assert _padding_loops(conv(1, 32, 9, 9, 32, 3, stride, 1))


def test_a_long_sum_is_summed_in_blocks():
    """ReduceSum of squares over a 512-long middle axis (a layer norm's E[x^2] in a jax2tf export): the
    pooling rule sums blocks of 16 terms, then the blocks, so its error against float64 is well under one
    float accumulator's (which, on that model's E[x^2] - E[x]^2, put 6e-3 relative on the output)."""
    x = np.random.default_rng(0).random((3, 512, 256)).astype(np.float32) * 0.7
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "x"], ["sq"]),
            helper.make_node("ReduceSum", ["sq", "axes"], ["y"], keepdims=0),
        ],
        "sum_of_squares",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 512, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 256])],
        [numpy_helper.from_array(np.array([1], np.int64), "axes")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = nx.InferenceSession(model)
    assert [v.variant for vs in session.kernel_variants().values() for v in vs] == ["default:pooling"]
    exact = (x.astype(np.float64) ** 2).sum(axis=1)
    one_accumulator = np.zeros((3, 256), np.float32)
    for row in x.transpose(1, 0, 2):
        one_accumulator += row * row
    got = session.run(None, {"x": x})[0]
    assert np.abs(got - exact).max() < 0.5 * np.abs(one_accumulator - exact).max()
    np.testing.assert_allclose(got, exact, rtol=2e-6)


@pytest.mark.parametrize("after_conv", [False, True], ids=["alone", "after-conv"])
def test_a_conv_transpose_over_symbolic_sizes_builds_and_matches_onnxruntime(after_conv):
    """A UNet/DB-head ConvTranspose with symbolic height and width. Alone: the conv rule ran its dilated
    input's static channel loop fused with the symbolic row loop in parallel, which TVM's index analysis
    fails on when building (a failed check, so the node was declined); now parallel without that fusion.
    After an NHWC conv: layout conversion carried NHWC into it, which TVM does not legalise (ppocr det's
    head was declined); it stays NCHW between transposes."""
    nodes = [
        helper.make_node("ConvTranspose", ["c", "w"], ["y"], strides=[2, 2], kernel_shape=[2, 2], name="up"),
        helper.make_node("Relu", ["y"], ["z"]),
    ]
    inits = [numpy_helper.from_array(RNG.standard_normal((4, 3, 2, 2)).astype(np.float32), "w")]
    if after_conv:
        nodes.insert(0, helper.make_node("Conv", ["x", "w0"], ["c"], kernel_shape=[3, 3], pads=[1] * 4))
        inits.append(numpy_helper.from_array(RNG.standard_normal((4, 4, 3, 3)).astype(np.float32), "w0"))
    else:
        nodes.insert(0, helper.make_node("Identity", ["x"], ["c"]))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4, "h", "w"])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["n", 3, None, None])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)])
    sess = nx.InferenceSession(
        model, providers=[("TvmExecutionProvider", {"claim_policy": "all"}), "CPUExecutionProvider"]
    )
    assert not sess.plan.declines, sess.plan.format(sess.graph)
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for size in [(1, 1, 1), (1, 3, 5), (2, 8, 8)]:
        feeds = {"x": RNG.standard_normal((size[0], 4, *size[1:])).astype(np.float32)}
        np.testing.assert_allclose(
            sess.run(None, feeds)[0], reference.run(None, feeds)[0], rtol=1e-4, atol=1e-4
        )


def test_softmax_scales_each_row_by_the_reciprocal_of_its_sum():
    """One reciprocal a row, computed once, and a multiply per element: a divide per element took a
    third of a 500-wide softmax's time (``vdivps``); 449 -> 409 us over [4, 500, 500] on a Zen 3."""
    funcs = _prim_funcs(_lowered(softmax([4, 50])))
    (kernel,) = [f for f in funcs.values() if f.attrs.get(RULE_ATTR) == "row-reduction"]
    script = kernel.script()
    norm = re.search(r'sblock\("T_softmax_norm"\).*?\n(\s*T_softmax_norm\[.*)', script, re.S).group(1)
    assert 'sblock("T_softmax_scale")' in script and " / " not in norm and "T_softmax_scale" in norm, norm


def test_row_reductions_with_a_tail_are_exact_where_values_are_extreme():
    """A row ending in part of a vector is reduced in whole vectors over a copy padded with the reduction's
    identity: a row whose values are all far below 0 (a fully masked attention row) or above it gives
    onnxruntime's result, not the padding's (0 would win a max of negative values and underflow every
    exp); the last row reads nothing past the input's end."""
    model = softmax([7, 37])
    x = RNG.standard_normal((7, 37)).astype(np.float32)
    x[0] = -1e9
    x[3] = np.linspace(-400, -300, 37)
    x[6] = np.linspace(300, 400, 37)
    session = nx.InferenceSession(model, provider_options=[{"target": "llvm", "claim_policy": "all"}, {}])
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    np.testing.assert_allclose(session.run(None, {"x": x})[0], want, rtol=1e-3, atol=1e-6)
    funcs = _prim_funcs(_lowered(model))
    script = "\n".join(f.script() for f in funcs.values() if f.attrs.get(RULE_ATTR) == "row-reduction")
    assert "pragma_loop_partition_hint" in script and "T.float32(0.0)" in script and "T.vectorized" in script


@pytest.mark.parametrize(
    "op,shape,sizes",
    [
        ("softmax", ["batch", 3, 197], [{"batch": 1}, {"batch": 3}]),
        ("layer_norm", ["batch", 5, 128], [{"batch": 1}, {"batch": 3}]),
        # a sequence's width: every row ends in part of a vector, or in whole ones, or in less than one
        ("softmax", [2, "batch", "seq"], [{"batch": 1, "seq": s} for s in (1, 15, 16, 77)]),
    ],
)
def test_row_reductions_over_symbolic_rows_take_the_row_rule(op, shape, sizes):
    """Rows counted by a symbolic batch (every transformers export) are rows all the same, and a
    symbolic width is reduced over its padded copy: the row rule takes both (dlight's rule, which did,
    reduced scalars: ViT's layer norms ran 4x slower, a BERT export's whole run 2.8x)."""
    model = softmax(shape) if op == "softmax" else layer_norm(shape)
    session = nx.InferenceSession(model, provider_options=[{"target": "llvm", "claim_policy": "all"}, {}])
    assert "default:row-reduction" in {v.variant for k in session.kernels().values() for v in k.variants()}
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for size in sizes:
        feeds = {"x": RNG.standard_normal([size.get(d, d) for d in shape]).astype(np.float32)}
        np.testing.assert_allclose(
            session.run(None, feeds)[0], reference.run(None, feeds)[0], rtol=1e-3, atol=1e-4
        )


def test_small_kernels_run_on_one_thread():
    """A parallel loop costs more to launch than a small kernel's work: below MIN_PARALLEL_WORK element
    operations a kernel stays on one thread (BERT-tiny's 47 kernels ran 2.2x slower parallel); above, the
    same rule runs it in parallel. Numerics are the rule's either way."""
    small, large = elementwise([3, 17, 19]), elementwise([4, 128, 160])
    for model in (small, large):
        _run_both(model, 1e-3)
    (kernel,) = [f for f in _prim_funcs(_fused(small)).values()]
    assert kernel_work(kernel) == 3 * (3 * 17 * 19) < base.MIN_PARALLEL_WORK  # add, erf, mul per element
    small_script = _prim_funcs(_lowered(small))
    large_script = _prim_funcs(_lowered(large))
    (s,), (g,) = small_script.values(), large_script.values()
    assert str(s.attrs[RULE_ATTR]) == str(g.attrs[RULE_ATTR]) == "injective"
    assert "T.parallel" not in s.script() and "T.vectorized" in s.script()
    assert "T.parallel" in g.script() and 3 * (4 * 128 * 160) >= base.MIN_PARALLEL_WORK


def test_kernel_work_counts_each_store_per_iteration():
    kernel = next(iter(_prim_funcs(_fused(matmul_bias_relu(5, 33, 17))).values()))
    # the [5, 17] product's update over k = 33 (its init not counted), then the bias and relu epilogue
    assert kernel_work(kernel) == 5 * 17 * 33 + 2 * 5 * 17


def test_the_normalization_rule_checks_rows_on_the_shared_normalisation():
    """The rule reads a kernel's one shared normalisation (`KernelStart`) and leaves a kernel that reduces
    nothing at that check: dlight's rule made and normalised two more schedules of every elementwise
    kernel that reached it, to refuse it (YOLOv8n's schedule phase 2.2 -> 1.6 s). A softmax still passes."""
    from tvm import te, topi

    from nxrt_tvm.lower.schedules.reduction import Normalization, _has_rows

    x = te.placeholder((8, 100), "float32", name="x")
    relu = te.create_prim_func([x, te.compute(x.shape, lambda i, j: te.max(x[i, j], 0.0), name="relu")])
    softmax = te.create_prim_func([x, topi.nn.softmax(x)])
    assert not _has_rows(*base.KernelStart(relu).fresh())
    assert Normalization().apply(relu, TARGET, False) is None
    assert _has_rows(*base.KernelStart(softmax).fresh())


def test_a_squeeze_excite_scale_is_tiled_and_broadcast_after_the_tile():
    """MobileNetV3's squeeze-excite: its second 1x1 conv, on the pooled 1x1 map, fuses with the product
    of its (hard-sigmoid) result and the feature map, an epilogue that writes more than the conv does.
    It cannot be the tile's write-back: TVM refused the schedule and the kernel ran the generic rule
    (MobileNetV3: 95 us a call); now the broadcast is a loop nest of its own after the tile."""
    c = 16
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["y"], pads=[1] * 4),
        helper.make_node("GlobalAveragePool", ["y"], ["p"]),
        helper.make_node("Conv", ["p", "f1"], ["q"]),
        helper.make_node("Relu", ["q"], ["r"]),
        helper.make_node("Conv", ["r", "f2", "b"], ["s"]),
        helper.make_node("HardSigmoid", ["s"], ["g"], alpha=1 / 6),
        helper.make_node("Mul", ["y", "g"], ["out"]),
    ]
    weights = [("w", (c, c, 3, 3)), ("f1", (4, c, 1, 1)), ("f2", (c, 4, 1, 1)), ("b", (c,))]
    model = _model(nodes, [("x", [1, c, 9, 7])], ["out"], weights)
    _run_both(model, 1e-4)
    funcs = _prim_funcs(_lowered(model))
    rules = {n: str(f.attrs[RULE_ATTR]) for n, f in funcs.items() if "conv2d" in n and "multiply" in n}
    assert rules and set(rules.values()) <= {"conv", "matmul"}, rules  # the tile, not "generic"
