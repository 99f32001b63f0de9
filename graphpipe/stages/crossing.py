"""The tensors that cross between stages: the edges of a stage graph, whoever made the stages."""

from __future__ import annotations

from collections.abc import Mapping

from graphpipe.graph.op_graph import OpGraph


def crossing_tensors(graph: OpGraph, stage_of: Mapping[str, int]) -> dict[tuple[int, int], tuple[str, ...]]:
    """(src stage, dst stage) -> producer ops whose outputs cross, in topological order."""
    found: dict[tuple[int, int], dict[str, None]] = {}
    for src, dst in graph.data_edges():
        a, b = stage_of[src], stage_of[dst]
        if a != b:
            found.setdefault((a, b), {})[src] = None
    return {key: tuple(sorted(names, key=graph.index)) for key, names in found.items()}
