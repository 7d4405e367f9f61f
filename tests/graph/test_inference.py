"""Shape inference: onnxruntime's symbolic pass (sympy, 0.2 s to import) runs only where ONNX's leaves a
dim that is not a number, and then names the dims ONNX could not relate to the inputs."""

from __future__ import annotations

import subprocess
import sys

import model_zoo
import numpy as np
import onnx
import pytest

from nxrt_tvm.graph import inference
from nxrt_tvm.graph.inference import _exact_resize
from nxrt_tvm.graph.model import analyse, load_model

_CHECK = """
import sys, onnx
from nxrt_tvm.graph.inference import _exact_resize
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


class _Store(dict):
    """A `BlobStore` in memory."""

    def put(self, key: str, data: bytes) -> None:
        self[key] = data


@pytest.fixture
def symbolic_runs(monkeypatch) -> list[int]:
    """One entry per run of the symbolic pass."""
    calls: list[int] = []
    real = inference._symbolic_value_info
    monkeypatch.setattr(inference, "_symbolic_value_info", lambda m: calls.append(1) or real(m))
    return calls


def _value_info(graph) -> dict:
    return {name: (vi.elem_type, vi.shape) for name, vi in graph.value_info.items()}


def test_a_stored_symbolic_inference_is_read_not_run_again(symbolic_runs):
    """A second session with a compile cache reads what the first inferred (no sympy import, 0.2 s); a
    stored result that does not parse is inferred again."""
    store = _Store()
    first = analyse(model_zoo.mlp(), store=store)
    runs = len(symbolic_runs)
    assert runs >= 1 and 1 <= len(store) <= runs
    second = analyse(model_zoo.mlp(), store=store)
    assert len(symbolic_runs) == runs and _value_info(second) == _value_info(first)
    for key in store:
        store[key] = b"\xff\xff not a GraphProto"
    third = analyse(model_zoo.mlp(), store=store)
    assert len(symbolic_runs) == 2 * runs and _value_info(third) == _value_info(first)


def test_a_fixed_plan_skips_the_symbolic_pass(symbolic_runs):
    """`symbolic=False` (a session that claims nothing) gives ONNX's types alone and stores nothing."""
    store = _Store()
    graph = analyse(model_zoo.mlp(), symbolic=False, store=store)
    assert not symbolic_runs and not store
    assert all(graph.value_info[out].elem_type for node in graph.nodes for out in node.output)


def _resize_chain(scales: list[float]) -> onnx.ModelProto:
    """A strided conv pyramid over a symbolic map, then Resizes by `scales` (an FPN's upsampling path)."""
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits, last = [], [], "x"
    for k in range(3):
        inits.append(numpy_helper.from_array(np.ones((8, 8, 3, 3), np.float32), f"w{k}"))
        nodes.append(helper.make_node("Conv", [last, f"w{k}"], [f"c{k}"], strides=[2, 2], pads=[1, 1, 1, 1]))
        last = f"c{k}"
    for k, scale in enumerate(scales):
        inits.append(numpy_helper.from_array(np.array([1, 1, scale, scale], np.float32), f"s{k}"))
        nodes.append(helper.make_node("Resize", [last, "", f"s{k}"], [f"r{k}"], mode="nearest"))
        last = f"r{k}"
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, "h", "w"])],
        [helper.make_tensor_value_info(last, TensorProto.FLOAT, [1, 8, None, None])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_resize_dims_are_exact_and_match_what_onnxruntime_runs():
    """Resize's scaled dims are computed exactly (``2*floor(...)``), not simplified by sympy from
    ``floor(2.0*floor(...))`` (5.2 of PP-OCR det's 5.6 s of loading, YOLOv8n 2.2 s): no float left in
    them, and evaluated at real sizes they are the shapes onnxruntime computes."""
    import onnxruntime as ort
    import sympy
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    model = _resize_chain([2.0, 2.0, 0.5, 1.25])
    inference = _exact_resize(SymbolicShapeInference)(2**31 - 1, True, False, 0)
    inference._preprocess(onnx.shape_inference.infer_shapes(model))
    while inference.run_:
        inference._infer_impl()
    names = [f"r{k}" for k in range(4)]
    dims = {
        vi.name: [d.dim_param for d in vi.type.tensor_type.shape.dim[2:]]
        for vi in inference.out_mp_.graph.value_info
        if vi.name in names
    }
    assert sorted(dims) == names and not any("." in d for name in names for d in dims[name]), dims
    del model.graph.output[:]
    model.graph.output.extend(
        onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in names
    )
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    h, w = sympy.symbols("h w")
    for size in ((37, 64), (100, 23)):
        x = np.zeros((1, 8, *size), np.float32)
        for name, out in zip(names, session.run(names, {"x": x}), strict=True):
            want = [int(sympy.sympify(d).subs({h: size[0], w: size[1]})) for d in dims[name]]
            assert list(out.shape[2:]) == want, (name, dims[name], size)


def _split_by(lengths: list[onnx.NodeProto], split_from: str, x_shape: list) -> onnx.ModelProto:
    """x [.., 8] split along its last axis by `split_from` (computed by `lengths` from x's shape)."""
    from onnx import TensorProto
    from onnx import helper as h

    nodes = [
        *lengths,
        h.make_node("Split", ["x", split_from], ["a", "b"], axis=-1),
        h.make_node("Relu", ["a"], ["ya"]),
        h.make_node("Relu", ["b"], ["yb"]),
    ]
    graph = h.make_graph(
        nodes,
        "split",
        [h.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [h.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("ya", "yb")],
        [],
    )
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 18)])


def test_a_split_through_identity_gets_its_computed_sizes():
    """RotaryEmbedding's body: [rotary dim, head - rotary dim] with the rotary dim an Identity of the
    head size. onnxruntime's inference lost the value at the Identity and split the axis evenly (4 and
    4 where it is 8 and 0)."""
    from onnx import helper as h

    lengths = [
        h.make_node("Shape", ["x"], ["head"], start=-1),  # [8]
        h.make_node("Identity", ["head"], ["rotary"]),
        h.make_node("Sub", ["head", "rotary"], ["rest"]),  # [0]
        h.make_node("Concat", ["rotary", "rest"], ["parts"], axis=0),
    ]
    model = _split_by(lengths, "parts", ["n", 3, 8])
    graph = load_model(model)
    assert graph.info("a").shape[-1] == 8 and graph.info("b").shape[-1] == 0, (
        graph.info("a"),
        graph.info("b"),
    )


def test_a_split_of_unknown_sizes_is_not_guessed_even():
    """Split sizes read from data the inference cannot follow get a size of their own, not the even
    split onnxruntime's inference assumes (4 and 4 for an axis of 8)."""
    from onnx import TensorProto
    from onnx import helper as h

    model = _split_by([], "lengths", ["n", 3, 8])
    model.graph.input.append(h.make_tensor_value_info("lengths", TensorProto.INT64, [2]))
    graph = load_model(model)
    a, b = graph.info("a").shape[-1], graph.info("b").shape[-1]
    assert not isinstance(a, int) and not isinstance(b, int) and a != b, (a, b)
