"""Route EPContext nodes to the EP that made them, by their `source` key."""

from __future__ import annotations

from collections.abc import Iterable

from ..api.errors import DuplicateContextSource, NoEpForContext
from ..api.provider import ExecutionProvider

__all__ = ["EpContextRegistry", "build_ep_context_registry"]


class EpContextRegistry:
    """`source` -> the EP that loads blobs with that source."""

    def __init__(self) -> None:
        self._by_source: dict[str, ExecutionProvider] = {}

    def register(self, source: str, ep: ExecutionProvider) -> None:
        existing = self._by_source.get(source)
        if existing is not None and existing is not ep:
            raise DuplicateContextSource(source, str(existing.ep_id), str(ep.ep_id))
        self._by_source[source] = ep

    def route(self, source: str | None) -> ExecutionProvider:
        ep = self._by_source.get(source or "")
        if ep is None:
            raise NoEpForContext(source)
        return ep

    def sources(self) -> list[str]:
        return sorted(self._by_source)


def build_ep_context_registry(providers: Iterable[ExecutionProvider]) -> EpContextRegistry:
    """Register every provider that can load contexts under its `ep_id` (the `source` it writes)."""
    registry = EpContextRegistry()
    for ep in providers:
        if type(ep).load_context is ExecutionProvider.load_context:
            continue  # this EP does not support EPContext
        registry.register(str(ep.ep_id), ep)
    return registry
