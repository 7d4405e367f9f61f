"""Turn node groups into `SubgraphClaim`s with boundaries and content-based names."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from ..api.claim import Cost, SubgraphClaim
from ..api.device import EpId
from ..graph.model import GraphView

__all__ = ["partition_name", "make_claims"]


def partition_name(graph: GraphView, nodes: Sequence[int], prefix: str) -> str:
    """A name that depends only on the partition's content (nodes, their wiring and weights' identity).

    The same subgraph gets the same name in every run and every model that
    contains it, which EPContext artifacts and compile caches rely on.
    """
    digest = hashlib.sha256()
    for i in sorted(nodes):
        digest.update(graph.nodes[i].SerializeToString(deterministic=True))
        for name in graph.node_inputs[i]:
            tensor = graph.initializers.get(name)
            if tensor is not None:
                digest.update(tensor.SerializeToString(deterministic=True))
    return f"{prefix}_{digest.hexdigest()[:12]}"


def make_claims(
    graph: GraphView, ep: EpId, groups: Sequence[Sequence[int]], prefix: str, cost: Cost = Cost()
) -> tuple[SubgraphClaim, ...]:
    claims = []
    for group in groups:
        inputs, outputs = graph.boundary(group)
        claims.append(
            SubgraphClaim(
                ep, partition_name(graph, group, prefix), tuple(sorted(group)), inputs, outputs, cost
            )
        )
    return tuple(claims)
