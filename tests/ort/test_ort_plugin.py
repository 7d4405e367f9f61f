"""Stock onnxruntime + the nxrt-tvm plugin EP runs EPContext models like nxrt_tvm.InferenceSession does.

The source model (the bundled one with a declined LpNormalization in its head, `model_zoo.split_model`)
compiles to two TVM partitions around a node that stays on ORT's CPU EP, so every parity test here is
multi-partition and mixed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
from pathlib import Path

import model_zoo
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

import nxrt_tvm as nx
from nxrt_tvm.epcontext.codec import is_ep_context
from nxrt_tvm.ort import EP_NAME, build_plugin, session_options
from nxrt_tvm.ort.cli import add_cli

NOT_COMPATIBLE = "not compatible with any execution provider"

# Fixtures live here, not in a conftest.py: tests import the top-level `conftest` by name.


@pytest.fixture(scope="session")
def plugin_library() -> Path:
    """The plugin, registered with this process's onnxruntime;
    skips where no compiler, npm or headers can be had."""
    if not hasattr(ort, "register_execution_provider_library"):
        pytest.skip(f"onnxruntime {ort.__version__} has no plugin-EP API (needs >= 1.23)")
    from nxrt_tvm.ort import PluginBuildError, register

    try:
        return register(ort)
    except PluginBuildError as exc:
        if os.environ.get("NXRT_TVM_REQUIRE_PLUGIN"):  # CI can always fetch the headers: a skip would hide it
            pytest.fail(f"the ORT plugin must build here (NXRT_TVM_REQUIRE_PLUGIN is set): {exc}")
        pytest.skip(f"the ORT plugin cannot be built here: {exc}")


@pytest.fixture(scope="session")
def source_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ort_source") / "split.onnx"
    onnx.save(model_zoo.split_model(), path)
    return path


def _compile(tmp_path_factory: pytest.TempPathFactory, source: Path, name: str, **options) -> Path:
    out = tmp_path_factory.mktemp(name) / "model_ctx.onnx"
    nx.compile_model(source, out, progress=False, **options)
    return out


@pytest.fixture(scope="session")
def embedded_model(tmp_path_factory: pytest.TempPathFactory, source_model: Path) -> Path:
    return _compile(tmp_path_factory, source_model, "ort_embedded")


@pytest.fixture(scope="session")
def external_model(tmp_path_factory: pytest.TempPathFactory, source_model: Path) -> Path:
    return _compile(tmp_path_factory, source_model, "ort_external", embed=False)


def _feeds(model: Path | str) -> dict[str, np.ndarray]:
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(7)
    return {
        i.name: rng.standard_normal([d if isinstance(d, int) else 2 for d in i.shape]).astype(np.float32)
        for i in sess.get_inputs()
    }


def _plugin_session(model: Path | str | bytes) -> ort.InferenceSession:
    options = session_options(ort)
    options.log_severity_level = 2  # the plugin's declines are warnings
    return ort.InferenceSession(model if isinstance(model, bytes) else str(model), options)


def _context_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if is_ep_context(n)]


def _set_attr(node: onnx.NodeProto, name: str, value) -> None:
    for i, attr in enumerate(node.attribute):
        if attr.name == name:
            node.attribute[i].CopyFrom(helper.make_attribute(name, value))
            return
    node.attribute.append(helper.make_attribute(name, value))


def _attr(node: onnx.NodeProto, name: str):
    return next(helper.get_attribute_value(a) for a in node.attribute if a.name == name)


def _edited_copy(model_path: Path, tmp_path: Path, edit) -> Path:
    """A copy of the model (and its blob files) with `edit(model)` applied to the copy."""
    for f in model_path.parent.iterdir():
        shutil.copy(f, tmp_path / f.name)
    copy = tmp_path / model_path.name
    model = onnx.load(str(copy))
    edit(model)
    onnx.save(model, str(copy))
    return copy


def _assert_declined(model: Path | bytes, capfd: pytest.CaptureFixture, reason: str) -> None:
    with pytest.raises(Exception, match=NOT_COMPATIBLE):
        _plugin_session(model)
    err = capfd.readouterr().err
    assert f"{EP_NAME} declines EPContext node" in err and reason in err, err[-2000:]


@pytest.mark.parametrize("fixture", ["embedded_model", "external_model"])
def test_parity_with_session_and_source(plugin_library, source_model, fixture, request):
    model: Path = request.getfixturevalue(fixture)
    assert len(_context_nodes(onnx.load(str(model), load_external_data=False))) == 2
    feeds = _feeds(source_model)
    sess = _plugin_session(model)
    assert sess.get_providers()[0] == EP_NAME
    got = sess.run(None, feeds)
    ours = nx.InferenceSession(model).run(None, feeds)
    reference = ort.InferenceSession(str(source_model), providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, o, r in zip(got, ours, reference):
        assert g.dtype == r.dtype and g.shape == r.shape
        np.testing.assert_array_equal(g, o)  # the same TVM code over the same inputs
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)
    again = sess.run(None, feeds)  # the VM and its buffers are reused across runs
    for a, g in zip(again, got):
        np.testing.assert_array_equal(a, g)


def test_providers_list_selects_the_plugin(plugin_library, embedded_model, source_model):
    sess = ort.InferenceSession(str(embedded_model), providers=[EP_NAME, "CPUExecutionProvider"])
    assert sess.get_providers()[0] == EP_NAME
    feeds = _feeds(source_model)
    reference = ort.InferenceSession(str(source_model), providers=["CPUExecutionProvider"]).run(None, feeds)
    np.testing.assert_allclose(sess.run(None, feeds)[0], reference[0], rtol=1e-4, atol=1e-5)


def test_tampered_embedded_blob_is_declined(plugin_library, embedded_model, tmp_path, capfd):
    def flip_a_byte(model):
        node = _context_nodes(model)[0]
        blob = bytearray(_attr(node, "ep_cache_context"))
        blob[len(blob) // 2] ^= 0xFF
        _set_attr(node, "ep_cache_context", bytes(blob))

    _assert_declined(_edited_copy(embedded_model, tmp_path, flip_a_byte), capfd, "sha256 does not match")


def test_tampered_external_blob_is_declined(plugin_library, external_model, tmp_path, capfd):
    copy = _edited_copy(external_model, tmp_path, lambda model: None)
    blob_file = next(tmp_path.glob("*.tvm.so"))
    data = bytearray(blob_file.read_bytes())
    data[100] ^= 0xFF
    blob_file.write_bytes(bytes(data))
    _assert_declined(copy, capfd, "sha256 does not match")


def test_truncated_blob_is_declined(plugin_library, embedded_model, tmp_path, capfd):
    def truncate(model):
        node = _context_nodes(model)[1]
        _set_attr(node, "ep_cache_context", _attr(node, "ep_cache_context")[:-16])

    _assert_declined(_edited_copy(embedded_model, tmp_path, truncate), capfd, "truncated or replaced")


@pytest.mark.parametrize("mode", ["truncated", "zeroed"])
def test_forged_blob_is_declined_before_dlopen(plugin_library, embedded_model, tmp_path, capfd, mode):
    """sha256 and size rewritten with the blob: the ELF
    checks (as in Python) decline it; dlopen would crash ORT."""

    def forge(model):
        node = _context_nodes(model)[0]
        blob = _attr(node, "ep_cache_context")
        blob = blob[: len(blob) // 2] if mode == "truncated" else blob[:4096] + b"\0" * (len(blob) - 4096)
        _set_attr(node, "ep_cache_context", blob)
        notes = json.loads(_attr(node, "notes"))
        notes["sha256"], notes["size"] = hashlib.sha256(blob).hexdigest(), len(blob)
        _set_attr(node, "notes", json.dumps(notes).encode())

    _assert_declined(_edited_copy(embedded_model, tmp_path, forge), capfd, "not a loadable shared library")


def test_external_path_leaving_the_model_folder_is_declined(plugin_library, external_model, tmp_path, capfd):
    inner = tmp_path / "inner"
    inner.mkdir()

    def escape(model):
        node = _context_nodes(model)[0]
        name = _attr(node, "ep_cache_context").decode()
        _set_attr(node, "ep_cache_context", f"../{name}")

    copy = _edited_copy(external_model, tmp_path, escape)
    moved = inner / copy.name
    copy.rename(moved)  # the blob files stay one folder up: reachable only by leaving the model's folder
    _assert_declined(moved, capfd, "leaves the model's folder")


def test_external_blob_of_a_model_given_as_bytes_is_declined(plugin_library, external_model, capfd):
    _assert_declined(external_model.read_bytes(), capfd, "the model was given as bytes")


def test_other_tvm_version_is_declined(plugin_library, embedded_model, tmp_path, capfd):
    def old_tvm(model):
        _set_attr(_context_nodes(model)[0], "ep_sdk_version", "0.1.0")

    _assert_declined(_edited_copy(embedded_model, tmp_path, old_tvm), capfd, "built by TVM 0.1.0")


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda notes: notes["cpu_features"].append("amx-tile-not-a-feature"), "cannot verify"),
        (lambda notes: notes.update(format_version=99), "format version 99"),
        (lambda notes: notes.update(target=json.dumps({"kind": "cuda"})), "built for target 'cuda'"),
    ],
    ids=["unknown-cpu-feature", "format-version", "cuda-target"],
)
def test_notes_the_host_cannot_satisfy_are_declined(
    plugin_library, embedded_model, tmp_path, capfd, change, reason
):
    def edit(model):
        node = _context_nodes(model)[0]
        notes = json.loads(_attr(node, "notes"))
        change(notes)
        _set_attr(node, "notes", json.dumps(notes))

    _assert_declined(_edited_copy(embedded_model, tmp_path, edit), capfd, reason)


def test_missing_cpu_feature_is_declined(plugin_library, embedded_model, tmp_path, capfd):
    import platform

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the cpuid feature table is x86-only")
    missing = next(
        (
            f
            for f in ("amx-tile", "avx512fp16", "avx512er", "fma4", "xop", "avx512vp2intersect")
            if not _host_has(f)
        ),
        None,
    )
    if missing is None:
        pytest.skip("this CPU has every probe feature")

    def edit(model):
        node = _context_nodes(model)[0]
        notes = json.loads(_attr(node, "notes"))
        notes["cpu_features"].append(missing)
        _set_attr(node, "notes", json.dumps(notes))

    _assert_declined(_edited_copy(embedded_model, tmp_path, edit), capfd, f"lacks: {missing}")


def _host_has(feature: str) -> bool:
    flags = {
        "amx-tile": "amx_tile",
        "avx512fp16": "avx512_fp16",
        "avx512er": "avx512er",
        "fma4": "fma4",
        "xop": "xop",
        "avx512vp2intersect": "avx512_vp2intersect",
    }
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return flags[feature] in line.split()


def test_build_is_cached_and_the_cli_prints_it(plugin_library, capsys):
    again = build_plugin()
    assert again == plugin_library and again.stat().st_mtime == plugin_library.stat().st_mtime
    parser = argparse.ArgumentParser(prog="nxrt-tvm")
    add_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["ort-plugin", "build", "--json"])
    assert args.func(args) == 0
    assert json.loads(capsys.readouterr().out)["library"] == str(plugin_library)


def test_sources_change_rebuilds(plugin_library, tmp_path, monkeypatch):
    from nxrt_tvm.ort import ort_headers, plugin_source_dir

    headers = ort_headers()  # the cached download; only the build goes to the temp cache
    copy = tmp_path / "plugin"
    shutil.copytree(plugin_source_dir(), copy)
    with (copy / "ep.c").open("a") as f:
        f.write("\n/* a change */\n")
    monkeypatch.setenv("NXRT_TVM_ORT_PLUGIN_SRC", str(copy))
    monkeypatch.setenv("NXRT_TVM_CACHE_DIR", str(tmp_path / "cache"))
    rebuilt = build_plugin(headers)
    assert rebuilt.is_file() and rebuilt.parent.name != plugin_library.parent.name  # a new build key


def test_weightless_blobs_take_weights_from_the_model(plugin_library, source_model, tmp_path):
    out = tmp_path / "weightless_ctx.onnx"
    nx.compile_model(source_model, out, weightless=True, progress=False)
    feeds = _feeds(source_model)
    got = _plugin_session(out).run(None, feeds)
    reference = ort.InferenceSession(str(source_model), providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, r in zip(got, reference):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)


def test_unaligned_input_is_staged(plugin_library, embedded_model, source_model):
    """Inputs ORT hands over as they are: a view at an odd address is staged, not misread."""
    feeds = _feeds(source_model)
    name, value = next(iter(feeds.items()))
    raw = np.zeros(value.nbytes + 64, dtype=np.uint8)
    start = (-raw.ctypes.data) % 64 + 4  # 4 bytes past a 64-byte boundary
    unaligned = raw[start : start + value.nbytes].view(np.float32).reshape(value.shape)
    unaligned[...] = value
    assert unaligned.ctypes.data % 64 != 0
    sess = _plugin_session(embedded_model)
    reference = ort.InferenceSession(str(source_model), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(
        sess.run(None, {name: unaligned})[0], reference.run(None, feeds)[0], rtol=1e-4, atol=1e-5
    )
