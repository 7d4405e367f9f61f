"""Graph order: Kahn's topological sort (the model's node order, the plan's partition order) and the
implicit inputs of control-flow nodes, which that order must respect."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Sequence
from typing import Any

import onnx

__all__ = ["implicit_inputs", "kahn_order"]


def kahn_order(deps: Sequence[Collection[int]], key: Callable[[int], Any] = lambda i: i) -> list[int]:
    """Items `0..n-1` in dependency order (`deps[i]`: the items `i` needs first), ties broken by the
    smallest `key`. Items on a cycle are left out: callers compare the length to detect one."""
    users: list[list[int]] = [[] for _ in deps]
    for i, d in enumerate(deps):
        for p in d:
            users[p].append(i)
    pending = [len(d) for d in deps]
    ready = [(key(i), i) for i, n in enumerate(pending) if n == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        _, i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            pending[u] -= 1
            if pending[u] == 0:
                heapq.heappush(ready, (key(u), u))
    return order


def _subgraph_free_names(graph: onnx.GraphProto) -> set[str]:
    """Names a control-flow body reads from the enclosing scope (its implicit inputs)."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    used: set[str] = set()
    for node in graph.node:
        used.update(n for n in node.input if n)
        used |= implicit_inputs(node)
        defined.update(node.output)
    return used - defined


def implicit_inputs(node: onnx.NodeProto) -> set[str]:
    """Values a node's control-flow bodies read from the enclosing scope."""
    free: set[str] = set()
    for attr in node.attribute:
        for sub in _attr_graphs(attr):
            free |= _subgraph_free_names(sub)
    return free


def _attr_graphs(attr: onnx.AttributeProto) -> list[onnx.GraphProto]:
    if attr.type == onnx.AttributeProto.GRAPH:
        return [attr.g]
    if attr.type == onnx.AttributeProto.GRAPHS:
        return list(attr.graphs)
    return []
