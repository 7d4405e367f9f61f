"""Which sizes a symbolic partition is also built at: every combination of its dims' tuned sizes."""

from __future__ import annotations

from onnx import TensorProto, helper

from nxrt_tvm.api.device import EpId
from nxrt_tvm.graph.model import load_model
from nxrt_tvm.partition.claims import make_claims
from nxrt_tvm.providers.tvm.sizes import MAX_SIZE_BUILDS, size_combinations


def _claim():
    info = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["b", "n"]) for n in ("x", "y", "z")]
    graph = helper.make_graph([helper.make_node("Add", ["x", "y"], ["z"])], "add", info[:2], info[2:])
    view = load_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    (claim,) = make_claims(view, EpId("TvmExecutionProvider"), [tuple(range(len(view.nodes)))], "tvm")
    return view, claim


def test_only_partitions_whose_symbolic_dims_all_have_tuned_sizes_get_size_builds():
    graph, claim = _claim()
    assert size_combinations(graph, claim, {"n": (4, 8)}) == []  # "b" has no tuned size: stays symbolic
    assert size_combinations(graph, claim, {"n": (4, 8), "b": (1,), "other": (3,)}) == [
        {"b": 1, "n": 4},
        {"b": 1, "n": 8},
    ]
    assert len(size_combinations(graph, claim, {"n": tuple(range(1, 20)), "b": (1, 2)})) == MAX_SIZE_BUILDS
