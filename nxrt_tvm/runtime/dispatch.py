"""A symbolic partition's kernel with static builds beside it, each run where a call's sizes are its own."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..api.kernel import Kernel, KernelVariant
from ..api.tensor import TensorView
from .kernel import TvmKernel

__all__ = ["SizeDispatchKernel", "Shapes"]

#: a call's input shapes, in the symbolic kernel's input order
Shapes = tuple[tuple[int, ...], ...]


class SizeDispatchKernel(Kernel):
    """Runs `static[shapes]` where the inputs have those shapes, else `generic`.

    A static build may take fewer inputs than the symbolic one (what only fed shapes folds away) and
    returns the same outputs, matched by name. `labels` names each static build by its sizes ("seq=128"):
    its kernels' variants and profile entries carry the label, so a report tells the builds apart.
    """

    def __init__(self, generic: TvmKernel, static: Mapping[Shapes, TvmKernel], labels: Mapping[Shapes, str]):
        self.generic = generic
        self.input_names = generic.input_names
        self.output_names = generic.output_names
        self.device = generic.device
        self.name = generic.name
        #: per shapes: the static kernel, which of our inputs it takes, where its outputs go, its label
        self._static: dict[Shapes, tuple[TvmKernel, tuple[int, ...], tuple[int, ...], str]] = {}
        for shapes, kernel in static.items():
            if set(kernel.output_names) != set(self.output_names) or not set(kernel.input_names) <= set(
                self.input_names
            ):
                raise ValueError(f"{kernel.name} does not compute {self.name}'s outputs from its inputs")
            takes = tuple(self.input_names.index(n) for n in kernel.input_names)
            order = tuple(kernel.output_names.index(n) for n in self.output_names)
            self._static[shapes] = (kernel, takes, order, labels[shapes])

    @property
    def labels(self) -> tuple[str, ...]:
        """The static builds' sizes, as their kernels are labelled ("seq=128")."""
        return tuple(entry[3] for entry in self._static.values())

    def prepare(self) -> None:
        self.generic.prepare()
        for kernel, *_ in self._static.values():
            kernel.prepare()

    def _pick(self, inputs: Sequence[TensorView]):
        return self._static.get(tuple(tuple(view.shape) for view in inputs))

    def compute(self, inputs: Sequence[TensorView]) -> list[TensorView]:
        entry = self._pick(inputs)
        if entry is None:
            return self.generic.compute(inputs)
        kernel, takes, order, _ = entry
        results = kernel.compute([inputs[k] for k in takes])
        return [results[k] for k in order]

    def variants(self) -> list[KernelVariant]:
        found = self.generic.variants()
        for kernel, _, _, label in self._static.values():
            found += [KernelVariant(f"{v.name}@{label}", v.variant, v.reason) for v in kernel.variants()]
        return found

    def function_times(self, inputs: Sequence[TensorView], repeat: int) -> dict[str, tuple[float, int]]:
        entry = self._pick(inputs)
        if entry is None:
            return self.generic.function_times(inputs, repeat)
        kernel, takes, _, label = entry
        times = kernel.function_times([inputs[k] for k in takes], repeat)
        return {f"{name}@{label}": value for name, value in times.items()}
