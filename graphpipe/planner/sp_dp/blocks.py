"""The DP's shared constants and the fork/join blocks of an SP chain (structure only, no costs).

A *fork/join block* of a chain `... F, P, J ...` is a parallel item P with the run F of leaf
items right before it (from any start) and the whole run J of leaf items right after it; the
DP may stage F with the first stage of one branch and J with the last stage of one branch
(`graphpipe.planner.sp_dp.fork_join`). `fork_join_items` finds a block from its start; the
exhaustive baseline reads the same blocks to enumerate exactly the partitions the DP can make.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np

from graphpipe.graph.sp import SPChain, SPLeaf, SPParallel

BIG = 1 << 40  # an infeasible device count: above any sum of real counts, still a plain int
MAX_ENUMERATED_BRANCHES = 4  # up to this many branches every grouping is tried, above only runs of sorted branches
MERGE_BRANCHES = 2  # merge stages (both branches' tails + J) only in blocks of exactly this many branches


@cache
def merged_runs(size: int) -> np.ndarray:
    """Over a block of size - 1 sorted branches, [g, s] is True where the run [g, s) merges at least two branches
    (s >= g + 2): the runs a block of runs costs as one stage (`runs`). Read only."""
    runs = np.triu(np.ones((size, size), dtype=bool), 2)
    runs.flags.writeable = False
    return runs


@dataclass(frozen=True, slots=True)
class ForkJoin:
    """A parallel block at item `par_pos` of a chain, the fork run from item `start`, the join run up to `stop`."""

    par: SPParallel
    fork: SPLeaf | None  # items [start, par_pos) merged, None when empty
    join: SPLeaf | None  # items [par_pos + 1, stop) merged, None when empty
    start: int
    par_pos: int
    stop: int

    @property
    def fork_ops(self) -> tuple[str, ...]:
        return self.fork.ops if self.fork is not None else ()

    @property
    def join_ops(self) -> tuple[str, ...]:
        return self.join.ops if self.join is not None else ()


def fork_join_items(chain: SPChain, start: int) -> ForkJoin | None:
    """The block whose fork run starts at item `start` (or whose parallel block is item `start`)."""
    items = chain.items
    pos = start
    while pos < len(items) and isinstance(items[pos], SPLeaf):
        pos += 1
    if pos >= len(items):
        return None
    par = items[pos]
    assert isinstance(par, SPParallel)
    stop = pos + 1
    while stop < len(items) and isinstance(items[stop], SPLeaf):
        stop += 1
    fork = SPLeaf(ops=tuple(op for item in items[start:pos] for op in item.ops)) if pos > start else None
    join = SPLeaf(ops=tuple(op for item in items[pos + 1:stop] for op in item.ops)) if stop > pos + 1 else None
    return ForkJoin(par=par, fork=fork, join=join, start=start, par_pos=pos, stop=stop)
