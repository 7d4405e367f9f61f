"""Per-node capability checks, whole-subgraph grouping, and the partition plan."""

from .grouping import group_nodes
from .plan import PartitionPlan, make_plan

__all__ = ["group_nodes", "PartitionPlan", "make_plan"]
