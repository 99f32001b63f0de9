"""Exhaustive optimum over partitions of small graphs (a test oracle; about 10 units at most).

Units: the ops the planners cut between, here every op but the model inputs, which ride with their
first reader (`reference_dp.topological_chain`). Spaces, each with every device assignment:

- `all_convex_partitions`: EVERY partition of the units into convex blocks (no data path leaves a
  block and comes back), at most N blocks; the blocks' graph may still have a cycle
  (`dag_counts` says None);
- `Expressible`: the partitions graphpipe's DP can express (the space of `reference_dp`'s
  docstring), enumerated rule by rule without costs or devices: `graph_space`, the SP-aligned stage
  graphs, and `chain_space`, the cuts of the units' topological order into runs; the test checks
  that each is convex with an acyclic stage graph, and that the planner's answer is one of them.

Evaluation from scratch, per partition: in-flight counts by the rule of docs/method.md §3 (a sink
holds 1, any other stage 1 + the most any successor holds) on the stage graph of its data edges
(`dag_counts`), or, for a chain plan, on the chain a sequential pipeline runs (`chain_counts`:
graphpipe joins consecutive stages of a chain plan by ordering edges, so stage i of k holds k - i
even where no tensor passes); then the device assignment (each d dividing b, sum at most N, every
stage within the memory limit) that minimises the largest TPS, by a knapsack over the stages
(`best_bottleneck`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Sequence

from graphpipe.graph.op_graph import OpGraph
from tests.planner.random_sp_graphs import Block, Chain, Leaf
from tests.planner.reference_dp import MAX_ENUMERATED, StageModel, topological_chain

Partition = frozenset[frozenset[str]]
Parts = tuple[frozenset[str], ...]  # the stages of part of a graph


# ---- every convex partition -----------------------------------------------------------------------
def all_convex_partitions(graph: OpGraph, max_blocks: int) -> Iterator[Partition]:
    """Units in topological order each join an open block or start one; a unit may join block S only if no
    unit outside S lies on a path from S to it (every such unit comes earlier, so the test is final)."""
    units = [frozenset(leaf.ops) for leaf in topological_chain(graph).items]
    unit_of = {op: pos for pos, unit in enumerate(units) for op in unit}
    below = [0] * len(units)  # bitset of strict ancestors
    for pos, unit in enumerate(units):
        for op in unit:
            for src in graph.op(op).inputs:
                if not graph.op(src).replicated and unit_of[src] != pos:
                    below[pos] |= below[unit_of[src]] | 1 << unit_of[src]
    above = [0] * len(units)  # bitset of strict descendants
    for pos in range(len(units)):
        for anc in range(pos):
            if below[pos] >> anc & 1:
                above[anc] |= 1 << pos

    def grow(pos: int, blocks: list[int], reach: list[int]) -> Iterator[Partition]:
        if pos == len(units):
            yield frozenset(frozenset(op for u in range(len(units)) if bits >> u & 1 for op in units[u])
                            for bits in blocks)
            return
        for idx, (bits, seen) in enumerate(zip(blocks, reach)):
            if not seen & below[pos] & ~bits:  # no unit outside the block lies between it and `pos`
                blocks[idx], reach[idx] = bits | 1 << pos, seen | above[pos]
                yield from grow(pos + 1, blocks, reach)
                blocks[idx], reach[idx] = bits, seen
        if len(blocks) < max_blocks:
            yield from grow(pos + 1, [*blocks, 1 << pos], [*reach, above[pos]])

    yield from grow(0, [], [])


# ---- the partitions the DP can express ------------------------------------------------------------
class Expressible:
    """Enumerates the space of `reference_dp` rule by rule: each rule lists the stagings (tuples of stages)
    of part of a chain, memoised by content (a block by identity, a leaf by its ops)."""

    def __init__(self, graph: OpGraph, weight: dict[str, float]) -> None:
        self.graph, self.weight = graph, weight
        self.memo: dict[tuple, list[Parts]] = {}

    def graph_space(self, tree: Chain) -> set[Partition]:
        """The SP-aligned stage graphs of `tree` (the graph's SP tree)."""
        return {frozenset(parts) for parts in self.chain(tree, 0, len(tree.items))}

    def chain_space(self) -> set[Parts]:
        """The chain plans: runs of the units in topological order, first stage first."""
        linear = topological_chain(self.graph)
        return set(self.chain(linear, 0, len(linear.items)))

    def chain(self, c: Chain, i: int, e: int) -> list[Parts]:
        """Stagings of items [i, e) of chain c."""
        key = (tuple(item.ops if isinstance(item, Leaf) else id(item) for item in c.items), i, e)
        if key not in self.memo:
            self.memo[key] = list(self._chain(c, i, e))
        return self.memo[key]

    def _chain(self, c: Chain, i: int, e: int) -> Iterator[Parts]:
        if i == e:
            yield ()
            return
        for j in range(i + 1, e + 1):  # a run of items as one stage
            for rest in self.chain(c, j, e):
                yield (_ops(c.items[i:j]), *rest)
        item = c.items[i]
        if isinstance(item, Block):  # the block opened
            yield from _then(self.block(item, range(len(item.branches))), lambda: self.chain(c, i + 1, e))
        pos = next((p for p in range(i, len(c.items)) if isinstance(c.items[p], Block)), len(c.items))
        block = c.items[pos] if pos < len(c.items) else None
        if isinstance(item, Block) and len(item.branches) > MAX_ENUMERATED:  # J's stage with the lightest branches
            stop = next((s for s in range(i + 1, len(c.items)) if isinstance(c.items[s], Block)), len(c.items))
            if i + 1 < stop <= e:
                yield from _then(self.joined(item, _ops(c.items[i + 1 : stop])), lambda: self.chain(c, stop, e))
        if not isinstance(block, Block) or len(block.branches) > MAX_ENUMERATED:
            return
        stop = next((s for s in range(pos + 1, len(c.items)) if isinstance(c.items[s], Block)), len(c.items))
        fork, join = _ops(c.items[i:pos]), _ops(c.items[pos + 1 : stop])
        if fork and pos < e:  # F absorbed
            yield from _then(self.absorbed(fork, block, frozenset()), lambda: self.chain(c, pos + 1, e))
        if join and stop <= e:  # J absorbed, with F when there is one
            yield from _then(self.absorbed(fork, block, join), lambda: self.chain(c, stop, e))

    def sorted_branches(self, block: Block, branches: Iterable[int]) -> list[int]:
        """By descending compute, ties in the branches' order."""
        weights = {r: sum(self.weight[op] for op in block.branches[r].ops) for r in branches}
        return sorted(weights, key=lambda r: -weights[r])

    def joined(self, block: Block, join: frozenset[str]) -> Iterator[Parts]:
        """J's stage with the last g sorted branches (1 <= g < all), the others grouped before it."""
        order = self.sorted_branches(block, range(len(block.branches)))
        for cut in range(1, len(order)):
            stage = join | _ops(block.branches[r] for r in order[cut:])
            yield from ((stage, *parts) for parts in self.block(block, order[:cut]))

    def block(self, block: Block, branches: Iterable[int]) -> Iterator[Parts]:
        """Groupings of `branches`: every set partition up to 4 branches, else runs of the sorted order."""
        branches = list(branches)
        if len(block.branches) > MAX_ENUMERATED:
            order = self.sorted_branches(block, branches)
            groupings: Iterable[list[list[int]]] = (
                [order[a:b] for a, b in itertools.pairwise((0, *cuts, len(order)))]
                for size in range(len(order)) for cuts in itertools.combinations(range(1, len(order)), size))
        else:
            groupings = _set_partitions(branches)
        for grouping in groupings:
            yield from _products([self.chain(block.branches[g[0]], 0, len(block.branches[g[0]].items)) if len(g) == 1
                                  else [(_ops(block.branches[r] for r in g),)] for g in grouping])

    def absorbed(self, fork: frozenset[str], block: Block, join: frozenset[str]) -> Iterator[Parts]:
        """F (maybe empty) in the first stage of branch rf, J (maybe empty) in the last of branch rj, the other
        branches grouped; or, for two branches with J, a merge stage of both tails and J."""
        count = len(block.branches)
        lanes = [branch.items for branch in block.branches]
        tail = (Leaf(ops=tuple(sorted(join))),)  # J is one leaf of the extended chain
        for rj in range(count) if join else (None,):
            for rf in range(count) if fork else (None,):
                pieces = [list(self.block(block, (r for r in range(count) if r not in (rf, rj))))]
                if rj is not None and rj != rf:
                    pieces.append(self.chain(Chain(items=lanes[rj] + tail), 0, len(lanes[rj]) + 1))
                if rf is not None:
                    lane = Chain(items=lanes[rf] + (tail if rf == rj else ()))
                    pieces.append(list(self.fork_lane(fork, lane, len(lane.items) - (rf == rj), len(lane.items))))
                yield from _products(pieces)
        if join and count == 2:
            for cuts in itertools.product(range(len(lanes[0])), range(len(lanes[1]))):
                merge = _ops((*lanes[0][cuts[0]:], *lanes[1][cuts[1]:])) | join
                for rf in (0, 1) if fork else (None,):
                    pieces = [[(merge,)]]
                    for r in (0, 1):
                        lane = block.branches[r]
                        pieces.append(list(self.fork_lane(fork, lane, cuts[r], cuts[r])) if r == rf
                                      else self.chain(lane, 0, cuts[r]))
                    yield from _products(pieces)

    def fork_lane(self, fork: frozenset[str], body: Chain, last_cut: int, end: int) -> Iterator[Parts]:
        """F's stage (F and body items [0, cut), cut <= last_cut), then the rest of the lane up to `end`."""
        for cut in range(last_cut + 1):
            for rest in self.chain(body, cut, end):
                yield (fork | _ops(body.items[:cut]), *rest)


def _ops(items: Iterable[Leaf | Block | Chain]) -> frozenset[str]:
    return frozenset(op for item in items for op in item.ops)


def _then(first: Iterable[Parts], rest: Callable[[], Iterable[Parts]]) -> Iterator[Parts]:
    for head in first:
        for tail in rest():
            yield (*head, *tail)


def _products(pieces: Sequence[Sequence[Parts]]) -> Iterator[Parts]:
    for combo in itertools.product(*pieces):
        yield tuple(part for parts in combo for part in parts)


def _set_partitions(items: list[int]) -> Iterator[list[list[int]]]:
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for sub in _set_partitions(rest):
        yield [[first], *sub]
        for idx in range(len(sub)):
            yield [*sub[:idx], [first, *sub[idx]], *sub[idx + 1 :]]


# ---- evaluation ------------------------------------------------------------------------------------
def dag_counts(graph: OpGraph, partition: Partition) -> dict[frozenset[str], int] | None:
    """In-flight micro-batches per stage on the stage graph of the data edges (None: the stages form a cycle)."""
    stage_of = {op: stage for stage in partition for op in stage}
    succ: dict[frozenset[str], set[frozenset[str]]] = {stage: set() for stage in partition}
    for op in graph.ops:
        if not op.replicated:  # a replicated value is computed by every reader: no message, no order
            for reader in graph.successors(op.name):
                if stage_of[reader] != stage_of[op.name]:
                    succ[stage_of[op.name]].add(stage_of[reader])
    counts: dict[frozenset[str], int] = {}
    visiting: set[frozenset[str]] = set()

    def count(stage: frozenset[str]) -> int | None:
        if stage not in counts:
            if stage in visiting:
                return None
            visiting.add(stage)
            below = [count(nxt) for nxt in succ[stage]]
            if any(c is None for c in below):
                return None
            counts[stage] = 1 + max((c for c in below if c is not None), default=0)
        return counts[stage]

    return counts if all(count(stage) is not None for stage in partition) else None


def chain_counts(stages: Parts) -> dict[frozenset[str], int]:
    """In-flight micro-batches of a chain plan: stage i of k holds k - i."""
    return {stage: len(stages) - pos for pos, stage in enumerate(stages)}


def best_bottleneck(model: StageModel, counts: dict[frozenset[str], int], num_devices: int,
                    degrees: Sequence[int]) -> float:
    """The smallest bottleneck TPS of the stages in `counts` (with their in-flight micro-batches) over device
    assignments; inf when none fits."""
    best = {0: 0.0}  # devices used -> smallest bottleneck so far
    for stage, held in counts.items():
        options = [(d, model.tps(stage, d)) for d in degrees if model.memory(stage, d, held) <= model.limit]
        nxt: dict[int, float] = {}
        for used, worst in best.items():
            for d, tps in options:
                if used + d <= num_devices and max(worst, tps) < nxt.get(used + d, math.inf):
                    nxt[used + d] = max(worst, tps)
        best = nxt
    return min(best.values(), default=math.inf)
