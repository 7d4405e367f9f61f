"""Transposed convolutions whose stride is their kernel run as a matmul and a shuffle, like onnxruntime."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import nxrt_tvm as nx

RNG = np.random.default_rng(0)


def _up(dims: list, kernel: int, stride: int, pads: int = 0, out_channels: int = 1, bias: bool = True):
    """ConvTranspose (4 -> `out_channels`) + bias + Sigmoid: PP-OCR det's head, a UNet's upsampling."""
    inputs = ["x", "w"] + (["b"] if bias else [])
    nodes = [
        helper.make_node(
            "ConvTranspose", inputs, ["y"], kernel_shape=[kernel] * 2, strides=[stride] * 2, pads=[pads] * 4
        ),
        helper.make_node("Sigmoid", ["y"], ["z"]),
    ]
    inits = [
        numpy_helper.from_array(
            RNG.standard_normal((4, out_channels, kernel, kernel)).astype(np.float32), "w"
        )
    ]
    if bias:
        inits.append(numpy_helper.from_array(RNG.standard_normal(out_channels).astype(np.float32), "b"))
    graph = helper.make_graph(
        nodes,
        "up",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [dims[0], out_channels, None, None])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _kernel_names(sess: nx.InferenceSession) -> list[str]:
    return [v.name for vs in sess.kernel_variants().values() for v in vs]


def _check(model, shapes) -> nx.InferenceSession:
    sess = nx.InferenceSession(model)
    assert not sess.plan.declines, sess.plan.format(sess.graph)
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for shape in shapes:
        feeds = {"x": RNG.standard_normal(shape).astype(np.float32)}
        np.testing.assert_allclose(
            sess.run(None, feeds)[0], reference.run(None, feeds)[0], rtol=1e-5, atol=1e-5
        )
    return sess


@pytest.mark.parametrize("out_channels", [1, 3, 24])
def test_stride_equal_to_kernel_is_a_matmul(out_channels):
    """Kernel 2x2 at stride 2 (and 3x3 at stride 3): no transposed-convolution kernel is left; each input
    pixel's channels times the weights fill its own output block (odd sizes, 1 to 24 output channels)."""
    for kernel in (2, 3):
        sess = _check(_up([1, 4, 7, 5], kernel, kernel, out_channels=out_channels), [(1, 4, 7, 5)])
        names = _kernel_names(sess)
        assert not any("conv2d_transpose" in n for n in names) and any("matmul" in n for n in names), names


def test_a_weight_without_bias_and_symbolic_sizes():
    """Without bias, and over symbolic sizes, which keep the transposed convolution (TVM's FuseTIR fails on
    the shuffle there): both match onnxruntime, including where the static one is built for a shape."""
    sess = _check(_up([2, 4, 9, 6], 2, 2, out_channels=3, bias=False), [(2, 4, 9, 6)])
    assert not any("conv2d_transpose" in n for n in _kernel_names(sess))
    model = _up(["n", 4, "h", "w"], 2, 2, out_channels=3)
    sess = _check(model, [(1, 4, 1, 1), (2, 4, 9, 6)] + [(1, 4, 5, 7)] * 3)
    assert any("conv2d_transpose" in n for n in _kernel_names(sess))
    built = sess.session_for({"x": np.zeros((1, 4, 5, 7), np.float32)})
    assert built is not sess and not any("conv2d_transpose" in n for n in _kernel_names(built))


def test_overlapping_or_padded_ones_stay_transposed_convolutions():
    """Kernel 3 at stride 2 with padding: output blocks overlap, no matmul can write them."""
    sess = _check(_up([1, 4, 6, 6], 3, 2, pads=1, out_channels=2), [(1, 4, 6, 6)])
    assert any("conv2d_transpose" in n for n in _kernel_names(sess))
