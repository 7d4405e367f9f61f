"""Test set-up: the test folder is importable (model_zoo, parity), shared fixtures."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# Our own bugs fail loudly here: an exception in nxrt's passes or rules raises InternalError
# (normal use logs a warning and keeps a decline or TVM's default schedule). Child processes inherit it.
os.environ["NXRT_TVM_STRICT"] = "1"
# The suite tests what TVM compiles, so every partition TVM can build is claimed; the default policy's
# timing-based choice is tested where a test asks for it (tests/providers/test_claim_policy.py).
os.environ["NXRT_TVM_CLAIM_POLICY"] = "all"

sys.path.insert(0, str(Path(__file__).parent))  # model_zoo and parity live beside the tests

from parity import DATA, assert_parity, ort_run  # noqa: E402,F401  (re-exported: older tests import them from here)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return DATA


@pytest.fixture(scope="session")
def exports_cache(tmp_path_factory) -> str:
    """One compile cache for the exports in tests/data, which several tests compile (tiny_bert cold: about
    50 s, 58 builds): the first test pays, the others load its builds and its remembered failures."""
    return str(tmp_path_factory.mktemp("exports-cache"))
