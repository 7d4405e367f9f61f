"""Group claimed nodes into maximal connected subgraphs that stay acyclic when fused.

Nodes are merged greedily in topological order along graph edges, each merge
contracting an edge of the group DAG. Contracting u -> v keeps a DAG exactly
when no other path leads from u to v, so every merge is checked for such a
path: A -> X(other EP) -> B beside A -> B never puts A and B together. Groups
fixed earlier (claims of a higher-priority EP) take part as single vertices,
so the whole plan, across EPs, is a DAG of partitions.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from ..graph.model import GraphView

__all__ = ["group_nodes"]


class _GroupDag:
    """Union-find over nodes plus the edges of the contracted graph."""

    def __init__(self, graph: GraphView, fixed: Sequence[Collection[int]]):
        n = len(graph.nodes)
        self.parent = list(range(n))
        self.succ: dict[int, set[int]] = {i: set(graph.successors[i]) for i in range(n)}
        self.pred: dict[int, set[int]] = {i: set(graph.predecessors[i]) for i in range(n)}
        for group in fixed:
            members = sorted(group)
            for m in members[1:]:
                self.merge(self.find(members[0]), self.find(m))

    def find(self, i: int) -> int:
        root = i
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[i] != root:
            self.parent[i], i = root, self.parent[i]
        return root

    def has_other_path(self, a: int, b: int) -> bool:
        """Is b reachable from a (both roots) other than by the direct edge a -> b?"""
        stack = [s for s in self.succ[a] if s != b]
        seen = set(stack)
        while stack:
            g = stack.pop()
            if g == b:
                return True
            for s in self.succ[g]:
                if s not in seen:
                    seen.add(s)
                    stack.append(s)
        return False

    def merge(self, a: int, b: int) -> int:
        """Contract roots a and b into a (edges updated; self-loops dropped)."""
        if a == b:
            return a
        self.parent[b] = a
        for s in self.succ.pop(b):
            self.pred[s].discard(b)
            if s != a:
                self.pred[s].add(a)
                self.succ[a].add(s)
        for p in self.pred.pop(b):
            self.succ[p].discard(b)
            if p != a:
                self.succ[p].add(a)
                self.pred[a].add(p)
        self.succ[a].discard(a)
        self.pred[a].discard(a)
        return a


def group_nodes(
    graph: GraphView, candidates: Collection[int], fixed: Sequence[Collection[int]] = ()
) -> list[tuple[int, ...]]:
    """Partition `candidates` into connected groups whose fusion keeps the graph (with `fixed` fused) acyclic.

    Returns the groups as sorted index tuples, ordered by their first node.
    """
    chosen = set(candidates)
    dag = _GroupDag(graph, fixed)
    for v in sorted(chosen):
        for p in graph.predecessors[v]:
            if p not in chosen:
                continue
            a, b = dag.find(p), dag.find(v)
            if a == b:
                continue
            if dag.succ[a].__contains__(b) and not dag.has_other_path(a, b):
                dag.merge(a, b)
    groups: dict[int, list[int]] = {}
    for v in sorted(chosen):
        groups.setdefault(dag.find(v), []).append(v)
    return sorted((tuple(g) for g in groups.values()), key=lambda g: g[0])
