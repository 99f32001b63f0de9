"""The GraphPipe planner: the SP partitioner per micro-batch size (PAPER.md §4).

A chain is a special case of a stage DAG, and some chains are not SP-aligned (a stage that
ends inside one branch and starts the next); so the search also runs the same DP on the
graph linearised in topological order, with the best graph pipeline's TPS as a ceiling: it
costs at most one probe per micro-batch size (none where the size's lower bound is already
above the ceiling) unless a chain is better, and then that chain is kept as a candidate too
(the ranking by simulation decides).
"""

from __future__ import annotations

from graphpipe.planner.partitioner import partition_sp
from graphpipe.planner.per_stage import refine_micro_batches
from graphpipe.planner.request import PlanRequest
from graphpipe.planner.stage_spec import Partition


def plan_graphpipe(request: PlanRequest) -> list[Partition]:
    model, sizes, limit = request.model, request.micro_batch_sizes, request.memory_limit
    found = partition_sp(model, request.sp_tree, request.num_devices, sizes, limit)
    partitions = [Partition(stages=tuple(stages)) for stages in found.values()]
    if partitions:
        best = min(max(model.stage_cost(s.ops, s.num_devices, s.micro_batch_size).tps_ms for s in stages)
                   for stages in found.values())
        chains = partition_sp(model, request.chain_tree, request.num_devices, sizes, limit,
                              ceiling_ms=best * (1 - 1e-9))
        partitions += [Partition(stages=tuple(stages), sequential=True) for stages in chains.values()]
    if request.per_stage_micro_batch:
        partitions += [refine_micro_batches(model, p, sizes, limit) for p in partitions]
    return partitions
