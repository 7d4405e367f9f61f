"""Full-size benchmark models, built from ``onnx.helper`` nodes.

    python benchmarks/models.py OUTDIR [--latency] [--repeat N] [--threads T]

Every builder returns an ``onnx.ModelProto``: float32, opset 17, IR version 8,
static shapes, deterministic weights from ``numpy.random.default_rng(seed)``;
each passes ``onnx.checker.check_model(full_check=True)`` and runs in
onnxruntime.

``MODELS`` maps names to builders (all keyword arguments have defaults, so
``MODELS[name]()`` gives the full-size model). ``make_inputs(name, **kwargs)``
gives a deterministic feed for ``MODELS[name](**kwargs)``: ``input_ids``
uniform in ``[0, vocab)``, float inputs standard normal.

``main()`` saves every model to ``OUTDIR/<name>.onnx`` and prints its file
size and parameter count (and, with ``--latency``, its onnxruntime median
latency).
"""

from __future__ import annotations

import argparse
import inspect
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto

from nxrt_tvm.data.builder import GraphBuilder, value_info


def _vi(name: str, shape, elem=TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return value_info(name, shape, elem)


class _Graph(GraphBuilder):
    def model(self, name: str, inputs, outputs) -> onnx.ModelProto:
        return super().model(name, inputs, outputs, producer="nxrt-tvm-benchmarks")


def param_count(model: onnx.ModelProto) -> int:
    """Elements in all initializers (shape constants included; they are tiny)."""
    return sum(int(np.prod(t.dims, dtype=np.int64)) for t in model.graph.initializer)


# ------------------------------------------------------------------ resnet


def _conv_bn(
    g: _Graph, x: str, prefix: str, c_in: int, c_out: int, k: int, stride: int, relu: bool, gamma: float = 1.0
) -> str:
    """Conv (no bias, He-init) + BatchNormalization (+ Relu)."""
    fan_in = c_in * k * k
    w = g.init(f"{prefix}.weight", g.normal((c_out, c_in, k, k), math.sqrt(2.0 / fan_in)))
    y = g.op(
        "Conv", [x, w], f"{prefix}.conv", kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4
    )
    scale = g.init(f"{prefix}.bn.scale", g.rng.uniform(0.9, 1.1, c_out) * gamma)
    bias = g.init(f"{prefix}.bn.bias", g.normal(c_out, 0.05))
    mean = g.init(f"{prefix}.bn.mean", g.normal(c_out, 0.05))
    var = g.init(f"{prefix}.bn.var", g.rng.uniform(0.9, 1.1, c_out))
    y = g.op("BatchNormalization", [y, scale, bias, mean, var], f"{prefix}.bn", epsilon=1e-5)
    if relu:
        y = g.op("Relu", [y], f"{prefix}.relu")
    return y


_RESNET_BLOCKS = {18: (2, 2, 2, 2), 34: (3, 4, 6, 3)}


def resnet(
    depth: int = 18, batch: int = 1, image: int = 224, classes: int = 1000, seed: int = 0
) -> onnx.ModelProto:
    """ResNet-18-style CNN (basic blocks): image [batch,3,image,image] -> logits [batch,classes].

    Conv7x7/2-BN-Relu, MaxPool3x3/2, 4 stages of basic blocks
    (Conv3x3-BN-Relu-Conv3x3-BN, + identity or Conv1x1/2-BN shortcut, Relu)
    at 64/128/256/512 channels, GlobalAveragePool, Flatten, Gemm.
    ``depth`` 18 (2,2,2,2 blocks) or 34 (3,4,6,3). ~11.7M parameters at depth 18.
    """
    if depth not in _RESNET_BLOCKS:
        raise ValueError(f"depth must be one of {sorted(_RESNET_BLOCKS)}, got {depth}")
    g = _Graph(seed)
    x = _conv_bn(g, "image", "stem", 3, 64, 7, 2, relu=True)
    x = g.op("MaxPool", [x], "stem.maxpool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    c_in = 64
    for s, (c_out, n_blocks) in enumerate(zip((64, 128, 256, 512), _RESNET_BLOCKS[depth])):
        for b in range(n_blocks):
            stride = 2 if (b == 0 and s > 0) else 1
            p = f"layer{s + 1}.{b}"
            y = _conv_bn(g, x, f"{p}.conv1", c_in, c_out, 3, stride, relu=True)
            # the last BN of a block starts small, as in zero-init-residual, so the
            # residual stream grows slowly and activations stay O(1)
            y = _conv_bn(g, y, f"{p}.conv2", c_out, c_out, 3, 1, relu=False, gamma=0.5)
            shortcut = x
            if stride != 1 or c_in != c_out:
                shortcut = _conv_bn(g, x, f"{p}.downsample", c_in, c_out, 1, stride, relu=False)
            y = g.op("Add", [y, shortcut], f"{p}.add")
            x = g.op("Relu", [y], f"{p}.relu")
            c_in = c_out
    x = g.op("GlobalAveragePool", [x], "avgpool")
    x = g.op("Flatten", [x], "flatten", axis=1)
    w = g.init("fc.weight", g.normal((classes, 512), math.sqrt(1.0 / 512)))
    bias = g.init("fc.bias", np.zeros(classes))
    g.op("Gemm", [x, w, bias], "logits", transB=1)
    return g.model(
        f"resnet{depth}", [_vi("image", (batch, 3, image, image))], [_vi("logits", (batch, classes))]
    )


# ------------------------------------------------------------- transformer


def _linear(g: _Graph, x: str, prefix: str, d_in: int, d_out: int) -> str:
    w = g.init(f"{prefix}.weight", g.normal((d_in, d_out), math.sqrt(1.0 / d_in)))
    b = g.init(f"{prefix}.bias", g.normal(d_out, 0.02))
    y = g.op("MatMul", [x, w], f"{prefix}.matmul")
    return g.op("Add", [y, b], f"{prefix}.add")


def _layer_norm(g: _Graph, x: str, prefix: str, hidden: int) -> str:
    scale = g.init(f"{prefix}.scale", np.ones(hidden))
    bias = g.init(f"{prefix}.bias", np.zeros(hidden))
    return g.op("LayerNormalization", [x, scale, bias], prefix, axis=-1, epsilon=1e-12)


def _encoder_layer(g: _Graph, x: str, p: str, batch: int, seq: int, hidden: int, heads: int) -> str:
    """Post-LN BERT encoder layer on x [batch, seq, hidden]."""
    if hidden % heads:
        raise ValueError(f"hidden {hidden} is not divisible by heads {heads}")
    hd = hidden // heads
    split = g.init(f"{p}.attn.split_shape", [batch, seq, heads, hd], dtype=np.int64)
    merge = g.init(f"{p}.attn.merge_shape", [batch, seq, hidden], dtype=np.int64)
    scale = g.init(f"{p}.attn.scale", math.sqrt(hd))

    def heads_of(name: str, perm) -> str:
        y = _linear(g, x, f"{p}.attn.{name}", hidden, hidden)
        y = g.op("Reshape", [y, split], f"{p}.attn.{name}.reshape")
        return g.op("Transpose", [y], f"{p}.attn.{name}.transpose", perm=perm)

    q = heads_of("query", [0, 2, 1, 3])  # [b, h, s, hd]
    k = heads_of("key", [0, 2, 3, 1])  # [b, h, hd, s]
    v = heads_of("value", [0, 2, 1, 3])  # [b, h, s, hd]
    scores = g.op("MatMul", [q, k], f"{p}.attn.scores")  # [b, h, s, s]
    scores = g.op("Div", [scores, scale], f"{p}.attn.scaled")
    probs = g.op("Softmax", [scores], f"{p}.attn.softmax", axis=-1)
    ctx = g.op("MatMul", [probs, v], f"{p}.attn.context")  # [b, h, s, hd]
    ctx = g.op("Transpose", [ctx], f"{p}.attn.context.transpose", perm=[0, 2, 1, 3])
    ctx = g.op("Reshape", [ctx, merge], f"{p}.attn.context.reshape")  # [b, s, hidden]
    y = _linear(g, ctx, f"{p}.attn.output", hidden, hidden)
    y = g.op("Add", [y, x], f"{p}.attn.residual")
    x = _layer_norm(g, y, f"{p}.attn.layernorm", hidden)

    # FFN with exact Gelu: 0.5 * h * (1 + erf(h / sqrt(2)))
    h = _linear(g, x, f"{p}.ffn.up", hidden, 4 * hidden)
    sqrt2 = g.init(f"{p}.ffn.gelu.sqrt2", math.sqrt(2.0))
    one = g.init(f"{p}.ffn.gelu.one", 1.0)
    half = g.init(f"{p}.ffn.gelu.half", 0.5)
    e = g.op("Div", [h, sqrt2], f"{p}.ffn.gelu.div")
    e = g.op("Erf", [e], f"{p}.ffn.gelu.erf")
    e = g.op("Add", [e, one], f"{p}.ffn.gelu.add")
    e = g.op("Mul", [h, e], f"{p}.ffn.gelu.mul")
    h = g.op("Mul", [e, half], f"{p}.ffn.gelu")
    y = _linear(g, h, f"{p}.ffn.down", 4 * hidden, hidden)
    y = g.op("Add", [y, x], f"{p}.ffn.residual")
    return _layer_norm(g, y, f"{p}.ffn.layernorm", hidden)


def bert(
    layers: int = 4,
    hidden: int = 256,
    heads: int = 4,
    seq: int = 128,
    batch: int = 1,
    vocab: int = 8192,
    seed: int = 0,
) -> onnx.ModelProto:
    """BERT-style encoder: input_ids int64 [batch, seq] -> hidden_states [batch, seq, hidden].

    Token Gather + position embedding ([seq, hidden] initializer, added) +
    LayerNormalization, then ``layers`` post-LN encoder layers. Static shapes.
    """
    g = _Graph(seed)
    tok = g.init("embeddings.word", g.normal((vocab, hidden), 0.02))
    pos = g.init("embeddings.position", g.normal((seq, hidden), 0.02))
    x = g.op("Gather", [tok, "input_ids"], "embeddings.gather", axis=0)
    x = g.op("Add", [x, pos], "embeddings.add")
    x = _layer_norm(g, x, "embeddings.layernorm", hidden)
    for i in range(layers):
        x = _encoder_layer(g, x, f"encoder.{i}", batch, seq, hidden, heads)
    g.op("Identity", [x], "hidden_states")
    return g.model(
        "bert",
        [_vi("input_ids", (batch, seq), TensorProto.INT64)],
        [_vi("hidden_states", (batch, seq, hidden))],
    )


def transformer_block(seq: int = 128, hidden: int = 256, heads: int = 4, seed: int = 0) -> onnx.ModelProto:
    """One BERT encoder layer: x float [1, seq, hidden] -> y [1, seq, hidden]."""
    g = _Graph(seed)
    x = _encoder_layer(g, "x", "layer", 1, seq, hidden, heads)
    g.op("Identity", [x], "y")
    return g.model("transformer_block", [_vi("x", (1, seq, hidden))], [_vi("y", (1, seq, hidden))])


# -------------------------------------------------------------- dense ones


def mlp(batch: int = 64, sizes=(512, 1024, 1024, 10), seed: int = 0) -> onnx.ModelProto:
    """x [batch, sizes[0]] -> (MatMul+Add+Relu)* -> MatMul+Add -> y [batch, sizes[-1]]."""
    sizes = tuple(sizes)
    if len(sizes) < 2:
        raise ValueError("sizes needs at least an input and an output width")
    g = _Graph(seed)
    x = "x"
    for i, (d_in, d_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        last = i == len(sizes) - 2
        w = g.init(f"fc{i}.weight", g.normal((d_in, d_out), math.sqrt((1.0 if last else 2.0) / d_in)))
        b = g.init(f"fc{i}.bias", g.normal(d_out, 0.01))
        x = g.op("MatMul", [x, w], f"fc{i}.matmul")
        x = g.op("Add", [x, b], "y" if last else f"fc{i}.add")
        if not last:
            x = g.op("Relu", [x], f"fc{i}.relu")
    return g.model("mlp", [_vi("x", (batch, sizes[0]))], [_vi("y", (batch, sizes[-1]))])


def gemm(m: int = 1024, n: int = 1024, k: int = 1024, seed: int = 0) -> onnx.ModelProto:
    """c [m, n] = a [m, k] @ b, with b an initializer [k, n]."""
    g = _Graph(seed)
    b = g.init("b", g.normal((k, n), math.sqrt(1.0 / k)))
    g.op("MatMul", ["a", b], "c")
    return g.model("gemm", [_vi("a", (m, k))], [_vi("c", (m, n))])


MODELS = {
    "resnet": resnet,
    "bert": bert,
    "mlp": mlp,
    "gemm": gemm,
    "transformer_block": transformer_block,
}


# ------------------------------------------------------------------ inputs


def _args(name: str, kwargs: dict) -> dict:
    """The builder's defaults, overridden by ``kwargs`` (unknown keys refused)."""
    params = inspect.signature(MODELS[name]).parameters
    unknown = set(kwargs) - set(params)
    if unknown:
        raise TypeError(f"{name}() has no parameter(s) {sorted(unknown)}")
    return {k: kwargs.get(k, p.default) for k, p in params.items()}


def input_shapes(name: str, **kwargs) -> dict[str, tuple]:
    """Input name -> shape for ``MODELS[name](**kwargs)``."""
    a = _args(name, kwargs)
    if name == "resnet":
        return {"image": (a["batch"], 3, a["image"], a["image"])}
    if name == "bert":
        return {"input_ids": (a["batch"], a["seq"])}
    if name == "mlp":
        return {"x": (a["batch"], tuple(a["sizes"])[0])}
    if name == "gemm":
        return {"a": (a["m"], a["k"])}
    if name == "transformer_block":
        return {"x": (1, a["seq"], a["hidden"])}
    raise KeyError(name)


def make_inputs(name: str, seed: int = 0, **kwargs) -> dict[str, np.ndarray]:
    """A deterministic feed for ``MODELS[name](**kwargs)``.

    ``input_ids`` are int64 uniform in ``[0, vocab)``; float inputs are
    standard normal float32. ``seed`` seeds the feed, not the weights.
    """
    rng = np.random.default_rng(seed)
    feeds = {}
    for key, shape in input_shapes(name, **kwargs).items():
        if key == "input_ids":
            feeds[key] = rng.integers(0, _args(name, kwargs)["vocab"], size=shape, dtype=np.int64)
        else:
            feeds[key] = rng.standard_normal(shape).astype(np.float32)
    return feeds


# -------------------------------------------------------------------- main


def ort_latency_s(model: onnx.ModelProto, feeds: dict, repeat: int = 20, threads: int = 2) -> float:
    """Median onnxruntime CPU latency in seconds (3 warm-up runs)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    for _ in range(3):
        sess.run(None, feeds)
    samples = []
    for _ in range(repeat):
        t = time.perf_counter()
        sess.run(None, feeds)
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir", type=Path, help="folder for <name>.onnx files")
    ap.add_argument("--latency", action="store_true", help="also time each model in onnxruntime")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", nargs="*", choices=sorted(MODELS), help="build only these models")
    args = ap.parse_args(argv)
    args.outdir.mkdir(parents=True, exist_ok=True)
    header = f"{'model':<18} {'params':>12} {'size MiB':>9}"
    print(header + ("  ort median ms" if args.latency else ""))
    for name in args.only or MODELS:
        model = MODELS[name]()
        path = args.outdir / f"{name}.onnx"
        onnx.save(model, path)
        line = f"{name:<18} {param_count(model):>12,} {path.stat().st_size / 2**20:>9.2f}"
        if args.latency:
            ms = 1e3 * ort_latency_s(model, make_inputs(name), args.repeat, args.threads)
            line += f"  {ms:>13.2f}"
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
