"""What every planner is asked: the graph, its costs, the cluster, the batch and the options.

`granularity` says what the planners cut between: "op" (the op-level units of
`graphpipe.graph.sp.stage_units`) or "layer" (those with every layer block contracted into one:
`graphpipe.graph.layers`), less the blocks in `open_blocks`, which stay at op level. "auto" plans
at layer level here; `plan_candidates` and `gp.plan` then re-plan with the blocks at the stage
boundaries opened (`graphpipe.planner.granularity`). Every planner reads the units, the SP tree or
the chain through this request, so the granularity applies to all of them alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from graphpipe.cost.cluster import Cluster
from graphpipe.cost.cost_table import CostTable
from graphpipe.graph.layers import LayerBlock, coarsen_units, layer_blocks
from graphpipe.graph.op_graph import OpGraph
from graphpipe.graph.sp import SPChain, SPLeaf, StageUnits, sp_decompose, stage_units
from graphpipe.planner.options import PlanOptions
from graphpipe.planner.progress import SizeDone, size_steps
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
    options: PlanOptions = field(default_factory=PlanOptions)  # as asked (the limits of Piper, PipeDream, ...)
    granularity: str = "op"  # "op" | "layer" | "auto" (layer units here; see the module docstring)
    open_blocks: frozenset[str] = frozenset()  # paths of layer blocks kept at op level

    @property
    def num_devices(self) -> int:
        return self.cluster.num_devices

    def size_steps(self, phase: str) -> SizeDone | None:
        """What a search over this request's micro-batch sizes calls with each size it has done, to report
        `phase` to the options' `progress` (`graphpipe.planner.progress.size_steps`); a refinement's search
        ("auto", with blocks opened) says so in its phase."""
        return size_steps(self.options.progress, phase, len(self.micro_batch_sizes), bool(self.open_blocks))

    @cached_property
    def model(self) -> CostModel:
        return CostModel(self.graph, self.costs, self.cluster, self.global_batch_size)

    @cached_property
    def op_units(self) -> StageUnits:
        """The op-level units (`graphpipe.graph.sp.stage_units`), computed once per request."""
        return stage_units(self.graph)

    @cached_property
    def blocks(self) -> tuple[LayerBlock, ...]:
        """The layer blocks the planners keep whole: none at op granularity, else every valid block
        (`graphpipe.graph.layers.layer_blocks`) but the opened ones."""
        if self.granularity == "op":
            return ()
        return tuple(block for block in layer_blocks(self.graph, self.op_units) if block.path not in self.open_blocks)

    @cached_property
    def units(self) -> StageUnits:
        """What every planner cuts between: the op-level units with the layer blocks contracted."""
        return coarsen_units(self.graph, self.op_units, self.blocks)

    @cached_property
    def sp_tree(self) -> SPChain:
        return sp_decompose(self.graph, self.units)

    @cached_property
    def chain_tree(self) -> SPChain:
        """The graph linearised in topological order: one chain of units (single ops, except the ops that
        must share a stage and the replicated ops riding with their readers: `stage_units`)."""
        return SPChain(items=tuple(SPLeaf(ops=ops) for ops in self.units.ops))
