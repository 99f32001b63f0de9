"""A readable account of a captured graph: ops by type, parameters, activations, branches."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

from graphpipe.graph.branches import BranchRegion, find_branches, largest_block
from graphpipe.graph.layers import layer_blocks, layer_unit_count
from graphpipe.graph.op_graph import OpGraph
from graphpipe.graph.sp import sp_decompose, stage_units

COMPUTE_KINDS = ("call_module", "call_function", "call_method")


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphSummary:
    """Sizes are per sample where named so (divided by the example batch size).

    `act_bytes_per_sample` sums the outputs of every compute op, views included: an upper
    bound on what a forward pass holds, not what autograd keeps.
    """

    name: str
    example_batch_size: int
    num_ops: int
    ops_by_type: tuple[tuple[str, int], ...]
    num_params: int
    param_bytes: int
    buffer_bytes: int
    input_bytes_per_sample: float
    act_bytes_per_sample: float
    branches: tuple[BranchRegion, ...]
    num_compute_ops: int = 0  # ops that are not replicated (inputs, parameter reads, sizes, masks)
    largest_block_ops: int = 0  # computing ops that must share one stage (see graph/branches.py)
    # What the planners cut between at each granularity (graph/layers.py): op-level units (ops with the
    # replicated ones riding along and colocation groups joined), and those with each layer block joined.
    num_op_units: int = 0
    num_layer_units: int = 0
    layer_blocks: tuple[tuple[str, int], ...] = ()  # (module class, number of blocks of it)
    capture: str = "fx"  # how the graph was captured (`graphpipe.graph.capture.CAPTURE_METHODS`)

    @property
    def max_branches(self) -> int:
        return max((region.num_branches for region in self.branches), default=1)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "example_batch_size": self.example_batch_size, "num_ops": self.num_ops,
            "ops_by_type": dict(self.ops_by_type), "num_params": self.num_params, "param_bytes": self.param_bytes,
            "buffer_bytes": self.buffer_bytes, "input_bytes_per_sample": self.input_bytes_per_sample,
            "act_bytes_per_sample": self.act_bytes_per_sample, "max_branches": self.max_branches,
            "branches": [region.to_dict() for region in self.branches],
            "num_compute_ops": self.num_compute_ops, "largest_block_ops": self.largest_block_ops,
            "units": {"op": self.num_op_units, "layer": self.num_layer_units},
            "layer_blocks": dict(self.layer_blocks), "capture": self.capture,
        }


def summarize(graph: OpGraph) -> GraphSummary:
    batch = graph.example_batch_size
    units = stage_units(graph)
    tree = sp_decompose(graph, units)
    blocks = layer_blocks(graph, units, tree)
    params = [param for op in graph.ops for param in op.params]
    counts = Counter(op.module_type or op.kind for op in graph.ops)
    return GraphSummary(
        name=graph.name, example_batch_size=batch, num_ops=len(graph.ops), capture=graph.capture,
        ops_by_type=tuple(sorted(counts.items(), key=lambda item: (-item[1], item[0]))),
        num_params=sum(math.prod(param.shape) for param in params if not param.is_buffer),
        param_bytes=sum(param.num_bytes for param in params if not param.is_buffer),
        buffer_bytes=sum(param.num_bytes for param in params if param.is_buffer),
        input_bytes_per_sample=sum(graph.op(name).output_bytes for name in graph.inputs) / batch,
        act_bytes_per_sample=sum(op.output_bytes for op in graph.ops if op.kind in COMPUTE_KINDS) / batch,
        branches=find_branches(graph, tree), num_compute_ops=len(graph.ops) - len(graph.replicated),
        largest_block_ops=len(largest_block(graph, tree)), num_op_units=len(units.keys),
        num_layer_units=layer_unit_count(units, blocks),
        layer_blocks=tuple(Counter(block.module_type for block in blocks).most_common()),
    )
