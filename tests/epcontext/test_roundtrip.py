"""AOT compile to EPContext models and deploy them without compiling (embedded, external, weightless)."""

from __future__ import annotations

import json
import os

import model_zoo
import numpy as np
import onnx
import pytest
from parity import DATA, assert_parity, ort_run

import nxrt_tvm as nx
from nxrt_tvm.epcontext.codec import is_ep_context
from nxrt_tvm.epcontext.loader import restore_sources
from nxrt_tvm.epcontext.record import FORMAT_VERSION
from nxrt_tvm.fileio import new_file_mode

TVM = nx.EpId("TvmExecutionProvider")


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """The bundled model with a declined node in its head: two TVM partitions around it (multi-partition)."""
    path = tmp_path_factory.mktemp("src") / "model.onnx"
    onnx.save(model_zoo.split_model(), path)
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _deploy_options() -> nx.SessionOptions:
    options = nx.SessionOptions()
    options.add_session_config_entry("session.disable_model_compile", "1")
    return options


def _tvm_ep(sess: nx.InferenceSession):
    return sess.provider(TVM)


@pytest.mark.parametrize("embed", [True, False], ids=["embedded", "external"])
def test_round_trip_loads_without_compiling(source, tmp_path, embed):
    out = tmp_path / "model_ctx.onnx"
    report = nx.compile_model(source, out, embed=embed, progress=False)
    assert report.compiled_partitions == 2
    model = onnx.load(out)
    onnx.checker.check_model(model)
    contexts = [n for n in model.graph.node if is_ep_context(n)]
    assert len(contexts) == 2 and {n.op_type for n in model.graph.node} == {"EPContext", model_zoo.SPLIT_OP}
    blobs = sorted(tmp_path.glob("model_ctx.*.tvm.so"))
    assert len(blobs) == (0 if embed else 2)
    for written in (out, *blobs):  # as open() would create them (0666 less the umask), not mkstemp's 0600
        assert written.stat().st_mode & 0o777 == new_file_mode() == 0o666 & ~_umask()
    for node in contexts:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attrs["source"] == b"TvmExecutionProvider" and attrs["embed_mode"] == int(embed)
        notes = json.loads(attrs["notes"])
        assert notes["format_version"] == FORMAT_VERSION and len(notes["sha256"]) == 64
        if not embed:  # relative, beside the model
            assert (tmp_path / attrs["ep_cache_context"].decode()).is_file()

    sess = nx.InferenceSession(out, _deploy_options())  # any compile would raise CompileDisabled
    ep = _tvm_ep(sess)
    assert ep.stats["loaded"] == 2 and ep.stats["builds"] == 0 and ep.stats["compiled"] == 0
    assert [p.cost.source for p in sess.plan.partitions if p.ep == TVM] == ["precompiled"] * 2
    feeds = model_zoo.make_inputs("split_model")
    assert_parity(sess.run(None, feeds), ort_run(source, feeds))


@pytest.mark.parametrize(
    "left", [{"op_types_to_exclude": "Softmax"}, {"min_subgraph_size": 10_000}], ids=["some", "all"]
)
def test_nodes_a_compile_left_to_the_fallback_stay_there(source, tmp_path, left):
    """What `compile_model` gave the fallback (its options, or the `auto` policy's measurement, which a
    deploying host cannot repeat) runs there, with compiling disabled: the model says its plan is made."""
    from nxrt_tvm.epcontext.writer import PLANNED_KEY

    out = tmp_path / "model_ctx.onnx"
    report = nx.compile_model(source, out, provider_options=left, progress=False)
    model = onnx.load(out)
    plain = [n.name for n in model.graph.node if not is_ep_context(n)]
    assert {e.key: e.value for e in model.metadata_props}[
        PLANNED_KEY
    ] == f"{len(plain)} nodes on the fallback EP"
    assert report.compiled_partitions == (0 if "min_subgraph_size" in left else 2)
    sess = nx.InferenceSession(out, _deploy_options())  # without the options: the TVM EP could take them
    on_cpu = {sess.graph.nodes[i].name for p in sess.plan.partitions if p.ep != TVM for i in p.nodes}
    assert on_cpu == set(plain) and _tvm_ep(sess).stats["builds"] == 0
    feeds = model_zoo.make_inputs("split_model")
    assert_parity(sess.run(None, feeds), ort_run(source, feeds))
    # the source model itself is no plan: compiling it stays refused (test below), and compiling the
    # compiled model again keeps one mark
    again = nx.compile_model(out, tmp_path / "again.onnx", progress=False)
    assert [e.key for e in onnx.load(again.output).metadata_props].count(PLANNED_KEY) == 1


def test_sessions_of_one_model_share_its_loaded_library(source, tmp_path):
    """TVM never unloads a library: a second session of the same EPContext model shares the first's
    module instead of mapping another copy of its code and weights; each runs its own VM."""
    out = tmp_path / "model_ctx.onnx"
    nx.compile_model(source, out, progress=False)
    first, second = (nx.InferenceSession(out, _deploy_options()) for _ in range(2))
    modules = [[k.module for k in s._kernels if hasattr(k, "module")] for s in (first, second)]
    assert len(modules[0]) == 2 and all(a is b for a, b in zip(*modules))
    feeds = model_zoo.make_inputs("split_model")
    expected = ort_run(source, feeds)
    for sess in (first, second):
        assert_parity(sess.run(None, feeds), expected)


def test_compile_disabled_refuses_a_plain_model(source):
    with pytest.raises(nx.CompileDisabled, match="compile the model ahead of time"):
        nx.InferenceSession(source, _deploy_options())


def test_session_options_write_the_context_model(source, tmp_path):
    out = tmp_path / "from_session.onnx"
    options = nx.SessionOptions()
    options.add_session_config_entry("ep.context_enable", "1")
    options.add_session_config_entry("ep.context_file_path", str(out))
    options.add_session_config_entry("ep.context_embed_mode", "0")
    nx.InferenceSession(source, options)
    assert len(list(tmp_path.glob("from_session.*.tvm.so"))) == 2
    feeds = model_zoo.make_inputs("split_model")
    assert_parity(nx.InferenceSession(out, _deploy_options()).run(None, feeds), ort_run(source, feeds))


def test_unknown_session_config_key_is_rejected():
    with pytest.raises(nx.InvalidProviderOptions, match="unknown session config key"):
        nx.SessionOptions().add_session_config_entry("ep.context_enabled", "1")


def test_weightless_blobs_share_one_copy_of_weights(source, tmp_path):
    full = nx.compile_model(source, tmp_path / "full.onnx", embed=False, progress=False)
    lean = nx.compile_model(source, tmp_path / "lean.onnx", embed=False, weightless=True, progress=False)
    size = lambda report: sum(f.stat().st_size for f in report.files if f.suffix == ".so")  # noqa: E731
    assert size(lean) < size(full)
    sess = nx.InferenceSession(tmp_path / "lean.onnx", _deploy_options())
    weights = {w for k in sess.kernels().values() for w in getattr(k, "weight_names", ())}
    assert weights and len(_tvm_ep(sess).weights) == len(weights)
    feeds = model_zoo.make_inputs("split_model")
    assert_parity(sess.run(None, feeds), ort_run(source, feeds))


def test_source_subgraphs_restore_a_plain_model(source, tmp_path):
    out = tmp_path / "ctx.onnx"
    nx.compile_model(source, out, progress=False)
    plain = restore_sources(onnx.load(out))
    assert not any(is_ep_context(n) for n in plain.graph.node)
    feeds = model_zoo.make_inputs("split_model")
    np.testing.assert_allclose(ort_run(plain, feeds)[0], ort_run(source, feeds)[0], rtol=1e-6)


def test_symbolic_batch_survives_the_round_trip(tmp_path):
    src = tmp_path / "mlp.onnx"
    onnx.save(model_zoo.mlp(), src)
    nx.compile_model(src, tmp_path / "mlp_ctx.onnx", progress=False)
    sess = nx.InferenceSession(tmp_path / "mlp_ctx.onnx", _deploy_options())
    for batch in (1, 9):
        feeds = {"x": np.random.default_rng(batch).standard_normal((batch, 64)).astype(np.float32)}
        assert_parity(sess.run(None, feeds), ort_run(src, feeds))


def test_free_dimension_overrides_keep_epcontext_output_types(tmp_path):
    """Fixing a symbolic dim must not drop the declared
    types of EPContext outputs (inference cannot redo them)."""
    src = DATA / "torch_encoder.onnx"
    out = tmp_path / "enc_ctx.onnx"
    nx.compile_model(src, out, embed=False, progress=False)
    stored = np.load(DATA / "torch_encoder.npz")
    options = nx.SessionOptions()  # a static batch lets TVM take nodes it declined at compile time
    options.add_free_dimension_override_by_name("batch", stored["x"].shape[0])
    sess = nx.InferenceSession(out, options)
    assert any(p.cost.source == "precompiled" for p in sess.plan.partitions)
    assert_parity(sess.run(None, {"x": stored["x"]}), ort_run(src, {"x": stored["x"]}), rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("deploy", [True, False], ids=["compile-disabled", "default"])
def test_loading_a_compiled_model_runs_no_symbolic_shape_inference(tmp_path, monkeypatch, deploy):
    """Every node of a compiled model has its EP already: no claims, so no symbolic dims to infer (0.2 s
    of a 0.25 s load)."""
    from nxrt_tvm.graph import inference

    src = tmp_path / "mlp.onnx"
    onnx.save(model_zoo.mlp(), src)
    out = tmp_path / "mlp_ctx.onnx"
    assert nx.compile_model(src, out, progress=False).compiled_partitions >= 1
    runs: list[int] = []
    real = inference._symbolic_value_info
    monkeypatch.setattr(inference, "_symbolic_value_info", lambda m: runs.append(1) or real(m))
    sess = nx.InferenceSession(out, _deploy_options() if deploy else None)
    assert not runs
    feeds = model_zoo.make_inputs("mlp")
    assert_parity(sess.run(None, feeds), ort_run(src, feeds))
    nx.InferenceSession(src)
    assert runs  # the plain model still gets it
