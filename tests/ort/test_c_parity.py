"""The plugin's C copies of Python constants say the same (read from the C sources: no build needed)."""

from __future__ import annotations

import re
from pathlib import Path

from nxrt_tvm.epcontext.record import FAT_FORMAT_VERSION, FORMAT_VERSION
from nxrt_tvm.lower import target
from nxrt_tvm.providers import TvmExecutionProvider

PLUGIN = Path(__file__).resolve().parents[2] / "plugin"


def _define(name: str) -> str:
    match = re.search(rf"#define {name} (\S+)", (PLUGIN / "plugin.h").read_text())
    assert match, f"plugin.h defines no {name}"
    return match.group(1)


def _c_strings(array: str) -> set[str]:
    source = (PLUGIN / "cpu.c").read_text()
    match = re.search(rf"{array}\[\] = \{{(.*?)NULL\}};", source, re.S)
    assert match, f"cpu.c has no array {array}"
    return set(re.findall(r'"([^"]*)"', match.group(1)))


def test_ep_name_and_format_version_match():
    assert _define("NXRT_EP_NAME") == f'"{TvmExecutionProvider.ep_id}"'
    assert int(_define("NXRT_FORMAT_VERSION")) == FORMAT_VERSION
    assert int(_define("NXRT_FAT_FORMAT_VERSION")) == FAT_FORMAT_VERSION  # fat (multi-CPU) nodes


def test_llvm_tuning_hints_match():
    """A feature on one list and not the other makes the plugin refuse blobs Python loads, or the reverse."""
    assert _c_strings("TUNING") == set(target._TUNING_HINTS)
    assert _c_strings("TUNING_PREFIX") == set(target._TUNING_PREFIXES)


def test_signature_names_match():
    """The sidecar's format and algorithm names the plugin accepts are the ones signing.py writes."""
    from nxrt_tvm.epcontext import signing

    source = (PLUGIN / "signature.c").read_text()
    defines = dict(re.findall(r'#define (\w+) "([^"]*)"', source))
    assert defines["SIGNATURE_FORMAT"] == signing.SIGNATURE_FORMAT
    assert defines["ECDSA_P256"] == signing.ECDSA_P256
    assert defines["ED25519"] == signing.ED25519


def test_features_never_emitted_match():
    """A system feature one side ignores and the other requires splits their verdicts on a foreign build."""
    assert _c_strings("NOT_EMITTED") == set(target._NOT_EMITTED)
