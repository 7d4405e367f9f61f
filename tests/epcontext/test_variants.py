"""Fat EPContext nodes: one build per CPU target in each partition; a host loads the closest it can run."""

from __future__ import annotations

import json

import model_zoo
import numpy as np
import onnx
import pytest
from cpus import foreign_cpu
from parity import assert_parity, ort_run

import nxrt_tvm as nx
from nxrt_tvm.cli import main
from nxrt_tvm.epcontext.codec import is_ep_context
from nxrt_tvm.epcontext.compat import COMPATIBILITY_KEY, judge_compatibility
from nxrt_tvm.epcontext.record import FAT_FORMAT_VERSION
from nxrt_tvm.epcontext.signing import SignaturePolicy, generate_key, load_public_key, verify_artifacts
from nxrt_tvm.lower.target import host_arch, host_cpu

GENERIC = "x86-64-v3"
pytestmark = pytest.mark.skipif(host_arch() != "x86_64", reason="the CPU names here are x86's")


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    path = tmp_path_factory.mktemp("src") / "mlp.onnx"
    onnx.save(model_zoo.mlp(batch=2), path)
    return path


@pytest.fixture(scope="module")
def feeds():
    return {"x": np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)}


def _compile(source, out, cpus, **kwargs):
    report = nx.compile_model(source, out, cpus=cpus, progress=False, **kwargs)
    assert report.compiled_partitions == 1
    return out


@pytest.fixture(scope="module")
def fat(source, tmp_path_factory):
    """Built for a generic level, this very CPU and one whose features this host lacks."""
    return _compile(source, tmp_path_factory.mktemp("fat") / "fat.onnx", [GENERIC, host_cpu(), foreign_cpu()])


def _node(path):
    return next(n for n in onnx.load(path).graph.node if is_ep_context(n))


def _notes(path) -> dict:
    return json.loads(next(a.s for a in _node(path).attribute if a.name == "notes"))


def _loaded_variant(sess) -> str:
    (variant,) = [v for vs in sess.kernel_variants().values() for v in vs]
    return variant.variant


def test_fat_node_holds_one_build_per_cpu(fat, source, feeds):
    notes = _notes(fat)
    assert notes["format_version"] == FAT_FORMAT_VERSION
    assert [v["mcpu"] for v in notes["variants"]] == [GENERIC, host_cpu(), foreign_cpu()]
    ends = [v["offset"] + v["size"] for v in notes["variants"]]
    assert [v["offset"] for v in notes["variants"]] == [0, *ends[:-1]] and ends[-1] == notes["size"]
    hardware = next(a.s for a in _node(fat).attribute if a.name == "hardware_architecture").decode()
    assert hardware == f"x86_64/{GENERIC}+{host_cpu()}+{foreign_cpu()}"
    sess = nx.InferenceSession(fat)
    assert _loaded_variant(sess) == f"cpu:{host_cpu()}"
    assert_parity(sess.run(None, feeds), ort_run(source, feeds))


def test_host_without_its_own_build_loads_the_closest_it_runs(source, feeds, tmp_path):
    out = _compile(source, tmp_path / "two.onnx", [foreign_cpu(), GENERIC])
    sess = nx.InferenceSession(out)
    assert _loaded_variant(sess) == f"cpu:{GENERIC}"  # the foreign build is skipped, not attempted
    assert_parity(sess.run(None, feeds), ort_run(source, feeds))


def test_no_variant_fits_refuses_or_runs_source(source, feeds, tmp_path):
    out = _compile(source, tmp_path / "foreign.onnx", [foreign_cpu()])
    with pytest.raises(
        nx.ContextTargetMismatch, match="none of its 1 CPU variants runs on this host"
    ) as info:
        nx.InferenceSession(out)
    assert f"{foreign_cpu()} needs" in str(info.value) and "--cpus" in str(info.value)
    options = nx.SessionOptions()
    options.add_session_config_entry("nxrt.context_on_mismatch", "fallback")
    sess = nx.InferenceSession(out, options)
    assert len(sess.refused_contexts) == 1
    assert_parity(sess.run(None, feeds), ort_run(source, feeds))


def test_edited_variant_record_is_refused(fat, tmp_path):
    """The bundle's digest holds, but a variant's own record was edited: its bytes do not match."""
    model = onnx.load(fat)
    node = next(n for n in model.graph.node if is_ep_context(n))
    notes_attr = next(a for a in node.attribute if a.name == "notes")
    notes = json.loads(notes_attr.s)
    mine = next(v for v in notes["variants"] if v["mcpu"] == host_cpu())
    mine["offset"] = 0  # now points at the generic build's bytes
    notes_attr.s = json.dumps(notes).encode()
    out = tmp_path / "edited.onnx"
    onnx.save(model, out)
    with pytest.raises(nx.ContextIntegrityError, match="sha256"):
        nx.InferenceSession(out)


def test_the_fat_format_without_variants_is_refused(fat, tmp_path):
    model = onnx.load(fat)
    notes_attr = next(
        a for n in model.graph.node if is_ep_context(n) for a in n.attribute if a.name == "notes"
    )
    notes = json.loads(notes_attr.s)
    del notes["variants"]
    notes_attr.s = json.dumps(notes).encode()
    out = tmp_path / "bare.onnx"
    onnx.save(model, out)
    refused = f"format version {FAT_FORMAT_VERSION} with 0 CPU variants"
    with pytest.raises(nx.ContextIntegrityError, match=refused):
        nx.InferenceSession(out)


def test_unknown_cpu_name_is_refused_before_compiling(source, tmp_path):
    with pytest.raises(nx.InvalidProviderOptions, match="'znver44' is not a CPU LLVM knows.*znver4"):
        nx.compile_model(source, tmp_path / "x.onnx", cpus=["znver44"], progress=False)
    with pytest.raises(nx.InvalidProviderOptions, match="names a CPU twice"):
        nx.compile_model(source, tmp_path / "x.onnx", cpus=[GENERIC, GENERIC], progress=False)
    assert not (tmp_path / "x.onnx").exists()


def test_external_signed_fat_model(source, feeds, tmp_path):
    key, public = generate_key(tmp_path / "key.pem")
    out = _compile(source, tmp_path / "ext.onnx", [GENERIC, host_cpu()], embed=False, sign=key)
    (bundle,) = tmp_path.glob("ext.*.tvm.fat")
    assert bundle.stat().st_size == _notes(out)["size"]
    assert verify_artifacts(out, SignaturePolicy((load_public_key(public),), True)).problem is None
    options = nx.SessionOptions()
    options.add_session_config_entry("nxrt.trusted_keys", str(public))
    options.add_session_config_entry("nxrt.require_signature", "1")
    sess = nx.InferenceSession(out, options)
    assert _loaded_variant(sess) == f"cpu:{host_cpu()}"
    assert_parity(sess.run(None, feeds), ort_run(source, feeds))
    data = bytearray(bundle.read_bytes())  # a bundle swapped after signing
    data[len(data) // 2] ^= 1
    bundle.write_bytes(bytes(data))
    with pytest.raises(nx.ContextSignatureError, match="changed after signing"):
        nx.InferenceSession(out, options)


def _info(path) -> str:
    return next(p.value for p in onnx.load(path).metadata_props if p.key == COMPATIBILITY_KEY)


def test_compatibility_info_verdicts(fat, source, tmp_path):
    assert judge_compatibility(_info(fat))[0] == "optimal"
    generic = _compile(source, tmp_path / "generic.onnx", [GENERIC])
    verdict, why = judge_compatibility(_info(generic))
    assert verdict == "prefer_recompilation" and f"x86_64/{GENERIC}" in why
    plain = nx.compile_model(source, tmp_path / "plain.onnx", progress=False).output
    assert judge_compatibility(_info(plain))[0] == "optimal"
    foreign = _compile(source, tmp_path / "foreign.onnx", [foreign_cpu()])
    assert judge_compatibility(_info(foreign))[0] == "unsupported"
    other_tvm = json.loads(_info(plain)) | {"tvm": "0.1.0"}
    verdict, why = judge_compatibility(json.dumps(other_tvm))
    assert verdict == "unsupported" and "TVM 0.1.0" in why
    assert judge_compatibility("not json")[0] == "unsupported"


def test_cli_compile_cpus_then_run_says_which(source, tmp_path, capsys):
    out = tmp_path / "cli.onnx"
    assert main(["compile", str(source), "-o", str(out), "--cpus", f"{GENERIC},{host_cpu()}", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cpus"] == [GENERIC, host_cpu()]
    assert main(["run", str(out)]) == 0
    assert f"cpu:{host_cpu()}" in capsys.readouterr().out
