"""Signed EPContext models: a detached signature over the sha256 of the model and of each blob file.

The sha256 in an EPContext node's notes sits in the file it protects: it detects corruption, not
forgery. A signature by a key the host trusts (session config `nxrt.trusted_keys`) does. The sidecar
`MODEL.sig` (JSON) holds a manifest (the model's name and sha256, each external blob's name relative
to the model's folder and its sha256), the algorithm (ECDSA P-256 with SHA-256, or Ed25519), the
signing key's fingerprint and the signature over the manifest's canonical JSON. A session checks it
before any blob is loaded; a blob the signature does not vouch for is refused with
`ContextSignatureError`, which `nxrt.context_on_mismatch` routes like every other refusal.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import onnx
from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from ..api.errors import ContextSignatureError, InvalidProviderOptions
from ..fileio import atomic_write
from .codec import decode_node, is_ep_context, resolve_external
from .record import EpContext, sha256_hex

__all__ = [
    "ECDSA_P256",
    "ED25519",
    "Manifest",
    "ModelTrust",
    "PrivateKey",
    "PublicKey",
    "SignaturePolicy",
    "SignatureProblem",
    "check_model",
    "fingerprint",
    "generate_key",
    "load_private_key",
    "load_public_key",
    "sign_model",
    "signature_path",
    "verify_artifacts",
]

SIGNATURE_FORMAT = "nxrt-tvm-signature/1"
ECDSA_P256 = "ecdsa-p256-sha256"
ED25519 = "ed25519"

PrivateKey = ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey
PublicKey = ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey

_SIGN = (
    "sign it with `nxrt-tvm compile MODEL -o OUT --sign KEY` (compile_model(..., sign=KEY)) and add the "
    "public key to nxrt.trusted_keys"
)
_RESTORE = (
    "restore the model, its blob files and its .sig together from the signed compile output, or re-sign "
    "it with `nxrt-tvm compile MODEL -o OUT --sign KEY`"
)


def signature_path(model: Path) -> Path:
    """Where the signature of `model` lives: beside it, `MODEL.sig`."""
    return model.with_name(model.name + ".sig")


def fingerprint(key: PublicKey) -> str:
    """sha256 of the key's DER SubjectPublicKeyInfo: names the key in the sidecar, proves nothing alone."""
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + sha256_hex(der)


def _algorithm(key: Any) -> str:
    if isinstance(key, (ed25519.Ed25519PrivateKey, ed25519.Ed25519PublicKey)):
        return ED25519
    if isinstance(key, (ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey)) and isinstance(
        key.curve, ec.SECP256R1
    ):
        return ECDSA_P256
    raise InvalidProviderOptions(
        f"unsupported key ({type(key).__name__}): use an ECDSA P-256 or Ed25519 key (`nxrt-tvm keygen`)"
    )


def load_private_key(key: str | os.PathLike | PrivateKey) -> PrivateKey:
    """A signing key: an unencrypted PEM private key file, or a key object."""
    if isinstance(key, (str, os.PathLike)):
        try:
            key = serialization.load_pem_private_key(Path(key).read_bytes(), password=None)
        except (OSError, ValueError, TypeError, UnsupportedAlgorithm) as exc:
            raise InvalidProviderOptions(
                f"cannot read signing key {os.fspath(key)!r} ({exc}): give an unencrypted PEM private key "
                "(`nxrt-tvm keygen KEY` makes one)"
            ) from exc
    _algorithm(key)
    return key  # type: ignore[return-value]


def load_public_key(path: str | os.PathLike) -> PublicKey:
    """A trusted key: a PEM public key, or an X.509 certificate standing for its key (no chain or
    expiry check: trusting the file is trusting the key)."""
    try:
        data = Path(path).read_bytes()
        if b"-----BEGIN CERTIFICATE-----" in data:
            key = x509.load_pem_x509_certificate(data).public_key()
        else:
            key = serialization.load_pem_public_key(data)
    except (OSError, ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise InvalidProviderOptions(
            f"cannot read trusted key {os.fspath(path)!r} ({exc}): give a PEM public key or certificate"
        ) from exc
    _algorithm(key)
    return key  # type: ignore[return-value]


def generate_key(out: Path, algorithm: str = ECDSA_P256) -> tuple[Path, Path]:
    """A new key pair: the private key at `out` (PEM, mode 0600), the public key beside it
    (`signing.pem` -> `signing.pub.pem`)."""
    key: PrivateKey = (
        ed25519.Ed25519PrivateKey.generate()
        if algorithm == ED25519
        else ec.generate_private_key(ec.SECP256R1())
    )
    public = out.with_name(out.stem + ".pub.pem")
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    atomic_write(out, pem, mode=0o600)
    atomic_write(
        public,
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
    )
    return out, public


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


@dataclass(frozen=True)
class Manifest:
    """What a signature vouches for. The model is matched by content (it may be renamed), each blob by
    the name its EPContext node gives, relative to the model's folder."""

    model: str
    model_sha256: str
    blobs: tuple[tuple[str, str], ...]

    def to_json(self) -> dict:
        return {
            "format": SIGNATURE_FORMAT,
            "model": {"name": self.model, "sha256": self.model_sha256},
            "blobs": dict(self.blobs),
        }

    @classmethod
    def from_json(cls, value: dict) -> Manifest:
        if value["format"] != SIGNATURE_FORMAT:
            raise ValueError(f"format {value['format']!r}, this nxrt-tvm reads {SIGNATURE_FORMAT!r}")
        blobs = tuple(sorted((str(k), str(v)) for k, v in value["blobs"].items()))
        return cls(str(value["model"]["name"]), str(value["model"]["sha256"]), blobs)

    def files(self) -> list[tuple[str, str]]:
        """(name, sha256) of every file covered, the model first."""
        return [(self.model, self.model_sha256), *self.blobs]


def sign_model(model: Path, blobs: list[Path], key: str | os.PathLike | PrivateKey) -> Path:
    """Sign `model` and its blob files (paths inside the model's folder); returns the sidecar written."""
    private = load_private_key(key)
    manifest = Manifest(
        model.name,
        sha256_hex(model.read_bytes()),
        tuple(sorted((b.relative_to(model.parent).as_posix(), sha256_hex(b.read_bytes())) for b in blobs)),
    )
    payload = _canonical(manifest.to_json())
    algorithm = _algorithm(private)
    signature = (
        private.sign(payload, ec.ECDSA(hashes.SHA256()))  # type: ignore[call-arg]
        if algorithm == ECDSA_P256
        else private.sign(payload)  # type: ignore[call-arg]
    )
    sidecar = {
        "manifest": manifest.to_json(),
        "algorithm": algorithm,
        "key_fingerprint": fingerprint(private.public_key()),
        "signature": base64.b64encode(signature).decode(),
    }
    path = signature_path(model)
    atomic_write(path, json.dumps(sidecar, indent=2, sort_keys=True).encode() + b"\n")
    return path


@dataclass(frozen=True)
class SignatureProblem:
    """Why a signature does not vouch for a model or blob (see `ContextSignatureError.check`)."""

    check: str
    reason: str
    remedy: str

    def error(self, partition: str) -> ContextSignatureError:
        return ContextSignatureError(partition, self.reason, self.remedy, self.check)


def _changed(name: str) -> SignatureProblem:
    return SignatureProblem(
        "digest", f"digest of {name} differs from the signed manifest (changed after signing)", _RESTORE
    )


@dataclass(frozen=True)
class SignaturePolicy:
    """The session's trust: keys whose signatures count, and whether a blob needs one to load."""

    keys: tuple[PublicKey, ...] = ()
    required: bool = False

    def __post_init__(self) -> None:
        if self.required and not self.keys:  # digests alone authenticate nothing
            raise InvalidProviderOptions(
                "nxrt.require_signature='1' needs nxrt.trusted_keys: the public keys whose signatures count"
            )

    @classmethod
    def from_paths(cls, paths: tuple[str, ...], required: bool) -> SignaturePolicy:
        return cls(tuple(load_public_key(p) for p in paths), required)


@dataclass(frozen=True)
class ModelTrust:
    """What the model's signature vouches for. No manifest and no problem: unsigned, and allowed.
    An empty `key_fingerprint` with a manifest: the digests are pinned but no trusted key was given."""

    manifest: Manifest | None = None
    key_fingerprint: str = ""
    algorithm: str = ""
    problem: SignatureProblem | None = None

    def blob_problem(self, ctx: EpContext) -> SignatureProblem | None:
        """Embedded blobs are covered by the model's digest; an external one must be listed with the
        digest of the bytes about to be loaded."""
        if self.problem is not None or self.manifest is None or ctx.external_path is None:
            return self.problem
        want = dict(self.manifest.blobs).get(ctx.external_path)
        if want is None:
            return SignatureProblem(
                "unlisted", f"the signed manifest does not list its blob {ctx.external_path!r}", _RESTORE
            )
        if sha256_hex(ctx.blob) != want:
            return _changed(ctx.external_path)
        return None

    def check(self, ctx: EpContext) -> None:
        """Raise `ContextSignatureError` unless the signature vouches for `ctx`'s blob."""
        problem = self.blob_problem(ctx)
        if problem is not None:
            raise problem.error(ctx.partition_name)


def _verifies(key: PublicKey, algorithm: str, signature: bytes, payload: bytes) -> bool:
    if algorithm != _algorithm(key):
        return False
    try:
        if isinstance(key, ec.EllipticCurvePublicKey):
            key.verify(signature, payload, ec.ECDSA(hashes.SHA256()))
        else:
            key.verify(signature, payload)
    except InvalidSignature:
        return False
    return True


def check_model(model: Path | None, data: bytes | None, policy: SignaturePolicy) -> ModelTrust:
    """The trust `model` (read as `data`, the bytes that will be parsed) earns under `policy`.

    A present signature is always checked: against the trusted keys where any are given, and its
    digests in every case, so a signed model edited after signing never loads.
    """
    if model is None or data is None:
        if not policy.required:
            return ModelTrust()
        return ModelTrust(
            problem=SignatureProblem(
                "unsigned",
                "the model was given as bytes or a ModelProto, so its signature file cannot be found",
                "open the model from its file path, with its .sig beside it",
            )
        )
    sidecar = signature_path(model)
    if not sidecar.is_file():
        if not policy.required:
            return ModelTrust()
        return ModelTrust(
            problem=SignatureProblem("unsigned", f"no signature file {sidecar.name} beside the model", _SIGN)
        )
    try:
        raw = json.loads(sidecar.read_bytes())
        manifest = Manifest.from_json(raw["manifest"])
        algorithm, signer = str(raw["algorithm"]), str(raw["key_fingerprint"])
        signature = base64.b64decode(raw["signature"], validate=True)
    except (OSError, ValueError, TypeError, KeyError, AttributeError, binascii.Error) as exc:
        unreadable = f"signature file {sidecar.name} is unreadable ({exc})"
        return ModelTrust(problem=SignatureProblem("malformed", unreadable, _RESTORE))
    if policy.keys:
        key = next((k for k in policy.keys if fingerprint(k) == signer), None)
        if key is None:
            return ModelTrust(
                problem=SignatureProblem(
                    "untrusted",
                    f"signed by key {signer}, which is not among the trusted keys (nxrt.trusted_keys)",
                    "add the signer's public key (PEM or certificate) to nxrt.trusted_keys if you trust it, "
                    "or re-sign with `nxrt-tvm compile MODEL -o OUT --sign KEY` using a trusted key",
                )
            )
        if not _verifies(key, algorithm, signature, _canonical(raw["manifest"])):
            return ModelTrust(
                problem=SignatureProblem(
                    "invalid",
                    f"the signature in {sidecar.name} does not verify with trusted key {signer} "
                    "(the manifest or the signature was edited)",
                    _RESTORE,
                )
            )
    if sha256_hex(data) != manifest.model_sha256:
        return ModelTrust(problem=_changed(model.name))
    return ModelTrust(manifest, signer if policy.keys else "", algorithm)


def verify_artifacts(model: Path, policy: SignaturePolicy) -> ModelTrust:
    """The whole artifact set, as a deployment would check it before shipping: the signature, the model's
    digest, every blob file the manifest lists, and that every external blob the model names is listed."""
    data = model.read_bytes()
    trust = check_model(model, data, policy)
    if trust.problem is not None or trust.manifest is None:
        return trust
    for name, digest in trust.manifest.blobs:
        if sha256_hex(resolve_external(model.parent, name, "(manifest)").read_bytes()) != digest:
            return replace(trust, problem=_changed(name))
    for node in onnx.load_model_from_string(data).graph.node:
        if is_ep_context(node):
            problem = trust.blob_problem(decode_node(node, model.parent))
            if problem is not None:
                return replace(trust, problem=problem)
    return trust
