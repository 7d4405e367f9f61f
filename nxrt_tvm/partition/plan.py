"""The partition plan: which EP runs which subgraph, in what order, and every decline."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..api.claim import Cost, Decline, SubgraphClaim
from ..api.errors import NoEpForOp
from ..api.kernel import KernelVariant
from ..api.provider import ExecutionProvider
from ..graph.model import GraphView
from ..graph.order import kahn_order

__all__ = ["PartitionPlan", "make_plan"]


@dataclass(frozen=True)
class PartitionPlan:
    """Partitions in an order that respects every data dependency, plus the declines that shaped them."""

    partitions: tuple[SubgraphClaim, ...]
    declines: tuple[Decline, ...]
    node_count: int

    def nodes_by_ep(self) -> dict[str, int]:
        counts: Counter[str] = Counter()
        for p in self.partitions:
            counts[str(p.ep)] += len(p.nodes)
        return dict(counts)

    def to_json(
        self, graph: GraphView | None = None, variants: Mapping[str, Sequence[KernelVariant]] | None = None
    ) -> dict:
        def ops(p: SubgraphClaim) -> dict[str, int]:
            return dict(Counter(graph.nodes[i].op_type for i in p.nodes)) if graph else {}

        return {
            "node_count": self.node_count,
            "nodes_by_ep": self.nodes_by_ep(),
            "partitions": [
                {
                    "name": p.name,
                    "ep": str(p.ep),
                    "nodes": len(p.nodes),
                    "op_types": ops(p),
                    "inputs": list(p.inputs),
                    "outputs": list(p.outputs),
                    "cost": str(p.cost),
                    "kernels": [
                        {"name": v.name, "variant": v.variant, "reason": v.reason}
                        for v in (variants or {}).get(p.name, ())
                    ],
                }
                for p in self.partitions
            ],
            "declines": [d.to_json() for d in self.declines],
        }

    def format(
        self, graph: GraphView | None = None, variants: Mapping[str, Sequence[KernelVariant]] | None = None
    ) -> str:
        lines = [
            f"{len(self.partitions)} partitions over {self.node_count} nodes "
            + ", ".join(f"{ep}: {n}" for ep, n in self.nodes_by_ep().items())
        ]
        for p in self.partitions:
            ops = ""
            if graph is not None:
                counts = Counter(graph.nodes[i].op_type for i in p.nodes)
                ops = " [" + ", ".join(f"{op} x{n}" if n > 1 else op for op, n in counts.most_common()) + "]"
            lines.append(f"  {p.name:<20} {str(p.ep):<22} {len(p.nodes):>4} nodes{ops}")
            lines.append(f"  {'':<20} in: {', '.join(p.inputs) or '-'}  out: {', '.join(p.outputs)}")
            if p.cost.source != Cost().source:
                lines.append(f"  {'':<20} cost: {p.cost}")
            kinds = Counter(v.variant for v in (variants or {}).get(p.name, ()))
            if kinds:
                lines.append(
                    f"  {'':<20} kernels: " + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
                )
        if self.declines:
            lines.append(f"{len(self.declines)} declines:")
            lines.extend(f"  - {text}" for text in _grouped(self.declines))
        return "\n".join(lines)


def _grouped(declines: Sequence[Decline]) -> list[str]:
    """Declines in words, one line per reason: a partition the claim policy hands to the fallback declines
    each of its nodes for the same reason, which read as a wall of repeated lines (`to_json` keeps each)."""
    groups: dict[tuple, list[Decline]] = {}
    for d in declines:
        groups.setdefault((d.ep, d.rejected, d.detail, d.accepts, d.remediation), []).append(d)
    lines = []
    for same in groups.values():
        if len(same) < 3:
            lines.extend(str(d) for d in same)
            continue
        shown = ", ".join(f"{d.node!r} ({d.op_type})" for d in same[:3])
        lines.append(same[0].text(f"{len(same)} nodes ({shown} and {len(same) - 3} more)"))
    return lines


def _order(graph: GraphView, partitions: Sequence[SubgraphClaim]) -> tuple[SubgraphClaim, ...]:
    """Topological order of the partition DAG (ties broken by first node, so it is deterministic)."""
    owner = {n: k for k, p in enumerate(partitions) for n in p.nodes}
    deps = [
        {owner[q] for n in p.nodes for q in graph.predecessors[n]} - {k} for k, p in enumerate(partitions)
    ]
    order = kahn_order(deps, key=lambda k: partitions[k].nodes[0])
    if len(order) != len(partitions):  # the grouping guarantees a DAG; this is its postcondition
        raise AssertionError("partition plan is cyclic: grouping broke its acyclicity guarantee")
    return tuple(partitions[k] for k in order)


def make_plan(
    graph: GraphView, providers: Sequence[ExecutionProvider], fixed: Sequence[SubgraphClaim] = ()
) -> PartitionPlan:
    """Ask each EP in priority order to claim what is left; fail if any node stays unclaimed.

    `fixed` partitions (loaded EPContext nodes, forced fallbacks) are assigned before any EP claims.
    """
    claims: list[SubgraphClaim] = list(fixed)
    declines: list[Decline] = []
    for ep in providers:
        result = ep.claim(graph, [p.nodes for p in claims])
        claims.extend(result.claims)
        declines.extend(result.declines)
    assigned = [n for p in claims for n in p.nodes]
    if len(assigned) != len(set(assigned)):
        raise AssertionError("a node was claimed twice")
    missing = sorted(set(range(len(graph.nodes))) - set(assigned))
    if missing:
        i = missing[0]
        node = graph.nodes[i]
        raise NoEpForOp(
            node.name,
            node.domain,
            node.op_type,
            graph.opset_of(i),
            [str(d) for d in declines if d.node == node.name],
        )
    return PartitionPlan(_order(graph, claims), tuple(declines), len(graph.nodes))
