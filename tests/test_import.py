"""`import nxrt_tvm` leaves torch alone: `tvm_ffi` would import it (1.2 s) where it is installed."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_import_does_not_load_torch_and_torch_still_imports(tmp_path):
    """A stand-in `torch`, first on the path, notes every import of it (and then fails, as tvm_ffi
    expects of a missing torch): none while nxrt_tvm (and TVM) import, and a later import reaches it."""
    marker = tmp_path / "imported"
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(
        f"open({str(marker)!r}, 'a').write('x')\nraise ImportError('stand-in torch')\n"
    )
    code = """
        import pathlib
        import nxrt_tvm
        print(pathlib.Path(MARKER).exists())
        try:
            import torch
        except ImportError as exc:
            print(exc)
        """
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code).replace("MARKER", repr(str(marker)))],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert result.stdout.splitlines() == ["False", "stand-in torch"]
    assert marker.read_text() == "x"
