"""The Piper planner (docs/method.md §7): a DP over the downsets (ideals) of the DAG.

Downsets are taken over the graph's units (`graphpipe.graph.sp.stage_units`: replicated ops ride
with their readers, ops that must share a stage are one unit). A stage is the difference
J \\ I of two downsets I ⊂ J, so every stage is convex and the
stages form a chain; each stage gets its own data-parallel degree; memory is
a · in-flight + b per stage (activations per micro-batch times the 1F1B in-flight count of
a chain, plus weights, gradients and optimizer state). The number of downsets grows
exponentially with the graph's width, so, like the original on many-branch models, the
planner gives up with a PlanningError beyond `max_downsets` downsets or `time_limit_s`
seconds (options of the request).
"""

from __future__ import annotations

import time

import numpy as np

from graphpipe.errors import PlanningError
from graphpipe.planner.baselines.chain_dp import empty, in_flight_cap, relax
from graphpipe.planner.request import PlanRequest
from graphpipe.planner.sp_dp import divisors_up_to
from graphpipe.planner.stage_spec import Partition, StageSpec

DEFAULT_MAX_DOWNSETS = 2000
DEFAULT_TIME_LIMIT_S = 60.0


def enumerate_downsets(request: PlanRequest, max_downsets: int, deadline: float) -> list[int]:
    """Every downward-closed op set as a bitmask over topological positions, largest first."""
    graph = request.graph
    units = request.units
    pos = {key: idx for idx, key in enumerate(units.keys)}
    pred_mask = [sum(1 << pos[p] for p in units.preds[key]) for key in units.keys]
    seen = {0}
    frontier = [0]
    while frontier:
        if len(seen) > max_downsets or time.perf_counter() > deadline:
            limit_s = time_limit_s(request)
            raise PlanningError(
                f"piper: no strategy within {max_downsets} downsets / {limit_s} s: "
                f"graph {graph.name!r} ({len(graph)} ops) has too many downsets (its search space grows "
                "exponentially with the number of branches); use planner 'graphpipe'")
        nxt = []
        for mask in frontier:
            for idx, need in enumerate(pred_mask):
                if not mask >> idx & 1 and need & mask == need:
                    grown = mask | 1 << idx
                    if grown not in seen:
                        seen.add(grown)
                        nxt.append(grown)
        frontier = nxt
    return sorted(seen, key=lambda m: -bin(m).count("1"))


def time_limit_s(request: PlanRequest) -> float:
    return request.options.time_limit_s or DEFAULT_TIME_LIMIT_S


def plan_piper(request: PlanRequest) -> list[Partition]:
    limit_s = time_limit_s(request)
    deadline = time.perf_counter() + limit_s
    downsets = enumerate_downsets(request, request.options.max_downsets or DEFAULT_MAX_DOWNSETS, deadline)
    found = []
    for size in request.micro_batch_sizes:
        stages = _solve(request, downsets, size, deadline, limit_s)
        if stages is not None:
            found.append(Partition(stages=tuple(stages), sequential=True))
    return found


def _solve(request: PlanRequest, downsets: list[int], size: int, deadline: float,
           limit_s: float) -> list[StageSpec] | None:
    units = request.units.ops
    model, num_devices = request.model, request.num_devices
    degrees = divisors_up_to(size, num_devices)
    full = downsets[0]
    best = {full: np.zeros((num_devices + 1, num_devices + 1))}
    choice: dict[int, np.ndarray] = {}
    tags: list[tuple[int, int]] = []
    for lower in downsets[1:]:
        if time.perf_counter() > deadline:
            raise PlanningError(f"piper: no strategy within {len(downsets)} downsets / {limit_s} s; "
                                "use planner 'graphpipe'")
        row, chosen = empty(num_devices, num_devices), np.zeros((num_devices + 1, num_devices + 1), dtype=np.int64)
        for upper, rest in best.items():
            if upper & lower != lower:
                continue
            diff = upper ^ lower
            ops = [op for idx in range(diff.bit_length()) if diff >> idx & 1 for op in units[idx]]
            for r in degrees:
                cost = model.stage_cost(ops, r, size)
                k_max = in_flight_cap(cost.param_bytes, cost.act_bytes, request.memory_limit,
                                      request.global_batch_size // size)
                tags.append((upper, r))
                relax(row, chosen, rest, cost.tps_ms, r, k_max, len(tags) - 1)
        best[lower], choice[lower] = row, chosen
    if 0 not in best or not np.isfinite(best[0][num_devices, num_devices]):
        return None
    stages, lower, m, k = [], 0, num_devices, num_devices
    while lower != full:
        upper, r = tags[int(choice[lower][m, k])]
        diff = upper ^ lower
        stage_ops = tuple(op for idx in range(diff.bit_length()) if diff >> idx & 1 for op in units[idx])
        stages.append(StageSpec(ops=stage_ops, num_devices=r, micro_batch_size=size))
        lower, m, k = upper, m - r, k - 1
    return stages
