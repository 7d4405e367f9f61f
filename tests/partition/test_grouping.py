"""Whole-subgraph grouping: maximal, connected, acyclic when fused (across EPs), deterministic names."""

from __future__ import annotations

import itertools

import pytest
from onnx import TensorProto, helper

from nxrt_tvm.graph.model import GraphView, load_model
from nxrt_tvm.partition.claims import partition_name
from nxrt_tvm.partition.grouping import group_nodes


def _graph(edges: list[tuple[str, list[str]]]) -> GraphView:
    """Nodes named by their output; each is an elementwise Sum of its inputs ('x' is the graph input)."""
    nodes = [helper.make_node("Sum", ins, [out], name=out) for out, ins in edges]
    consumed = {i for _, ins in edges for i in ins}
    outputs = [out for out, _ in edges if out not in consumed]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, [2]) for o in outputs],
    )
    return load_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def _names(g: GraphView, groups) -> list[set[str]]:
    return [{g.nodes[i].name for i in grp} for grp in groups]


def _idx(g: GraphView, *names: str) -> set[int]:
    return {i for i, n in enumerate(g.nodes) if n.name in names}


def _fused_is_acyclic(g: GraphView, groups) -> bool:
    owner = {}
    for k, grp in enumerate(groups):
        for n in grp:
            owner[n] = ("g", k)
    vertex = lambda i: owner.get(i, ("n", i))  # noqa: E731
    succ: dict = {}
    for i, nxt in enumerate(g.successors):
        for j in nxt:
            if vertex(i) != vertex(j):
                succ.setdefault(vertex(i), set()).add(vertex(j))
    state: dict = {}

    def visit(v) -> bool:
        state[v] = 1
        for w in succ.get(v, ()):
            if state.get(w) == 1 or (w not in state and not visit(w)):
                return False
        state[v] = 2
        return True

    return all(visit(v) for v in list(succ) if v not in state)


def test_cycle_trap_keeps_a_and_b_apart():
    g = _graph([("a", ["x"]), ("xx", ["a"]), ("b", ["a", "xx"])])
    groups = group_nodes(g, _idx(g, "a", "b"))
    assert _names(g, groups) == [{"a"}, {"b"}]


def test_chain_is_one_group():
    g = _graph([("a", ["x"]), ("b", ["a"]), ("c", ["b"]), ("d", ["c"])])
    assert _names(g, group_nodes(g, _idx(g, "a", "b", "c", "d"))) == [{"a", "b", "c", "d"}]


def test_disconnected_claims_stay_separate():
    g = _graph([("a", ["x"]), ("u", ["a"]), ("b", ["u"])])
    assert _names(g, group_nodes(g, _idx(g, "a", "b"))) == [{"a"}, {"b"}]


def test_diamond_with_claimed_side_branch_merges():
    g = _graph([("a", ["x"]), ("l", ["a"]), ("r", ["a"]), ("j", ["l", "r"])])
    assert _names(g, group_nodes(g, _idx(g, "a", "l", "r", "j"))) == [{"a", "l", "r", "j"}]


def test_diamond_with_unclaimed_side_branch_splits():
    g = _graph([("a", ["x"]), ("l", ["a"]), ("r", ["a"]), ("j", ["l", "r"])])
    groups = group_nodes(g, _idx(g, "a", "l", "j"))
    assert _fused_is_acyclic(g, groups)
    assert not any({"a", "j"} <= s for s in _names(g, groups))


def test_fixed_groups_of_another_ep_are_respected():
    # Two EPs' groups must be jointly acyclic: a1->b2 and b1->a2 would form a cycle if both fused.
    g = _graph([("a1", ["x"]), ("b1", ["x"]), ("a2", ["a1", "b1"]), ("b2", ["b1", "a1"])])
    tvm_groups = group_nodes(g, _idx(g, "a1", "a2"))
    cpu_groups = group_nodes(g, _idx(g, "b1", "b2"), tvm_groups)
    assert _fused_is_acyclic(g, [*tvm_groups, *cpu_groups])


@pytest.mark.parametrize("seed", range(20))
def test_random_dags_fuse_acyclic(seed):
    import random

    rnd = random.Random(seed)
    edges = []
    for k in range(14):
        preds = [f"n{j}" for j in range(k) if rnd.random() < 0.25] or ["x"]
        edges.append((f"n{k}", preds))
    g = _graph(edges)
    claimed = {i for i in range(len(g.nodes)) if rnd.random() < 0.6}
    first = group_nodes(g, claimed)
    second = group_nodes(g, set(range(len(g.nodes))) - claimed, first)
    assert _fused_is_acyclic(g, [*first, *second])
    assert sorted(itertools.chain(*first, *second)) == list(range(len(g.nodes)))
    for grp in first:  # connected through claimed edges
        members = set(grp)
        reached, todo = {grp[0]}, [grp[0]]
        while todo:
            v = todo.pop()
            for w in (*g.successors[v], *g.predecessors[v]):
                if w in members and w not in reached:
                    reached.add(w)
                    todo.append(w)
        assert reached == members


def test_partition_names_depend_on_content_only():
    g1 = _graph([("a", ["x"]), ("b", ["a"])])
    g2 = _graph([("a", ["x"]), ("b", ["a"]), ("c", ["b"])])
    assert partition_name(g1, [0, 1], "tvm") == partition_name(g2, [0, 1], "tvm")
    assert partition_name(g2, [0, 1], "tvm") != partition_name(g2, [1, 2], "tvm")
