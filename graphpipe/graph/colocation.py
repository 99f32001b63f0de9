"""Ops that must share a stage, as convex groups: the planner's constraints from the runtime's rules.

Two rules, over the ops that are not replicated (`graphpipe.graph.replication`):

- a value that cannot be sent (not one tensor, or no batch as its first dimension: a tuple
  before its `getitem`s, a `[1, heads, q, k]` position bias made from a parameter) stays
  with every op that reads it;
- an op with no data edge at all (an in-place update of a buffer, such as a step counter)
  runs with the model output;
- an in-place op on a computed tensor stays with the views it writes through and with every
  later reader of that tensor (`graphpipe.graph.mutation`).

Ops that read the same trainable parameter (tied embeddings) may sit in different stages: each
holds a copy and the runtime sums the gradient (`graphpipe.runtime.shared_grads`).

A stage is convex, so each group is closed under "every op on a path between two members"
(its convex hull); groups that overlap are merged, until nothing changes. Contracting each
group to one node leaves a DAG, which is what the SP decomposition needs.
"""

from __future__ import annotations

from collections.abc import Callable

from graphpipe.graph.mutation import views_of
from graphpipe.graph.op_graph import FREE_KINDS, OpGraph
from graphpipe.graph.replication import is_mutating, op_base_name, op_changes

__all__ = ["colocation_groups"]


def colocation_groups(graph: OpGraph) -> list[tuple[str, ...]]:
    """Groups of two or more ops that must share a stage, each convex, in topological order."""
    names = [op.name for op in graph.ops if not op.replicated]
    parent = {name: name for name in names}

    def find(name: str) -> str:
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    def union(a: str, b: str) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb, key=graph.index)] = min(ra, rb, key=graph.index)

    for a, b in _required_pairs(graph, names):
        union(a, b)
    pos = {name: idx for idx, name in enumerate(names)}
    below = _reach(graph, names, pos, forward=True)
    above = _reach(graph, names, pos, forward=False)
    while _close_hulls(names, pos, (below, above), find, union):
        pass
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(find(name), []).append(name)
    return [tuple(group) for group in groups.values() if len(group) > 1]


def _required_pairs(graph: OpGraph, names: list[str]) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    for name in names:
        op = graph.op(name)
        if op.kind != "output" and not op.can_cross:
            pairs += [(name, reader) for reader in graph.data_successors(name)]
        if op.kind != "output" and not graph.data_predecessors(name) and not graph.data_successors(name):
            pairs.append((name, graph.output))
    return pairs + _write_pairs(graph)


def _write_pairs(graph: OpGraph) -> list[tuple[str, str]]:
    """An in-place op on a computed tensor that is not replicated, with the views it writes through and
    with every later op that reads the tensor or a view of it other than through the op itself (those read
    its value along a data edge: `relu_`'s next layer may sit in another stage; `graphpipe.graph.mutation`)."""
    ops = graph.ops
    changes = {op: chain for op, chain in op_changes(ops).items() if not graph.op(op).replicated
               and graph.op(chain[-1]).kind not in FREE_KINDS}
    if not changes:
        return []
    first_readers: dict[str, list[str]] = {}
    for op in ops:
        if op.inputs:
            first_readers.setdefault(op.inputs[0], []).append(op.name)
    pairs: list[tuple[str, str]] = []
    for writer, chain in changes.items():
        pairs += [(writer, view) for view in chain if not graph.op(view).replicated]
        aliases = views_of((chain[-1],), first_readers, lambda name: op_base_name(graph.op(name)),
                           lambda name: is_mutating(graph.op(name)), skip=writer)  # its own readers have a data
        # edge from it
        later = {reader for alias in aliases for reader in graph.successors(alias)
                 if graph.index(reader) > graph.index(writer) and not graph.op(reader).replicated}
        pairs += [(writer, reader) for reader in sorted(later, key=graph.index)]
    return pairs


def _close_hulls(names: list[str], pos: dict[str, int], reach: tuple[dict[str, int], dict[str, int]],
                 find: Callable[[str], str], union: Callable[[str, str], None]) -> bool:
    """Add every op on a path between two members of a group to it (`reach`: each op's descendants and
    ancestors as bitsets over `names`, `_reach`); True when something changed. Reads each group's members
    only: a graph with a small group in every layer costs what its groups hold, not groups times ops."""
    below, above = reach
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(find(name), []).append(name)
    changed = False
    for root, group in groups.items():
        if len(group) < 2:
            continue
        mask = 0
        for name in group:
            mask |= 1 << pos[name]
        down = up = mask
        for name in group:
            down |= below[name]
            up |= above[name]
        extra = (down & up) & ~mask
        while extra:
            low = extra & -extra
            union(root, names[low.bit_length() - 1])
            extra ^= low
            changed = True
    return changed


def _reach(graph: OpGraph, names: list[str], pos: dict[str, int], *, forward: bool) -> dict[str, int]:
    """Bitsets of the ops reachable from each op along data edges (descendants, or ancestors)."""
    reach: dict[str, int] = {}
    for name in (reversed(names) if forward else names):
        nexts = graph.data_successors(name) if forward else graph.data_predecessors(name)
        mask = 0
        for other in nexts:
            mask |= reach[other] | 1 << pos[other]
        reach[name] = mask
    return reach
