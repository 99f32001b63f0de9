"""The GraphPipe partitioner (PAPER.md §4): binary search on a TPS target over a DP on the SP tree.

For one micro-batch size b, a probe with target T asks: is there a stage graph with every
stage's TPS <= T that fits in memory on the devices, and which one has the fewest
in-flight samples at its source? The DP answers per SP node with a *need vector*:

    need[v] = fewest devices with which the node can be staged so that its entry stages
              hold at most v micro-batches in flight (v = in-flight samples / b)

given the in-flight count `k_after` of what follows the node. Vectors are non-increasing
in v; combining two parts is adding their vectors, so device splits d = d1 + d2 cost O(v).

- Chain (series case), solved from the sink backwards, so downstream in-flight counts
  are known when an upstream stage's memory is checked. A suffix starting at item i either
  starts with a segment [i, j) of items as one stage on d1 devices (d1 divides b: every
  device gets whole samples), whose in-flight count is one more than what follows, or,
  when item i is a parallel block, opens it: the block is solved given the in-flight count
  of the rest of the chain. Any op boundary of a chain can be cut, in O(L^2) per chain of
  L items (segment costs are prefix sums, tabulated per micro-batch size for all segments
  and degrees at once; a probe reads only the segments that fit in memory with TPS within T,
  kept sorted by TPS per start, less the degrees a smaller degree of the same segment
  dominates at T: see `graphpipe.planner.size_tables`).
- Parallel block: its branches are grouped; a group is one branch solved as a chain, or
  several whole branches merged into one stage. The fork's stage takes the larger of the
  branches' in-flight requirements (the max over entries). With up to 4 branches every
  grouping is tried; with more, the branches are sorted by compute and groups are runs of
  consecutive branches (interval partitions), which keeps the DP polynomial.

- Fork and join absorption (`graphpipe.planner.fork_join`): the leaves just before a block
  with at most 4 branches may join the first stage of one branch, and the leaves just after
  it the last stage of one branch, so a cheap input or concat + head costs no device.

Cost of a probe, with n ops, V = devices + 2 in-flight values and D degrees. Every sub-problem
is memoised in the probe by what its answer depends on: a chain suffix by (chain, k_after, end),
a parallel block by (block, k_after), a fork/join block by (its parallel block, the ops of its
fork and join runs, with or without J, k_after), never by the chain it was met in. The chains
solved are the SP tree's, their prefixes cut at merge tails, and the branches with a join run
appended (B_r + [J]); a fork's lane [F] + B_r is never solved itself, only B_r behind F's stage.
So a fork run never travels into the blocks nested inside the branch, and a join run only into
the last block of a branch: a block at nesting depth t has at most f + 1 fork runs (f the
leaves right before it in its own chain) and t + 1 join runs (its own, or merged with those of
the blocks around it). Keyed by chain, with fork lanes solved whole, every extended chain had
re-solved the blocks inside it with new fork and join runs: about 3x the chain tables and
solves per level of nesting, 3-5x the time. Every block content is solved once per k_after and
with or without J: its c^2 + c layouts cost O(V) each, plus O(L·D·V) for F's stage (L the
items of F's lane) in the few layouts that pass an O(V) floor test (`fork_join._fork_stage`),
plus O(L0·L1·(D + V)) for the merge tails of a two-branch block; every chain of L items costs
O(L^2·D·V) at most. Summed over the tree this is polynomial in n, and at a fixed op count it
grows about linearly, not exponentially, with the nesting depth
(`tests/planner/test_nested_branches.py` counts the memo entries and chain tables;
`benchmarks/nested_branches` times it).

The stage graphs this DP can produce are those whose stages are runs of items of one SP
chain (or of an extended chain of fork/join absorption) or unions of whole branches of one
parallel block ("SP-aligned" partitions); the exhaustive baseline checks optimality over
exactly that space (`sp_aligned=True`). The search on T keeps an interval [lo, hi]: lo from
`Search.lower_bound_ms` and failed probes, hi the bottleneck of the best plan found, and stops
when it is below 1e-3 relative. Where hi is likely close to the optimum (a guess from another
micro-batch size, or a coarser search before), it probes just below hi first and widens the
step while probes succeed, so a good guess costs two or three probes instead of a dozen of
bisection; otherwise it bisects. Uniform micro-batch size and 1F1B (in-flight = v · b);
per-stage sizes are a refinement (`graphpipe.planner.per_stage`). Sizes and pruning across
sizes: see `partition_sp`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from weakref import WeakKeyDictionary

import numpy as np

from graphpipe.graph.sp import SPChain, SPParallel
from graphpipe.planner.chain_info import ChainInfo
from graphpipe.planner.memory import OPTIMIZER_STATE_FACTOR
from graphpipe.planner.probe import MAX_ENUMERATED_BRANCHES, ParInfo, Probe, SegmentOffers, divisors_up_to
from graphpipe.planner.size_tables import ChainConstants, SizeTables
from graphpipe.planner.stage_cost import CostModel
from graphpipe.planner.stage_spec import StageSpec

__all__ = ["MAX_ENUMERATED_BRANCHES", "TOLERANCE", "Search", "divisors_up_to", "partition_sp"]

TOLERANCE = 1e-3
COARSE_TOLERANCE = 5e-2
COARSE_KEEP = 1.05
FIRST_GUESS = 1.6  # optimum / lower bound is 1.2-1.6 on most of the paper's configurations, up to 2.8


_LOWER_BOUNDS: WeakKeyDictionary[CostModel, dict[tuple[int, int, frozenset[str]], float]] = WeakKeyDictionary()
_OP_COLUMNS: WeakKeyDictionary[CostModel, dict[tuple[tuple[str, ...], float], tuple[np.ndarray, np.ndarray]]] = (
    WeakKeyDictionary())


def op_columns(model: CostModel, ops: tuple[str, ...], per_device_batch: float) -> tuple[np.ndarray, np.ndarray]:
    """(fwd + bwd ms, activation bytes) of each op at `per_device_batch` samples, cached per model: every size's
    lower bound and fit test read them on each of its degrees, and sizes share per-device batches."""
    table = _OP_COLUMNS.setdefault(model, {})
    key = (ops, per_device_batch)
    hit = table.get(key)
    if hit is None:
        rows = [model.op_at(op, per_device_batch) for op in ops]
        hit = table[key] = (np.array([sum(row[:2]) for row in rows], dtype=float),
                            np.array([row[2] for row in rows], dtype=float))
    return hit


def _running_sum(values: np.ndarray) -> float:
    """0.0 + values[0] + values[1] + ... added in this order, as a Python loop would (`add.accumulate` is
    sequential, unlike `sum`'s pairwise summation), so the bounds are the same floats."""
    return float(np.add.accumulate(np.concatenate(([0.0], values)))[-1])


class Search(SizeTables):
    """Binary search on the TPS target for one micro-batch size, over that size's tables (shared by its probes)."""

    def __init__(self, model: CostModel, tree: SPChain, num_devices: int, micro_batch_size: int,
                 memory_limit: float, infos: dict[int, ChainInfo], pars: dict[int, ParInfo],
                 constants: dict[int, ChainConstants] | None = None) -> None:
        super().__init__(model, num_devices, micro_batch_size, memory_limit, infos, pars, constants)
        self.tree = tree
        self._offers: dict[int, SegmentOffers] = {}
        self.best: list[StageSpec] = []
        self.lo = self.hi = 0.0
        self.window_top = 0.0  # the largest target the search expects to probe (`offers` builds up to it)
        self._lower_bound: float | None = None

    def offers(self, info: ChainInfo, target_ms: float) -> SegmentOffers:
        """The chain's (segment, degree) offers that `Probe._segment_keys` may need at `target_ms`.

        Built for a window of targets and reused while the targets stay in it: the binary search's
        interval once its lower end is known (`start`), which later probes never leave, else only this
        target (a lone chain-ceiling probe); rebuilt when a target falls outside."""
        hit = self._offers.get(id(info))
        if hit is None or not hit.low <= target_ms <= hit.bound:
            top = max(target_ms, self.hi, self.window_top)
            low, bound = (self.lo, top) if 0 < self.lo <= target_ms else (target_ms, target_ms)
            hit = self._offers[id(info)] = self._build_offers(info, low, bound)
        return hit

    def probe(self, target_ms: float) -> list[StageSpec] | None:
        probe = Probe(self, target_ms)
        v = probe.best_entry(self.tree)
        return None if v is None else probe.stages(self.tree, v)

    def bottleneck_ms(self, stages: Sequence[StageSpec]) -> float:
        return max(self.model.stage_cost(st.ops, st.num_devices, st.micro_batch_size).tps_ms for st in stages)

    def lower_bound_ms(self) -> float:
        """No plan beats this (cached): every op's compute on its cheapest data-parallel degree spread over all
        devices, and no less than the costliest op alone on the widest degree (an op is never split)."""
        if self._lower_bound is None:
            shared = _LOWER_BOUNDS.setdefault(self.model, {})  # the graph-pipeline and chain searches share it
            key = (self.micro_batch_size, self.num_devices, frozenset(self.tree.ops))
            if key not in shared:
                b, widest, ops = self.micro_batch_size, self.degrees[-1], self.tree.ops
                cheapest = np.minimum.reduce([op_columns(self.model, ops, b / d)[0] * d for d in self.degrees])
                costliest = max(0.0, float(np.max(op_columns(self.model, ops, b / widest)[0], initial=0.0)))
                shared[key] = max(_running_sum(cheapest) / self.num_devices, costliest) / b
            self._lower_bound = shared[key]
        return self._lower_bound

    def may_fit(self) -> bool:
        """False when no plan at this size can fit, whatever its TPS: every device holds its stage's weights,
        gradients and Adam state and at least one micro-batch's activations (split d ways on d devices), so
        all devices together hold at least 4 x all the weights plus every op's activations on its cheapest
        degree. Saves the probes that would find out (the largest sizes on few devices)."""
        b, ops, params = self.micro_batch_size, self.tree.ops, 0.0
        for op in ops:
            params += self.model.param_bytes[op]
        acts = _running_sum(np.minimum.reduce([op_columns(self.model, ops, b / d)[1] * d for d in self.degrees]))
        return OPTIMIZER_STATE_FACTOR * params + acts <= self.memory_limit * self.num_devices

    def attempt(self, target_ms: float) -> bool:
        """One probe; moves `hi` down to the plan found, or `lo` up to the target."""
        found = self.probe(target_ms)
        if found is None:
            self.lo = max(self.lo, target_ms)
            return False
        self.best, self.hi = found, min(target_ms, self.bottleneck_ms(found))
        return True

    def start(self, guess_ms: float | None = None, tolerance: float = COARSE_TOLERANCE) -> bool:
        """First feasible plan (False: none at this size). The guess (from another size, else FIRST_GUESS
        times the lower bound) is probed, then above it by steps growing from `tolerance` fourfold, and
        last with no TPS target, which tells whether the size has a plan at all. A close guess brackets
        the optimum in about two probes; a low one costs a few failed probes, which are cheap (few
        offers are within a tight target), where a loose one costs a slow first probe."""
        self.lo = self.lower_bound_ms() * (1 - TOLERANCE)  # set first: `offers` then builds for the whole search
        if guess_ms is None:
            guess_ms = self.lower_bound_ms() * FIRST_GUESS
        step, target = tolerance, guess_ms
        self.window_top = guess_ms * (1 + step * 5)  # the first two probes of the walk up
        while step < 1:
            if self.attempt(max(target, self.lo)):
                return True
            target, step = guess_ms * (1 + step), step * 4
        return self.attempt(math.inf)

    def narrow(self, tolerance: float, near_top: bool = True) -> None:
        """Shrink [lo, hi] below `tolerance` relative. When `hi` is likely close to the optimum (`near_top`),
        probe just below it first, with steps growing fourfold while probes succeed: one failed probe
        just below hi ends the search. Never probes below the middle, so it is at worst a bisection
        with a few extra probes."""
        first = 0.95 * tolerance  # a failure there leaves less than `tolerance` to search
        step = first if near_top else 1.0
        while self.hi - self.lo > tolerance * self.hi:
            target = max(self.hi * (1 - step), (self.lo + self.hi) / 2)
            if not self.attempt(target):
                step = 1.0
            elif step < 1 and self.hi < target * (1 - first):
                step = first  # the plan found beats the target by far: start again just below it
            else:
                step *= 4

    def run(self, tolerance: float = TOLERANCE, guess_ms: float | None = None) -> list[StageSpec] | None:
        if not self.start(guess_ms):
            return None
        self.narrow(tolerance, near_top=guess_ms is not None)
        return self.best


def build_tables(model: CostModel, tree: SPChain) -> tuple[dict[int, ChainInfo], dict[int, ParInfo]]:
    """Chain and parallel-block tables, shared by every micro-batch size and probe."""
    from graphpipe.graph.sp import iter_chains

    infos = {id(chain): ChainInfo(model, chain) for chain in iter_chains(tree)}
    pars = {id(item): ParInfo(model, item, infos) for chain in iter_chains(tree) for item in chain.items
            if isinstance(item, SPParallel)}
    return infos, pars


def partition_sp(model: CostModel, tree: SPChain, num_devices: int, micro_batch_sizes: Sequence[int],
                 memory_limit: float, tolerance: float = TOLERANCE,
                 ceiling_ms: float | None = None, every_size: bool = False) -> dict[int, list[list[StageSpec]]]:
    """Best SP-aligned stage graph per micro-batch size, first in each size's list (sizes with no feasible
    plan are left out).

    Sizes are searched from the largest down. A size whose lower bound (`Search.lower_bound_ms`)
    is already more than COARSE_KEEP above the best bottleneck found is skipped: no plan at
    that size could be among the best. Every other size is searched to COARSE_TOLERANCE,
    starting from a guess: the previous size's optimum scaled by the ratio of the two sizes'
    lower bounds (optimum / lower bound varies little between neighbouring sizes). Then, best
    first, each size whose proven lower bound is below the best bottleneck found so far is
    narrowed to `tolerance` (the others cannot hold the optimum, and their plans are still
    within COARSE_TOLERANCE of their own). With `every_size` (for a ranking that looks beyond
    TPS, such as `gp.plan`'s by simulation), every size is narrowed to `tolerance`, and each
    size's list also holds, when they differ, the plan the coarse search had found and the plan
    of a probe COARSE_TOLERANCE above the best bottleneck: the DP returns the plan with the
    fewest micro-batches in flight at the source within the target, so a slightly looser target
    often gives a shallower graph with less warm-up, which the simulation may prefer.
    With `ceiling_ms`, only plans whose bottleneck is at most the ceiling are searched for (one
    probe per size when there are none, none when the size's lower bound is above the ceiling).
    """
    infos, pars = build_tables(model, tree)
    constants: dict[int, ChainConstants] = {}
    searches: dict[int, Search] = {}
    ratio = None
    for size in sorted(micro_batch_sizes, reverse=True):
        search = Search(model, tree, num_devices, size, memory_limit, infos, pars, constants)
        bound = search.lower_bound_ms()
        if searches and bound > min(s.hi for s in searches.values()) * COARSE_KEEP:
            continue  # even a perfect plan at this size could not be among the best
        if not search.may_fit():
            continue
        if ceiling_ms is not None:
            if bound * (1 - TOLERANCE) > ceiling_ms:
                continue  # no plan at this size has a bottleneck within the ceiling: skip the probe
            if not search.attempt(ceiling_ms):  # a lone probe: `offers` builds for this target only
                continue  # nothing at this size beats the ceiling
            search.lo = bound * (1 - TOLERANCE)
        elif not search.start(bound * ratio if ratio is not None else None):
            continue
        search.narrow(max(tolerance, COARSE_TOLERANCE), near_top=ratio is not None or ceiling_ms is not None)
        searches[size] = search
        ratio = search.hi / bound
    if not searches:
        return {}
    coarse = {size: search.best for size, search in searches.items()}
    best = math.inf
    for search in sorted(searches.values(), key=lambda item: item.hi):
        if search.lo < best or every_size:  # this size might still hold the optimum
            search.narrow(tolerance)
            best = min(best, search.hi)
    found = {size: [searches[size].best] for size in sorted(searches)}
    if every_size:
        for size, plans in found.items():
            looser = searches[size].probe(searches[size].hi * (1 + COARSE_TOLERANCE))
            plans.extend(plan for plan in (coarse[size], looser) if plan is not None and plan not in plans)
    return found
