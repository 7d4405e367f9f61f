"""Builder for the bundled default model (``nxrt_tvm/data/default.onnx``).

The default model is a small image classifier used by the quick start:

    image [1,3,64,64]
      -> 4 x (Conv 3x3 pad 1 -> BatchNormalization -> Relu [-> MaxPool 2x2])
      -> GlobalAveragePool -> Flatten
      -> Gemm(64->64) -> Celu -> Gemm(64->10) -> Softmax      => probs [1,10]

``Celu`` is deliberately placed in the head: TVM's Relax ONNX frontend has no
converter for it, but ONNX defines it by a function body (Div, Elu, Mul), which
nxrt-tvm inlines before claims (`nxrt_tvm.graph.functions`), so the whole model
is one TVM partition.

Only ``onnx`` and ``numpy`` are needed; weights are deterministic
(``numpy.random.default_rng(seed)``).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from .builder import OPSET, finish_model, initializer

INPUT_NAME = "image"
OUTPUT_NAME = "probs"
INPUT_SHAPE = (1, 3, 64, 64)
NUM_CLASSES = 10


def build_default_model(seed: int = 0) -> onnx.ModelProto:
    """Return the default classifier as an ``onnx.ModelProto``."""
    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []

    def conv_bn_relu(i: int, x: str, cin: int, cout: int, pool: bool) -> str:
        w = (rng.standard_normal((cout, cin, 3, 3)) * np.sqrt(2.0 / (cin * 9))).astype(np.float32)
        b = (rng.standard_normal(cout) * 0.01).astype(np.float32)
        scale = rng.uniform(0.8, 1.2, cout).astype(np.float32)
        shift = (rng.standard_normal(cout) * 0.1).astype(np.float32)
        mean = (rng.standard_normal(cout) * 0.1).astype(np.float32)
        var = rng.uniform(0.5, 1.5, cout).astype(np.float32)
        p = f"block{i}"
        inits.extend(
            [
                initializer(f"{p}.conv.weight", w),
                initializer(f"{p}.conv.bias", b),
                initializer(f"{p}.bn.scale", scale),
                initializer(f"{p}.bn.bias", shift),
                initializer(f"{p}.bn.mean", mean),
                initializer(f"{p}.bn.var", var),
            ]
        )
        nodes.append(
            helper.make_node(
                "Conv",
                [x, f"{p}.conv.weight", f"{p}.conv.bias"],
                [f"{p}.conv"],
                name=f"{p}/Conv",
                kernel_shape=[3, 3],
                pads=[1, 1, 1, 1],
                strides=[1, 1],
            )
        )
        nodes.append(
            helper.make_node(
                "BatchNormalization",
                [f"{p}.conv", f"{p}.bn.scale", f"{p}.bn.bias", f"{p}.bn.mean", f"{p}.bn.var"],
                [f"{p}.bn"],
                name=f"{p}/BatchNormalization",
                epsilon=1e-5,
            )
        )
        nodes.append(helper.make_node("Relu", [f"{p}.bn"], [f"{p}.relu"], name=f"{p}/Relu"))
        out = f"{p}.relu"
        if pool:
            nodes.append(
                helper.make_node(
                    "MaxPool", [out], [f"{p}.pool"], name=f"{p}/MaxPool", kernel_shape=[2, 2], strides=[2, 2]
                )
            )
            out = f"{p}.pool"
        return out

    h = conv_bn_relu(0, INPUT_NAME, 3, 16, pool=True)  # -> [1,16,32,32]
    h = conv_bn_relu(1, h, 16, 32, pool=True)  # -> [1,32,16,16]
    h = conv_bn_relu(2, h, 32, 64, pool=True)  # -> [1,64,8,8]
    h = conv_bn_relu(3, h, 64, 64, pool=False)  # -> [1,64,8,8]

    nodes.append(helper.make_node("GlobalAveragePool", [h], ["gap"], name="head/GlobalAveragePool"))
    nodes.append(helper.make_node("Flatten", ["gap"], ["flat"], name="head/Flatten", axis=1))

    w1 = (rng.standard_normal((64, 64)) * np.sqrt(1.0 / 64)).astype(np.float32)
    b1 = (rng.standard_normal(64) * 0.01).astype(np.float32)
    w2 = (rng.standard_normal((NUM_CLASSES, 64)) * np.sqrt(1.0 / 64)).astype(np.float32)
    b2 = (rng.standard_normal(NUM_CLASSES) * 0.01).astype(np.float32)
    inits.extend(
        [
            initializer("head.fc1.weight", w1),
            initializer("head.fc1.bias", b1),
            initializer("head.fc2.weight", w2),
            initializer("head.fc2.bias", b2),
        ]
    )
    nodes.append(
        helper.make_node(
            "Gemm", ["flat", "head.fc1.weight", "head.fc1.bias"], ["fc1"], name="head/Gemm_1", transB=1
        )
    )
    # Celu: no converter in TVM's Relax ONNX frontend; claimed through its ONNX function body.
    nodes.append(helper.make_node("Celu", ["fc1"], ["celu"], name="head/Celu", alpha=1.0))
    nodes.append(
        helper.make_node(
            "Gemm", ["celu", "head.fc2.weight", "head.fc2.bias"], ["logits"], name="head/Gemm_2", transB=1
        )
    )
    nodes.append(helper.make_node("Softmax", ["logits"], [OUTPUT_NAME], name="head/Softmax", axis=-1))

    graph = helper.make_graph(
        nodes,
        "nxrt_tvm_default_classifier",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, list(INPUT_SHAPE))],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, [1, NUM_CLASSES])],
        initializer=inits,
    )
    model = finish_model(
        graph,
        "nxrt-tvm",
        OPSET,
        doc="nxrt-tvm bundled default model: small CNN classifier with a Celu in the head.",
    )
    return model


def write_default_model(path, seed: int = 0) -> onnx.ModelProto:
    """Build the default model and save it to ``path``."""
    model = build_default_model(seed)
    onnx.save(model, str(path))
    return model
