"""The plan in words: partitions, and declines that say why."""

from __future__ import annotations

import model_zoo

import nxrt_tvm as nx


def test_nodes_declined_for_one_reason_read_as_one_line():
    """min_subgraph_size above the model's size declines every node for the same reason: one line names
    the count and the first nodes; the JSON keeps each node's decline."""
    model = model_zoo.mlp(batch=2).SerializeToString()
    sess = nx.InferenceSession(
        model,
        providers=["TvmExecutionProvider", "CPUExecutionProvider"],
        provider_options=[{"min_subgraph_size": 100}, {}],
    )
    declines = sess.plan.declines
    assert len(declines) == 13 and len({d.detail for d in declines}) == 1
    text = sess.plan.format(sess.graph)
    (line,) = [ln for ln in text.splitlines() if "declined" in ln]
    assert "declined 13 nodes ('fc1/MatMul' (MatMul), 'fc1/Add' (Add), 'relu' (Relu) and 10 more)" in line
    assert "below min_subgraph_size=100" in line and "fix: lower min_subgraph_size" in line
    assert len(sess.plan.to_json(sess.graph)["declines"]) == 13
