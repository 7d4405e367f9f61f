"""What a capability check sees of one node: op, opset, attributes, input/output types, constants."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import onnx

from ..api.registry import normalize_domain
from ..graph.model import GraphView, ValueInfo, attributes

__all__ = ["NodeContext"]


@dataclass(frozen=True)
class NodeContext:
    """One node under a capability check; `target_features` are the ISA features the code will use."""

    graph: GraphView
    index: int
    target_features: frozenset[str] = frozenset()

    @property
    def node(self) -> onnx.NodeProto:
        return self.graph.nodes[self.index]

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def op_type(self) -> str:
        return self.node.op_type

    @property
    def domain(self) -> str:
        return normalize_domain(self.node.domain)

    @property
    def opset(self) -> int:
        return self.graph.opset_of(self.index)

    @cached_property
    def attrs(self) -> dict[str, Any]:
        return attributes(self.node)

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)

    @cached_property
    def inputs(self) -> tuple[ValueInfo | None, ...]:
        """Explicit inputs in order; None where an optional input is left out."""
        return tuple(self.graph.info(n) if n else None for n in self.node.input)

    @cached_property
    def outputs(self) -> tuple[ValueInfo | None, ...]:
        return tuple(self.graph.info(n) if n else None for n in self.node.output)

    def has_input(self, i: int) -> bool:
        return i < len(self.node.input) and bool(self.node.input[i])

    def const(self, i: int) -> np.ndarray | None:
        """The value of input `i` when it is an initializer (Constant nodes were folded at load)."""
        if not self.has_input(i):
            return None
        return self.graph.constant(self.node.input[i])

    def is_const(self, i: int) -> bool:
        return self.has_input(i) and self.node.input[i] in self.graph.initializers

    def rank(self, i: int) -> int | None:
        info = self.inputs[i] if i < len(self.inputs) else None
        return None if info is None or info.shape is None else len(info.shape)
