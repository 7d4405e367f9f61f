"""nxrt-tvm leaves torch alone: `tvm_ffi` and `onnxruntime.tools` would import it (1.2 s each process)
where it is installed."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_import_does_not_load_torch_and_torch_still_imports(tmp_path):
    """A stand-in `torch`, first on the path, notes every import of it (and then fails, as tvm_ffi
    expects of a missing torch): none while nxrt_tvm (and TVM) import or shape inference loads
    onnxruntime's symbolic inference, and a later import reaches it."""
    marker = tmp_path / "imported"
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(
        f"open({str(marker)!r}, 'a').write('x')\nraise ImportError('stand-in torch')\n"
    )
    code = """
        import pathlib
        from onnx import TensorProto, helper
        import nxrt_tvm
        from nxrt_tvm.graph.inference import infer
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
        graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
        infer(helper.make_model(graph))
        import onnxruntime.tools.symbolic_shape_infer  # infer imported it already: this runs nothing
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
