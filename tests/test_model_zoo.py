"""The test model zoo and the checked-in exported models are valid and run in onnxruntime."""

from __future__ import annotations

import pathlib
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest

HERE = pathlib.Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

import model_zoo  # noqa: E402

DATA = HERE / "data"
CPU = ["CPUExecutionProvider"]


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=CPU)


@pytest.mark.parametrize("name", sorted(model_zoo.ALL))
def test_zoo_model_checks_and_runs(name, tmp_path):
    model = model_zoo.ALL[name]()
    assert isinstance(model, onnx.ModelProto)
    onnx.checker.check_model(model, full_check=True)
    assert any(o.domain in ("", "ai.onnx") and o.version == 17 for o in model.opset_import)

    # Round-trips through onnx.save like the tests that use the zoo.
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    sess = ort.InferenceSession(str(path), providers=CPU)

    feed = model_zoo.make_inputs(name)
    assert set(feed) == {i.name for i in sess.get_inputs()}
    outs = sess.run(None, feed)
    assert len(outs) == len(model.graph.output)
    for out in outs:
        assert out.dtype == np.float32
        assert np.all(np.isfinite(out))


def test_zoo_is_deterministic():
    for name, fn in model_zoo.ALL.items():
        assert fn().SerializeToString() == fn().SerializeToString(), name


def test_expected_shapes_and_names():
    cnn = _session(model_zoo.cnn())
    assert cnn.get_outputs()[0].name == "logits"
    assert cnn.run(None, model_zoo.make_inputs("cnn"))[0].shape == (1, 10)

    mlp = model_zoo.mlp()
    assert mlp.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"
    sess = _session(mlp)
    for batch in (1, 5):
        x = np.random.default_rng(batch).standard_normal((batch, 64)).astype(np.float32)
        (probs,) = sess.run(None, {"x": x})
        assert probs.shape == (batch, 10)
        np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)

    att = _session(model_zoo.attention_block(seq=8, hidden=32, heads=2))
    x = np.random.default_rng(0).standard_normal((1, 8, 32)).astype(np.float32)
    (y,) = att.run(None, {"x": x})
    assert y.shape == (1, 8, 32)

    (y,) = _session(model_zoo.unsupported_op()).run(None, model_zoo.make_inputs("unsupported_op"))
    assert y.shape == (2, 1)

    (probs,) = _session(model_zoo.default_model()).run(None, model_zoo.make_inputs("default_model"))
    np.testing.assert_allclose(probs.sum(), 1.0, atol=1e-5)


def test_gelu_matches_reference():
    """mlp's hand-written Erf Gelu computes the real Gelu."""
    from math import erf, sqrt

    model = model_zoo.mlp()
    init = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    x = model_zoo.make_inputs("mlp")["x"]
    h = np.maximum(x @ init["fc1.weight"] + init["fc1.bias"], 0) @ init["fc2.weight"] + init["fc2.bias"]
    g = h * 0.5 * (1 + np.vectorize(erf)(h / sqrt(2)))
    logits = g @ init["fc3.weight"] + init["fc3.bias"]
    ref = np.exp(logits - logits.max(-1, keepdims=True))
    ref /= ref.sum(-1, keepdims=True)
    (probs,) = _session(model).run(None, {"x": x})
    np.testing.assert_allclose(probs, ref, rtol=1e-4, atol=1e-5)


def test_cycle_trap_structure():
    model = model_zoo.cycle_trap()
    ops = [n.op_type for n in model.graph.node]
    assert ops == ["Relu", "LpNormalization", "Add", "Sigmoid"]
    x = model_zoo.make_inputs("cycle_trap")["x"]
    a = np.maximum(x, 0)
    norm = a / np.linalg.norm(a, axis=-1, keepdims=True)
    ref = 1 / (1 + np.exp(-(a + norm)))
    (y,) = _session(model).run(None, {"x": x})
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)


def test_with_if_takes_both_branches():
    model = model_zoo.with_if()
    assert any(n.op_type == "If" for n in model.graph.node)
    sess = _session(model)
    init = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    x = np.abs(model_zoo.make_inputs("with_if")["x"])
    for sign in (1.0, -1.0):
        xs = (sign * x).astype(np.float32)
        a = np.maximum(xs @ init["W"] + init["b"], 0)
        t = np.tanh(xs)
        branch = np.maximum(a + t, 0) if xs.sum() > 0 else a * t
        ref = 1 / (1 + np.exp(-(branch * 2 + xs)))
        (y,) = sess.run(None, {"x": xs})
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)


def test_bundled_default_model_matches_builder():
    from nxrt_tvm.data import default_model_path

    path = default_model_path()
    assert path.is_file()
    assert path.stat().st_size < 2 * 1024 * 1024
    on_disk = onnx.load(str(path))
    onnx.checker.check_model(on_disk, full_check=True)
    # The checked-in file is what tools/make_default_model.py writes.
    assert on_disk.SerializeToString() == model_zoo.default_model().SerializeToString()


def test_torch_encoder_matches_torch_output():
    path = DATA / "torch_encoder.onnx"
    ref = np.load(DATA / "torch_encoder.npz")
    model = onnx.load(str(path))
    onnx.checker.check_model(model)
    sess = ort.InferenceSession(str(path), providers=CPU)
    (y,) = sess.run(None, {"x": ref["x"]})
    assert y.shape == ref["y"].shape == (3, 10)
    np.testing.assert_allclose(y, ref["y"], atol=1e-4, rtol=0)


def test_tiny_bert_matches_torch_output():
    path = DATA / "tiny_bert.onnx"
    if not path.exists():
        pytest.skip("tests/data/tiny_bert.onnx not exported")
    ref = np.load(DATA / "tiny_bert.npz")
    sess = ort.InferenceSession(str(path), providers=CPU)
    hidden, pooled = sess.run(None, {"input_ids": ref["input_ids"], "attention_mask": ref["attention_mask"]})
    np.testing.assert_allclose(hidden, ref["last_hidden_state"], atol=1e-4, rtol=0)
    np.testing.assert_allclose(pooled, ref["pooler_output"], atol=1e-4, rtol=0)
