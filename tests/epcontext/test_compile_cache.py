"""The TVM EP's compile cache: a second session on the plain model loads instead of building."""

from __future__ import annotations

import multiprocessing as mp

import model_zoo
import numpy as np
import onnx
from onnx import helper as h
from onnx import numpy_helper
from parity import assert_parity, ort_run

import nxrt_tvm as nx

TVM = nx.EpId("TvmExecutionProvider")


def _session(model, cache_dir) -> nx.InferenceSession:
    return nx.InferenceSession(model, provider_options=[{"cache_dir": str(cache_dir)}, {}])


def _stats(sess):
    return sess.provider(TVM).stats


def test_second_session_hits_the_cache(tmp_path):
    model = model_zoo.split_model()
    first = _session(model, tmp_path)
    assert _stats(first)["cache_hits"] == 0 and _stats(first)["builds"] >= 2
    second = _session(model, tmp_path)
    assert _stats(second)["cache_hits"] == 2 and _stats(second)["builds"] == 0
    feeds = model_zoo.make_inputs("split_model")
    assert_parity(second.run(None, feeds), ort_run(model, feeds))


def test_key_changes_with_weights_and_target(tmp_path):
    first = _session(model_zoo.cnn(seed=0), tmp_path)
    other_weights = _session(model_zoo.cnn(seed=1), tmp_path)
    assert _stats(other_weights)["cache_hits"] == 0
    one_value = model_zoo.cnn(seed=0)  # one element of the largest weight changed, nothing else
    weight = max(one_value.graph.initializer, key=lambda t: len(t.raw_data))
    changed = numpy_helper.to_array(weight).copy()
    changed.flat[changed.size // 2] += 1.0
    weight.CopyFrom(numpy_helper.from_array(changed, weight.name))
    changed_session = _session(one_value, tmp_path)
    assert _stats(changed_session)["cache_hits"] == 0
    # names tell one model's partitions apart by structure; only the cache key hashes the values
    assert [p.name for p in changed_session.plan.partitions] == [p.name for p in first.plan.partitions]
    other_target = nx.InferenceSession(
        model_zoo.cnn(seed=0),
        provider_options=[{"cache_dir": str(tmp_path), "target": {"kind": "llvm", "mcpu": "x86-64-v3"}}, {}],
    )
    assert _stats(other_target)["cache_hits"] == 0


def test_a_change_to_the_kernel_generating_code_rebuilds(tmp_path, monkeypatch):
    """The key holds a digest of the converters, passes and
    rules: a cache written by older code is not served."""
    from nxrt_tvm.lower import pipeline
    from nxrt_tvm.providers.tvm import builder as tvm_builder

    _session(model_zoo.cnn(seed=0), tmp_path)
    assert _stats(_session(model_zoo.cnn(seed=0), tmp_path))["cache_hits"] > 0
    monkeypatch.setattr(tvm_builder, "codegen_digest", lambda: "another rule set")
    assert _stats(_session(model_zoo.cnn(seed=0), tmp_path))["cache_hits"] == 0
    assert len(pipeline.codegen_digest()) == 64 and pipeline.codegen_digest() == pipeline.codegen_digest()


def test_codegen_digest_covers_the_frontend_every_lowering_module_and_the_linker():
    from nxrt_tvm.lower import pipeline

    frontend, lower, linker = pipeline._CODEGEN_SOURCES
    assert frontend.name == "frontend.py" and frontend.is_file()
    assert linker.name == "artifact.py" and linker.is_file()
    assert {"pipeline.py", "precision.py", "winograd.py"} <= {p.name for p in lower.rglob("*.py")}
    assert {"base.py", "conv.py", "matmul.py"} <= {p.name for p in (lower / "schedules").glob("*.py")}


def test_corrupt_entry_is_dropped_and_rebuilt(tmp_path):
    model = model_zoo.cnn()
    _session(model, tmp_path)
    (entry,) = list(tmp_path.glob("v1/*/*.entry"))
    data = bytearray(entry.read_bytes())
    data[-100] ^= 0xFF
    entry.write_bytes(bytes(data))
    rebuilt = _session(model, tmp_path)
    assert _stats(rebuilt)["cache_hits"] == 0 and _stats(rebuilt)["builds"] == 1
    assert _stats(_session(model, tmp_path))["cache_hits"] == 1
    feeds = model_zoo.make_inputs("cnn")
    assert_parity(rebuilt.run(None, feeds), ort_run(model, feeds))


def test_cached_partitions_save_to_epcontext(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(model_zoo.cnn(), src)
    _session(src, tmp_path / "cache")
    options = nx.SessionOptions()
    options.add_session_config_entry("ep.context_enable", "1")
    sess = nx.InferenceSession(src, options, provider_options=[{"cache_dir": str(tmp_path / "cache")}, {}])
    assert _stats(sess)["cache_hits"] == 1
    deployed = nx.InferenceSession(tmp_path / "m_ctx.onnx")
    feeds = model_zoo.make_inputs("cnn")
    assert_parity(deployed.run(None, feeds), ort_run(src, feeds))


def _compile_into(cache_dir: str, queue) -> None:
    sess = nx.InferenceSession(model_zoo.cnn(), provider_options=[{"cache_dir": cache_dir}, {}])
    feeds = model_zoo.make_inputs("cnn")
    queue.put(sess.run(None, feeds)[0].tolist())


def test_two_processes_compile_into_one_cache(tmp_path):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_compile_into, args=(str(tmp_path), queue)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert results[0] == results[1]
    assert len(list(tmp_path.glob("v1/*/*.entry"))) == 1
    assert _stats(_session(model_zoo.cnn(), tmp_path))["cache_hits"] == 1


def _declines(sess) -> list[tuple[str, str]]:
    return sorted((d.node, d.detail) for d in sess.plan.declines)


def _refuse_tanh():
    """A user pass that fails (as a TVM error would) on any module holding a tanh: one build of the chain
    below fails and is bisected to its culprit, whatever the state of our own rules."""
    import tvm

    @tvm.transform.module_pass(opt_level=0, name="refuse_tanh")
    def refuse(mod, _ctx):
        if "tanh" in mod.script():
            raise tvm.error.InternalError("refuse_tanh: this pass does not take tanh")
        return mod

    return refuse


def _chain() -> onnx.ModelProto:
    graph = h.make_graph(
        [
            h.make_node("Relu", ["x"], ["a"]),
            h.make_node("Tanh", ["a"], ["b"]),
            h.make_node("Sigmoid", ["b"], ["y"]),
        ],
        "chain",
        [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4, 8])],
        [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4, 8])],
    )
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def test_a_warm_cache_neither_rebuilds_nor_bisects(tmp_path):
    """A failed proof build is cached under its partition's key like a success, so a warm session builds
    nothing, bisects nothing and declines the same node for the same reason."""
    options = {"cache_dir": str(tmp_path), "passes": [_refuse_tanh()]}
    first = nx.InferenceSession(_chain(), provider_options=[options, {}])
    assert _stats(first)["builds"] >= 2 and _stats(first)["bisections"] >= 1, _stats(first)
    assert [d.node for d in first.plan.declines] == [first.graph.nodes[1].name], first.plan.declines
    assert "refuse_tanh" in first.plan.declines[0].detail
    second = nx.InferenceSession(_chain(), provider_options=[options, {}])
    assert _stats(second)["builds"] == 0 and _stats(second)["bisections"] == 0, _stats(second)
    assert _stats(second)["failures_remembered"] >= 1, _stats(second)
    assert _declines(second) == _declines(first)
    assert [p.nodes for p in second.plan.partitions] == [p.nodes for p in first.plan.partitions]
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    assert_parity(second.run(None, {"x": x}), ort_run(_chain(), {"x": x}))


def test_an_interrupted_build_is_not_remembered_as_a_failure(tmp_path):
    """A build stopped by compile_timeout_s says nothing about the partition: the next session with time
    to spare builds it."""
    model = model_zoo.cnn(seed=0)
    options = {"cache_dir": str(tmp_path), "compile_timeout_s": 0.01}
    hurried = nx.InferenceSession(model, provider_options=[options, {}])
    assert not hurried.plan.nodes_by_ep().get(str(TVM)), hurried.plan.format(hurried.graph)
    assert any("took longer than" in d.detail for d in hurried.plan.declines)
    patient = _session(model, tmp_path)
    assert _stats(patient)["failures_remembered"] == 0 and _stats(patient)["builds"] >= 1
    assert patient.plan.nodes_by_ep().get(str(TVM)), patient.plan.format(patient.graph)


def test_a_cache_hit_runs_no_symbolic_shape_inference(tmp_path, monkeypatch):
    """The first session keeps its symbolic shape inference in the cache beside its partitions; the second
    reads it (sympy's import alone is 0.2 s of a 0.25 s cache hit)."""
    from nxrt_tvm.graph import inference

    model = model_zoo.mlp()
    _session(model, tmp_path)
    runs: list[int] = []
    monkeypatch.setattr(inference, "_symbolic_value_info", lambda m: runs.append(1) or {})
    second = _session(model, tmp_path)
    assert not runs and _stats(second)["cache_hits"] >= 1 and _stats(second)["builds"] == 0
    assert second.graph.value_info["probs"].shape == ("N", 10)
    feeds = model_zoo.make_inputs("mlp")
    assert_parity(second.run(None, feeds), ort_run(model, feeds))


def test_a_cache_that_cannot_write_costs_a_session_nothing_but_the_cache(tmp_path, monkeypatch, caplog):
    """A full disk refuses every entry (the shape inference, the partition, its timing): the session
    compiles, keeps its inferred dims and runs, and says the cache was left out. A refused partition
    entry used to fail the session; a refused inference entry read as a failed inference, and the
    model lost its dims."""
    from nxrt_tvm.epcontext.cache import CacheError, CompileCache

    def full(cache, key, blob, meta):
        raise CacheError(f"cannot write cache entry {key}: no space left on device")

    monkeypatch.setattr(CompileCache, "put", full)
    model = model_zoo.mlp()
    with caplog.at_level("WARNING", logger="nxrt_tvm.providers.tvm.builder"):
        sess = _session(model, tmp_path)
    assert _stats(sess)["builds"] >= 1 and "goes on without the compile cache" in caplog.text
    assert sess.graph.value_info["m1"].shape == ("N", 128)  # an inner value: inferred, not declared
    feeds = model_zoo.make_inputs("mlp")
    assert_parity(sess.run(None, feeds), ort_run(model, feeds))
