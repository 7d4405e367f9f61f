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
import re
import shutil
from pathlib import Path

import cpus
import model_zoo
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from blobs import lying_index
from onnx import helper

import nxrt_tvm as nx
from nxrt_tvm.epcontext.codec import is_ep_context
from nxrt_tvm.epcontext.record import FAT_FORMAT_VERSION, FORMAT_VERSION
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


@pytest.mark.parametrize("mode", ["truncated", "zeroed", "index"])
def test_forged_blob_is_declined_before_dlopen(plugin_library, embedded_model, tmp_path, capfd, mode):
    """sha256 and size rewritten with the blob: the ELF checks (as in Python) decline it, as the packed
    index's checks do a constant placed past the blob's end; dlopen or the copy would crash ORT."""

    def forge(model):
        node = _context_nodes(model)[0]
        blob = _attr(node, "ep_cache_context")
        if mode == "index":
            blob = lying_index(blob)
        else:
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


# ---- fat (multi-CPU) nodes: the closest variant runs; none that runs here, declined ----


def _x86_only() -> None:
    import platform

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the CPU targets named here are x86's")


@pytest.fixture(scope="module")
def host_cpu() -> str:
    from nxrt_tvm.lower.target import host_cpu as llvm_host_cpu

    return llvm_host_cpu()


@pytest.fixture(scope="module")
def foreign_cpu() -> str:
    """A CPU whose build this host cannot run (nxrt_tvm.epcontext.variants' rule: it lacks an ISA feature)."""
    _x86_only()
    return cpus.foreign_cpu()


@pytest.fixture(scope="module")
def generic_model(tmp_path_factory: pytest.TempPathFactory, source_model: Path) -> Path:
    _x86_only()
    return _compile(tmp_path_factory, source_model, "ort_generic", cpus=["x86-64-v3"])


@pytest.fixture(scope="module")
def foreign_model(tmp_path_factory: pytest.TempPathFactory, source_model: Path, foreign_cpu: str) -> Path:
    return _compile(tmp_path_factory, source_model, "ort_foreign", cpus=[foreign_cpu])


@pytest.fixture(scope="module")
def fat_model(
    tmp_path_factory: pytest.TempPathFactory, source_model: Path, host_cpu: str, foreign_cpu: str
) -> Path:
    if host_cpu == "x86-64-v3":
        pytest.skip("LLVM names this CPU x86-64-v3: no distinct host variant")
    cpus = ["x86-64-v3", host_cpu, foreign_cpu]
    return _compile(tmp_path_factory, source_model, "ort_fat", cpus=cpus, embed=False)


def test_fat_model_runs_the_variant_built_for_this_cpu(
    plugin_library, fat_model, source_model, host_cpu, foreign_cpu, capfd
):
    feeds = _feeds(source_model)
    options = session_options(ort)
    options.log_severity_level = 1  # the variant chosen is logged at info
    sess = ort.InferenceSession(str(fat_model), options)
    assert sess.get_providers()[0] == EP_NAME
    got = sess.run(None, feeds)
    err = capfd.readouterr().err
    choice = f"CPU variant {host_cpu} of x86-64-v3, {host_cpu}, {foreign_cpu}: built for this CPU"
    assert err.count(choice) == 2, err[-3000:]  # one line per partition
    ours = nx.InferenceSession(fat_model).run(None, feeds)  # Python picks the same variant
    reference = ort.InferenceSession(str(source_model), providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, o, r in zip(got, ours, reference):
        assert g.dtype == r.dtype and g.shape == r.shape
        np.testing.assert_array_equal(g, o)
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)


def test_fat_model_with_no_variant_for_this_host_is_declined(
    plugin_library, foreign_model, foreign_cpu, capfd
):
    _assert_declined(foreign_model, capfd, "none of its 1 CPU variants runs on this host (x86_64/")
    # the first of what the foreign CPU needs, as variants.py names it
    with pytest.raises(Exception, match=NOT_COMPATIBLE):
        _plugin_session(foreign_model)
    assert f"{foreign_cpu} needs " in capfd.readouterr().err


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda notes, i: notes["variants"][i].update(sha256="0" * 64), "sha256 does not match"),
        (lambda notes, i: notes["variants"][i].update(offset=notes["size"] - 10), "blob is 10 bytes"),
        (lambda notes, i: notes.pop("variants"), f"format version {FAT_FORMAT_VERSION} with 0 CPU variants"),
        (lambda notes, i: notes["variants"][i].pop("offset"), "notes.variants is malformed"),
    ],
    ids=["variant-sha256", "variant-past-the-end", "no-variants", "malformed-variant"],
)
def test_fat_variant_records_are_checked(
    plugin_library, fat_model, host_cpu, tmp_path, capfd, change, reason
):
    def edit(model):
        for node in _context_nodes(model):
            notes = json.loads(_attr(node, "notes"))
            chosen = next(i for i, v in enumerate(notes["variants"]) if v["mcpu"] == host_cpu)
            change(notes, chosen)
            _set_attr(node, "notes", json.dumps(notes))

    _assert_declined(_edited_copy(fat_model, tmp_path, edit), capfd, reason)


# ---- onnxruntime's compatibility API: the model's ep_compatibility_info, judged by the plugin ----


def _verdict(info: str):
    from onnxruntime.capi import _pybind_state as C

    from nxrt_tvm.ort import ep_devices

    return C.get_model_compatibility_for_ep_devices(ep_devices(ort), info)


@pytest.mark.parametrize(
    ("fixture", "expected"),
    [
        ("embedded_model", "optimal"),
        ("generic_model", "prefer_recompilation"),
        ("foreign_model", "unsupported"),
        ("fat_model", "optimal"),
    ],
)
def test_compatibility_verdict_matches_python(plugin_library, fixture, expected, request):
    from onnxruntime.capi import _pybind_state as C

    from nxrt_tvm.epcontext.compat import judge_compatibility

    model: Path = request.getfixturevalue(fixture)
    info = C.get_compatibility_info_from_model(str(model), EP_NAME)
    assert info, "the compiled model carries no ep_compatibility_info"
    names = {
        "optimal": C.OrtCompiledModelCompatibility.EP_SUPPORTED_OPTIMAL,
        "prefer_recompilation": C.OrtCompiledModelCompatibility.EP_SUPPORTED_PREFER_RECOMPILATION,
        "unsupported": C.OrtCompiledModelCompatibility.EP_UNSUPPORTED,
    }
    assert judge_compatibility(info)[0] == expected
    assert _verdict(info) == names[expected]


def _info(**change) -> str:
    info = {"ep": "nxrt-tvm", "format_version": FORMAT_VERSION, "kind": "llvm", "tvm": "", "variants": []}
    import tvm

    info["tvm"] = tvm.__version__
    info.update(change)
    return json.dumps(info)


@pytest.mark.parametrize(
    "info",
    [
        "{",
        json.dumps([]),
        _info(ep="other"),
        _info(format_version=1),  # a library alone, before constants were packed with it
        _info(tvm="0.1.0"),
        _info(kind="cuda"),
        _info(variants=[]),
        _info(variants=[{"hardware_architecture": "aarch64/neoverse-v2", "cpu_features": []}]),
        _info(variants=[{"hardware_architecture": "x86_64/x86-64-v3"}]),
    ],
    ids=["not-json", "not-object", "ep", "format", "tvm", "kind", "no-variants", "arch", "no-features"],
)
def test_unusable_compatibility_info_is_unsupported(plugin_library, info):
    from onnxruntime.capi import _pybind_state as C

    from nxrt_tvm.epcontext.compat import judge_compatibility

    assert judge_compatibility(info)[0] == "unsupported"
    assert _verdict(info) == C.OrtCompiledModelCompatibility.EP_UNSUPPORTED


@pytest.mark.parametrize(
    "fixture", ["embedded_model", "external_model", "generic_model", "foreign_model", "fat_model"]
)
def test_compatibility_info_of_a_node_is_the_one_python_writes(plugin_library, fixture, request):
    """What the EP's GetCompiledModelCompatibilityInfo returns (ORT asks only when it writes an EPContext
    model, never for a compiled one, so the builder is called through the plugin's test hook)."""
    import ctypes

    from onnxruntime.capi import _pybind_state as C

    model: Path = request.getfixturevalue(fixture)
    node = _context_nodes(onnx.load(str(model), load_external_data=False))[0]
    hook = ctypes.CDLL(str(plugin_library)).NxrtTvmCompatibilityInfo
    hook.restype = ctypes.c_long
    hook.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    out = ctypes.create_string_buffer(1 << 16)
    args = [_attr(node, "notes"), _attr(node, "ep_sdk_version"), _attr(node, "hardware_architecture")]
    n = hook(*args, out, len(out))
    assert 0 < n < len(out)
    assert out.value.decode() == C.get_compatibility_info_from_model(str(model), EP_NAME)


# ---- signed models: nxrt.trusted_keys and nxrt.require_signature, checked by the plugin ----


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """(private, public) PEM pairs: the signer's (ECDSA P-256), an Ed25519 one, and one nobody trusts."""
    from nxrt_tvm.epcontext.signing import ED25519, generate_key

    folder = tmp_path_factory.mktemp("ort_keys")
    return {
        "signer": generate_key(folder / "signer.pem"),
        "ed25519": generate_key(folder / "ed.pem", ED25519),
        "stranger": generate_key(folder / "stranger.pem"),
    }


@pytest.fixture(scope="module")
def signed_model(tmp_path_factory: pytest.TempPathFactory, source_model: Path, keys) -> Path:
    """External blobs, so that each blob file is covered by the manifest, not by the model's digest."""
    return _compile(tmp_path_factory, source_model, "ort_signed", embed=False, sign=keys["signer"][0])


def _signed_session(model: Path | bytes, trusted: list[Path], required: bool = True) -> ort.InferenceSession:
    options = session_options(ort)
    options.log_severity_level = 2
    if trusted:
        options.add_session_config_entry("nxrt.trusted_keys", ",".join(str(k) for k in trusted))
    options.add_session_config_entry("nxrt.require_signature", "1" if required else "0")
    return ort.InferenceSession(model if isinstance(model, bytes) else str(model), options)


def _assert_signature_declined(model, trusted, capfd, reason: str, required: bool = True) -> None:
    with pytest.raises(Exception, match=NOT_COMPATIBLE):
        _signed_session(model, trusted, required)
    err = capfd.readouterr().err
    assert f"{EP_NAME} declines EPContext node" in err and reason in err, err[-2000:]


def _resigned_copy(model: Path, tmp_path: Path, key: Path) -> Path:
    """A copy of `model` and its blob files, signed anew with `key`."""
    from nxrt_tvm.epcontext.signing import sign_model

    copy = _edited_copy(model, tmp_path, lambda m: None)
    sign_model(copy, sorted(tmp_path.glob("*.tvm.*")), key)
    return copy


@pytest.mark.parametrize("key", ["signer", "ed25519"])
def test_signed_model_runs_when_a_trusted_key_signed_it(
    plugin_library, signed_model, source_model, keys, key, tmp_path
):
    model = signed_model if key == "signer" else _resigned_copy(signed_model, tmp_path, keys[key][0])
    feeds = _feeds(source_model)
    sess = _signed_session(model, [keys["stranger"][1], keys[key][1]])  # any of the trusted keys will do
    assert sess.get_providers()[0] == EP_NAME
    reference = ort.InferenceSession(str(source_model), providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, r in zip(sess.run(None, feeds), reference):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)


def test_unsigned_model_is_declined_when_a_signature_is_required(plugin_library, external_model, keys, capfd):
    _assert_signature_declined(
        external_model,
        [keys["signer"][1]],
        capfd,
        "no signature file model_ctx.onnx.sig beside the model; sign it",
    )


def test_model_given_as_bytes_is_declined_when_a_signature_is_required(
    plugin_library, embedded_model, keys, tmp_path, capfd
):
    signed = _resigned_copy(embedded_model, tmp_path, keys["signer"][0])
    _assert_signature_declined(
        signed.read_bytes(), [keys["signer"][1]], capfd, "the model was given as bytes"
    )


def test_signature_by_an_untrusted_key_is_declined(plugin_library, signed_model, keys, capfd):
    from nxrt_tvm.epcontext.signing import fingerprint, load_public_key

    signer = fingerprint(load_public_key(keys["signer"][1]))
    reason = f"signed by key {signer}, which is not among the trusted keys"
    _assert_signature_declined(signed_model, [keys["stranger"][1]], capfd, reason)


def test_blob_swapped_after_signing_is_declined(plugin_library, signed_model, keys, tmp_path, capfd):
    copy = _edited_copy(signed_model, tmp_path, lambda m: None)
    first, second = sorted(tmp_path.glob("*.tvm.so"))
    first.write_bytes(second.read_bytes())  # a well-formed library, just not the one signed
    reason = f"digest of {first.name} differs from the signed manifest (changed after signing)"
    _assert_signature_declined(copy, [keys["signer"][1]], capfd, reason)


@pytest.mark.parametrize("edit", ["model-name", "blob-digest", "signature"])
def test_edited_signature_file_is_declined(plugin_library, signed_model, keys, tmp_path, capfd, edit):
    from nxrt_tvm.epcontext.signing import signature_path

    copy = _edited_copy(signed_model, tmp_path, lambda m: None)
    sidecar = json.loads(signature_path(copy).read_text())
    if edit == "model-name":
        sidecar["manifest"]["model"]["name"] = "other.onnx"
    elif edit == "blob-digest":
        name = next(iter(sidecar["manifest"]["blobs"]))
        sidecar["manifest"]["blobs"][name] = "0" * 64
    else:
        sidecar["signature"] = sidecar["signature"][:-8] + "AAAAAAA="
    signature_path(copy).write_text(json.dumps(sidecar, indent=1))
    _assert_signature_declined(copy, [keys["signer"][1]], capfd, "does not verify with trusted key")


def test_present_signature_is_checked_without_trusted_keys(
    plugin_library, signed_model, source_model, tmp_path, capfd
):
    """No keys, not required: a signed model still loads only as signed (digests), as in check_model."""
    assert _signed_session(signed_model, [], required=False).get_providers()[0] == EP_NAME

    def rename_a_node(model):
        next(n for n in model.graph.node if not is_ep_context(n)).name += "_edited"

    edited = _edited_copy(signed_model, tmp_path, rename_a_node)
    reason = "digest of model_ctx.onnx differs from the signed manifest (changed after signing)"
    _assert_signature_declined(edited, [], capfd, reason, required=False)


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ({"nxrt.require_signature": "1"}, "nxrt.require_signature='1' needs nxrt.trusted_keys"),
        ({"nxrt.require_signature": "maybe"}, "must be '0' or '1'"),
        ({"nxrt.trusted_keys": "/nonexistent/key.pem"}, "cannot read trusted key '/nonexistent/key.pem'"),
    ],
    ids=["required-without-keys", "bad-flag", "missing-key-file"],
)
def test_unusable_signature_config_fails_the_session(plugin_library, embedded_model, entries, message):
    options = session_options(ort)
    for key, value in entries.items():
        options.add_session_config_entry(key, value)
    with pytest.raises(Exception, match=re.escape(message)):
        ort.InferenceSession(str(embedded_model), options)


_WITHOUT_OPENSSL = """
import sys, onnxruntime as ort, nxrt_tvm.ort as nort
nort.register(ort)
def session(model, required):
    options = nort.session_options(ort)
    options.log_severity_level = 2
    options.add_session_config_entry("nxrt.trusted_keys", sys.argv[3])
    options.add_session_config_entry("nxrt.require_signature", required)
    return ort.InferenceSession(model, options)
assert session(sys.argv[2], "0").get_providers()[0] == "TvmExecutionProvider"  # unsigned, not required: loads
for model, required in ((sys.argv[1], "0"), (sys.argv[2], "1")):
    try:
        session(model, required)
    except Exception as exc:
        assert "not compatible with any execution provider" in str(exc), exc
    else:
        raise AssertionError(f"{model} (require_signature={required}) loaded without a signature check")
"""


def test_plugin_without_openssl_loads_no_signed_code(
    plugin_library, signed_model, embedded_model, keys, tmp_path
):
    """Without libcrypto the plugin declines signed models, and every model if signatures are required."""
    import subprocess
    import sys

    from nxrt_tvm.ort import ort_headers

    env = {
        **os.environ,
        "NXRT_TVM_ORT_OPENSSL": "0",
        "NXRT_TVM_CACHE_DIR": str(tmp_path / "cache"),
        "NXRT_TVM_ORT_INCLUDE": str(ort_headers()),
    }
    args = [str(signed_model), str(embedded_model), str(keys["signer"][1])]
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_OPENSSL, *args], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count("built without OpenSSL's libcrypto") == 4, done.stderr[
        -3000:
    ]  # 2 nodes x 2 models


def test_signature_over_names_python_escapes_verifies(plugin_library, signed_model, keys, tmp_path):
    """The plugin rebuilds the signed bytes as json.dumps(ensure_ascii=True) does: quotes, backslashes,
    controls, DEL, non-ASCII and characters beyond the BMP (surrogate pairs) in the model's name."""
    from nxrt_tvm.epcontext.signing import sign_model

    copy = _edited_copy(signed_model, tmp_path, lambda m: None)
    odd = copy.rename(tmp_path / 'mö"d\\el\t\x7f\U0001f600_ctx.onnx')
    sign_model(odd, sorted(tmp_path.glob("*.tvm.so")), keys["signer"][0])
    assert "\\ud83d\\ude00" in odd.with_name(odd.name + ".sig").read_text()
    assert _signed_session(odd, [keys["signer"][1]]).get_providers()[0] == EP_NAME
