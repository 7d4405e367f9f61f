"""Test set-up: the test folder is importable (model_zoo, parity), shared fixtures."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # model_zoo and parity live beside the tests

from parity import DATA, assert_parity, ort_run  # noqa: E402,F401  (re-exported: older tests import them from here)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return DATA
