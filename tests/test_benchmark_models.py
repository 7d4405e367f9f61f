"""benchmarks/models.py: small variants of the benchmark models are valid, run in
onnxruntime with finite outputs of the right shapes, and compute what they claim."""

from __future__ import annotations

import math
import pathlib
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from nxrt_tvm.data import builder

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

import models  # noqa: E402  (benchmarks/models.py)

CPU = ["CPUExecutionProvider"]

# name -> (builder kwargs for a small variant, {output name: expected shape})
SMALL = {
    "resnet": (dict(image=64), {"logits": (1, 1000)}),
    "bert": (dict(layers=1, seq=16, vocab=100), {"hidden_states": (1, 16, 256)}),
    "mlp": (dict(batch=2), {"y": (2, 10)}),
    "gemm": (dict(m=64, n=64, k=64), {"c": (64, 64)}),
    "transformer_block": (dict(seq=16, hidden=64, heads=4), {"y": (1, 16, 64)}),
}


def _run(model: onnx.ModelProto, feeds: dict) -> dict[str, np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=CPU)
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, feeds)))


def _weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def test_registry_covers_small_variants():
    assert set(models.MODELS) == set(SMALL)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_small_variant_checks_and_runs(name):
    kwargs, outputs = SMALL[name]
    model = models.MODELS[name](**kwargs)
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == builder.IR_VERSION == 8
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    # static shapes: no Shape ops, every graph input fully specified
    assert not [n for n in model.graph.node if n.op_type == "Shape"]
    for vi in model.graph.input:
        assert all(d.HasField("dim_value") for d in vi.type.tensor_type.shape.dim), vi.name

    feeds = models.make_inputs(name, **kwargs)
    assert set(feeds) == {vi.name for vi in model.graph.input}
    got = _run(model, feeds)
    assert set(got) == set(outputs)
    for out, shape in outputs.items():
        assert got[out].shape == shape and got[out].dtype == np.float32, (out, got[out].shape, got[out].dtype)
        assert np.isfinite(got[out]).all(), out


@pytest.mark.parametrize("name", sorted(SMALL))
def test_builders_and_inputs_are_deterministic(name):
    kwargs, _ = SMALL[name]
    assert (
        models.MODELS[name](**kwargs).SerializeToString() == models.MODELS[name](**kwargs).SerializeToString()
    )
    a, b = models.make_inputs(name, **kwargs), models.make_inputs(name, **kwargs)
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_make_inputs_ranges_and_dtypes():
    ids = models.make_inputs("bert", layers=1, seq=16, vocab=100)["input_ids"]
    assert ids.dtype == np.int64 and ids.shape == (1, 16)
    assert ids.min() >= 0 and ids.max() < 100
    x = models.make_inputs("mlp", batch=2)["x"]
    assert x.dtype == np.float32 and x.shape == (2, 512)
    with pytest.raises(TypeError):
        models.make_inputs("gemm", nope=1)


def test_full_resnet18_parameter_count():
    # torchvision's resnet18 has 11,689,512 parameters plus 9,600 BN running-stat buffers
    model = models.resnet()
    assert models.param_count(model) == 11_689_512 + 9_600
    assert [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim] == [1, 3, 224, 224]


def test_resnet_structure():
    ops = [n.op_type for n in models.resnet(image=64).graph.node]
    assert ops.count("Conv") == 1 + 16 + 3  # stem, 8 blocks x 2, 3 downsamples
    assert ops.count("BatchNormalization") == ops.count("Conv")
    assert ops.count("Add") == 8 and ops.count("Gemm") == 1 and ops.count("MaxPool") == 1


def test_gemm_matches_numpy():
    model = models.gemm(64, 32, 48)
    feeds = models.make_inputs("gemm", m=64, n=32, k=48)
    got = _run(model, feeds)["c"]
    np.testing.assert_allclose(got, feeds["a"] @ _weights(model)["b"], rtol=1e-4, atol=1e-4)


def test_mlp_matches_numpy():
    sizes = (16, 32, 8, 3)
    model = models.mlp(batch=4, sizes=sizes)
    feeds = models.make_inputs("mlp", batch=4, sizes=sizes)
    w = _weights(model)
    x = feeds["x"]
    for i in range(len(sizes) - 1):
        x = x @ w[f"fc{i}.weight"] + w[f"fc{i}.bias"]
        if i < len(sizes) - 2:
            x = np.maximum(x, 0)
    np.testing.assert_allclose(_run(model, feeds)["y"], x, rtol=1e-4, atol=1e-4)


def _np_layer_norm(x, scale, bias, eps=1e-12):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * scale + bias


def _np_encoder_layer(x, w, p, heads):
    from math import erf

    b, s, h = x.shape
    hd = h // heads

    def lin(v, name):
        return v @ w[f"{p}.{name}.weight"] + w[f"{p}.{name}.bias"]

    def split(v):
        return v.reshape(b, s, heads, hd).transpose(0, 2, 1, 3)

    q, k, v = (split(lin(x, f"attn.{n}")) for n in ("query", "key", "value"))
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd)
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    probs = scores / scores.sum(-1, keepdims=True)
    ctx = (probs @ v).transpose(0, 2, 1, 3).reshape(b, s, h)
    x = _np_layer_norm(
        lin(ctx, "attn.output") + x, w[f"{p}.attn.layernorm.scale"], w[f"{p}.attn.layernorm.bias"]
    )
    up = lin(x, "ffn.up")
    gelu = 0.5 * up * (1 + np.vectorize(erf)(up / math.sqrt(2)))
    return _np_layer_norm(
        lin(gelu, "ffn.down") + x, w[f"{p}.ffn.layernorm.scale"], w[f"{p}.ffn.layernorm.bias"]
    )


def test_transformer_block_matches_numpy():
    kwargs = dict(seq=8, hidden=32, heads=4)
    model = models.transformer_block(**kwargs)
    feeds = models.make_inputs("transformer_block", **kwargs)
    w = {k: v.astype(np.float64) for k, v in _weights(model).items()}
    want = _np_encoder_layer(feeds["x"].astype(np.float64), w, "layer", heads=4)
    np.testing.assert_allclose(_run(model, feeds)["y"], want, rtol=1e-3, atol=1e-4)


def test_bert_matches_numpy():
    kwargs = dict(layers=2, hidden=32, heads=2, seq=8, batch=2, vocab=50)
    model = models.bert(**kwargs)
    feeds = models.make_inputs("bert", **kwargs)
    w = {k: v.astype(np.float64) for k, v in _weights(model).items()}
    x = w["embeddings.word"][feeds["input_ids"]] + w["embeddings.position"]
    x = _np_layer_norm(x, w["embeddings.layernorm.scale"], w["embeddings.layernorm.bias"])
    for i in range(2):
        x = _np_encoder_layer(x, w, f"encoder.{i}", heads=2)
    np.testing.assert_allclose(_run(model, feeds)["hidden_states"], x, rtol=1e-3, atol=1e-4)


def test_main_saves_models(tmp_path, capsys):
    assert models.main([str(tmp_path), "--only", "gemm", "mlp"]) == 0
    for name in ("gemm", "mlp"):
        onnx.checker.check_model(str(tmp_path / f"{name}.onnx"), full_check=True)
    out = capsys.readouterr().out
    assert "gemm" in out and "1,048,576" in out
