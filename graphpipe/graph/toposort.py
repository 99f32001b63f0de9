"""Kahn's topological order with a priority: the one order both the SP units and the stages use."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import TypeVar

Node = TypeVar("Node", bound=Hashable)

__all__ = ["priority_topological_order"]


def priority_topological_order(nodes: Sequence[Node], edges: Iterable[tuple[Node, Node]],
                               priority: Callable[[Node], int]) -> list[Node]:
    """Nodes in an order where every edge goes forward, the ready node of lowest priority first.

    On a cycle the nodes on it (and after it) are left out: callers compare lengths.
    """
    succs: dict[Node, list[Node]] = {node: [] for node in nodes}
    indeg = dict.fromkeys(nodes, 0)
    for src, dst in edges:
        succs[src].append(dst)
        indeg[dst] += 1
    ready = [(priority(node), pos, node) for pos, node in enumerate(nodes) if not indeg[node]]
    heapq.heapify(ready)
    position = {node: pos for pos, node in enumerate(nodes)}
    order: list[Node] = []
    while ready:
        _, _, node = heapq.heappop(ready)
        order.append(node)
        for nxt in succs[node]:
            indeg[nxt] -= 1
            if not indeg[nxt]:
                heapq.heappush(ready, (priority(nxt), position[nxt], nxt))
    return order
