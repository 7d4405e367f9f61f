"""TVM EP provider options: min_subgraph_size, op_types_to_exclude, user passes, bad options."""

from __future__ import annotations

import re

import model_zoo
import pytest
import tvm
from parity import assert_parity, ort_run

import nxrt_tvm as nx

TVM = nx.EpId("TvmExecutionProvider")


def test_min_subgraph_size_declines_small_partitions():
    model = model_zoo.cycle_trap()  # TVM partitions of 1 node (Relu) and 2 nodes (Add, Sigmoid)
    sess = nx.InferenceSession(model, provider_options=[{"min_subgraph_size": 2}, {}])
    tvm_parts = [p for p in sess.plan.partitions if p.ep == TVM]
    assert tvm_parts and all(len(p) >= 2 for p in tvm_parts)
    small = [d for d in sess.plan.declines if d.rejected is nx.Rejected.PARTITION]
    assert small and "min_subgraph_size=2" in small[0].detail and small[0].remediation
    feeds = model_zoo.make_inputs("cycle_trap")
    assert_parity(sess.run(None, feeds), ort_run(model, feeds))


@pytest.mark.parametrize("exclude", [["MaxPool"], "MaxPool,Gemm"])
def test_op_types_to_exclude(exclude):
    model = model_zoo.cnn()
    sess = nx.InferenceSession(model, provider_options=[{"op_types_to_exclude": exclude}, {}])
    declined = {d.op_type for d in sess.plan.declines if d.rejected is nx.Rejected.OPTION}
    assert "MaxPool" in declined
    assert all(
        sess.graph.nodes[i].op_type not in declined
        for p in sess.plan.partitions
        if p.ep == TVM
        for i in p.nodes
    )
    feeds = model_zoo.make_inputs("cnn")
    assert_parity(sess.run(None, feeds), ort_run(model, feeds))


def test_user_passes_run_during_lowering():
    seen = []

    @tvm.transform.module_pass(opt_level=0, name="count_functions")
    def count(mod, _ctx):
        seen.append(len(mod.functions))
        return mod

    # In process, to see the pass's side effect (an isolated compile runs passes in the forked child).
    sess = nx.InferenceSession(
        model_zoo.mlp(), provider_options=[{"passes": [count], "compile_isolation": "none"}, {}]
    )
    assert seen and len(seen) == sum(p.ep == TVM for p in sess.plan.partitions)


def test_bad_options_are_typed_errors():
    with pytest.raises(nx.InvalidProviderOptions, match="does not know option"):
        nx.InferenceSession(model_zoo.mlp(), provider_options=[{"targte": "llvm"}, {}])
    with pytest.raises(nx.InvalidProviderOptions, match="min_subgraph_size.*>= 1"):
        nx.InferenceSession(model_zoo.mlp(), provider_options=[{"min_subgraph_size": 0}, {}])
    with pytest.raises(nx.InvalidProviderOptions, match="one dict per provider"):
        nx.InferenceSession(model_zoo.mlp(), provider_options=[{}])
    with pytest.raises(nx.InvalidProviderOptions, match="tvm.transform.Pass"):
        nx.InferenceSession(model_zoo.mlp(), provider_options=[{"passes": ["FoldConstant"]}, {}])
    with pytest.raises(nx.InvalidProviderOptions, match="compile_timeout_s.*number of seconds"):
        nx.InferenceSession(model_zoo.mlp(), provider_options=[{"compile_timeout_s": "soon"}, {}])
    with pytest.raises(nx.InvalidProviderOptions, match="cost_budget_s.*> 0"):
        nx.InferenceSession(model_zoo.mlp(), provider_options=[{"cost_budget_s": 0}, {}])


def test_empty_paths_mean_no_cache_and_no_logs(tmp_path, monkeypatch):
    """As onnxruntime's providers read an empty path option: unset (it made the working directory a
    compile cache, writing `.lock` and `v1/` beside the user's files)."""
    monkeypatch.chdir(tmp_path)
    model = model_zoo.mlp()
    sess = nx.InferenceSession(model, provider_options=[{"cache_dir": "", "tuning_logs": " "}, {}])
    assert TVM in {p.ep for p in sess.plan.partitions}
    assert list(tmp_path.iterdir()) == []
    feeds = model_zoo.make_inputs("mlp")
    assert_parity(sess.run(None, feeds), ort_run(model, feeds))


def test_cost_policy_declines_a_partition_slower_than_the_fallback():
    """Naive TVM loops (no schedule rules) lose to onnxruntime
    on a 256x256x256 matmul: the cost policy declines it."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(
        np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32), "w"
    )
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [256, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [256, 256])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    naive = {"schedule_passes": [], "claim_policy": "cost"}
    sess = nx.InferenceSession(model, provider_options=[naive, {}])
    assert [str(p.ep) for p in sess.plan.partitions] == ["CPUExecutionProvider"]
    (decline,) = sess.plan.declines
    assert (
        decline.rejected is nx.Rejected.PARTITION
        and "claim_policy='cost'" in decline.detail
        and " us on TVM" in decline.detail
    )
    assert "TVM must be 5% faster, plus one fallback run" in decline.detail
    kept = nx.InferenceSession(model, provider_options=[{"schedule_passes": [], "claim_policy": "all"}, {}])
    assert [str(p.ep) for p in kept.plan.partitions] == ["TvmExecutionProvider"]


def test_cost_policy_shows_its_estimate_in_the_plan():
    sess = nx.InferenceSession(model_zoo.cnn(), provider_options=[{"claim_policy": "cost"}, {}])
    costs = [p.cost for p in sess.plan.partitions]
    assert all(c.source.startswith("measured") or c.source == "unestimated" for c in costs)
    tvm = [p for p in sess.plan.partitions if str(p.ep) == "TvmExecutionProvider"]
    measured_slower = [d for d in sess.plan.declines if "claim_policy='cost'" in d.detail]
    # static shapes are always measured: each kept partition shows its latency, each dropped one says why:
    # measured after its build (" us on TVM"), or, where onnxruntime ran it alone faster than a TVM call's
    # floor in this host's fast regime (this 9-node CNN: 26-64 us), before it ("alone in ... (not built)")
    assert all(p.cost.latency_us is not None and p.cost.source.startswith("measured") for p in tvm)
    said = [
        " us on TVM" in d.detail or re.search(r"alone in .* \(not built\)$", d.detail)
        for d in measured_slower
    ]
    assert tvm or (measured_slower and all(said))
