"""Hand-built op graphs, cost tables and clusters for planner tests (plain numbers, no torch).

Costs are stored at micro-batch sizes 1, 2, 4 and 8 with a fixed per-op overhead plus a
per-sample part, so that bigger micro-batches are more efficient, as on real devices.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from graphpipe.cost.cluster import Cluster, Device, Link
from graphpipe.cost.cost_table import CostTable, OpCost
from graphpipe.graph.op_graph import OpGraph, OpNode, ParamRef
from graphpipe.graph.tensor_meta import TensorMeta

GiB = 2**30
SIZES = (1, 2, 4, 8)


def make_graph(preds: Mapping[str, Sequence[str]], *, name: str = "test", out_floats: int = 256) -> OpGraph:
    """Ops in the mapping's order (must be topological); ops without inputs are placeholders;
    an `output` op reading every op without successors is appended."""
    consumers = {src for srcs in preds.values() for src in srcs}
    ops = []
    for op_name, srcs in preds.items():
        kind = "call_function" if srcs else "placeholder"
        ops.append(OpNode(name=op_name, kind=kind, target=op_name, inputs=tuple(srcs),
                          outputs=(TensorMeta(shape=(1, out_floats)),),
                          params=(ParamRef(name=f"{op_name}.weight", num_bytes=4096),) if srcs else ()))
    sinks = tuple(n for n in preds if n not in consumers)
    ops.append(OpNode(name="output", kind="output", target="output", inputs=sinks))
    return OpGraph(name=name, ops=tuple(ops), example_batch_size=1)


def chain_graph(num_ops: int) -> OpGraph:
    preds: dict[str, tuple[str, ...]] = {"x": ()}
    prev = "x"
    for idx in range(num_ops):
        preds[f"l{idx}"] = (prev,)
        prev = f"l{idx}"
    return make_graph(preds, name=f"chain{num_ops}")


def branches_graph(num_branches: int, branch_len: int) -> OpGraph:
    """x -> `num_branches` chains of `branch_len` ops -> cat -> head."""
    preds: dict[str, tuple[str, ...]] = {"x": ()}
    ends = []
    for br in range(num_branches):
        prev = "x"
        for idx in range(branch_len):
            preds[f"b{br}_{idx}"] = (prev,)
            prev = f"b{br}_{idx}"
        ends.append(prev)
    preds["cat"] = tuple(ends)
    preds["head"] = ("cat",)
    return make_graph(preds, name=f"branches{num_branches}x{branch_len}")


def make_costs(graph: OpGraph, fwd_ms: Mapping[str, float] | float = 1.0, *, overhead_ms: float = 0.0,
               act_bytes: Mapping[str, int] | int = 1 << 20, param_bytes: Mapping[str, int] | int = 1 << 20,
               output_bytes: int = 1 << 16) -> CostTable:
    """Per-sample costs: fwd = overhead + fwd_ms × batch, bwd = 2 × fwd; placeholders and output are free."""
    def pick(value: Mapping[str, float] | float, op: str) -> float:
        return value[op] if isinstance(value, Mapping) else value

    entries: dict[str, dict[int, OpCost]] = {}
    for op in graph.ops:
        free = op.kind in ("placeholder", "output")
        per = {}
        for size in SIZES:
            fwd = 0.0 if free else overhead_ms + pick(fwd_ms, op.name) * size
            act = 0 if free else int(pick(act_bytes, op.name)) * size
            per[size] = OpCost(fwd_ms=fwd, bwd_ms=2 * fwd, act_bytes=act,
                               output_bytes=0 if op.kind == "output" else output_bytes * size,
                               param_bytes=0 if free else int(pick(param_bytes, op.name)))
        entries[op.name] = per
    return CostTable(device="test", source="analytic", entries=entries)


def make_cluster(num_devices: int, *, devices_per_node: int = 4, memory_bytes: int = 16 * GiB,
                 latency_us: float = 0.0, intra_gb_per_s: float = 100.0, inter_gb_per_s: float = 10.0) -> Cluster:
    device = Device(name="test-gpu", peak_tflops=100.0, mem_bandwidth_gb_per_s=1000.0, memory_bytes=memory_bytes,
                    kernel_overhead_us=0.0)
    return Cluster(name="test", device=device, num_devices=num_devices, devices_per_node=devices_per_node,
                   intra_node=Link(name="nvlink", latency_us=latency_us, bandwidth_gb_per_s=intra_gb_per_s),
                   inter_node=Link(name="ib", latency_us=latency_us, bandwidth_gb_per_s=inter_gb_per_s))
