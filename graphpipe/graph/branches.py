"""Where a graph runs branches in parallel, read off its SP tree (`graphpipe.graph.sp`).

Every parallel block of the tree, nested ones included, is a region: its branches are the
chains of ops between a fork (the op before the block in its chain, or None: the model's
inputs) and a join (the op after it, or None: the output). Only ops that compute count:
replicated values (inputs, sizes, masks, parameter reads) ride along and join nothing, and
dead ops are gone at capture. The *largest block* is the biggest group of ops that must share
a stage (a non-SP core, or ops tied by a shared weight or a value that cannot be sent): when it
holds most of the model, graph pipelining cannot help it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from graphpipe.graph.op_graph import OpGraph
from graphpipe.graph.sp import SPChain, SPLeaf, SPParallel, iter_chains, sp_decompose


@dataclass(frozen=True, slots=True, kw_only=True)
class BranchRegion:
    """Parallel chains between `fork` and `join` (None: the model's inputs or its output)."""

    fork: str | None
    join: str | None
    chains: tuple[tuple[str, ...], ...]  # the computing ops of each branch, in topological order

    @property
    def num_branches(self) -> int:
        return len(self.chains)

    def to_dict(self) -> dict[str, Any]:
        return {"fork": self.fork, "join": self.join, "num_branches": self.num_branches,
                "chain_lengths": [len(chain) for chain in self.chains]}


def find_branches(graph: OpGraph, tree: SPChain | None = None) -> tuple[BranchRegion, ...]:
    """Every region with at least two parallel branches, in topological order of its first op."""
    tree = tree if tree is not None else sp_decompose(graph)
    regions = []
    for chain in iter_chains(tree):
        for pos, item in enumerate(chain.items):
            if not isinstance(item, SPParallel):
                continue
            chains = tuple(_computing(graph, branch.ops) for branch in item.branches)
            chains = tuple(ops for ops in chains if ops)
            if len(chains) < 2:
                continue
            fork = _edge_op(graph, chain.items[pos - 1].ops, last=True) if pos > 0 else None
            join = _edge_op(graph, chain.items[pos + 1].ops, last=False) if pos + 1 < len(chain.items) else None
            regions.append(BranchRegion(fork=fork, join=join, chains=chains))
    return tuple(sorted(regions, key=lambda region: graph.index(region.chains[0][0])))


def max_branches(graph: OpGraph) -> int:
    """The most parallel branches anywhere in the graph (1 for a chain)."""
    return max((region.num_branches for region in find_branches(graph)), default=1)


def largest_block(graph: OpGraph, tree: SPChain | None = None) -> tuple[str, ...]:
    """The computing ops of the biggest leaf of the SP tree: ops that always share one stage."""
    tree = tree if tree is not None else sp_decompose(graph)
    leaves = [item for chain in iter_chains(tree) for item in chain.items if isinstance(item, SPLeaf)]
    return max((_computing(graph, leaf.ops) for leaf in leaves), key=len, default=())


def _computing(graph: OpGraph, ops: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(name for name in ops if not graph.op(name).replicated and graph.op(name).kind != "output")


def _edge_op(graph: OpGraph, ops: tuple[str, ...], *, last: bool) -> str | None:
    computing = _computing(graph, ops) or tuple(name for name in ops if not graph.op(name).replicated)
    if not computing:
        return None
    return max(computing, key=graph.index) if last else min(computing, key=graph.index)
