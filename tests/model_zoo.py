"""Small hand-built ONNX models for tests.

Every builder returns an ``onnx.ModelProto`` built with ``onnx.helper``:
float32, opset 17 (unless noted), deterministic weights from
``numpy.random.default_rng(seed)``; each passes ``onnx.checker.check_model``
and runs in onnxruntime. Tests save them with ``onnx.save``.

``ALL`` maps names to the builders that take no arguments.
``INPUTS`` / ``make_inputs(name)`` give a matching deterministic feed.
"""

from __future__ import annotations

import math
import pathlib
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper

from nxrt_tvm.data import builder

OPSET = builder.OPSET


def _init(name: str, arr) -> onnx.TensorProto:
    return builder.initializer(name, arr)


def _f32(arr) -> np.ndarray:
    return np.asarray(arr, dtype=np.float32)


def _vi(name: str, shape, elem=TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return builder.value_info(name, shape, elem)


def _model(graph: onnx.GraphProto, opset: int = OPSET, extra_opsets=()) -> onnx.ModelProto:
    return builder.finish_model(graph, "nxrt-tvm-tests", opset, extra_opsets)


# ------------------------------------------------------------------ models


def cnn(seed: int = 0) -> onnx.ModelProto:
    """x [1,3,32,32] -> Conv+bias -> Relu -> MaxPool -> Conv
    -> BN -> Relu -> GAP -> Flatten -> Gemm -> logits [1,10]."""
    rng = np.random.default_rng(seed)
    inits = [
        _init("conv1.weight", _f32(rng.standard_normal((8, 3, 3, 3)) * 0.3)),
        _init("conv1.bias", _f32(rng.standard_normal(8) * 0.1)),
        _init("conv2.weight", _f32(rng.standard_normal((16, 8, 3, 3)) * 0.15)),
        _init("bn.scale", _f32(rng.uniform(0.8, 1.2, 16))),
        _init("bn.bias", _f32(rng.standard_normal(16) * 0.1)),
        _init("bn.mean", _f32(rng.standard_normal(16) * 0.1)),
        _init("bn.var", _f32(rng.uniform(0.5, 1.5, 16))),
        _init("fc.weight", _f32(rng.standard_normal((10, 16)) * 0.25)),
        _init("fc.bias", _f32(rng.standard_normal(10) * 0.1)),
    ]
    nodes = [
        helper.make_node(
            "Conv",
            ["x", "conv1.weight", "conv1.bias"],
            ["c1"],
            name="conv1",
            kernel_shape=[3, 3],
            pads=[1, 1, 1, 1],
        ),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], name="pool1", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node(
            "Conv", ["p1", "conv2.weight"], ["c2"], name="conv2", kernel_shape=[3, 3], pads=[1, 1, 1, 1]
        ),
        helper.make_node(
            "BatchNormalization",
            ["c2", "bn.scale", "bn.bias", "bn.mean", "bn.var"],
            ["bn"],
            name="bn",
            epsilon=1e-5,
        ),
        helper.make_node("Relu", ["bn"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["flat"], name="flatten", axis=1),
        helper.make_node("Gemm", ["flat", "fc.weight", "fc.bias"], ["logits"], name="fc", transB=1),
    ]
    graph = helper.make_graph(
        nodes, "cnn", [_vi("x", [1, 3, 32, 32])], [_vi("logits", [1, 10])], initializer=inits
    )
    return _model(graph)


def mlp(batch="N", seed: int = 1) -> onnx.ModelProto:
    """x [batch,64] -> MatMul+Add -> Relu -> MatMul+Add ->
    Gelu(Erf) -> MatMul+Add -> Softmax -> probs [batch,10]."""
    rng = np.random.default_rng(seed)
    inits = [
        _init("fc1.weight", _f32(rng.standard_normal((64, 128)) / 8.0)),
        _init("fc1.bias", _f32(rng.standard_normal(128) * 0.1)),
        _init("fc2.weight", _f32(rng.standard_normal((128, 128)) / math.sqrt(128))),
        _init("fc2.bias", _f32(rng.standard_normal(128) * 0.1)),
        _init("fc3.weight", _f32(rng.standard_normal((128, 10)) / math.sqrt(128))),
        _init("fc3.bias", _f32(rng.standard_normal(10) * 0.1)),
        _init("sqrt2", _f32(math.sqrt(2.0))),
        _init("one", _f32(1.0)),
        _init("half", _f32(0.5)),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "fc1.weight"], ["m1"], name="fc1/MatMul"),
        helper.make_node("Add", ["m1", "fc1.bias"], ["a1"], name="fc1/Add"),
        helper.make_node("Relu", ["a1"], ["r1"], name="relu"),
        helper.make_node("MatMul", ["r1", "fc2.weight"], ["m2"], name="fc2/MatMul"),
        helper.make_node("Add", ["m2", "fc2.bias"], ["a2"], name="fc2/Add"),
        # Gelu(h) = h * 0.5 * (1 + Erf(h / sqrt(2)))
        helper.make_node("Div", ["a2", "sqrt2"], ["g_div"], name="gelu/Div"),
        helper.make_node("Erf", ["g_div"], ["g_erf"], name="gelu/Erf"),
        helper.make_node("Add", ["g_erf", "one"], ["g_add"], name="gelu/Add"),
        helper.make_node("Mul", ["a2", "g_add"], ["g_mul"], name="gelu/Mul"),
        helper.make_node("Mul", ["g_mul", "half"], ["g"], name="gelu/Mul_half"),
        helper.make_node("MatMul", ["g", "fc3.weight"], ["m3"], name="fc3/MatMul"),
        helper.make_node("Add", ["m3", "fc3.bias"], ["logits"], name="fc3/Add"),
        helper.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=-1),
    ]
    graph = helper.make_graph(
        nodes, "mlp", [_vi("x", [batch, 64])], [_vi("probs", [batch, 10])], initializer=inits
    )
    return _model(graph)


def attention_block(seq: int = 16, hidden: int = 64, heads: int = 4, seed: int = 2) -> onnx.ModelProto:
    """Self-attention + output projection + residual +
    LayerNormalization: x [1,seq,hidden] -> y [1,seq,hidden]."""
    if hidden % heads:
        raise ValueError("hidden must be divisible by heads")
    hd = hidden // heads
    rng = np.random.default_rng(seed)
    scale = 1.0 / math.sqrt(hidden)
    inits = []
    for p in ("q", "k", "v", "o"):
        inits.append(_init(f"{p}.weight", _f32(rng.standard_normal((hidden, hidden)) * scale)))
        inits.append(_init(f"{p}.bias", _f32(rng.standard_normal(hidden) * 0.02)))
    inits += [
        _init("split_shape", np.array([1, seq, heads, hd], dtype=np.int64)),
        _init("merge_shape", np.array([1, seq, hidden], dtype=np.int64)),
        _init("sqrt_hd", _f32(math.sqrt(hd))),
        _init("ln.scale", _f32(rng.uniform(0.9, 1.1, hidden))),
        _init("ln.bias", _f32(rng.standard_normal(hidden) * 0.02)),
    ]
    nodes = []
    for p in ("q", "k", "v"):
        nodes += [
            helper.make_node("MatMul", ["x", f"{p}.weight"], [f"{p}_mm"], name=f"{p}/MatMul"),
            helper.make_node("Add", [f"{p}_mm", f"{p}.bias"], [f"{p}_lin"], name=f"{p}/Add"),
            helper.make_node("Reshape", [f"{p}_lin", "split_shape"], [f"{p}_4d"], name=f"{p}/Reshape"),
        ]
    nodes += [
        helper.make_node("Transpose", ["q_4d"], ["q_t"], name="q/Transpose", perm=[0, 2, 1, 3]),  # [1,h,s,hd]
        helper.make_node("Transpose", ["k_4d"], ["k_t"], name="k/Transpose", perm=[0, 2, 3, 1]),  # [1,h,hd,s]
        helper.make_node("Transpose", ["v_4d"], ["v_t"], name="v/Transpose", perm=[0, 2, 1, 3]),  # [1,h,s,hd]
        helper.make_node("MatMul", ["q_t", "k_t"], ["scores"], name="attn/MatMul_qk"),  # [1,h,s,s]
        helper.make_node("Div", ["scores", "sqrt_hd"], ["scaled"], name="attn/Div"),
        helper.make_node("Softmax", ["scaled"], ["weights"], name="attn/Softmax", axis=-1),
        helper.make_node("MatMul", ["weights", "v_t"], ["ctx"], name="attn/MatMul_v"),  # [1,h,s,hd]
        helper.make_node("Transpose", ["ctx"], ["ctx_t"], name="attn/Transpose", perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ctx_t", "merge_shape"], ["ctx_3d"], name="attn/Reshape"),
        helper.make_node("MatMul", ["ctx_3d", "o.weight"], ["o_mm"], name="o/MatMul"),
        helper.make_node("Add", ["o_mm", "o.bias"], ["o_lin"], name="o/Add"),
        helper.make_node("Add", ["o_lin", "x"], ["resid"], name="residual/Add"),
        helper.make_node(
            "LayerNormalization", ["resid", "ln.scale", "ln.bias"], ["y"], name="ln", axis=-1, epsilon=1e-5
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "attention_block",
        [_vi("x", [1, seq, hidden])],
        [_vi("y", [1, seq, hidden])],
        initializer=inits,
    )
    return _model(graph)


def conv3x3(seed: int = 0) -> onnx.ModelProto:
    """A 3x3 stride-1 conv, 16 -> 16 channels on a 16x16 map: one Winograd fits (`conv_algorithm="auto"`)."""
    rng = np.random.default_rng(seed)
    weight = _init("w", rng.standard_normal((16, 16, 3, 3)).astype(np.float32))
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
        "conv",
        [_vi("x", [1, 16, 16, 16])],
        [_vi("y", [1, 16, 16, 16])],
        [weight],
    )
    return _model(graph)


def elementwise_chain(shape=(1024, 1024)) -> onnx.ModelProto:
    """8 x (Tanh, Mul by the input) over `shape`: onnxruntime makes 16 passes over memory, TVM fuses one,
    so the default claim policy keeps it on TVM (where no symbolic dim is a leading one, measured at 1)."""
    nodes, y = [], "x"
    for k in range(8):
        nodes += [
            helper.make_node("Tanh", [y], [f"t{k}"]),
            helper.make_node("Mul", [f"t{k}", "x"], [f"m{k}"]),
        ]
        y = f"m{k}"
    graph = helper.make_graph(nodes, "chain", [_vi("x", list(shape))], [_vi(y, list(shape))])
    return _model(graph, opset=17)


def cycle_trap() -> onnx.ModelProto:
    """A = Relu(x); X = LpNormalization(A) (not in TVM's frontend); B = Add(A, X); y = Sigmoid(B).

    A and B are TVM-claimable but X is not; fusing {A, B} into one partition
    would create a cycle A-part -> X -> A-part.
    """
    nodes = [
        helper.make_node("Relu", ["x"], ["A"], name="A_relu"),
        helper.make_node("LpNormalization", ["A"], ["X"], name="X_lpnorm", axis=-1, p=2),
        helper.make_node("Add", ["A", "X"], ["B"], name="B_add"),
        helper.make_node("Sigmoid", ["B"], ["y"], name="y_sigmoid"),
    ]
    graph = helper.make_graph(nodes, "cycle_trap", [_vi("x", [4, 8])], [_vi("y", [4, 8])])
    return _model(graph)


def unsupported_op(seed: int = 3) -> onnx.ModelProto:
    """x [2,3,3] -> Mul 2 -> Det [2] (not in TVM's frontend)
    -> Unsqueeze(axis 1) [2,1] -> Add const -> y [2,1]."""
    rng = np.random.default_rng(seed)
    inits = [
        _init("two", _f32(2.0)),
        _init("unsq_axes", np.array([1], dtype=np.int64)),
        _init("offset", _f32(rng.standard_normal((2, 1)))),
    ]
    nodes = [
        helper.make_node("Mul", ["x", "two"], ["scaled"], name="mul2"),
        helper.make_node("Det", ["scaled"], ["det"], name="det"),
        helper.make_node("Unsqueeze", ["det", "unsq_axes"], ["det_col"], name="unsqueeze"),
        helper.make_node("Add", ["det_col", "offset"], ["y"], name="add_offset"),
    ]
    graph = helper.make_graph(
        nodes, "unsupported_op", [_vi("x", [2, 3, 3])], [_vi("y", [2, 1])], initializer=inits
    )
    return _model(graph)


def with_if(seed: int = 4) -> onnx.ModelProto:
    """x [4,8]; a = Relu(x@W + b), t = Tanh(x); cond = ReduceSum(x) > 0;
    If(cond): then Relu(a + t) else a * t (both [4,8], reading outer-scope a, t);
    y = Sigmoid(If_out * 2 + x).
    """
    rng = np.random.default_rng(seed)
    inits = [
        _init("W", _f32(rng.standard_normal((8, 8)) / math.sqrt(8))),
        _init("b", _f32(rng.standard_normal(8) * 0.1)),
        _init("zero", _f32(0.0)),
        _init("two", _f32(2.0)),
    ]
    then_graph = helper.make_graph(
        [
            helper.make_node("Add", ["a", "t"], ["then_sum"], name="then/Add"),
            helper.make_node("Relu", ["then_sum"], ["then_out"], name="then/Relu"),
        ],
        "then_branch",
        [],
        [_vi("then_out", [4, 8])],
    )
    else_graph = helper.make_graph(
        [helper.make_node("Mul", ["a", "t"], ["else_out"], name="else/Mul")],
        "else_branch",
        [],
        [_vi("else_out", [4, 8])],
    )
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["xw"], name="pre/MatMul"),
        helper.make_node("Add", ["xw", "b"], ["xwb"], name="pre/Add"),
        helper.make_node("Relu", ["xwb"], ["a"], name="pre/Relu"),
        helper.make_node("Tanh", ["x"], ["t"], name="pre/Tanh"),
        helper.make_node("ReduceSum", ["x"], ["s"], name="cond/ReduceSum", keepdims=0),
        helper.make_node("Greater", ["s", "zero"], ["cond"], name="cond/Greater"),
        helper.make_node(
            "If", ["cond"], ["branch_out"], name="if", then_branch=then_graph, else_branch=else_graph
        ),
        helper.make_node("Mul", ["branch_out", "two"], ["scaled"], name="post/Mul"),
        helper.make_node("Add", ["scaled", "x"], ["summed"], name="post/Add"),
        helper.make_node("Sigmoid", ["summed"], ["y"], name="post/Sigmoid"),
    ]
    graph = helper.make_graph(nodes, "with_if", [_vi("x", [4, 8])], [_vi("y", [4, 8])], initializer=inits)
    return _model(graph)


def default_model() -> onnx.ModelProto:
    """The bundled quick-start model (see ``nxrt_tvm/data/make_default.py``)."""
    try:
        from nxrt_tvm.data.make_default import build_default_model
    except ImportError:
        root = str(pathlib.Path(__file__).resolve().parents[1])
        if root not in sys.path:
            sys.path.insert(0, root)
        from nxrt_tvm.data.make_default import build_default_model
    return build_default_model()


#: the op `split_model` puts in the default model's head: one that TVM's frontend has no converter for
#: and ONNX defines no function body for, so it stays on the fallback EP between two TVM partitions
SPLIT_OP = "LpNormalization"


def split_model() -> onnx.ModelProto:
    """The bundled model with its Celu replaced by an `SPLIT_OP` node: two TVM partitions around a
    declined node (multi-partition EPContext models, fallback between compiled partitions)."""
    model = default_model()
    (node,) = [n for n in model.graph.node if n.op_type == "Celu"]
    node.op_type, node.name = SPLIT_OP, f"head/{SPLIT_OP}"
    del node.attribute[:]
    node.attribute.extend([helper.make_attribute("axis", -1), helper.make_attribute("p", 2)])
    return model


ALL = {
    "cnn": cnn,
    "mlp": mlp,
    "attention_block": attention_block,
    "cycle_trap": cycle_trap,
    "unsupported_op": unsupported_op,
    "with_if": with_if,
    "default_model": default_model,
    "split_model": split_model,
}

# Input name -> concrete shape used by make_inputs (symbolic dims filled in).
INPUTS = {
    "cnn": {"x": (1, 3, 32, 32)},
    "mlp": {"x": (3, 64)},
    "attention_block": {"x": (1, 16, 64)},
    "cycle_trap": {"x": (4, 8)},
    "unsupported_op": {"x": (2, 3, 3)},
    "with_if": {"x": (4, 8)},
    "default_model": {"image": (1, 3, 64, 64)},
    "split_model": {"image": (1, 3, 64, 64)},
}


def make_inputs(name: str, seed: int = 0) -> dict:
    """Deterministic float32 feed for ``ALL[name]()``."""
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in INPUTS[name].items()}
