"""Hand-built plans, cost tables and clusters for schedule and simulator tests.

Every stage holds one op named `op{idx}`; its cost table entry is stored at batch 1, so
the table scales it linearly with the batch (f and b are per sample).
"""

from __future__ import annotations

from collections.abc import Sequence

from graphpipe.cost.cluster import Cluster, Device, Link
from graphpipe.cost.cost_table import CostTable, OpCost
from graphpipe.stages.in_flight import in_flight_samples
from graphpipe.stages.stage_graph import Plan, Stage, StageEdge

GiB = 2**30


def make_plan(edges: Sequence[tuple[int, int]], micro_batch_sizes: Sequence[int], global_batch_size: int, *,
              ranks_per_stage: Sequence[int] | None = None, bytes_per_sample: float = 0.0,
              cluster: Cluster | None = None, name: str = "test") -> Plan:
    """A plan with one op per stage; in-flight counts from the planner's rule (docs/method.md §3)."""
    num_stages = len(micro_batch_sizes)
    dps = list(ranks_per_stage or [1] * num_stages)
    first = [sum(dps[:i]) for i in range(num_stages)]
    stages = tuple(Stage(idx=i, ops=(f"op{i}",), ranks=tuple(range(first[i], first[i] + dps[i])),
                         micro_batch_size=micro_batch_sizes[i], in_flight_samples=0) for i in range(num_stages))
    stage_edges = tuple(StageEdge(src=a, dst=b, tensors=(f"op{a}",), bytes_per_sample=bytes_per_sample)
                        for a, b in edges)
    world = sum(dps)
    bare = Plan(graph_name=name, stages=stages, edges=stage_edges, global_batch_size=global_batch_size,
                num_devices=world, planner="test", cluster=(cluster or make_cluster(world)).to_dict())
    rule = in_flight_samples(bare.successors, {st.idx: st.micro_batch_size for st in stages})
    stages = tuple(Stage(idx=s.idx, ops=s.ops, ranks=s.ranks, micro_batch_size=s.micro_batch_size,
                         in_flight_samples=rule[s.idx]) for s in stages)
    return Plan(graph_name=name, stages=stages, edges=stage_edges, global_batch_size=global_batch_size,
                num_devices=world, planner="test", cluster=bare.cluster)


def chain(num_stages: int, micro_batch_size: int, global_batch_size: int, **kwargs: object) -> Plan:
    edges = [(i, i + 1) for i in range(num_stages - 1)]
    return make_plan(edges, [micro_batch_size] * num_stages, global_batch_size, **kwargs)  # type: ignore[arg-type]


def diamond(micro_batch_size: int, global_batch_size: int, **kwargs: object) -> Plan:
    """s0 -> {s1, s2} -> s3."""
    return make_plan([(0, 1), (0, 2), (1, 3), (2, 3)], [micro_batch_size] * 4, global_batch_size,
                     **kwargs)  # type: ignore[arg-type]


def fan(num_branches: int, branch_len: int, micro_batch_size: int, global_batch_size: int,
        **kwargs: object) -> Plan:
    """`num_branches` parallel chains of `branch_len` stages, all feeding one merge stage."""
    edges, idx = [], 0
    merge = num_branches * branch_len
    for _ in range(num_branches):
        for step in range(branch_len):
            edges.append((idx, idx + 1 if step < branch_len - 1 else merge))
            idx += 1
    edges.sort()
    return make_plan(edges, [micro_batch_size] * (merge + 1), global_batch_size, **kwargs)  # type: ignore[arg-type]


def make_costs(plan: Plan, fwd_ms: float | Sequence[float] = 1.0, bwd_ms: float | Sequence[float] = 2.0, *,
               act_bytes: int = 1000, param_bytes: int = 0) -> CostTable:
    """Per-sample costs for every stage op (a sequence gives one value per stage)."""
    def pick(value: float | Sequence[float], idx: int) -> float:
        return value if isinstance(value, (int, float)) else value[idx]

    entries = {f"op{s.idx}": {1: OpCost(fwd_ms=pick(fwd_ms, s.idx), bwd_ms=pick(bwd_ms, s.idx), act_bytes=act_bytes,
                                         output_bytes=0, param_bytes=param_bytes)} for s in plan.stages}
    return CostTable(device="test", source="analytic", entries=entries)


def make_cluster(num_devices: int, *, devices_per_node: int = 4, latency_us: float = 0.0,
                 intra_gb_per_s: float = 100.0, inter_gb_per_s: float = 10.0) -> Cluster:
    device = Device(name="test-gpu", peak_tflops=100.0, mem_bandwidth_gb_per_s=1000.0, memory_bytes=16 * GiB,
                    kernel_overhead_us=0.0)
    return Cluster(name="test", device=device, num_devices=num_devices, devices_per_node=devices_per_node,
                   intra_node=Link(name="nvlink", latency_us=latency_us, bandwidth_gb_per_s=intra_gb_per_s),
                   inter_node=Link(name="ib", latency_us=latency_us, bandwidth_gb_per_s=inter_gb_per_s))
