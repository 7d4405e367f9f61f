"""claim_policy='cost': a built partition is kept only where it measured faster than the fallback."""

from __future__ import annotations

from typing import Any

from ...api.claim import Cost, DeclineSignal, Rejected
from ...api.device import DeviceId, DeviceType
from ...graph.model import GraphView
from ...runtime.measure import measure_partition, ort_run_floor_us

__all__ = ["COST_MARGIN", "judge_cost"]

#: how much faster than the fallback a partition must measure on TVM (timing noise).
COST_MARGIN = 0.05


def judge_cost(
    graph: GraphView, group: tuple[int, ...], name: str, module: Any, device: DeviceId, budget_s: float
) -> tuple[Cost, DeclineSignal | None]:
    """The partition's measured cost, and a decline if TVM is not faster than the fallback."""
    timing = None
    if module is not None and device.type is DeviceType.CPU:
        timing = measure_partition(graph, group, name, module, budget_s)
    if timing is None:
        return Cost(None, "unmeasured (symbolic sizes); kept"), None
    tvm_us, ort_us = timing
    cost = Cost(tvm_us, f"measured; fallback {ort_us:.1f} us")
    # TVM must win by the timing noise and by the fallback run that splitting the graph adds: the bundled
    # model's conv partition measured level with onnxruntime, and taking it made the session 1.35x slower.
    if tvm_us * (1 + COST_MARGIN) + ort_run_floor_us() <= ort_us:
        return cost, None
    return cost, DeclineSignal(
        Rejected.PARTITION,
        f"claim_policy='cost': its partition ({len(group)} nodes) measured {tvm_us:.1f} us on TVM "
        f"vs {ort_us:.1f} us on the fallback (net of its per-run cost); TVM must be {COST_MARGIN:.0%} "
        "faster, plus one fallback run",
        "partitions expected to run faster on TVM than on the fallback",
        "tune it (nxrt-tvm tune) or use claim_policy='all' to compile it anyway",
    )
