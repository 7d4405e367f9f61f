"""What an EP says about a graph: the subgraphs it claims, and why it declines the rest.

`require` / `deny` mirror the contract's macros: a capability check calls them
with what was rejected, what the EP accepts and how to fix it; the claim loop
adds the node, op, domain, opset and EP, so every decline is actionable.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NoReturn

from .device import EpId

__all__ = [
    "Rejected",
    "Cost",
    "Decline",
    "SubgraphClaim",
    "ClaimResult",
    "DeclineSignal",
    "require",
    "deny",
]


class Rejected(enum.Enum):
    """Which property of a node made the EP decline it."""

    OP = "op"
    DOMAIN = "domain"
    OPSET = "opset"
    DTYPE = "dtype"
    SHAPE = "shape"
    ATTRIBUTE = "attribute"
    INPUT = "input"
    FRONTEND = "frontend"
    BUILD = "build"
    PARTITION = "partition"
    OPTION = "option"


@dataclass(frozen=True)
class Cost:
    """An EP's estimate of what running a claim costs, and where the estimate came from."""

    latency_us: float | None = None
    source: str = "unestimated"

    def __str__(self) -> str:
        if self.latency_us is None:
            return self.source
        return f"{self.latency_us:.1f} us ({self.source})"


@dataclass(frozen=True)
class Decline:
    """Why one node was not claimed by one EP, with enough detail to act on."""

    node: str
    op_type: str
    domain: str
    opset: int
    ep: EpId
    rejected: Rejected
    detail: str
    accepts: str
    remediation: str = ""

    def __str__(self) -> str:
        return self.text(
            f"node {self.node!r} ({self.domain or 'ai.onnx'}::{self.op_type}, opset {self.opset})"
        )

    def text(self, subject: str) -> str:
        """The decline in words, of `subject` (this node, or every node declined for the same reason)."""
        text = f"{self.ep} declined {subject}: {self.rejected.value} rejected: {self.detail}"
        text += f"; accepts: {self.accepts}"
        return text + (f"; fix: {self.remediation}" if self.remediation else "")

    def to_json(self) -> dict:
        return {
            "node": self.node,
            "op_type": self.op_type,
            "domain": self.domain,
            "opset": self.opset,
            "ep": str(self.ep),
            "rejected": self.rejected.value,
            "detail": self.detail,
            "accepts": self.accepts,
            "remediation": self.remediation,
        }


@dataclass(frozen=True)
class SubgraphClaim:
    """A set of nodes one EP will run as a single fused unit.

    `nodes` are indices into the graph's topologically sorted node list, in
    that order; `inputs`/`outputs` are the boundary values. The set is acyclic
    when fused (checked by the partitioner).
    """

    ep: EpId
    name: str
    nodes: tuple[int, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    cost: Cost = field(default_factory=Cost)

    def __len__(self) -> int:
        return len(self.nodes)


@dataclass(frozen=True)
class ClaimResult:
    """An EP's answer to `claim`: what it takes, and a decline for every node it saw and refused."""

    claims: tuple[SubgraphClaim, ...]
    declines: tuple[Decline, ...]


class DeclineSignal(Exception):
    """Raised by `deny`; the claim loop turns it into a `Decline` for the node being checked."""

    def __init__(self, rejected: Rejected, detail: str, accepts: str, remediation: str = ""):
        super().__init__(detail)
        self.rejected, self.detail, self.accepts, self.remediation = rejected, detail, accepts, remediation


def deny(rejected: Rejected, detail: str, *, accepts: str, remediation: str = "") -> NoReturn:
    """Decline the node under check: say what was rejected, what is accepted, and how to fix it."""
    raise DeclineSignal(rejected, detail, accepts, remediation)


def require(condition: bool, rejected: Rejected, detail: str, *, accepts: str, remediation: str = "") -> None:
    """Decline the node under check unless `condition` holds."""
    if not condition:
        deny(rejected, detail, accepts=accepts, remediation=remediation)
