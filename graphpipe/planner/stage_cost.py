"""Cost of a set of ops run as one stage on d data-parallel devices with micro-batch b.

Per micro-batch, every device computes b / d samples: fwd and bwd are the cost table
read at b / d. Communication per micro-batch and device:

    comm_ms = 2 × (messages × latency + (recv + send bytes per sample) × b / d / bandwidth)

(activations forward, the same bytes of gradients backward), where a tensor is received
once per outside producer the stage reads and sent once per stage op read outside. The
planner does not know the placement yet, so point-to-point traffic is costed on the
inter-node link whenever the cluster has several nodes (the placement then tries to do
better). The data-parallel ring all-reduce of the stage's gradients and its optimizer step
happen once per iteration; spread over the B samples of the mini-batch, with the device's
fixed cost of a forward and a backward action per micro-batch (`fwd_ms` and `bwd_ms` include
them, as the simulator's do):

    TPS = (compute + comm + actions) / b + (all_reduce + step) / B      compute = the ops' fwd + bwd

The formulas live in `graphpipe.cost.formulas` (the rule: `time_per_sample`, shared with the DP's
numpy tables, the baselines and the simulator); this module chooses what they are applied to: the ops, the
links before placement, the batch per device.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from graphpipe.cost.cluster import Cluster, Link
from graphpipe.cost.cost_table import CostTable
from graphpipe.cost.formulas.communication import p2p_ms, ring_all_reduce_ms, ring_all_reduce_ms_array
from graphpipe.cost.formulas.time_per_sample import (
    action_overheads_ms,
    iteration_ms_per_sample_array,
    optimizer_step_ms,
    optimizer_step_ms_array,
    time_per_sample_ms,
)
from graphpipe.graph.op_graph import OpGraph
from graphpipe.stages.stage_cost import StageCost


def p2p_link(cluster: Cluster) -> Link:
    """The link the planner assumes between stages before placement."""
    return cluster.intra_node if cluster.num_nodes <= 1 else cluster.inter_node


def all_reduce_link(cluster: Cluster, num_devices: int) -> Link:
    """A group that fits in one node is placed inside one node."""
    return cluster.node_collective if num_devices <= cluster.devices_per_node else cluster.inter_node


class CostModel:
    """The planner's view of a graph's costs on a cluster, with caches for the DP."""

    def __init__(self, graph: OpGraph, costs: CostTable, cluster: Cluster, global_batch_size: int) -> None:
        self.graph = graph
        self.costs = costs
        self.cluster = cluster
        self.global_batch_size = global_batch_size
        self.device = cluster.device
        self.link = p2p_link(cluster)
        self._by_batch: dict[float, dict[str, tuple[float, float, float]]] = {}
        self._groups: dict[tuple[tuple[str, ...], float], tuple[float, float]] = {}
        self._stages: dict[tuple[tuple[str, ...], int, int], StageCost] = {}
        ref = max(costs.micro_batch_sizes, default=1)
        self.out_bytes_per_sample: dict[str, float] = {}
        self.param_bytes: dict[str, int] = {}
        tied = tied_param_bytes(graph)
        for op in graph.names:
            cost = costs.at(op, ref)
            self.out_bytes_per_sample[op] = cost.output_bytes / ref
            self.param_bytes[op] = cost.param_bytes + tied.get(op, 0)
        # data edges only: a replicated value (an input, a mask, a size) is computed by every stage reading it
        self.preds = {op: graph.data_predecessors(op) for op in graph.names}
        self.succs = {op: graph.data_successors(op) for op in graph.names}
        self._inputs = frozenset(graph.inputs)

    def op_at(self, op: str, batch: float) -> tuple[float, float, float]:
        """(fwd_ms, bwd_ms, act_bytes) of `op` on `batch` samples, cached."""
        return self.ops_at(batch)[op]

    def ops_at(self, batch: float) -> dict[str, tuple[float, float, float]]:
        """(fwd_ms, bwd_ms, act_bytes) of every op on `batch` samples, as one dict made once per batch: the
        loops over a stage's ops read it without building a key per op (a merge stage of a large model sums
        thousands of ops, thousands of times)."""
        table = self._by_batch.get(batch)
        if table is None:
            table = self._by_batch[batch] = {}
            for op in self.graph.names:
                cost = self.costs.at(op, batch)
                table[op] = (cost.fwd_ms, cost.bwd_ms, float(cost.act_bytes))
        return table

    def group_at(self, ops: tuple[str, ...], batch: float) -> tuple[float, float]:
        """(fwd + bwd ms, act bytes) of a group of ops on `batch` samples, summed op by op in their order, cached
        per group: the trees one request searches (its SP tree, its chain, a branch with its join) share their
        leaves, so each leaf is summed once per batch, not once per tree."""
        key = (ops, batch)
        hit = self._groups.get(key)
        if hit is None:
            at = self.ops_at(batch)
            time_ms = act = 0.0
            for op in ops:
                fwd, bwd, act_bytes = at[op]
                time_ms += fwd + bwd
                act += act_bytes
            hit = self._groups[key] = (time_ms, act)
        return hit

    def all_reduce_ms(self, grad_bytes: float, num_devices: int) -> float:
        return ring_all_reduce_ms(all_reduce_link(self.cluster, num_devices), grad_bytes, num_devices)

    def tps_ms(self, compute_ms: float, comm_ms: float, params: float, num_devices: int,
               micro_batch_size: int) -> float:
        """The rule's TPS of a stage from one micro-batch's compute (its ops' fwd + bwd) and p2p time and its
        weights, on `num_devices` devices."""
        return time_per_sample_ms(self.device, compute_ms, comm_ms, self.all_reduce_ms(params, num_devices), params,
                                  micro_batch_size, self.global_batch_size)

    def per_iteration_array(self, params: np.ndarray, num_devices: int,
                            step_ms: np.ndarray | None = None) -> np.ndarray:
        """The rule's once-per-iteration term per sample (all-reduce and optimizer step) of stages with weights
        `params` on `num_devices` devices, for the numpy tables (`step_ms`: the step of `params`, where the caller
        keeps it for every degree)."""
        if step_ms is None:
            step_ms = optimizer_step_ms_array(self.device, params)
        link = all_reduce_link(self.cluster, num_devices)
        return iteration_ms_per_sample_array(ring_all_reduce_ms_array(link, params, num_devices), step_ms,
                                             self.global_batch_size)

    def boundary(self, ops: Iterable[str]) -> tuple[int, float]:
        """(messages, bytes per sample) crossing the boundary of an op set, both directions."""
        return self.crossing(*self.boundary_sides(ops))

    def boundary_sides(self, ops: Iterable[str]) -> tuple[frozenset[str], frozenset[str]]:
        """(received, sent) tensors of an op set: producers outside it read inside, and ops inside read outside."""
        inside = set(ops)
        return (frozenset(p for op in inside for p in self.preds[op] if p not in inside),
                frozenset(op for op in inside if any(s not in inside for s in self.succs[op])))

    def recompute_input_bytes(self, ops: Iterable[str], per_device_batch: float) -> float:
        """What a recomputing stage of `ops` keeps of one micro-batch share of `per_device_batch` samples: the
        values it receives and the model inputs among its ops, as the simulator counts them
        (`graphpipe.stages.recompute.recompute_input_bytes`)."""
        ops = tuple(ops)
        received = sum(self.out_bytes_per_sample[op] for op in self.boundary_sides(ops)[0]) * per_device_batch
        return round(received + sum(self.costs.at(op, per_device_batch).output_bytes
                                    for op in ops if op in self._inputs))

    def crossing(self, recv: frozenset[str], send: frozenset[str]) -> tuple[int, float]:
        """(messages, bytes per sample) of the tensors received and sent."""
        return len(recv) + len(send), sum(self.out_bytes_per_sample[op] for op in recv | send)

    def stage_cost(self, ops: Iterable[str], num_devices: int, micro_batch_size: int,
                   boundary: tuple[int, float] | None = None, params: int | None = None) -> StageCost:
        """The stage of `ops` on `num_devices` devices; `boundary` (messages, bytes per sample) and `params`
        (weight bytes) when the caller has them: they depend on neither the devices nor the micro-batch.
        Cached when the caller has neither: a search costs the stages of each plan it finds, and the plans
        found again by later probes, by the chain pass's ceiling and by the plans' assembly are the same."""
        ops = tuple(ops)
        if boundary is None and params is None:
            key = (ops, num_devices, micro_batch_size)
            hit = self._stages.get(key)
            if hit is None:
                hit = self._stages[key] = self._stage_cost(ops, num_devices, micro_batch_size, None, None)
            return hit
        return self._stage_cost(ops, num_devices, micro_batch_size, boundary, params)

    def _stage_cost(self, ops: tuple[str, ...], num_devices: int, micro_batch_size: int,
                    boundary: tuple[int, float] | None, params: int | None) -> StageCost:
        per_device = micro_batch_size / num_devices
        at = self.ops_at(per_device)
        fwd = bwd = act = 0.0
        for op in ops:
            f, b, a = at[op]
            fwd, bwd, act = fwd + f, bwd + b, act + a
        if params is None:
            params = sum(self.param_bytes[op] for op in ops)
        messages, bytes_per_sample = self.boundary(ops) if boundary is None else boundary
        comm = p2p_ms(self.link, messages, bytes_per_sample * per_device)
        reduce_ms = self.all_reduce_ms(params, num_devices)
        device = self.device
        tps = time_per_sample_ms(device, fwd + bwd, comm, reduce_ms, params, micro_batch_size, self.global_batch_size)
        fwd_extra, bwd_extra = action_overheads_ms(device)
        return StageCost(fwd_ms=fwd + fwd_extra, bwd_ms=bwd + bwd_extra, comm_ms=comm, all_reduce_ms=reduce_ms,
                         step_ms=optimizer_step_ms(device, params), tps_ms=tps, param_bytes=params,
                         act_bytes=round(act))


def tied_param_bytes(graph: OpGraph) -> dict[str, int]:
    """Bytes of the trainable parameters each op reads but another op owns (tied weights). A stage holding
    such a reader holds a copy (weights, gradient, optimizer state) and all-reduces its gradient, so the
    planner counts the copy with every reader: exact when the readers are in different stages, an
    overestimate when two share one."""
    extra: dict[str, int] = {}
    for op in graph.ops:
        for param in op.params:
            if not param.is_buffer:
                for reader in param.shared_with:
                    extra[reader] = extra.get(reader, 0) + param.num_bytes
    return extra
