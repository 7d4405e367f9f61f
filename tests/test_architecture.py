"""The package's dependencies run one way (pyproject.toml's import-linter layers contract)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def test_layers_contract_is_kept():
    result = _lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 kept, 0 broken" in result.stdout


def test_an_upward_import_inside_a_function_breaks_the_contract(tmp_path):
    pkg = tmp_path / "layered"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "high.py").write_text("from . import low\n")
    (pkg / "low.py").write_text("def f():\n    from . import high  # the kind of import a cycle hides in\n")
    (tmp_path / ".importlinter").write_text(
        "[importlinter]\nroot_package = layered\n\n"
        "[importlinter:contract:layers]\nname = one way\ntype = layers\n"
        "layers =\n    layered.high\n    layered.low\n"
    )
    result = _lint(tmp_path)
    assert result.returncode == 1 and "layered.low -> layered.high" in result.stdout, result.stdout
