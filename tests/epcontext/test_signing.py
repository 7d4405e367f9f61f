"""Signed EPContext models: a blob loads only where a trusted key's signature vouches for every byte of it.

Each refusal says which check fired (`ContextSignatureError.check`) and fires before the blob's own
checks, so before any native code loads. The model is compiled once per module; each test edits a copy.
"""

from __future__ import annotations

import datetime
import json
import shutil

import model_zoo
import onnx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509.oid import NameOID
from parity import assert_parity, ort_run

import nxrt_tvm as nx
from nxrt_tvm.cli import main
from nxrt_tvm.epcontext.signing import generate_key, load_private_key, sign_model, signature_path
from nxrt_tvm.providers import TvmExecutionProvider

FEEDS = model_zoo.make_inputs("split_model")


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """ECDSA P-256 signing key, an Ed25519 one, and a stranger's: {name: (private, public)}."""
    folder = tmp_path_factory.mktemp("keys")
    return {
        "ecdsa": generate_key(folder / "signing.pem"),
        "ed25519": generate_key(folder / "ed.pem", "ed25519"),
        "stranger": generate_key(folder / "stranger.pem"),
    }


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    path = tmp_path_factory.mktemp("src") / "model.onnx"
    onnx.save(model_zoo.split_model(), path)
    return path


@pytest.fixture(scope="module")
def _signed(source, keys, tmp_path_factory):
    """Two TVM partitions (around a declined node), blobs in files beside the model, signed."""
    out = tmp_path_factory.mktemp("signed") / "ctx.onnx"
    report = nx.compile_model(source, out, embed=False, progress=False, sign=keys["ecdsa"][0])
    assert report.signature == signature_path(out) and report.signature in report.files
    return out


@pytest.fixture()
def signed(_signed, tmp_path):
    for path in _signed.parent.iterdir():
        shutil.copy2(path, tmp_path / path.name)
    return tmp_path / _signed.name


def _blobs(path):
    return sorted(path.parent.glob(f"{path.stem}.*.tvm.so"))


def _options(*trusted, require=True, on_mismatch=None):
    options = nx.SessionOptions()
    options.add_session_config_entry("nxrt.trusted_keys", ";".join(str(k) for k in trusted))
    options.add_session_config_entry("nxrt.require_signature", "1" if require else "0")
    if on_mismatch:
        options.add_session_config_entry("nxrt.context_on_mismatch", on_mismatch)
    return options


def _refusal(path, options) -> nx.ContextSignatureError:
    with pytest.raises(nx.ContextSignatureError) as info:
        nx.InferenceSession(path, options)
    return info.value


def test_good_signature_loads_and_matches_onnxruntime(signed, source, keys):
    tvm_ep = TvmExecutionProvider(target="llvm")
    sess = nx.InferenceSession(
        signed, _options(keys["stranger"][1], keys["ecdsa"][1]), providers=[tvm_ep, "CPUExecutionProvider"]
    )
    assert tvm_ep.stats["loaded"] == 2 and not sess.refused_contexts
    assert_parity(sess.run(None, FEEDS), ort_run(source, FEEDS), rtol=1e-4, atol=1e-5)


def test_cli_signs_embedded_blobs_with_ed25519(source, keys, tmp_path, capsys):
    out = tmp_path / "embedded.onnx"
    assert main(["compile", str(source), "-o", str(out), "--sign", str(keys["ed25519"][0])]) == 0
    assert "signed (embedded.onnx.sig)" in capsys.readouterr().out
    sess = nx.InferenceSession(out, _options(keys["ed25519"][1]))
    assert not sess.refused_contexts
    assert_parity(sess.run(None, FEEDS), ort_run(source, FEEDS), rtol=1e-4, atol=1e-5)
    error = _refusal(out.read_bytes(), _options(keys["ed25519"][1]))  # no file, so no signature beside it
    assert error.check == "unsigned" and "given as bytes" in str(error)
    model = onnx.load(out)
    model.doc_string = "edited after signing"
    onnx.save(model, out)
    error = _refusal(out, _options(keys["ed25519"][1]))
    assert error.check == "digest" and "digest of embedded.onnx differs from the signed manifest" in str(
        error
    )


def test_a_certificate_stands_for_its_key(signed, keys, tmp_path):
    private = load_private_key(keys["ecdsa"][0])
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "nxrt-tvm test signer")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(private.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(private, hashes.SHA256())
    )
    path = tmp_path / "signer.crt"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    assert not nx.InferenceSession(signed, _options(path)).refused_contexts


def test_unsigned_model_is_refused_when_signatures_are_required(signed, keys):
    signature_path(signed).unlink()
    error = _refusal(signed, _options(keys["ecdsa"][1]))
    assert error.check == "unsigned"
    assert "no signature file ctx.onnx.sig" in str(error)
    assert "nxrt-tvm compile MODEL -o OUT --sign KEY" in str(error) and "nxrt.trusted_keys" in str(error)


def test_unsigned_model_with_fallback_runs_its_source(signed, source, keys):
    signature_path(signed).unlink()
    tvm_ep = TvmExecutionProvider(target="llvm")
    sess = nx.InferenceSession(
        signed, _options(keys["ecdsa"][1], on_mismatch="fallback"), providers=[tvm_ep, "CPUExecutionProvider"]
    )
    assert [e.check for e in sess.refused_contexts] == ["unsigned", "unsigned"]
    assert tvm_ep.stats["loaded"] == 0  # no blob was loaded
    assert {str(p.ep) for p in sess.plan.partitions} == {"CPUExecutionProvider"}
    assert_parity(sess.run(None, FEEDS), ort_run(source, FEEDS), rtol=1e-4, atol=1e-5)


def test_signature_by_an_untrusted_key_is_refused(signed, keys):
    error = _refusal(signed, _options(keys["stranger"][1]))
    assert error.check == "untrusted" and "which is not among the trusted keys (nxrt.trusted_keys)" in str(
        error
    )
    assert json.loads(signature_path(signed).read_text())["key_fingerprint"] in str(error)


def test_blob_swapped_after_signing_is_refused(signed, keys):
    """The other blob is a valid library for this host: only the signature tells them apart."""
    a, b = _blobs(signed)
    a.write_bytes(b.read_bytes())
    error = _refusal(signed, _options(keys["ecdsa"][1]))
    assert error.check == "digest" and f"digest of {a.name} differs from the signed manifest" in str(error)


def test_edited_manifest_is_refused(signed, keys):
    """A manifest rewritten to match a swapped blob no longer matches its signature."""
    a, b = _blobs(signed)
    a.write_bytes(b.read_bytes())
    sidecar = json.loads(signature_path(signed).read_text())
    sidecar["manifest"]["blobs"][a.name] = sidecar["manifest"]["blobs"][b.name]
    signature_path(signed).write_text(json.dumps(sidecar))
    error = _refusal(signed, _options(keys["ecdsa"][1]))
    assert error.check == "invalid" and "does not verify with trusted key" in str(error)


def test_model_edited_after_signing_is_refused(signed, keys):
    model = onnx.load(signed)
    model.graph.node[0].name += "_edited"
    onnx.save(model, signed)
    error = _refusal(signed, _options(keys["ecdsa"][1]))
    assert error.check == "digest" and "digest of ctx.onnx differs from the signed manifest" in str(error)


def test_blob_the_manifest_does_not_list_is_refused(signed, keys):
    sign_model(signed, _blobs(signed)[1:], keys["ecdsa"][0])
    error = _refusal(signed, _options(keys["ecdsa"][1]))
    assert error.check == "unlisted" and f"does not list its blob '{_blobs(signed)[0].name}'" in str(error)


def test_unreadable_signature_file_is_refused(signed, keys):
    signature_path(signed).write_text("{not json")
    assert _refusal(signed, _options(keys["ecdsa"][1])).check == "malformed"


def test_without_source_a_refused_signature_keeps_its_check(source, keys, tmp_path):
    out = tmp_path / "lean.onnx"
    nx.compile_model(source, out, keep_source=False, progress=False)  # unsigned
    error = _refusal(out, _options(keys["ecdsa"][1], on_mismatch="fallback"))
    assert error.check == "unsigned" and "keeps no source subgraph" in str(error)


def test_recompiling_unsigned_removes_the_stale_signature(signed, source):
    nx.compile_model(source, signed, embed=False, progress=False)
    assert not signature_path(signed).exists()
    assert not nx.InferenceSession(signed).refused_contexts


@pytest.mark.parametrize("trusted", [True, False])
def test_tampered_signed_model_is_refused_even_when_not_required(signed, keys, trusted):
    """A present signature is always checked: a signed model edited after signing never loads."""
    a, b = _blobs(signed)
    a.write_bytes(b.read_bytes())
    options = _options(*([keys["ecdsa"][1]] if trusted else []), require=False)
    assert _refusal(signed, options).check == "digest"


def test_require_without_trusted_keys_is_a_configuration_error():
    with pytest.raises(nx.InvalidProviderOptions, match="needs nxrt.trusted_keys"):
        nx.InferenceSession(model_zoo.split_model(), _options(require=True))


def test_bad_signing_key_fails_before_compiling(source, tmp_path):
    key = tmp_path / "not_a_key.pem"
    key.write_text("hello")
    with pytest.raises(nx.InvalidProviderOptions, match="cannot read signing key"):
        nx.compile_model(source, tmp_path / "out.onnx", sign=key, progress=False)
    assert not (tmp_path / "out.onnx").exists()


def test_verify_cli(signed, keys, capsys):
    fingerprint = json.loads(signature_path(signed).read_text())["key_fingerprint"]
    assert main(["verify", str(signed), "--key", str(keys["ecdsa"][1])]) == 0
    out = capsys.readouterr().out
    assert f"verified, signed by {fingerprint} (ecdsa-p256-sha256)" in out
    assert all(f"  {p.name}  sha256 " in out for p in [signed, *_blobs(signed)])

    assert main(["verify", str(signed), "--key", str(keys["stranger"][1])]) == 1
    assert "NOT verified (untrusted)" in capsys.readouterr().out

    a, b = _blobs(signed)
    a.write_bytes(b.read_bytes())
    assert main(["verify", str(signed), "--key", str(keys["ecdsa"][1]), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert not report["verified"] and report["check"] == "digest" and a.name in report["reason"]

    signature_path(signed).unlink()
    assert main(["verify", str(signed), "--key", str(keys["ecdsa"][1])]) == 1
    assert "NOT verified (unsigned)" in capsys.readouterr().out
