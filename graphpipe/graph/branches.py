"""Where a graph runs branches in parallel: the chains of ops between a fork and its join.

A *cut op* lies on every path from the inputs to the output (every other live op is its
ancestor or descendant). Between two consecutive cut ops, the remaining ops fall into
weakly connected groups; two or more groups there are parallel branches. A residual edge
that skips ops is not a branch: only chains of ops count. Dead ops (unused tuple items)
are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from graphpipe.graph.op_graph import OpGraph


@dataclass(frozen=True, slots=True, kw_only=True)
class BranchRegion:
    """Parallel chains between `fork` and `join` (None: the model's inputs or its output)."""

    fork: str | None
    join: str | None
    chains: tuple[tuple[str, ...], ...]  # the ops of each branch, in topological order

    @property
    def num_branches(self) -> int:
        return len(self.chains)

    def to_dict(self) -> dict[str, Any]:
        return {"fork": self.fork, "join": self.join, "num_branches": self.num_branches,
                "chain_lengths": [len(chain) for chain in self.chains]}


def find_branches(graph: OpGraph) -> tuple[BranchRegion, ...]:
    """Every region with at least two parallel branches, in topological order."""
    live = _live_ops(graph)
    cuts = _cut_ops(graph, live)
    groups = _components(graph, [name for name in live if name not in cuts])
    by_region: dict[int, list[tuple[str, ...]]] = {}
    cut_positions = sorted(graph.index(name) for name in cuts)
    for group in groups:
        region = sum(1 for pos in cut_positions if pos < graph.index(group[0]))
        by_region.setdefault(region, []).append(group)
    cut_names = [graph.ops[pos].name for pos in cut_positions]
    regions = []
    for region, chains in sorted(by_region.items()):
        if len(chains) > 1:
            fork = cut_names[region - 1] if region > 0 else None
            join = cut_names[region] if region < len(cut_names) else None
            ordered = tuple(sorted(chains, key=lambda chain: graph.index(chain[0])))
            regions.append(BranchRegion(fork=fork, join=join, chains=ordered))
    return tuple(regions)


def max_branches(graph: OpGraph) -> int:
    """The most parallel branches anywhere in the graph (1 for a chain)."""
    return max((region.num_branches for region in find_branches(graph)), default=1)


def _live_ops(graph: OpGraph) -> list[str]:
    """Ops the output depends on, plus the output itself, in topological order; constants
    (get_attr: a parameter or buffer read directly) are sources of no branch and are left out."""
    live = {graph.output}
    for op in reversed(graph.ops):
        if op.name in live:
            live.update(op.inputs)
    return [op.name for op in graph.ops if op.name in live and op.kind != "get_attr"]


def _cut_ops(graph: OpGraph, live: list[str]) -> set[str]:
    bit = {name: 1 << idx for idx, name in enumerate(live)}
    ancestors: dict[str, int] = {}
    for name in live:
        ancestors[name] = 0
        for src in graph.predecessors(name):
            if src in bit:
                ancestors[name] |= ancestors[src] | bit[src]
    descendants = dict.fromkeys(live, 0)
    for name in reversed(live):
        for src in graph.predecessors(name):
            if src in bit:
                descendants[src] |= descendants[name] | bit[name]
    return {name for name in live if (ancestors[name] | descendants[name]).bit_count() == len(live) - 1}


def _components(graph: OpGraph, names: list[str]) -> list[tuple[str, ...]]:
    parent = {name: name for name in names}

    def find(name: str) -> str:
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    for name in names:
        for src in graph.predecessors(name):
            if src in parent:
                parent[find(src)] = find(name)
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(find(name), []).append(name)
    return [tuple(group) for group in groups.values()]
