"""Planning granularity: op, layer, or layer refined at the stage boundaries ("auto").

- "op": the planners cut between op-level units (`graphpipe.graph.sp.stage_units`).
- "layer": each layer block (`graphpipe.graph.layers`) is one unit, so the planners search a graph of
  about one unit per layer: far fewer items per chain for the partitioner's DP, far fewer downsets
  for Piper, and plans that never cut inside a layer.
- "auto": plan at layer level, then once more with the blocks around the stage boundaries of that plan
  opened to op level, and keep the better of the two plans. The blocks opened are those with an op that
  sends to or receives from another stage (`boundary_blocks`), next to the slowest stages first, and at
  most a quarter of all blocks (at least MIN_OPENED). The second search can move those boundaries
  anywhere inside the blocks around them, where cutting a layer balances the stages better, and still
  sees the rest of the graph at layer level; its space holds the first plan, and the better one is
  kept, so "auto" is never worse than "layer" on the ranking's own measure. Why the cap: a deep chain
  cut into stages of one or two layers has every block at a boundary, and opening them all is the
  op-level search again (mmt 4x32 at 1024 devices: 6-9 s at layer level, 75 s more to refine them all);
  with a quarter, the refined graph has at most about 2.75 times the units of the layer level (8 units a
  layer), and it lost little of the gain (mmt at 32 devices: 1672 samples/s, against 1680 with every
  boundary block open, 1613 at layer level and 1678 at op level; `docs/architecture.md`). One round
  only: a second would mostly reopen the blocks the first placed.
"""

from __future__ import annotations

import math

from graphpipe.errors import PlanningError
from graphpipe.graph.layers import LayerBlock, layer_blocks
from graphpipe.graph.op_graph import OpGraph
from graphpipe.stages.stage_graph import Plan

GRANULARITIES = ("op", "layer", "auto")
MIN_OPENED = 8  # "auto" may open this many blocks however few the model has (a quarter of them otherwise)


def check_granularity(granularity: str) -> None:
    if granularity not in GRANULARITIES:
        raise PlanningError(f"unknown granularity {granularity!r}; choose one of {', '.join(GRANULARITIES)}")


def refine_limit(num_blocks: int) -> int:
    """How many layer blocks "auto" opens at most: a quarter of them, at least MIN_OPENED."""
    return max(MIN_OPENED, math.ceil(num_blocks / 4))


def boundary_blocks(graph: OpGraph, plan: Plan, blocks: tuple[LayerBlock, ...] | None = None,
                    limit: int | None = None) -> frozenset[str]:
    """Paths of the layer blocks with an op whose value crosses a stage boundary of `plan`, either way
    (data edges only: replicated values are computed where they are read): the blocks in which moving a
    boundary could balance the two stages; every other block is interior to its stage. With `limit`, at
    most that many, those next to the slowest stages first (the TPS of the slower of the two stages)."""
    blocks = blocks if blocks is not None else layer_blocks(graph)
    block_of = {op: block.path for block in blocks for op in block.ops}
    stage_of = {op: stage.idx for stage in plan.stages for op in stage.ops}
    tps = {stage.idx: stage.tps_ms for stage in plan.stages}
    touched: dict[str, float] = {}
    for src, dst in graph.data_edges():
        if stage_of[src] != stage_of[dst]:
            slower = max(tps[stage_of[src]], tps[stage_of[dst]])
            for path in (block_of.get(src), block_of.get(dst)):
                if path is not None:
                    touched[path] = max(touched.get(path, 0.0), slower)
    position = {block.path: idx for idx, block in enumerate(blocks)}
    ranked = sorted(touched, key=lambda path: (-touched[path], position[path]))
    return frozenset(ranked if limit is None else ranked[:limit])
