"""Kahn's topological sort, shared by the model's node order and the plan's partition order."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Sequence
from typing import Any

__all__ = ["kahn_order"]


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
