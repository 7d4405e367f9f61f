"""The compiled unit an EP hands the session: it computes one claimed subgraph."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .device import DeviceId
from .tensor import TensorView

__all__ = ["Kernel", "KernelVariant"]


@dataclass(frozen=True)
class KernelVariant:
    """Diagnostics: which implementation a kernel (or one of its parts) runs, and why."""

    name: str
    variant: str
    reason: str


class Kernel(abc.ABC):
    """A session-lifetime executable for one `SubgraphClaim`.

    Inputs arrive in `input_names` order, outputs leave in `output_names` order.
    `compute` must be safe to call from several threads at once.
    """

    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    device: DeviceId

    def prepare(self) -> None:
        """Acquire what running needs (device, runtime state) so that failures show at session load."""

    @abc.abstractmethod
    def compute(self, inputs: Sequence[TensorView]) -> list[TensorView]:
        """Run the subgraph; raise `KernelFailed` (never a bare exception) on failure."""

    def compute_arrays(self, arrays: Sequence[np.ndarray]) -> list[Any]:
        """`compute` from host arrays to host arrays (sequences stay lists): the session's call where this
        kernel is the whole plan. A kernel may override it to skip the views on the way."""
        outputs = self.compute([TensorView.host_array(a) for a in arrays])
        return [v.numpy() if isinstance(v, TensorView) else v for v in outputs]

    def variants(self) -> list[KernelVariant]:
        """Which implementation each part of the kernel runs (tuned, default schedule, ...)."""
        return []

    def function_times(self, inputs: Sequence[TensorView], repeat: int) -> dict[str, tuple[float, int]]:
        """Where one call's time goes, for profiles: each function the kernel calls (by the names
        `variants` gives) to (median seconds per call over `repeat` calls, times called per call); {}
        where a kernel cannot see inside itself (the fallback's partitions are timed whole)."""
        return {}
