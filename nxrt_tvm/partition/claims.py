"""Turn node groups into `SubgraphClaim`s with boundaries and content-based names."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from ..api.claim import Cost, SubgraphClaim
from ..api.device import EpId
from ..graph.model import GraphView

__all__ = ["partition_name", "make_claims"]


def partition_name(graph: GraphView, nodes: Sequence[int], prefix: str) -> str:
    """A name that depends only on the partition's structure: its nodes, their wiring, and the types and
    shapes of the weights they read (not the weights' values).

    The same subgraph gets the same name in every run and every model that contains it, which EPContext
    artifacts rely on. A name only has to tell one model's partitions apart (its initializers' names do)
    and stay the same from run to run: hashing the values as well cost ResNet-50 60 ms of every session.
    What must tell weights apart, a compile-cache key, hashes their values (`GraphView.initializer_digest`).
    """
    digest = hashlib.sha256()
    for i in sorted(nodes):
        digest.update(graph.nodes[i].SerializeToString(deterministic=True))
        for name in graph.node_inputs[i]:
            tensor = graph.initializers.get(name)
            if tensor is not None:
                digest.update(repr((tensor.data_type, tuple(tensor.dims))).encode())
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
