"""Turn a partition (op sets, device counts, micro-batch sizes) into a validated-shape `Plan`.

Stages are numbered in topological order of the stage graph; edges carry the producer ops
whose outputs cross, with their bytes per sample; in-flight counts follow docs/method.md §3;
predictions (fwd/bwd, TPS, memory) come from `CostModel.stage_cost` and `plan.memory`, and those of a stage
that recomputes (`StageSpec.recompute`) from `reprice_recompute`, the rule the simulator prices it by.
A sequential partition gets ordering edges (no tensors) between consecutive stages so
that its stage graph is the chain a sequential pipeline runs.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from graphpipe.errors import PlanningError
from graphpipe.graph.fingerprint import fingerprint_of
from graphpipe.graph.op_graph import FREE_KINDS, OpGraph
from graphpipe.graph.toposort import priority_topological_order
from graphpipe.planner.placement import place
from graphpipe.planner.stage_cost import CostModel
from graphpipe.planner.stage_spec import Partition, StageSpec
from graphpipe.stages.crossing import crossing_tensors
from graphpipe.stages.in_flight import in_flight_samples
from graphpipe.stages.memory import stage_memory_bytes
from graphpipe.stages.recompute import reprice_recompute
from graphpipe.stages.stage_graph import Plan, Stage, StageEdge


def _topological(specs: tuple[StageSpec, ...], index_of: dict[str, int],
                 links: set[tuple[int, int]]) -> list[int]:
    first = [min(index_of[op] for op in spec.ops) for spec in specs]
    order = priority_topological_order(range(len(specs)), sorted(links), first.__getitem__)
    if len(order) != len(specs):
        raise PlanningError("the stages form a cycle: some stage is not convex")
    return order


def build_plan(model: CostModel, partition: Partition, planner: str) -> Plan:
    graph = model.graph
    specs = partition.stages
    raw_of = {op: idx for idx, spec in enumerate(specs) for op in spec.ops}
    raw_links = set(crossing_tensors(graph, raw_of))
    if partition.sequential:
        raw_links |= {(idx, idx + 1) for idx in range(len(specs) - 1)}
    order = _topological(specs, {op: graph.index(op) for op in graph.names}, raw_links)
    specs = tuple(specs[idx] for idx in order)
    stage_of = {op: idx for idx, spec in enumerate(specs) for op in spec.ops}
    tensors = crossing_tensors(graph, stage_of)
    if partition.sequential:
        for idx in range(len(specs) - 1):
            tensors.setdefault((idx, idx + 1), ())
    edges = tuple(StageEdge(src=src, dst=dst, tensors=names,
                            bytes_per_sample=sum(model.out_bytes_per_sample[op] for op in names))
                  for (src, dst), names in sorted(tensors.items()))
    successors: dict[int, list[int]] = {idx: [] for idx in range(len(specs))}
    for edge in edges:
        successors[edge.src].append(edge.dst)
    counts = in_flight_samples(successors, {idx: spec.micro_batch_size for idx, spec in enumerate(specs)},
                               model.global_batch_size)
    ranks = place([spec.num_devices for spec in specs], {(e.src, e.dst): e.bytes_per_sample for e in edges},
                  model.cluster)
    stages = [_priced(model, idx, tuple(sorted(spec.ops, key=graph.index)), ranks[idx], spec.micro_batch_size,
                      counts[idx]) for idx, spec in enumerate(specs)]
    bottleneck = max(stage.tps_ms for stage in stages)
    mixed = len({stage.micro_batch_size for stage in stages}) > 1
    plan = Plan(schedule="kfkb" if mixed else "1f1b",
                graph_name=graph.name, stages=tuple(stages), edges=edges, global_batch_size=model.global_batch_size,
                num_devices=model.cluster.num_devices, planner=planner, predicted_tps_ms=bottleneck,
                predicted_samples_per_s=1e3 / bottleneck if bottleneck > 0 else 0.0,
                lower_bound_samples_per_s=lower_bound_samples_per_s(model, specs),
                cluster=model.cluster.to_dict(), shared_params=shared_parameters(graph, stage_of),
                **runtime_contract(graph))
    recomputing = [idx for idx, spec in enumerate(specs) if spec.recompute]
    if not recomputing:
        return plan
    plan = reprice_recompute(plan, recomputing, model.costs)
    return dataclasses.replace(plan, predicted_samples_per_s=1e3 / plan.predicted_tps_ms)


def _priced(model: CostModel, idx: int, ops: tuple[str, ...], ranks: tuple[int, ...], micro_batch_size: int,
            in_flight: int) -> Stage:
    """A stage keeping its activations, its predictions (fwd/bwd, TPS, memory) from `model`."""
    cost = model.stage_cost(ops, len(ranks), micro_batch_size)
    memory = stage_memory_bytes(cost.param_bytes, cost.act_bytes, in_flight, micro_batch_size)
    return Stage(idx=idx, ops=ops, ranks=ranks, micro_batch_size=micro_batch_size, in_flight_samples=in_flight,
                 fwd_ms=cost.fwd_ms, bwd_ms=cost.bwd_ms, memory_bytes=round(memory), tps_ms=cost.tps_ms)


def priced_again(model: CostModel, plan: Plan) -> Plan:
    """`plan`, every stage keeping its activations, with its predictions priced from `model`'s costs (a plan found
    on other costs: `graphpipe.planner.techniques`); the simulated iteration is left to its ranking."""
    stages = tuple(_priced(model, stage.idx, stage.ops, stage.ranks, stage.micro_batch_size, stage.in_flight_samples)
                   for stage in plan.stages)
    bottleneck = max(stage.tps_ms for stage in stages)
    specs = tuple(StageSpec(ops=stage.ops, num_devices=stage.data_parallel_degree,
                            micro_batch_size=stage.micro_batch_size) for stage in stages)
    return dataclasses.replace(plan, stages=stages, predicted_tps_ms=bottleneck,
                               predicted_samples_per_s=1e3 / bottleneck if bottleneck > 0 else 0.0,
                               lower_bound_samples_per_s=lower_bound_samples_per_s(model, specs))


def shared_parameters(graph: OpGraph, stage_of: dict[str, int]) -> dict[str, dict[str, Any]]:
    """Trainable parameters whose readers sit in more than one stage, with their bytes, the stage of the
    op that owns them (where the cost table counts them) and every stage that holds a copy."""
    shared: dict[str, dict[str, Any]] = {}
    for op in graph.ops:
        for param in op.params:
            stages = sorted({stage_of[name] for name in (op.name, *param.shared_with) if name in stage_of})
            if not param.is_buffer and len(stages) > 1:
                shared[param.name] = {"bytes": param.num_bytes, "owner": stage_of[op.name], "stages": stages}
    return shared


def runtime_contract(graph: OpGraph) -> dict[str, Any]:
    """The Plan fields the runtime needs from the op graph: capture method, replicated ops, input batch axes, and
    the graph's fingerprint (what the ranks check their own capture against)."""
    axes = {name: (graph.op(name).outputs[0].batch_axis if graph.op(name).outputs else None)
            for name in graph.inputs}
    computed = tuple(op.name for op in graph.ops if op.replicated and op.kind not in FREE_KINDS)
    return {"capture": graph.capture, "replicated": computed, "input_batch_axes": axes,
            "graph_fingerprint": fingerprint_of(graph)}


def lower_bound_samples_per_s(model: CostModel, specs: tuple[StageSpec, ...]) -> float:
    """Throughput if all compute were spread evenly over all devices: no bubbles, no communication."""
    ms_per_sample = 0.0
    for spec in specs:
        for op in spec.ops:
            fwd, bwd, _ = model.op_at(op, spec.micro_batch_size)
            ms_per_sample += (fwd + bwd) / spec.micro_batch_size
    return model.cluster.num_devices * 1e3 / ms_per_sample if ms_per_sample > 0 else 0.0
