"""Per-stage micro-batch sizes (kFkB, docs/method.md §3-§4), as a refinement of a uniform-size plan.

The DP runs with one micro-batch size everywhere (the paper found per-stage sizes gave
incremental gains on its models). With `per_stage_micro_batch=True` each candidate is then
improved greedily: the bottleneck stage tries the other sizes (those its data-parallel
degree divides); a change is kept when it lowers that stage's TPS and every stage still
fits in memory with the in-flight counts of the changed stage graph (§3, incl. b_i > b_j).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from graphpipe.planner.stage_cost import CostModel
from graphpipe.planner.stage_spec import Partition, StageSpec
from graphpipe.stages.crossing import crossing_tensors
from graphpipe.stages.in_flight import in_flight_samples
from graphpipe.stages.memory import stage_memory_bytes


def refine_micro_batches(model: CostModel, partition: Partition, sizes: Sequence[int],
                         memory_limit: float, max_rounds: int = 64) -> Partition:
    stages = list(partition.stages)
    stage_of = {op: idx for idx, spec in enumerate(stages) for op in spec.ops}
    successors: dict[int, list[int]] = {idx: [] for idx in range(len(stages))}
    for src, dst in crossing_tensors(model.graph, stage_of):
        successors[src].append(dst)
    if partition.sequential:
        for idx in range(len(stages) - 1):
            successors[idx].append(idx + 1)

    def tps(spec: StageSpec) -> float:
        return model.stage_cost(spec.ops, spec.num_devices, spec.micro_batch_size).tps_ms

    def fits(specs: list[StageSpec]) -> bool:
        counts = in_flight_samples(successors, {i: s.micro_batch_size for i, s in enumerate(specs)},
                                   model.global_batch_size)
        for idx, spec in enumerate(specs):
            cost = model.stage_cost(spec.ops, spec.num_devices, spec.micro_batch_size)
            if stage_memory_bytes(cost.param_bytes, cost.act_bytes, counts[idx], spec.micro_batch_size) > memory_limit:
                return False
        return True

    for _ in range(max_rounds):
        worst = max(range(len(stages)), key=lambda i: tps(stages[i]))
        current = tps(stages[worst])
        best: tuple[float, StageSpec] | None = None
        for size in sizes:
            if size == stages[worst].micro_batch_size or size % stages[worst].num_devices:
                continue
            trial = dataclasses.replace(stages[worst], micro_batch_size=size)
            value = tps(trial)
            if value < current and (best is None or value < best[0]):
                candidate = [*stages[:worst], trial, *stages[worst + 1:]]
                if fits(candidate):
                    best = (value, trial)
        if best is None:
            break
        stages[worst] = best[1]
    return dataclasses.replace(partition, stages=tuple(stages))
