"""The PipeDream planner (docs/method.md §7): linearise, then a DP over contiguous segments with replication.

The DAG is linearised along its topological order into a chain of cut states (the
downward-closed prefixes of that order); a stage is a contiguous segment of the chain,
replicated (data parallel) over r devices, r dividing the micro-batch. The DP minimises the
slowest stage's TPS over segments, replication factors and stage counts, with the memory
check of 1F1B on a chain (a stage followed by k - 1 stages keeps k micro-batches). Costs
are those of the GraphPipe planner (`plan.stage_cost`), so the planners differ in search
space alone. O(L^2 · D · D) per micro-batch size for L ops and D devices.
"""

from __future__ import annotations

import time

import numpy as np

from graphpipe.cost.formulas.communication import p2p_ms
from graphpipe.cost.formulas.memory import OPTIMIZER_STATE_FACTOR
from graphpipe.cost.formulas.time_per_sample import time_per_sample_ms
from graphpipe.errors import PlanningError
from graphpipe.planner.baselines.chain_dp import empty, in_flight_cap, relax
from graphpipe.planner.request import PlanRequest
from graphpipe.planner.sp_dp import ChainInfo, divisors_up_to
from graphpipe.planner.stage_spec import Partition, StageSpec

DEFAULT_TIME_LIMIT_S = 600.0


def plan_pipedream(request: PlanRequest) -> list[Partition]:
    info = ChainInfo(request.model, request.chain_tree)
    deadline = time.perf_counter() + (request.options.time_limit_s or DEFAULT_TIME_LIMIT_S)
    found = []
    for size in request.micro_batch_sizes:
        stages = _solve(request, info, size, deadline)
        if stages is not None:
            found.append(Partition(stages=tuple(stages), sequential=True))
    return found


def _solve(request: PlanRequest, info: ChainInfo, size: int, deadline: float) -> list[StageSpec] | None:
    model, limit = request.model, request.memory_limit
    num_items, num_devices = info.num_items, request.num_devices
    best = [empty(num_devices, num_devices) for _ in range(num_items + 1)]
    best[num_items][:] = 0.0
    choices = [np.zeros((num_devices + 1, num_devices + 1), dtype=np.int64) for _ in range(num_items + 1)]
    degrees = divisors_up_to(size, num_devices)
    for start in range(num_items - 1, -1, -1):
        if time.perf_counter() > deadline:
            limit_s = request.options.time_limit_s or DEFAULT_TIME_LIMIT_S
            raise PlanningError(f"pipedream: no strategy within {limit_s} s "
                                f"({info.num_items} ops linearised); raise the time limit or use planner 'graphpipe'")
        for r in degrees:
            times, acts = info.prefix_at(size / r)
            for stop in range(start + 1, num_items + 1):
                params = info.param_prefix[stop] - info.param_prefix[start]
                if OPTIMIZER_STATE_FACTOR * params > limit:
                    break
                messages, num_bytes = info.boundary(start, stop)
                compute = times[stop] - times[start]
                tps = time_per_sample_ms(compute, p2p_ms(model.link, messages, num_bytes * size / r),
                                         model.all_reduce_ms(params, r), size, request.global_batch_size)
                k_max = in_flight_cap(params, acts[stop] - acts[start], limit, request.global_batch_size // size)
                relax(best[start], choices[start], best[stop], tps, r, k_max, stop * (num_devices + 1) + r)
    if not np.isfinite(best[0][num_devices, num_devices]):
        return None
    stages, start, m, k = [], 0, num_devices, num_devices
    while start < num_items:
        tag = int(choices[start][m, k])
        stop, r = divmod(tag, num_devices + 1)
        stages.append(StageSpec(ops=info.ops(start, stop), num_devices=r, micro_batch_size=size))
        start, m, k = stop, m - r, k - 1
    return stages
