"""The plugin's C copies of Python constants say the same (read from the C sources: no build needed)."""

from __future__ import annotations

import re
from pathlib import Path

from nxrt_tvm.epcontext.record import FORMAT_VERSION
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


def test_llvm_tuning_hints_match():
    """A feature on one list and not the other makes the plugin refuse blobs Python loads, or the reverse."""
    assert _c_strings("TUNING") == set(target._TUNING_HINTS)
    assert _c_strings("TUNING_PREFIX") == set(target._TUNING_PREFIXES)
