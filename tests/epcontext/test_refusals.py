"""Blobs that do not fit this host are refused before
any native code loads, with what differs and what to do."""

from __future__ import annotations

import json
import shutil

import model_zoo
import onnx
import pytest
import tvm
from cpus import foreign_cpu
from parity import assert_parity, ort_run

import nxrt_tvm as nx
from nxrt_tvm.epcontext.codec import is_ep_context
from nxrt_tvm.lower.target import host_cpu


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    path = tmp_path_factory.mktemp("src") / "model.onnx"
    onnx.save(model_zoo.split_model(), path)
    return path


def _copy_of(compiled, tmp_path):
    """A test's own copy of a module's compiled EPContext model and its blobs (each test edits its copy)."""
    for path in compiled.parent.iterdir():
        shutil.copy2(path, tmp_path / path.name)
    return tmp_path / compiled.name


@pytest.fixture(scope="module")
def _external(source, tmp_path_factory):
    out = tmp_path_factory.mktemp("external") / "ctx.onnx"
    nx.compile_model(source, out, embed=False, progress=False)
    return out


@pytest.fixture()
def external(_external, tmp_path):
    return _copy_of(_external, tmp_path)


def _edit_context(path, edit) -> None:
    model = onnx.load(path)
    for node in model.graph.node:
        if is_ep_context(node):
            attrs = {a.name: a for a in node.attribute}
            edit(attrs)
    onnx.save(model, path)


def _blobs(path):
    return sorted(path.parent.glob(f"{path.stem}.*.tvm.so"))


def test_corrupt_blob(external):
    blob = _blobs(external)[0]
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    with pytest.raises(nx.ContextIntegrityError, match="sha256 does not match.*restore the artifact"):
        nx.InferenceSession(external)


def test_truncated_blob(external):
    blob = _blobs(external)[0]
    blob.write_bytes(blob.read_bytes()[:1000])
    with pytest.raises(nx.ContextIntegrityError, match="blob is 1000 bytes.*truncated or replaced"):
        nx.InferenceSession(external)


def test_swapped_blobs(external):
    a, b = _blobs(external)
    tmp = a.with_suffix(".swap")
    shutil.move(a, tmp)
    shutil.move(b, a)
    shutil.move(tmp, b)
    with pytest.raises(nx.ContextIntegrityError):
        nx.InferenceSession(external)


def test_other_tvm_version(external):
    _edit_context(external, lambda a: setattr(a["ep_sdk_version"], "s", b"0.19.0"))
    with pytest.raises(
        nx.ContextVersionMismatch, match=f"built by TVM 0.19.0, this host runs TVM {tvm.__version__}"
    ):
        nx.InferenceSession(external)


def test_other_format_version(external):
    def bump(attrs):
        notes = json.loads(attrs["notes"].s)
        notes["format_version"] = 99
        attrs["notes"].s = json.dumps(notes).encode()

    _edit_context(external, bump)
    with pytest.raises(nx.ContextVersionMismatch, match="format version 99"):
        nx.InferenceSession(external)


@pytest.mark.parametrize(
    "path, why", [("/etc/passwd", "is absolute"), ("../outside.so", "leaves the model's folder")]
)
def test_unsafe_external_paths(external, path, why):
    _edit_context(external, lambda a: setattr(a["ep_cache_context"], "s", path.encode()))
    with pytest.raises(nx.ContextPathError, match=why):
        nx.InferenceSession(external)


def test_missing_external_blob(external):
    _blobs(external)[0].unlink()
    with pytest.raises(nx.ContextPathError, match="does not exist.*copy the blob files"):
        nx.InferenceSession(external)


def test_unknown_source(external):
    _edit_context(external, lambda a: setattr(a["source"], "s", b"SomeOtherExecutionProvider"))
    with pytest.raises(nx.NoEpForContext, match="SomeOtherExecutionProvider"):
        nx.InferenceSession(external)


def test_blob_for_another_target_kind(source, tmp_path):
    out = tmp_path / "cuda_ctx.onnx"
    nx.compile_model(source, out, target="cuda", progress=False)
    with pytest.raises(
        nx.ContextTargetMismatch, match="built for target 'cuda', this session targets 'llvm'"
    ):
        nx.InferenceSession(out)
    if not tvm.cuda(0).exist:
        with pytest.raises(nx.ContextTargetMismatch, match="none is visible"):
            nx.InferenceSession(out, provider_options=[{"target": "cuda"}, {}])


@pytest.fixture(scope="module")
def _foreign(source, tmp_path_factory):
    out = tmp_path_factory.mktemp("foreign") / "foreign_ctx.onnx"
    nx.compile_model(source, out, target={"kind": "llvm", "mcpu": foreign_cpu()}, progress=False)
    return out


@pytest.fixture()
def foreign(_foreign, tmp_path):
    return _copy_of(_foreign, tmp_path)


def test_blob_needing_cpu_features_this_host_lacks(foreign):
    with pytest.raises(
        nx.ContextTargetMismatch, match=f"needs CPU features this host \\({host_cpu()}\\) lacks"
    ) as info:
        nx.InferenceSession(foreign)
    assert "nxrt.context_on_mismatch='recompile'" in str(info.value)
    assert "false-deps" not in str(info.value)  # tuning hints are not hardware requirements


@pytest.mark.parametrize(
    "policy, ep", [("recompile", "TvmExecutionProvider"), ("fallback", "CPUExecutionProvider")]
)
def test_mismatch_policy_runs_the_source(source, foreign, policy, ep):
    options = nx.SessionOptions()
    options.add_session_config_entry("nxrt.context_on_mismatch", policy)
    sess = nx.InferenceSession(foreign, options)
    assert len(sess.refused_contexts) == 2
    assert {str(p.ep) for p in sess.plan.partitions} == (
        {"TvmExecutionProvider", "CPUExecutionProvider"} if policy == "recompile" else {ep}
    )
    feeds = model_zoo.make_inputs("split_model")
    assert_parity(sess.run(None, feeds), ort_run(source, feeds))


def test_no_source_means_no_policy_rescue(source, tmp_path):
    out = tmp_path / "lean.onnx"
    nx.compile_model(
        source, out, target={"kind": "llvm", "mcpu": foreign_cpu()}, keep_source=False, progress=False
    )
    options = nx.SessionOptions()
    options.add_session_config_entry("nxrt.context_on_mismatch", "fallback")
    with pytest.raises(nx.ContextTargetMismatch, match="keeps no source subgraph"):
        nx.InferenceSession(out, options)
