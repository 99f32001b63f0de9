"""Assign ranks to stages: a data-parallel group inside one node where possible, and stages
joined by heavy edges in the same node.

Ranks are numbered node by node (see `Cluster`). Stages are placed largest group first;
a group that fits in some node goes to the node (with room) that already holds the most
bytes per sample of its stage-graph neighbours, ties to the lowest node; a group larger
than a node takes whole free nodes first, then whatever is left.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from graphpipe.cost.cluster import Cluster


def place(num_devices_per_stage: Sequence[int], edge_bytes: Mapping[tuple[int, int], float],
          cluster: Cluster) -> tuple[tuple[int, ...], ...]:
    """Ranks of each stage; ranks 0..sum-1 are used, each exactly once."""
    total = sum(num_devices_per_stage)
    per_node = cluster.devices_per_node
    free: list[list[int]] = [list(range(start, min(start + per_node, total))) for start in range(0, total, per_node)]
    neighbours: dict[int, dict[int, float]] = {idx: {} for idx in range(len(num_devices_per_stage))}
    for (src, dst), num_bytes in edge_bytes.items():
        neighbours[src][dst] = neighbours[src].get(dst, 0.0) + num_bytes
        neighbours[dst][src] = neighbours[dst].get(src, 0.0) + num_bytes
    node_of_stage: dict[int, set[int]] = {}
    ranks: dict[int, tuple[int, ...]] = {}
    order = sorted(range(len(num_devices_per_stage)), key=lambda idx: (-num_devices_per_stage[idx], idx))
    for idx in order:
        want = num_devices_per_stage[idx]
        taken = _take(free, want, neighbours[idx], node_of_stage, per_node)
        ranks[idx] = tuple(sorted(taken))
        node_of_stage[idx] = {rank // per_node for rank in taken}
    return tuple(ranks[idx] for idx in range(len(num_devices_per_stage)))


def _take(free: list[list[int]], want: int, neighbours: Mapping[int, float], node_of_stage: Mapping[int, set[int]],
          per_node: int) -> list[int]:
    fitting = [node for node, ranks in enumerate(free) if len(ranks) >= want]
    if fitting:
        near: dict[int, float] = {}  # bytes per sample to the neighbours already placed, per node that holds one
        for other, weight in neighbours.items():
            for held in node_of_stage.get(other, ()):
                near[held] = near.get(held, 0.0) + weight
        # the most bytes to neighbours, then the tightest fit, then the lowest node
        node = min(fitting, key=lambda node: (-near.get(node, 0.0), len(free[node]), node))
        chosen, free[node] = free[node][:want], free[node][want:]
        return chosen
    taken: list[int] = []
    for node in sorted(range(len(free)), key=lambda n: (-len(free[n]), n)):
        grab = min(want - len(taken), len(free[node]))
        taken += free[node][:grab]
        free[node] = free[node][grab:]
        if len(taken) == want:
            break
    return taken
