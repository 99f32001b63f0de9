"""`validate_plan`: the invariants every planner's answer must keep (docs/method.md §2).

Every op in exactly one stage; stages convex (no path of data edges leaves a stage and comes
back: a replicated op is computed by every stage that reads it); stage edges equal the data
edges that cross stages, with the right producer ops (edges with
no tensors are ordering edges of sequential plans); devices partitioned; in-flight counts
follow the rule of §3; every stage's predicted memory fits.
"""

from __future__ import annotations

from collections.abc import Mapping

from graphpipe.cost.cluster import Cluster
from graphpipe.errors import PlanValidationError
from graphpipe.graph.op_graph import OpGraph
from graphpipe.graph.toposort import priority_topological_order
from graphpipe.stages.crossing import crossing_tensors
from graphpipe.stages.in_flight import in_flight_samples
from graphpipe.stages.stage_graph import Plan


def validate_plan(plan: Plan, graph: OpGraph, cluster: Cluster | None = None,
                  memory_limit: float | None = None) -> None:
    """Raise PlanValidationError naming the first broken invariant."""
    validate_structure(plan, graph)
    _check_devices(plan, cluster)
    _check_in_flight(plan)
    limit = memory_limit if memory_limit is not None else (cluster.device.memory_bytes if cluster else None)
    if limit is not None:
        for stage in plan.stages:
            if stage.memory_bytes > limit:
                raise PlanValidationError(
                    f"stage {stage.idx} needs {stage.memory_bytes / 2**30:.2f} GiB per device but a device has "
                    f"{limit / 2**30:.2f} GiB: use a smaller micro-batch or more devices")


def validate_structure(plan: Plan, graph: OpGraph) -> None:
    """What the runtime and the simulator need of a plan for `graph`: every op in exactly one stage, convex
    stages, stage edges equal to the data edges that cross. (In-flight counts and memory are predictions.)"""
    stage_of = _check_cover(plan, graph)
    crossing = crossing_tensors(graph, stage_of)
    if not _acyclic([stage.idx for stage in plan.stages], crossing):
        _check_convex(plan, graph, stage_of)
    _check_edges(plan, graph, crossing)


def check_runtime_rules(plan: Plan, graph: OpGraph) -> None:
    """Raise PlanValidationError if the runtime would refuse `plan`: what crosses a stage boundary must be
    one tensor with the batch first. (A parameter read by several stages is fine: each holds a copy.)"""
    for edge in plan.edges:
        for name in edge.tensors:
            op = graph.op(name)
            if not op.can_cross:
                kind = "not one tensor" if not op.is_tensor else "a tensor without the batch as its first dimension"
                raise PlanValidationError(f"value {name!r} crosses from stage {edge.src} to stage {edge.dst} but is "
                                          f"{kind}; the runtime cannot send it")


def _check_cover(plan: Plan, graph: OpGraph) -> dict[str, int]:
    stage_of: dict[str, int] = {}
    for stage in plan.stages:
        for op in stage.ops:
            if op not in graph:
                raise PlanValidationError(f"stage {stage.idx} names op {op!r}, which is not in graph {graph.name!r}")
            if op in stage_of:
                raise PlanValidationError(f"op {op!r} is in stages {stage_of[op]} and {stage.idx}")
            stage_of[op] = stage.idx
    missing = [op for op in graph.names if op not in stage_of]
    if missing:
        raise PlanValidationError(f"{len(missing)} ops are in no stage, e.g. {missing[:3]}")
    return stage_of


def _acyclic(stages: list[int], crossing: Mapping[tuple[int, int], object]) -> bool:
    """True when the stages' data edges form no cycle: then every stage is convex (a path that left a stage and
    came back would walk a cycle of stages), and the per-stage test (`_check_convex`, quadratic in the ops)
    is not needed."""
    nodes = sorted(set(stages))
    return len(priority_topological_order(nodes, crossing, int)) == len(nodes)


def _check_convex(plan: Plan, graph: OpGraph, stage_of: dict[str, int]) -> None:
    pos = {name: idx for idx, name in enumerate(graph.names)}
    desc: dict[str, int] = {}
    for name in reversed(graph.names):
        bits = 1 << pos[name]
        for succ in graph.data_successors(name):
            bits |= desc[succ]
        desc[name] = bits
    anc: dict[str, int] = {}
    for name in graph.names:
        bits = 1 << pos[name]
        for pred in graph.data_predecessors(name):
            bits |= anc[pred]
        anc[name] = bits
    for stage in plan.stages:
        inside = down = up = 0
        for op in stage.ops:
            inside |= 1 << pos[op]
            down |= desc[op]
            up |= anc[op]
        between = down & up & ~inside
        if between:
            culprit = graph.names[(between & -between).bit_length() - 1]
            raise PlanValidationError(f"stage {stage.idx} is not convex: a path leaves it through op {culprit!r} "
                                      "and comes back")


def _check_edges(plan: Plan, graph: OpGraph, expected: Mapping[tuple[int, int], tuple[str, ...]]) -> None:
    seen = set()
    for edge in plan.edges:
        key = (edge.src, edge.dst)
        if key in seen:
            raise PlanValidationError(f"stage edge s{edge.src}->s{edge.dst} appears twice")
        seen.add(key)
        want = expected.get(key, ())
        if tuple(sorted(edge.tensors, key=graph.index)) != want:
            raise PlanValidationError(f"stage edge s{edge.src}->s{edge.dst} carries {list(edge.tensors)} but the "
                                      f"op edges crossing it come from {list(want)}")
    for src, dst in expected:
        if (src, dst) not in seen:
            raise PlanValidationError(f"op edges cross from stage {src} to stage {dst} but the plan has no such edge")


def _check_devices(plan: Plan, cluster: Cluster | None) -> None:
    available = cluster.num_devices if cluster is not None else plan.num_devices
    if plan.world_size > available:
        raise PlanValidationError(f"plan uses {plan.world_size} devices but {available} are available")


def _check_in_flight(plan: Plan) -> None:
    counts = in_flight_samples(plan.successors, {s.idx: s.micro_batch_size for s in plan.stages},
                               plan.global_batch_size)
    for stage in plan.stages:
        if stage.in_flight_samples != counts[stage.idx]:
            raise PlanValidationError(f"stage {stage.idx} holds {stage.in_flight_samples} in-flight samples but "
                                      f"the rule of docs/method.md §3 gives {counts[stage.idx]}")
