"""Sequential pipeline parallelism with GraphPipe's own DP (the SPP ablation of docs/method.md §6).

The op graph is linearised in topological order into one chain, so every stage is a run
of consecutive ops and the stage graph is a chain; the search itself is the GraphPipe
partitioner, which makes the comparison one of stage-graph shape alone.
"""

from __future__ import annotations

from graphpipe.planner.request import PlanRequest
from graphpipe.planner.sp_dp import partition_sp
from graphpipe.planner.stage_spec import Partition


def plan_sequential(request: PlanRequest) -> list[Partition]:
    found = partition_sp(request.model, request.chain_tree, request.num_devices, request.micro_batch_sizes,
                         request.memory_limit, every_size=request.every_size, size_done=request.size_steps("chains"))
    return [Partition(stages=tuple(stages), sequential=True) for plans in found.values() for stages in plans]
