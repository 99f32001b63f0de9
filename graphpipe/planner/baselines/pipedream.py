"""The PipeDream planner (docs/method.md §7): PipeDream's DP over the antichain DAG of the units.

As the original optimizer (pipedream, `optimizer/optimizer_graph_hierarchical.py`), the states are the
antichain DAG's (`antichains.py`: every downset of the unit DAG), a stage is the set of units between
two states I ⊂ J, replicated (data parallel) over r devices with r dividing the micro-batch, and a DP
minimises the slowest stage's TPS over the split states, replication factors and stage counts. Costs
are graphpipe's (`pipedream_tables.py`, equal to `CostModel.stage_cost`) and the memory check is 1F1B
on a chain (a stage followed by k - 1 stages keeps k micro-batches: `chain_dp.py`), so the planners
differ in search space only. Plans are chains of stages.

Simplified: the original solves one DP per network level (inside a server, then across servers), each
with that level's bandwidth, and the level below for every pair of states, O(S³) in the S states.
graphpipe's cost model already prices a stage's all-reduce by whether its group spans nodes, so one DP
over all devices covers every plan of the levels (and more), in O(S²) pairs.

Exact acceleration: a first pass over the states of one topological order (the chain DP of the
`sequential` space, a subset of the antichain DAG's plans) bounds the bottleneck, and the full pass skips
the stages slower than that bound, which no better plan uses. The antichain DAG grows exponentially with
the graph's width: past `time_limit_s`, MAX_STATES states or MAX_TABLE_CELLS cells of the DP table the
planner gives up and says how far it got.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

import numpy as np

from graphpipe.errors import PlanningError
from graphpipe.planner.baselines.advice import smaller_graph_advice
from graphpipe.planner.baselines.antichains import AntichainDag, AntichainLimitError, antichain_dag
from graphpipe.planner.baselines.pipedream_dp import chain, dp_pass
from graphpipe.planner.baselines.pipedream_tables import (
    PairLimitError,
    StagePairs,
    StateSums,
    stage_costs,
    stage_pairs,
)
from graphpipe.planner.request import PlanRequest
from graphpipe.planner.sp_dp import divisors_up_to
from graphpipe.planner.stage_spec import Partition, StageSpec

DEFAULT_TIME_LIMIT_S = 600.0
MAX_STATES = 100_000  # past this the O(S²) pairs outlast any time limit
MAX_PAIRS = 20_000_000  # stages J \ I: their tables take about 100 bytes each, per degree and micro-batch size
MAX_TABLE_CELLS = 1 << 27  # the table: 1 GiB


def plan_pipedream(request: PlanRequest) -> list[Partition]:
    limit_s = request.options.time_limit_s or DEFAULT_TIME_LIMIT_S
    start = time.perf_counter()
    deadline = start + limit_s
    try:
        dag = antichain_dag(request.units, deadline, MAX_STATES)
    except AntichainLimitError as stop:
        raise PlanningError(
            f"pipedream: gave up after {time.perf_counter() - start:.1f} s with {stop.num_states:,} antichain states "
            f"built (limits: {limit_s:g} s, {MAX_STATES:,} states); the antichain DAG of graph "
            f"{request.graph.name!r} ({len(request.units.keys)} units) grows exponentially with its width: "
            f"{smaller_graph_advice(request.granularity)}") from None
    check = _deadline_check(request, dag, deadline, limit_s)
    try:
        pairs = stage_pairs(dag, request.model, request.units, check, MAX_PAIRS)
    except PairLimitError as stop:
        raise PlanningError(
            f"pipedream: gave up after {time.perf_counter() - start:.1f} s: the antichain DAG of graph "
            f"{request.graph.name!r} ({dag.num_units} units) has {len(dag.states):,} states and more than "
            f"{MAX_PAIRS:,} stages between them (at least {stop.num_pairs:,}, from {stop.done:,} of its states); "
            "the DP prices every stage, and their number grows with the square of the states: "
            f"{smaller_graph_advice(request.granularity)}") from None
    sums = StateSums(dag, request.model, request.units)
    found, size_done = [], request.size_steps("chains")
    for size in request.micro_batch_sizes:
        stages = _solve(request, dag, pairs, sums, size, check)
        if stages is not None:
            found.append(Partition(stages=tuple(stages), sequential=True))
        if size_done is not None:
            size_done(size)
    return found


def _deadline_check(request: PlanRequest, dag: AntichainDag, deadline: float,
                    limit_s: float) -> Callable[[int], None]:
    def check(done: int) -> None:
        if time.perf_counter() > deadline:
            raise PlanningError(
                f"pipedream: gave up after {limit_s:g} s: the antichain DAG of graph {request.graph.name!r} "
                f"({dag.num_units} units) has {len(dag.states):,} states and the DP had reached {done:,} of them; "
                f"raise --time-limit (PlanOptions.time_limit_s) or {smaller_graph_advice(request.granularity)}")
    return check


def _solve(request: PlanRequest, dag: AntichainDag, pairs: StagePairs, sums: StateSums, size: int,
           check: Callable[[int], None]) -> list[StageSpec] | None:
    """The best chain for one micro-batch size: a pass along one topological order bounds the full pass."""
    max_stages = max(1, min(request.num_devices, len(request.units.keys)))
    costs = {degree: stage_costs(sums, pairs, size, degree, request.memory_limit, max_stages)
             for degree in divisors_up_to(size, request.num_devices)}
    limits = [int(c.in_flight_cap[(c.in_flight_cap >= 1) & (c.in_flight_cap < max_stages)].max(initial=0))
              for c in costs.values()]
    shape = (len(dag.states), request.num_devices + 1, min(max_stages, 1 + max(limits)) + 1)
    if np.prod(shape) > MAX_TABLE_CELLS:
        raise PlanningError(
            f"pipedream: gave up: its DP table of {shape[0]:,} antichain states x {shape[1]} device counts x "
            f"{shape[2]} stage counts would need {np.prod(shape) * 8 / 2**30:.1f} GiB; plan on fewer devices or "
            f"{smaller_graph_advice(request.granularity)}")
    levels = _levels(dag, pairs)
    fits = {degree: c.in_flight_cap >= 1 for degree, c in costs.items()}
    on_order = _prefix_pairs(dag, pairs)
    bound = dp_pass(pairs, costs, {d: fits[d] & on_order for d in costs}, levels, shape, check).answer()[0]
    keep = {degree: fits[degree] & (c.tps_ms <= bound) for degree, c in costs.items()}
    tables = dp_pass(pairs, costs, keep, levels, shape, check)
    if not np.isfinite(tables.answer()[0]):
        return None
    return [StageSpec(ops=_ops(request, units), num_devices=degree, micro_batch_size=size)
            for units, degree in chain(tables, pairs, costs, dag.states, request.num_devices)]


def _prefix_pairs(dag: AntichainDag, pairs: StagePairs) -> np.ndarray:
    """The pairs of prefixes of the units' topological order: the chain DP of one order, whose best plan is a
    plan of the antichain DAG too, so no better plan has a stage slower than its bottleneck."""
    index = {state: idx for idx, state in enumerate(dag.states)}
    prefixes = [index[(1 << count) - 1] for count in range(dag.num_units + 1)]
    on_order = np.zeros(len(pairs.uppers), dtype=bool)
    for pos, lower in enumerate(prefixes):
        lo, hi = pairs.offsets[lower], pairs.offsets[lower + 1]
        on_order[lo + np.searchsorted(pairs.uppers[lo:hi], prefixes[pos + 1 :])] = True
    return on_order


def _levels(dag: AntichainDag, pairs: StagePairs) -> list[tuple[int, int]]:
    """The pair ranges of the states of each size, largest first (the whole graph has no pairs)."""
    sizes = [state.bit_count() for state in dag.states]
    starts = [idx for idx in range(1, len(sizes)) if sizes[idx] != sizes[idx - 1]] + [len(sizes)]
    return [(int(pairs.offsets[a]), int(pairs.offsets[b])) for a, b in itertools.pairwise(starts)]


def _ops(request: PlanRequest, units: int) -> tuple[str, ...]:
    return tuple(op for idx in range(units.bit_length()) if units >> idx & 1 for op in request.units.ops[idx])
