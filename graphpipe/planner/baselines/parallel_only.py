"""Graph stages, but the micro-batch size of the best sequential plan (the ablation of docs/method.md §6).

Separates the two sources of GraphPipe's gain: parallel stages alone, without the larger
micro-batch that the shallower pipeline makes fit. The size is the option
`fixed_micro_batch` when given (`gp.plan` passes the size of the sequential plan it would
pick itself, e.g. by simulated iteration time), else that of the sequential plan with the
best TPS.
"""

from __future__ import annotations

import dataclasses

from graphpipe.planner.baselines.sequential import plan_sequential
from graphpipe.planner.graphpipe_planner import plan_graphpipe
from graphpipe.planner.request import PlanRequest
from graphpipe.planner.stage_spec import Partition


def plan_parallel_only(request: PlanRequest) -> list[Partition]:
    size = request.options.fixed_micro_batch
    if size is None:
        chains = plan_sequential(request)
        if not chains:
            return []
        model = request.model

        def bottleneck(partition: Partition) -> float:
            return max(model.stage_cost(s.ops, s.num_devices, s.micro_batch_size).tps_ms for s in partition.stages)

        size = min(chains, key=bottleneck).stages[0].micro_batch_size
    return plan_graphpipe(dataclasses.replace(request, micro_batch_sizes=(int(size),)))
