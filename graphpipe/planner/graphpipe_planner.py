"""The GraphPipe planner: the SP partitioner per micro-batch size (docs/method.md §4).

A chain is a special case of a stage DAG, and some chains are not SP-aligned (a stage that
ends inside one branch and starts the next); so the search also runs the same DP on the
graph linearised in topological order, with the best graph pipeline's TPS as a ceiling: it
costs at most one probe per micro-batch size (none where the size's lower bound is already above
the ceiling, or where a floor over the chain's segments rules it out: `Search.may_meet`) unless a
chain is better, and then that chain is searched like any size and kept as
a candidate too. So graphpipe's best TPS is never worse than the chains' (to the search's
tolerance). A chain that is worse in TPS is not searched for, even if it would simulate
faster (docs/architecture.md). When no graph pipeline fits in memory, a chain still may (one
that cuts inside a branch): it is searched without a ceiling. When the SP tree is itself that
chain (a model without branches), the second search would repeat the first and is skipped; a
set of stages both searches find is kept once, as the graph pipeline (its edges are the
tensors that cross, without the chain's added links).
"""

from __future__ import annotations

from graphpipe.graph.sp import SPChain, SPLeaf
from graphpipe.planner.per_stage import refine_micro_batches
from graphpipe.planner.request import PlanRequest
from graphpipe.planner.sp_dp import partition_sp
from graphpipe.planner.stage_cost import CostModel
from graphpipe.planner.stage_spec import Partition, StageSpec


def plan_graphpipe(request: PlanRequest) -> list[Partition]:
    model, sizes, limit = request.model, request.micro_batch_sizes, request.memory_limit
    found = partition_sp(model, request.sp_tree, request.num_devices, sizes, limit, every_size=request.every_size,
                         size_done=request.size_steps("stage graphs"))
    partitions = [Partition(stages=tuple(stages)) for plans in found.values() for stages in plans]
    if not is_the_chain(request.sp_tree, request.chain_tree):
        chains = partition_sp(model, request.chain_tree, request.num_devices, sizes, limit,
                              ceiling_ms=chain_ceiling(model, found), every_size=request.every_size,
                              size_done=request.size_steps("chains"))
        seen = {frozenset(partition.stages) for partition in partitions}
        partitions += [Partition(stages=tuple(stages), sequential=True) for plans in chains.values()
                       for stages in plans if frozenset(stages) not in seen]
    if request.per_stage_micro_batch:
        partitions += [refine_micro_batches(model, p, sizes, limit) for p in partitions]
    return partitions


def chain_ceiling(model: CostModel, found: dict[int, list[list[StageSpec]]]) -> float | None:
    """The TPS a chain must beat to be searched for: a hair below the best graph pipeline's bottleneck; None
    when no graph pipeline fits (memory), and a chain, which may cut inside a branch, is searched in full."""
    best = min((max(model.stage_cost(s.ops, s.num_devices, s.micro_batch_size).tps_ms for s in plans[0])
                for plans in found.values() if plans), default=None)
    return None if best is None else best * (1 - 1e-9)


def is_the_chain(tree: SPChain, chain: SPChain) -> bool:
    """True when the SP tree has no parallel block and the same leaves as the linearised chain."""
    return all(isinstance(item, SPLeaf) for item in tree.items) and \
        [item.ops for item in tree.items] == [item.ops for item in chain.items]
