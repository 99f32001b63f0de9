"""What every planner is asked: the graph, its costs, the cluster, the batch and the options."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from graphpipe.cost.cluster import Cluster
from graphpipe.cost.cost_table import CostTable
from graphpipe.graph.op_graph import OpGraph
from graphpipe.graph.sp import SPChain, SPLeaf, StageUnits, sp_decompose, stage_units
from graphpipe.planner.stage_cost import CostModel


@dataclass(frozen=True, kw_only=True)
class PlanRequest:
    graph: OpGraph
    costs: CostTable
    cluster: Cluster
    global_batch_size: int
    micro_batch_sizes: tuple[int, ...]
    memory_limit: float
    per_stage_micro_batch: bool = False
    every_size: bool = False  # every size to full precision, with a shallower alternative (see partition_sp)
    options: dict[str, float] = field(default_factory=dict)  # planner-specific limits (time, downsets)

    @property
    def num_devices(self) -> int:
        return self.cluster.num_devices

    @cached_property
    def model(self) -> CostModel:
        return CostModel(self.graph, self.costs, self.cluster, self.global_batch_size)

    @cached_property
    def units(self) -> StageUnits:
        """What every planner cuts between (`graphpipe.graph.sp.stage_units`), computed once per request."""
        return stage_units(self.graph)

    @cached_property
    def sp_tree(self) -> SPChain:
        return sp_decompose(self.graph, self.units)

    @cached_property
    def chain_tree(self) -> SPChain:
        """The graph linearised in topological order: one chain of units (single ops, except the ops that
        must share a stage and the replicated ops riding with their readers: `stage_units`)."""
        return SPChain(items=tuple(SPLeaf(ops=ops) for ops in self.units.ops))
