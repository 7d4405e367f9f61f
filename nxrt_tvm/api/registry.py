"""Keyed lookups: op rules by (domain, op type, opset), and EPs by name."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

import onnx

from .device import EpId
from .errors import InvalidProviderOptions

__all__ = ["OpKey", "OpRegistry", "EpRegistry", "default_opset", "normalize_domain"]

T = TypeVar("T")


def normalize_domain(domain: str) -> str:
    """ONNX spells the default domain both '' and 'ai.onnx'; use ''."""
    return "" if domain in ("", "ai.onnx") else domain


def default_opset(model: onnx.ModelProto) -> int | None:
    """The opset `model` imports for the default domain, None where it imports none."""
    return next((o.version for o in model.opset_import if normalize_domain(o.domain) == ""), None)


@dataclass(frozen=True, order=True)
class OpKey:
    """An operator version: domain, op type and the opset from which an entry applies."""

    domain: str
    op_type: str
    since_version: int = 1

    def __str__(self) -> str:
        return f"{self.domain or 'ai.onnx'}::{self.op_type}@{self.since_version}"


class OpRegistry(Generic[T]):
    """Entries keyed by `OpKey`; a lookup picks the newest entry not above the node's opset.

    This is the shape of the Relax ONNX frontend's versioned converters, so the
    registry doubles as the printable support table.
    """

    def __init__(self) -> None:
        self._entries: dict[tuple[str, str], dict[int, T]] = {}

    def register(self, key: OpKey, entry: T) -> None:
        versions = self._entries.setdefault((normalize_domain(key.domain), key.op_type), {})
        if key.since_version in versions:
            raise ValueError(f"{key} is registered twice")
        versions[key.since_version] = entry

    def lookup(self, domain: str, op_type: str, opset: int) -> T | None:
        versions = self._entries.get((normalize_domain(domain), op_type))
        if not versions:
            return None
        usable = [v for v in versions if v <= opset]
        return versions[max(usable)] if usable else None

    def __contains__(self, key: tuple[str, str]) -> bool:
        return (normalize_domain(key[0]), key[1]) in self._entries

    def keys(self) -> Iterator[OpKey]:
        for (domain, op_type), versions in sorted(self._entries.items()):
            for since in sorted(versions):
                yield OpKey(domain, op_type, since)


class EpRegistry:
    """Execution provider factories by name, in the order a session should try them."""

    def __init__(self) -> None:
        self._factories: dict[EpId, Callable[[dict], object]] = {}

    def register(self, ep_id: str, factory: Callable[[dict], object]) -> None:
        key = EpId(ep_id)
        if key in self._factories:
            raise ValueError(f"execution provider {ep_id!r} is registered twice")
        self._factories[key] = factory

    def names(self) -> list[EpId]:
        return list(self._factories)

    def create(self, ep_id: str, options: dict | None = None) -> object:
        factory = self._factories.get(EpId(ep_id))
        if factory is None:
            raise InvalidProviderOptions(
                f"unknown execution provider {ep_id!r}; available: {', '.join(self._factories)}"
            )
        return factory(dict(options or {}))
