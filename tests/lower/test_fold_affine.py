"""BatchNormalization, and Mul or Add by a per-channel constant, after a convolution fold into its
weights and bias: same results as onnxruntime, one kernel.

Tolerance: rtol=atol=1e-4 against onnxruntime (folding rounds the scaled weights once, in float32).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper

import nxrt_tvm as nx
from nxrt_tvm.frontend import import_onnx
from nxrt_tvm.lower.fold_affine import FoldAffineIntoConv

RNG = np.random.default_rng(0)


def _conv_model(
    nodes: list, inits: dict, x_shape: list[int], outputs: dict[str, list[int]]
) -> onnx.ModelProto:
    """An opset-17 model of `nodes` over a float input ``x``, with float `outputs` (name: shape)."""
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in outputs.items()],
        initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _model(conv_bias: bool, group: int = 1, norm_input: str = "y", channels: int = 8) -> onnx.ModelProto:
    c_in = 4
    inits = {
        "w": RNG.standard_normal((channels, c_in // group, 3, 3)).astype(np.float32),
        "b": RNG.standard_normal(channels).astype(np.float32),
        "gamma": RNG.uniform(0.5, 1.5, channels).astype(np.float32),
        "beta": RNG.standard_normal(channels).astype(np.float32),
        "mean": RNG.standard_normal(channels).astype(np.float32),
        "var": RNG.uniform(0.2, 2.0, channels).astype(np.float32),
    }
    conv_inputs = ["x", "w", "b"] if conv_bias else ["x", "w"]
    nodes = [
        helper.make_node("Conv", conv_inputs, ["y"], kernel_shape=[3, 3], pads=[1] * 4, group=group),
        helper.make_node(
            "BatchNormalization", [norm_input, "gamma", "beta", "mean", "var"], ["z"], epsilon=1e-3
        ),
        helper.make_node("Relu", ["z"], ["out"]),
    ]
    outputs = {"out": [1, channels, 9, 9]}
    if norm_input != "y":  # the norm reads the input, not the conv: nothing to fold
        outputs["y"] = [1, channels, 9, 9]
    return _conv_model(nodes, inits, [1, c_in, 9, 9], outputs)


def _ops(mod: tvm.IRModule) -> list[str]:
    ops: list[str] = []

    def visit(expr) -> None:
        if isinstance(expr, tvm.relax.Call) and isinstance(expr.op, tvm.ir.Op):
            ops.append(expr.op.name)

    tvm.relax.analysis.post_order_visit(mod["main"], visit)
    return ops


@pytest.mark.parametrize(
    "conv_bias,group", [(True, 1), (False, 1), (True, 2)], ids=["bias", "no-bias", "grouped"]
)
def test_folded_norm_matches_onnxruntime(conv_bias, group):
    model = _model(conv_bias, group)
    folded = FoldAffineIntoConv(import_onnx(model))
    assert "relax.nn.batch_norm" not in _ops(folded) and _ops(folded).count("relax.nn.conv2d") == 1
    x = RNG.standard_normal((1, 4, 9, 9)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )
    session = nx.InferenceSession(model)
    assert session.plan.nodes_by_ep() == {"TvmExecutionProvider": 3}
    np.testing.assert_allclose(session.run(None, {"x": x})[0], want[0], rtol=1e-4, atol=1e-4)


def test_norm_not_after_a_conv_is_left_alone():
    model = _model(True, norm_input="x", channels=4)
    assert "relax.nn.batch_norm" in _ops(FoldAffineIntoConv(import_onnx(model)))
    x = RNG.standard_normal((1, 4, 9, 9)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )
    for got, ref in zip(nx.InferenceSession(model).run(None, {"x": x}), want):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_fold_runs_before_legalisation_on_llvm_only():
    from nxrt_tvm.lower import pipeline
    from nxrt_tvm.lower.target import make_target

    names = [p.info.name for p in pipeline.lowering_passes(make_target("llvm"))]
    assert (
        names.index("nxrt_tvm.FoldAffineIntoConv")
        < names.index("nxrt_tvm.ConvertConvLayout")
        < names.index("LegalizeOps")
    )
    assert "nxrt_tvm.FoldAffineIntoConv" not in [
        p.info.name for p in pipeline.lowering_passes(make_target("cuda"))
    ]


def _affine_model(operand_shape: tuple[int, ...], norm: bool) -> onnx.ModelProto:
    """Conv [-> BatchNormalization] -> Mul -> Add -> Relu, the Mul/Add operands of `operand_shape`
    (Inception v2's Caffe2 export: ``[C, 1, 1]`` after every norm); 8 channels over an 8-wide map."""
    inits = {
        "w": RNG.standard_normal((8, 4, 3, 3)).astype(np.float32),
        "b": RNG.standard_normal(8).astype(np.float32),
        "s": RNG.uniform(-1.5, 1.5, operand_shape).astype(np.float32),
        "t": RNG.standard_normal(operand_shape).astype(np.float32),
    }
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[3, 3], pads=[1] * 4)]
    if norm:
        inits.update(
            gamma=RNG.uniform(0.5, 1.5, 8).astype(np.float32),
            beta=RNG.standard_normal(8).astype(np.float32),
            mean=RNG.standard_normal(8).astype(np.float32),
            var=RNG.uniform(0.2, 2.0, 8).astype(np.float32),
        )
        nodes.append(helper.make_node("BatchNormalization", ["y", "gamma", "beta", "mean", "var"], ["z"]))
    nodes += [
        helper.make_node("Mul", ["z" if norm else "y", "s"], ["scaled"]),
        helper.make_node("Add", ["t", "scaled"], ["shifted"]),
        helper.make_node("Relu", ["shifted"], ["out"]),
    ]
    return _conv_model(nodes, inits, [1, 4, 8, 8], {"out": [1, 8, 8, 8]})


@pytest.mark.parametrize(
    "operand_shape,norm,folded",
    [
        ((8, 1, 1), True, True),
        ((1, 8, 1, 1), False, True),
        ((), False, True),
        ((8,), False, False),  # broadcasts along the width, not the channels
        ((8, 8, 1), False, False),  # varies along the height too
    ],
    ids=["norm-C11", "1C11", "scalar", "last-axis", "per-row"],
)
def test_per_channel_mul_add_fold_into_the_conv(operand_shape, norm, folded):
    model = _affine_model(operand_shape, norm)
    ops = _ops(FoldAffineIntoConv(import_onnx(model)))
    assert ops.count("relax.nn.conv2d") == 1 and "relax.nn.batch_norm" not in ops
    # folded: only the conv's bias add is left
    assert (ops.count("relax.multiply") == 0 and ops.count("relax.add") == 1) == folded
    x = RNG.standard_normal((1, 4, 8, 8)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )
    np.testing.assert_allclose(
        nx.InferenceSession(model).run(None, {"x": x})[0], want[0], rtol=1e-4, atol=1e-4
    )


def test_a_conv_read_twice_is_not_folded_into_a_second_conv():
    """HardSwish reads its conv's output twice, ``y * relu6(y + 3) / 6``: folding the ``+ 3`` would
    leave two convolutions computing (MobileNetV3 1.2x -> 1.35x onnxruntime), so nothing folds."""
    inits = {
        "w": RNG.standard_normal((8, 4, 3, 3)).astype(np.float32),
        "b": RNG.standard_normal(8).astype(np.float32),
        "three": np.full((8, 1, 1), 3.0, np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[3, 3], pads=[1] * 4),
        helper.make_node("Add", ["y", "three"], ["shifted"]),
        helper.make_node("Mul", ["y", "shifted"], ["out"]),
    ]
    model = _conv_model(nodes, inits, [1, 4, 8, 8], {"out": [1, 8, 8, 8]})
    assert _ops(FoldAffineIntoConv(import_onnx(model))).count("relax.nn.conv2d") == 1
    x = RNG.standard_normal((1, 4, 8, 8)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )
    np.testing.assert_allclose(
        nx.InferenceSession(model).run(None, {"x": x})[0], want[0], rtol=1e-4, atol=1e-4
    )
