"""Shape inference: onnxruntime's symbolic pass (sympy, 0.2 s to import) runs only where ONNX's leaves a
dim that is not a number, and then names the dims ONNX could not relate to the inputs."""

from __future__ import annotations

import subprocess
import sys

import model_zoo
import onnx

from nxrt_tvm.graph.model import load_model

_CHECK = """
import sys, onnx
from nxrt_tvm.graph.model import load_model
load_model(onnx.load(sys.argv[1]))
print("sympy" in sys.modules)
"""


def _imports_sympy(model: onnx.ModelProto, tmp_path) -> bool:
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    out = subprocess.run(
        [sys.executable, "-c", _CHECK, str(path)], capture_output=True, text=True, check=True
    )
    return out.stdout.strip().splitlines()[-1] == "True"


def test_a_static_model_skips_the_symbolic_pass(tmp_path):
    assert not _imports_sympy(model_zoo.default_model(), tmp_path)


def test_a_symbolic_model_gets_it(tmp_path):
    """mlp's batch is `N`: the symbolic pass runs, and every value keeps `N` as its leading dim."""
    assert _imports_sympy(model_zoo.mlp(), tmp_path)
    graph = load_model(model_zoo.mlp())
    for node in graph.nodes:
        for out in node.output:
            assert graph.value_info[out].shape[0] == "N"
