"""Fork and join absorption: a parallel block's fork and join may share stages with its branches.

In an SP chain `... F, P, J ...` (P a parallel block with at most 4 branches), the plain DP
puts the leaves before P (the fork side) and after P (the join side) in stages of the outer
chain. Often they are a cheap input and a cheap concat + head, and a stage of their own
wastes a device; so the DP may also take a *block*, staged in one of these layouts:

- F + P: F is a run of leaf items ending right before P (any start); it joins the first
  stage of one branch r_f: the extended chain [F] + B_rf;
- P + J: J is the whole run of leaf items right after P; it joins the last stage of one
  branch r_j: B_rj + [J];
- F + P + J: both (r_f and r_j may be the same branch: [F] + B_r + [J]);
- merge stage (blocks of exactly MERGE_BRANCHES = 2 branches): J's stage M also takes the
  tails of both branches, items s_0.. of B_0 and s_1.. of B_1 (each non-empty), on the fewest
  data-parallel devices that meet the target and hold M's micro-batches; B_0[:s_0] and
  B_1[:s_1] feed it (either may take F). With two branches of 4 layers on 8 devices this is
  A1 -> A2 -> A3 -> M, B1 -> B2 -> B3 -> M: every path one stage shorter than with the head
  on one branch's last stage, so the sources hold one micro-batch fewer.

Each layout is a set of *lanes* (chains, or prefixes of chains, solved by the chain DP,
each given the in-flight count of what it feeds) plus the branches left whole (the plain
parallel-block DP). In-flight counts stay exact: what feeds J's stage gets one more than
what follows the block (k_side = k_after + 1 with J, else k_after); F's stage is the first
stage of its lane, and its count is one more than the largest entry count of the rest of its
lane and of everything else in the block. A stage holding both F and J would hold every
branch (the plain "whole block" segment), so F's stage never reaches J while anything else
runs beside it. The recurrence, per layout L and its lanes (`ForkJoinSolver._solve`):

    side_L[v]   = par_{k_side}[others_L][v] + sum over lanes l without F of lane_l[v]  (+ M's devices)
    block[v]    = min over layouts L without F of side_L[v]
    block[u + 1] = min over layouts L with F, over F's stages [0, stop) on d1 devices holding u + 1,
                  of d1 + body_{stop - 1}[u] + side_L[u]      (body: F's lane after F's stage)

then settled like a chain row (non-increasing, BIG above the devices).

Merge tails are tried while they fit on their own: the tails and J within the target on the
widest degree, their weights, gradients and Adam state within the memory limit (longer tails
only cost more). Every pair of tails is costed at once (`merge_tails`: M's devices per pair as a
matrix), and a pair is solved exactly (a prefix solve of each branch, its own tables cut at
the tail: `Probe.chain(..., end=)`) only when its floor, the lanes' `merge_tails.prefix_floors`
plus M's devices, betters a cell of the block's vector: almost none do. Where many do, the
branches' prefix needs come from `merge_tails.PrefixNeeds` instead (`_merges`): the floors
themselves where no stage's devices depend on its in-flight count, else a forward pass over every
count. A pair's floor and side are sums of need vectors, constant wherever all of them are, so they
are computed per run of such cells (`need.CellRuns`), not per cell: a few runs of the 1,026 cells at
1,024 devices. Two branches only: with more, the tails of every pair would multiply the DP's work.

Nesting. A block's need vector depends on its parallel block, the ops of F and J and k_after
only, so it is memoised by those (`tables.Block.key`), as are the extended chains (per branch
and runs: `ChainTables.extended`) and the merge stages' costs (per block and size:
`merge_tails.MergeTable`): the same block met in a branch and in that branch's extended chains
is solved once. F enters a block only through the options of F's stage (in a merge layout's
lanes too; the merge floors that read [F] + B only choose which pairs to place), so the fork runs
that give it the same options (from adjacent items of a chain, often) share one solution
(`ForkJoinSolver._same_stages`), and for a block without merge layouts the shortest fork run, its stage
judged by compute alone, gives a floor for all of them (`ForkJoinSolver.fork_floor`), with which a row
skips the fork runs it would override (`Probe._before`). A fork's lane is never solved as a chain:
F's stage is items [0, stop) of [F] + B (only its segments from item 0 are read), and the rest of
the lane is B from item stop - 1, whose suffix rows are B's own (or those of B + [J]). Solving [F] + B whole would
build its row 0, where blocks nested in B take F into their own fork runs, whose lanes would
do the same one level down: that made the work grow by a factor per level of nesting. Now fork
runs stay in their chain, and a join run travels only into the last block of a branch
(B + [J] is solved whole): a block at nesting depth t has at most t + 1 join runs. Per probe
and k_after, a block costs O(c^2 V) for its plain layouts plus, per layout with a fork,
O(options x breakpoints) for F's stage (`_fork_stage`: about one breakpoint per option on the
graphs measured).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from graphpipe.planner.sp_dp.blocks import BIG, MERGE_BRANCHES
from graphpipe.planner.sp_dp.merge_tails import (
    MergeTables,
    PrefixNeeds,
    Step,
    block_steps,
    extend_floors,
    held_floors,
    prefix_floors,
    shifted,
)
from graphpipe.planner.sp_dp.need import (
    BlockSol,
    CellRuns,
    ChainSol,
    ForkPick,
    Layout,
    LayoutChoice,
    ParSol,
    add,
    drops,
    sum_breakpoints,
)
from graphpipe.planner.sp_dp.rows import settle_block
from graphpipe.planner.sp_dp.size_tables import SizeTables
from graphpipe.planner.sp_dp.tables import Block, BlockKey, ChainInfo, ChainTables, ParInfo
from graphpipe.planner.stage_spec import StageSpec

EXACT_AFTER = 6  # lanes to solve above which `ForkJoinSolver._merges` reads every lane's need at once


class ChainSolver(Protocol):
    """What the fork/join blocks need of the probe that meets them (`Probe`): the chain and parallel-block DP
    (memoised) and the reconstruction of their stages."""

    def chain(self, info: ChainInfo, k_after: int, end: int | None = None) -> ChainSol: ...

    def entry_need(self, info: ChainInfo, k_after: int, end: int | None = None) -> list[int]: ...

    def cut_floor(self, info: ChainInfo, k_after: int, end: int) -> list[int] | None: ...

    def par(self, pinfo: ParInfo, k_after: int) -> ParSol: ...

    def emit_chain(self, info: ChainInfo, k_after: int, v: int, out: list[StageSpec], start: int = 0,
                   end: int | None = None) -> None: ...

    def emit_par(self, pinfo: ParInfo, k_after: int, v: int, out: list[StageSpec], mask: int | None = None) -> None:
        ...


@dataclass(frozen=True, slots=True)
class _Lane:
    chain: ChainInfo | None  # None: empty (a branch wholly inside the merge stage)
    at_side: bool  # followed by J's stage (given k_side), else by what follows the block (k_after)
    has_fork: bool
    end: int | None = None  # solve items [0, end) only
    body: ChainInfo | None = None  # a fork's lane: `chain` without its first item, the fork run (see `_fork_stage`)


@dataclass(frozen=True, slots=True)
class _Shape:
    """A layout's lanes, whatever the in-flight counts: the fork's lane (if any), the others, the mask of
    the branches left whole; for the fork's lane, its items solved (`end`) and the last item F's stage may
    reach (one before J when F's lane also takes J while something else runs beside it)."""

    fork: _Lane | None
    rest: tuple[_Lane, ...]
    others: int
    fork_end: int = 0
    fork_last: int = 0
    fork_key: tuple[int, int, int] = (0, 0, 0)  # (F's lane, end, last): `_fork_lane`'s memo


ShapeKey = tuple[BlockKey, int | None, int | None, int, int]  # (block, r_f, r_j, s_0, s_1), s = -1: no merge


class Shapes:
    """The lanes of every layout of the blocks met (`_Shape`), the same for every probe, size and in-flight
    count: built once per tree (one `partition_sp` call), keyed by block content and layout."""

    def __init__(self, chains: ChainTables) -> None:
        self.chains = chains
        self._shapes: dict[ShapeKey, _Shape] = {}
        self._plain: dict[tuple[BlockKey, bool], list[tuple[Layout, _Shape]]] = {}

    def plain(self, block: Block, with_join: bool) -> list[tuple[Layout, _Shape]]:
        """The plain layouts (no merge stage) with their shapes, in `_plain_layouts` order."""
        key = (block.key, with_join)
        hit = self._plain.get(key)
        if hit is None:
            hit = self._plain[key] = [(layout, self.shape(block, layout))
                                      for layout in _plain_layouts(block, with_join)]
        return hit

    def shape(self, block: Block, layout: Layout) -> _Shape:
        """The layout's lanes: the extended chains of the branches that take F or J (or the merge stage's
        prefixes of both branches), the fork's lane first, and the branches left whole."""
        rf, rj, merge = layout.rf, layout.rj, layout.merge
        key = (block.key, rf, rj, -1, -1) if merge is None else (block.key, rf, rj, merge[0], merge[1])
        hit = self._shapes.get(key)
        if hit is None:
            hit = self._shapes[key] = self._build(block, rf, rj, merge)
        return hit

    def _build(self, block: Block, rf: int | None, rj: int | None, merge: tuple[int, int, int] | None) -> _Shape:
        extended = self.chains.extended
        lanes = []
        others = 0
        if merge is not None:
            for pos, cut in enumerate(merge[:2]):
                if rf == pos:
                    lanes.append(_Lane(extended(block, pos, True, False), True, True, cut + 1,
                                       extended(block, pos, False, False)))
                elif cut:
                    lanes.append(_Lane(extended(block, pos, False, False), True, False, cut))
                else:
                    lanes.append(_Lane(None, True, False))
            lanes.sort(key=lambda lane: not lane.has_fork)
        else:
            if rj is not None:
                lanes.append(_Lane(extended(block, rj, rf == rj, True), False, rf == rj, None,
                                   extended(block, rj, False, True) if rf == rj else None))
            if rf is not None and rf != rj:
                lanes.insert(0, _Lane(extended(block, rf, True, False), True, True, None,
                                      extended(block, rf, False, False)))
            others = _without((1 << block.num_branches) - 1, rf, rj)
        fork = lanes[0] if lanes and lanes[0].has_fork else None
        rest = tuple(lanes[1:] if fork is not None else lanes)
        if fork is None or fork.chain is None:
            return _Shape(fork, rest, others)
        end = fork.chain.num_items if fork.end is None else fork.end
        holds_join = rj is not None and rf == rj and (others != 0 or bool(rest))
        last = end - 1 if holds_join else end
        return _Shape(fork, rest, others, end, last, (fork.chain.content, end, last))


def _has_merges(block: Block, with_join: bool) -> bool:
    """Whether the block has merge layouts (J's stage taking both branches' tails): two branches, with J."""
    return with_join and block.join is not None and block.num_branches == MERGE_BRANCHES


def _join_ops(block: Block, with_join: bool) -> tuple[str, ...]:
    """J's ops where the block takes J, else none: part of every key a block's solutions are shared by."""
    return block.join.ops if with_join and block.join is not None else ()


def _without(full: int, *positions: int | None) -> int:
    for pos in positions:
        if pos is not None:
            full &= ~(1 << pos)
    return full


def _plain_layouts(block: Block, with_join: bool) -> Iterator[Layout]:
    count = block.num_branches
    forks: tuple[int | None, ...] = tuple(range(count)) if block.fork is not None else (None,)
    for rj in (range(count) if with_join else (None,)):
        for rf in forks:
            yield Layout(rf, rj)


ForkOptions = tuple[tuple[int, int, int], ...]  # F's stage: (stop, d1, most in flight), `_fork_options`


@dataclass(frozen=True, slots=True)
class ForkLane:
    """What `_fork_stage` reads of a fork's lane in a probe, the same for every layout and side: F's stage
    options (stop, d1, most in flight) by degree and then stop, and the body's solution."""

    options: ForkOptions
    body: ChainSol


@dataclass(slots=True)
class _Side:
    """A layout's side (`ForkJoinSolver._place`) and what F's stage reads of it: where it drops, and per stop of F's
    stage the breakpoints of the body's row there plus the side (`need.sum_breakpoints`), built on first use. A
    plain layout's side does not depend on F, so the blocks of one parallel block and join run whose fork runs
    start at different items (one per item before it in its chain) share it (`ForkJoinSolver.side_memo`)."""

    need: list[int]
    drops: list[int] | None = None
    sums: dict[int, list[tuple[int, int]]] = field(default_factory=dict)

    def sum_at(self, row: list[int], row_breaks: list[tuple[int, int]], stop: int) -> list[tuple[int, int]]:
        """The breakpoints of `row` (the body's row before `stop`, the same for every block sharing this side)
        plus the side."""
        found = self.sums.get(stop)
        if found is None:
            if self.drops is None:
                self.drops = drops(self.need)
            found = self.sums[stop] = sum_breakpoints(row, row_breaks, self.need, self.drops)
        return found


SideKey = tuple[int, tuple[str, ...], int, int | None, int | None]  # (parallel block, J's ops, k_after, r_f, r_j)
StagesKey = tuple[int, tuple[str, ...], bool, int, tuple[ForkOptions | None, ...]]  # see `_same_stages`


@dataclass(frozen=True, slots=True)
class _Tails:
    """The tails of each branch (rows: branch 0's, columns: branch 1's, increasing) that may be part of a pair
    whose floor betters a cell; every pair with a tail left out is proven not to.

    A pair's floor at cell v is the base, M's devices on the pair and a lane's floor per branch (with F, one
    lane's floor with F's stage, read a cell up). Over the pairs sharing tail t_0, that is at least t_0's own
    lane, the fewest M devices of any pair with t_0, and the least floor of the other lane at v: separable, so
    the test costs a row per tail instead of a cell per pair. Where F may go to either branch, a tail is kept
    if it passes for either (the two layouts' floors are then built on the same tails). Increasing tails keep
    the pairs' order: a first minimum over the kept pairs is the first over all of them."""

    rows: np.ndarray
    cols: np.ndarray

    @classmethod
    def of(cls, devices: np.ndarray, lanes: Sequence[np.ndarray], forks: Sequence[np.ndarray] | None,
           room: np.ndarray) -> _Tails:
        """The tails whose bound is below `room` (`ForkJoinSolver._room`) at some cell: `lanes` the lanes' floors
        (or needs) per tail and cell, `forks` those of the lanes with F's stage (None: the block has no F)."""
        least = [devices.min(axis=1), devices.min(axis=0)]  # per tail, M's fewest devices with any other tail
        if forks is None:
            keep = [_below(lanes[pos], least[pos], lanes[1 - pos].min(axis=0), room) for pos in (0, 1)]
        else:  # F with branch r: its lane's floor at v + 1, the other lane's at v
            cells = len(room)
            keep = [_below(forks[pos][:, 1:], least[pos], lanes[1 - pos].min(axis=0)[:cells], room)
                    | _below(lanes[pos][:, :cells], least[pos], forks[1 - pos].min(axis=0)[1:], room)
                    for pos in (0, 1)]
        return cls(np.flatnonzero(keep[0]), np.flatnonzero(keep[1]))

    def devices(self, devices: np.ndarray) -> np.ndarray:
        """M's devices on the kept pairs."""
        return np.asarray(devices[np.ix_(self.rows, self.cols)])

    def starts(self, starts: tuple[np.ndarray, ...]) -> tuple[np.ndarray, np.ndarray]:
        """The kept tails' starts, per branch."""
        return starts[0][self.rows], starts[1][self.cols]


def _may_better(side: list[int], floors: Sequence[list[int]], extra: int, vec: list[int], num_devices: int) -> bool:
    """Whether `side` plus the `floors` and `extra` devices is below `vec` at some cell within the devices (a cell
    above them is infeasible whatever it holds: settling and the cap make it BIG)."""
    return any(devices + sum(floor[v] for floor in floors) + extra < min(now, num_devices + 1)
               for v, (devices, now) in enumerate(zip(side, vec)))


def _below(own: np.ndarray, fewest: np.ndarray, other: np.ndarray, room: np.ndarray) -> np.ndarray:
    """Per tail, whether its bound (its lane's floor per cell, its fewest M devices, the other lane's least floor)
    is below `room` at some cell."""
    return np.asarray(((own + fewest[:, None] + other[None, :]) < room[None, :]).any(axis=1))


class ForkJoinSolver:
    """The fork/join blocks of one probe (a size's `tables` and a `target`), memoised by content: block vectors
    by (block, with J, k_after), F's stage options by (lane, last item) and fork lanes by (lane, end, last)
    and k_after. The probe passes itself (`solver`) to each call rather than being held here: no reference
    cycle, so a finished probe and its memo tables are freed at once."""

    def __init__(self, tables: SizeTables, target_ms: float, shapes: Shapes, merges: MergeTables) -> None:
        self.tables = tables
        self.target = target_ms
        self.shapes = shapes
        self.merges = merges
        self.floor_memo: dict[tuple[int, int], np.ndarray] = {}  # per chain content and k_after (`_lane_floors`)
        self.free_memo: dict[int, np.ndarray | None] = {}  # per chain content (`free_floors`)
        self.fewest_memo: dict[int, np.ndarray | None] = {}  # per chain content (`free_fewest`)
        self.held_memo: dict[int, PrefixNeeds | None] = {}  # per chain content (`_lane_needs`)
        self.needs_memo: dict[tuple[int, int], np.ndarray] = {}  # per chain content and k_after (`_needs`)
        self.lane_needs_memo: dict[tuple[int, int, int | None], list[int]] = {}  # (content, k_after, end): solved
        self.steps_memo: dict[int, dict[int, list[Step]]] = {}  # per chain content, `merge_tails.block_steps`
        self.block_memo: dict[tuple[BlockKey, bool, int], BlockSol] = {}
        self.stages_memo: dict[StagesKey, BlockSol] = {}  # blocks whose fork runs give F's stage the same options
        self.side_memo: dict[SideKey, _Side] = {}  # plain layouts' sides, shared by fork runs (`_Side`)
        self.fork_memo: dict[tuple[int, int], ForkOptions] = {}  # see `_fork_options`
        self.lane_memo: dict[tuple[int, int, int], dict[int, ForkLane | None]] = {}  # see `_fork_lane`
        self.loose_fork_memo: dict[tuple[int, int], ForkOptions] = {}  # `_fork_options(loose=True)`
        self.loose_lane_memo: dict[tuple[int, int, int], dict[int, ForkLane | None]] = {}  # `_fork_lane(loose=True)`
        self.fork_floor_memo: dict[tuple[int, tuple[str, ...], bool, int], tuple[list[int], list[int]]] = {}

    def need(self, solver: ChainSolver, block: Block, with_join: bool, k_after: int) -> BlockSol:
        """Need vector of the block (entry = F's stage with a fork, else the branches' entries), memoised by
        content (`Block.key`) and k_after."""
        key = (block.key if with_join else block.key_alone, with_join, k_after)
        hit = self.block_memo.get(key)
        if hit is None:
            same = self._same_stages(block, with_join, k_after)
            hit = self.stages_memo.get(same) if same is not None else None
            if hit is None:
                hit = self._solve(solver, block, with_join, k_after)
                if same is not None:
                    self.stages_memo[same] = hit
            self.block_memo[key] = hit
        return hit

    def _same_stages(self, block: Block, with_join: bool, k_after: int) -> StagesKey | None:
        """What a block with a fork run depends on besides its parallel block, J and k_after: the options of F's
        stage in each plain layout (`_fork_options`: stop, degree, most in flight), None for a block without F.
        F is one item of its lane, the rest of each lane and the sides do not depend on it (`_Side`), and a
        choice names a layout and a stop, emitted with the block's own lanes (`emit`), so blocks whose fork runs
        give the same options have the same vector and choices. A merge layout's lane with F is [F] + B cut at
        its tail, whose options are those of the plain layout giving F to B (which J does not follow) up to the
        cut; the floors `_merges` reads off [F] + B only skip pairs that would write no cell (a pair is written
        where it is strictly below the cell, and its floor was not). Fork runs that start at adjacent items
        often give the same options: the item between them costs nothing (a view, a transpose) or changes no
        option. On CLIP's towers at op level 2,415 of a probe's 3,486 fork-run blocks read another's; on
        Llama's merge blocks (the MLP's gate and up, the rotary embedding's) at 64 devices they halve the
        merge blocks solved."""
        if block.fork is None:
            return None
        options = tuple(None if shape.fork is None or shape.fork.chain is None
                        else self._fork_options(shape.fork.chain, shape.fork_last)
                        for _, shape in self.shapes.plain(block, with_join))
        join_ops = _join_ops(block, with_join)
        return block.pinfo.index, join_ops, with_join, k_after, options

    def fork_floor(self, solver: ChainSolver, block: Block, shortest: Block, with_join: bool,
                   k_after: int) -> tuple[list[int], list[int]] | None:
        """A floor of the need vector of every block that differs from `shortest` (its fork run the one item right
        before the parallel block) only in a longer fork run, and the cells where it changes (`need.drops`); None
        for a block without F or with merge layouts.

        Such a block depends on F only through the options of F's stage (`_same_stages`). A longer fork run's stage
        holds every op of the shortest one's and more, so its compute per sample and its weights and activations
        are at least theirs at every stop and degree; only its traffic may be less (another tensor crosses into
        it). So the options of the shortest run's stage judged by compute alone, not TPS (`_fork_options` with
        `loose`), include an option at least as good as each of a longer run's, and the block solved with them is
        at or below each such block at every cell. Memoised per parallel block, J, with or without J and
        k_after: one solve for every fork run into the block."""
        if block.fork is None or _has_merges(block, with_join):
            return None
        join_ops = _join_ops(block, with_join)
        key = (block.pinfo.index, join_ops, with_join, k_after)
        hit = self.fork_floor_memo.get(key)
        if hit is None:
            floor = self._solve(solver, shortest, with_join, k_after, loose=True).need
            hit = self.fork_floor_memo[key] = (floor, drops(floor))
        return hit

    def vector(self, solver: ChainSolver, block: Block, with_join: bool, k_after: int) -> list[int]:
        return self.need(solver, block, with_join, k_after).need

    def array(self, solver: ChainSolver, block: Block, with_join: bool, k_after: int) -> np.ndarray:
        """`vector` as an array (`BlockSol.array`)."""
        return self.need(solver, block, with_join, k_after).array()

    def _solve(self, solver: ChainSolver, block: Block, with_join: bool, k_after: int,
               loose: bool = False) -> BlockSol:
        """Every layout's side (the lanes without F and the branches left whole), then F's stage where a layout
        has one (`_fork_stage`); settled like a chain row. Merge layouts come last (`_merges`). With `loose`, F's
        stage options are judged by compute alone (`fork_floor`)."""
        max_v = self.tables.max_v
        k_side = k_after + 1 if with_join else k_after
        psol = solver.par(block.pinfo, k_side)
        vec: list[int] = [BIG] * (max_v + 1)
        chosen: list[LayoutChoice | None] = [None] * (max_v + 1)
        join_ops = _join_ops(block, with_join)
        for layout, shape in self.shapes.plain(block, with_join):
            shared = (block.pinfo.index, join_ops, k_after, layout.rf, layout.rj)
            self._place(solver, layout, shape, psol, (k_after, k_side), vec, chosen, shared, loose)
        if _has_merges(block, with_join):
            self._merges(solver, block, psol, (k_after, k_side), vec, chosen)
        return settle_block(vec, chosen, self.tables.num_devices)

    def _place(self, solver: ChainSolver, layout: Layout, shape: _Shape, psol: ParSol, counts: tuple[int, int],
               vec: list[int], chosen: list[LayoutChoice | None], shared: SideKey | None = None,
               loose: bool = False) -> None:
        """Write one layout into the block's vector, given (k_after, k_side); a plain layout's side is kept by
        `shared` (its key without F) for the blocks that differ only in F."""
        k_after, k_side = counts
        side = self.side_memo.get(shared) if shared is not None else None
        if side is None:
            need = psol.need[shape.others]
            for lane in shape.rest:
                need = add(need, self._lane_need(solver, lane, k_side if lane.at_side else k_after))
            if layout.merge is not None:
                need = [devices + layout.merge[2] for devices in need]
            side = _Side(need)
            if shared is not None:
                self.side_memo[shared] = side
        if shape.fork is None:
            for v, devices in enumerate(side.need):
                if devices < vec[v]:
                    vec[v], chosen[v] = devices, (layout, None)
            return
        self._fork_stage(solver, layout, shape, k_side if shape.fork.at_side else k_after, side, vec, chosen, loose)

    def _place_merge(self, solver: ChainSolver, layout: Layout, shape: _Shape, psol: ParSol, k_side: int,
                     vec: list[int], chosen: list[LayoutChoice | None], floors: Sequence[list[int]]) -> None:
        """`_place` for a merge layout without F: the base, both lanes (each followed by M, holding k_side) and M's
        devices, each lane's need bounded by its floor (`floors`, in `shape.rest`'s order) until it is known.
        Lanes a pair before this one solved are read first; a lane is solved only while the needs read so far
        and the floors of the others still better a cell of the vector. Before the first solve, each unknown lane's
        floor is raised to its cut floor (`Probe.cut_floor`: a shorter prefix, solved once for every tail up to the
        next cut), which counts the in-flight micro-batches the prefix floors leave out; on CLIP's towers at op level
        that takes a probe's lane solves from 60 to 34 (64 devices, micro-batch 128). The side only grows
        as floors turn into needs, so a layout stopped there would have written nothing."""
        assert layout.merge is not None and shape.fork is None
        side = psol.need[shape.others]
        extra = layout.merge[2]
        known = [self._known_need(lane, k_side) for lane in shape.rest]
        bounds = [need if need is not None else floor for need, floor in zip(known, floors)]
        pending = sorted(range(len(shape.rest)), key=lambda at: known[at] is None)  # the lanes already known first
        raised = False  # the unknown lanes' floors raised to their cut floors

        def may_better() -> bool:  # the side so far, lane `at` and the pending ones at their bounds
            return _may_better(side, [bounds[at], *(bounds[other] for other in pending)], extra, vec,
                               self.tables.num_devices)

        while pending:
            at = pending.pop(0)
            need = known[at]
            if need is None:
                if not may_better():
                    return
                if not raised:
                    raised = True
                    for lane_at in (at, *pending):
                        bounds[lane_at] = self._cut_bound(solver, shape.rest[lane_at], k_side, bounds[lane_at])
                    if not may_better():
                        return
                need = self._lane_need(solver, shape.rest[at], k_side)
            side = add(side, need)
        for v, devices in enumerate(side):
            if devices + extra < vec[v]:
                vec[v], chosen[v] = devices + extra, (layout, None)

    @staticmethod
    def _cut_bound(solver: ChainSolver, lane: _Lane, k_after: int, floor: list[int]) -> list[int]:
        """`floor` raised, cell by cell, to the lane's cut floor where it has one (`Probe.cut_floor`)."""
        if lane.chain is None or lane.end is None:
            return floor
        cut = solver.cut_floor(lane.chain, k_after, lane.end)
        return floor if cut is None else [max(low, high) for low, high in zip(floor, cut)]

    def _known_need(self, lane: _Lane, k_after: int) -> list[int] | None:
        """The lane's need vector where it costs no solve (`_lane_need` without solving), else None."""
        read = self._lane_need_read(lane, k_after)
        if read is not None or lane.chain is None:
            return read
        return self.lane_needs_memo.get((lane.chain.content, k_after, lane.end))

    def _lane_need(self, solver: ChainSolver, lane: _Lane, k_after: int) -> list[int]:
        """The lane's need vector: a prefix whose chain has its `merge_tails.PrefixNeeds` is read from them
        (the same numbers, `_lane_needs`), anything else solved (memoised: `_known_need`)."""
        known = self._known_need(lane, k_after)
        if known is not None:
            return known
        assert lane.chain is not None
        need = self.lane_needs_memo[(lane.chain.content, k_after, lane.end)] = solver.entry_need(
            lane.chain, k_after, lane.end)
        return need

    def _lane_need_read(self, lane: _Lane, k_after: int) -> list[int] | None:
        """The lane's need vector where no solve gives it: an empty lane's, or read off its chain's
        `merge_tails.PrefixNeeds`; else None."""
        if lane.chain is None:
            return [0 if v >= k_after else BIG for v in range(self.tables.max_v + 1)]
        needs = self._needs(lane.chain.content, k_after) if lane.end is not None else None
        if needs is not None:
            row: list[int] = needs[lane.end].tolist()
            return row
        return None

    def _needs(self, content: int, k_after: int) -> np.ndarray | None:
        """Per end, the prefix need vectors of the chain `content` given k_after, where its `PrefixNeeds` were
        built (`_lane_needs`), else None; memoised per k_after."""
        key = (content, k_after)
        hit = self.needs_memo.get(key)
        if hit is None:
            held = self.held_memo.get(content)
            if held is None:
                return None
            hit = self.needs_memo[key] = held.after(k_after, self.tables.num_devices)
        return hit

    # ---- merge stages ------------------------------------------------------------------------
    def _merges(self, solver: ChainSolver, block: Block, psol: ParSol, counts: tuple[int, int], vec: list[int],
                chosen: list[LayoutChoice | None]) -> None:
        """The merge layouts, after the plain ones, as if written one by one in the order of the pairs of tails
        (shortest first) and then of the branch taking F: every pair within the target that fits (see the module
        docstring), its side the parallel block's base, the lanes' needs and M's devices.

        Only the pairs whose floor (`merge_tails`: the lanes' floors, M's devices and the base) is below a cell
        of the vector within the devices are placed (their lanes solved), each tested again as the vector falls;
        it only decreases, so a layout left out would have written no cell that counts. The floors are built
        only on the tails a bound per tail lets through (`_Tails`). Where that leaves more lanes to solve than
        EXACT_AFTER, the lanes of branches without parallel items get their exact needs (`_lane_needs`), which
        tighten the floors and are read instead of solved; with both exact and no F, each cell takes the first
        pair with the least side, if below it, as the writes one by one would (`_write_merges`)."""
        assert block.join is not None
        k_side = counts[1]
        found = self.merges.of(block.pinfo, block.join.ops).devices(self.target, k_side)
        if found is None:
            return
        starts, devices = found[:2], found[2]
        base = np.array(psol.need[0])
        lanes: list[np.ndarray | None] = [None, None]
        tails, (runs, floors), better = self._merge_floors(block, starts, base, devices, k_side, lanes, vec)
        pairs = np.nonzero(np.logical_or.reduce(better))
        if len(set(pairs[0].tolist())) + len(set(pairs[1].tolist())) > EXACT_AFTER:
            lanes = [self._lane_needs(block, pos, starts[pos], k_side) for pos in (0, 1)]
            exact = [lane for lane in lanes if lane is not None]
            if block.fork is None and len(exact) == 2:
                tails = _Tails.of(devices, exact, None, self._room(vec, base, 0))
                if tails.rows.size and tails.cols.size:
                    self._write_merges(*self._sides(tails, base, devices, exact), tails.starts(starts),
                                       tails.devices(devices), vec, chosen)
                return
            tails, (runs, floors), better = self._merge_floors(block, starts, base, devices, k_side, lanes,
                                                               vec)
            pairs = np.nonzero(np.logical_or.reduce(better))
        first = 0 if block.fork is None else 1
        for at0, at1 in zip(*pairs):
            t0, t1 = int(tails.rows[at0]), int(tails.cols[at1])
            merge = (int(starts[0][t0]), int(starts[1][t1]), int(devices[t0, t1]))
            for rf, (floor, hits) in enumerate(zip(floors, better)):
                # the vector has only gone down since `better`: test the floor again against it
                if hits[at0, at1] and any(low < now for low, now in zip(runs.expand(floor[at0, at1]).tolist(),
                                                                         vec[first:])):
                    layout = Layout(None if block.fork is None else rf, None, merge)
                    shape = self.shapes.shape(block, layout)
                    if block.fork is None:
                        lane_floors = self._rest_floors(block, shape, merge, k_side)
                        self._place_merge(solver, layout, shape, psol, k_side, vec, chosen, lane_floors)
                    else:
                        self._place(solver, layout, shape, psol, counts, vec, chosen)

    def _rest_floors(self, block: Block, shape: _Shape, merge: tuple[int, int, int], k_side: int) -> list[list[int]]:
        """A floor of each lane of a merge layout without F (`shape.rest`: branch 0's prefix, then branch 1's), at
        its tail's start: the lane floors the pairs were tested on (`_lane_floors`), a lane that is empty exact."""
        out = []
        for pos, lane in enumerate(shape.rest):
            empty = self._lane_need_read(lane, k_side) if lane.chain is None else None
            out.append(empty if empty is not None else
                       self._lane_floors(block, pos, False, np.array([merge[pos]]), k_side)[0].tolist())
        return out

    def _merge_floors(self, block: Block, starts: tuple[np.ndarray, ...], base: np.ndarray, devices: np.ndarray,
                      k_side: int, exact: list[np.ndarray | None], vec: list[int]
                      ) -> tuple[_Tails, tuple[CellRuns, list[np.ndarray]], list[np.ndarray]]:
        """The tails a bound lets through (`_Tails`), and on them, per layout kind (one without F, else one per
        branch taking F), the floor of every pair's cells, one per run of cells (`CellRuns`), and which pairs'
        floors are below a cell of `vec`. `base` is the parallel block's base and `devices` M's; a lane's floor
        is its exact need where `exact` has it."""
        lanes = [lane if lane is not None else self._lane_floors(block, pos, False, starts[pos], k_side)
                 for pos, lane in enumerate(exact)]
        cap = self.tables.num_devices
        if block.fork is None:  # cell v costs at least the floor at v
            tails = _Tails.of(devices, lanes, None, self._room(vec, base, 0))
            runs, sides = self._sides(tails, base, devices, lanes)
            floors = [sides]
            current = np.array(vec)
        else:  # F's stage opens lane r_f: cell u + 1 costs at least that lane's floor at u + 1 plus the rest at u
            forks = [self._lane_floors(block, pos, True, starts[pos], k_side) for pos in (0, 1)]
            tails = _Tails.of(devices, lanes, forks, self._room(vec, base, 1))
            ahead = [forks[0][tails.rows][:, 1:], forks[1][tails.cols][:, 1:]]
            own = [lanes[0][tails.rows][:, :-1], lanes[1][tails.cols][:, :-1]]
            runs = CellRuns.of([base[None, :-1], *ahead, *own], len(base) - 1)
            ahead, own = [runs.first(lane) for lane in ahead], [runs.first(lane) for lane in own]
            least = runs.first(base[:-1])[None, None, :] + tails.devices(devices)[:, :, None]
            floors = [ahead[0][:, None, :] + least + own[1][None, :, :],
                      ahead[1][None, :, :] + least + own[0][:, None, :]]
            for floor in floors:
                floor[floor > cap] = BIG  # above the devices: no cell it writes counts
            current = np.array(vec[1:])
        most = runs.most(current)  # a floor constant over a run betters some cell of it where it is below the most
        return tails, (runs, floors), [np.asarray((floor < most).any(axis=2)) for floor in floors]

    def _room(self, vec: list[int], base: np.ndarray, shift: int) -> np.ndarray:
        """Per cell v, what a pair may add to the base and still better the vector's cell v + `shift` within the
        devices (the floors' cells are shifted by one where F's stage comes first)."""
        cells = np.minimum(np.array(vec[shift:]), self.tables.num_devices + 1)
        return np.asarray(cells - base[:len(cells)])

    def _sides(self, tails: _Tails, base: np.ndarray, devices: np.ndarray,
               lanes: list[np.ndarray]) -> tuple[CellRuns, np.ndarray]:
        """Per pair of `tails` and run of cells (`CellRuns`), the base, M's devices and both lanes (above the devices:
        BIG)."""
        own = [lanes[0][tails.rows], lanes[1][tails.cols]]
        runs = CellRuns.of([base[None, :], *own], len(base))
        sides = np.asarray(runs.first(base)[None, None, :] + tails.devices(devices)[:, :, None]
                           + runs.first(own[0])[:, None, :] + runs.first(own[1])[None, :, :])
        sides[sides > self.tables.num_devices] = BIG
        return runs, sides

    @staticmethod
    def _write_merges(runs: CellRuns, sides: np.ndarray, starts: tuple[np.ndarray, ...], devices: np.ndarray,
                      vec: list[int], chosen: list[LayoutChoice | None]) -> None:
        """Per cell, the first pair of tails (in the pairs' order) with the least exact side, where below the cell
        (`sides` per run of cells, as `_sides` gives them: every cell of a run has its run's pair)."""
        flat = sides.reshape(-1, sides.shape[2])
        first = flat.argmin(axis=0)  # the first occurrence: pairs in order, shortest tails first
        best, least = runs.expand(first), runs.expand(flat[first, np.arange(flat.shape[1])])
        layouts: dict[int, Layout] = {}
        for v in np.flatnonzero(least < np.array(vec)).tolist():
            pair = int(best[v])
            layout = layouts.get(pair)
            if layout is None:
                t0, t1 = divmod(pair, sides.shape[1])
                layout = layouts[pair] = Layout(None, None, (int(starts[0][t0]), int(starts[1][t1]),
                                                             int(devices[t0, t1])))
            vec[v], chosen[v] = int(least[v]), (layout, None)

    def _lane_needs(self, block: Block, pos: int, starts: np.ndarray, k_side: int) -> np.ndarray | None:
        """Per tail start s, the need vector of items [0, s) of branch `pos` given k_side after it, from
        `merge_tails.PrefixNeeds` (None: the branch has parallel items, or its table would be too large)."""
        chain = self.shapes.chains.extended(block, pos, False, False)
        if chain.has_parallel:
            return None
        if chain.content not in self.held_memo:
            self.held_memo[chain.content] = PrefixNeeds.of(self.tables, chain, self.target, self.free_floors(chain))
        needs = self._needs(chain.content, k_side)
        return None if needs is None else np.asarray(needs[starts])

    def _lane_floors(self, block: Block, pos: int, with_fork: bool, starts: np.ndarray, k_side: int) -> np.ndarray:
        """Per tail start s, the floor of the need vector of the lane that feeds M from branch `pos`: items
        [0, s) of the branch (with F in front: [0, s + 1) of [F] + B), given k_side after it."""
        chain = self.shapes.chains.extended(block, pos, with_fork, False)
        key = (chain.content, k_side)
        floors = self.floor_memo.get(key)
        if floors is None:
            floors = self.floor_memo[key] = self._floors(chain, k_side)
        return shifted(floors, starts + 1 if with_fork else starts, k_side)

    def _floors(self, chain: ChainInfo, k_after: int) -> np.ndarray:
        """`merge_tails.prefix_floors` of the chain followed by k_after in flight (each of its stages holds at
        least k_after + 1), its parallel items and blocks stepped over as `merge_tails.block_steps`; where no
        stage's degree depends on its count, the count-free floors the probe's entry needs read too."""
        steps = None
        if chain.has_parallel:  # the same for every k_after
            steps = self.steps_memo.get(chain.content)
            if steps is None:
                steps = self.steps_memo[chain.content] = block_steps(self.tables, chain, self.target)
        elif k_after < self.tables.max_v:  # k_after + 1 is a count the DP asks for
            free = self.free_floors(chain)
            if free is not None:
                return free
        return held_floors(self.tables, chain, self.target, k_after + 1, steps)

    def free_floors(self, chain: ChainInfo) -> np.ndarray | None:
        """The prefix floors of a chain without parallel items whose segments' fewest degrees do not depend on the
        count they hold at this target (`SizeTables.fewest_free`), at any count; None where they do. Memoised per
        chain: the merge stages' lane floors and the probe's entry needs (`Probe.entry_need`) read the same."""
        if chain.content not in self.free_memo:
            self.free_memo[chain.content] = self._free_floors(chain)
        return self.free_memo[chain.content]

    def _free_floors(self, chain: ChainInfo) -> np.ndarray | None:
        """`free_floors` computed: a branch with J appended (`SizeTables.extends`) adds one row to the branch's
        floors, from its segments that end with J (`merge_tails.extend_floors`); either is count-free only where
        both are. Any other chain from its fewest degrees."""
        base = chain.prefix_of
        if base is not None and self.tables.extends(chain):
            floors = self.free_floors(base)
            if floors is None:
                return None
            last = self.tables.fewest_free_last(chain, self.target)
            return None if last is None else extend_floors(floors, last[:-1])
        fewest = self.free_fewest(chain)
        return None if fewest is None else prefix_floors(fewest, self.tables.max_v)

    def free_fewest(self, chain: ChainInfo) -> np.ndarray | None:
        """`SizeTables.fewest_free` at this target, memoised per chain: the floors and a rebuild from them
        (`Probe._emit_from_floors`) read the same."""
        if chain.content not in self.fewest_memo:
            self.fewest_memo[chain.content] = self.tables.fewest_free(chain, self.target)
        return self.fewest_memo[chain.content]

    # ---- the fork's stage --------------------------------------------------------------------
    def _fork_stage(self, solver: ChainSolver, layout: Layout, shape: _Shape, k_lane: int, shared: _Side,
                    vec: list[int], chosen: list[LayoutChoice | None], loose: bool = False) -> None:
        """F's stage = the first items [0, stop) of the fork's lane; the rest of the lane and the side after it.

        The rest of the lane is items [stop - 1, ...) of the lane's body (the lane without F), whose suffix
        rows are those of the lane from item 1 on: the body is solved, not the lane, so the lane's own
        row 0 (blocks whose fork runs would take F along, and their extended chains, level after level)
        is never built; only the segments from item 0 are read from the lane's tables.

        Every option is tried, with no floor test first: it writes a candidate only at the breakpoints of the
        body's row before its stop plus the side, below its most in flight (`_Side.sum_at`, shared by every
        fork run into the block), about one per option on the graphs measured. A candidate that is below the
        cell's best so far but above a cell below it, or above the devices, changes neither the settled vector
        nor a feasible cell's choice (`settle_block` replaces it by the cell below, or caps it), so the cells
        a floor test would skip are written to no effect, and costed in less time than the test took (on
        CLIP's towers at op level its O(v) scan was about a fifth of a probe and building its floor another
        7%: `docs/architecture.md`)."""
        fork = self._fork_lane(solver, shape, k_lane, loose)
        if fork is None:
            return
        need, row_breaks = fork.body.need, fork.body.breaks
        for stop, d1, k_max in fork.options:
            for u, devices in shared.sum_at(need[stop - 1], row_breaks[stop - 1], stop):
                if u >= k_max:
                    break
                cost = devices + d1
                if cost < vec[u + 1]:
                    pick: ForkPick = (stop, d1, u)
                    vec[u + 1], chosen[u + 1] = cost, (layout, pick)

    def _fork_lane(self, solver: ChainSolver, shape: _Shape, k_lane: int, loose: bool = False) -> ForkLane | None:
        """The lane's `ForkLane` (None: no segment from item 0 meets the target), memoised: the layouts that
        give F to the same branch share it."""
        memo = self.loose_lane_memo if loose else self.lane_memo
        per_k = memo.get(shape.fork_key)
        if per_k is None:
            per_k = memo[shape.fork_key] = {}
        elif k_lane in per_k:
            return per_k[k_lane]
        lane, end, last = shape.fork, shape.fork_end, shape.fork_last
        assert lane is not None and lane.chain is not None and lane.body is not None
        options = self._fork_options(lane.chain, last, loose)
        found = None
        if options:
            body = solver.chain(lane.body, k_lane, end - 1)  # the lane's row i is the body's row i - 1
            found = ForkLane(options, body)
        per_k[k_lane] = found
        return found

    def _fork_options(self, info: ChainInfo, last: int, loose: bool = False) -> ForkOptions:
        """(stop, d1, most in flight) of the segments [0, stop) of a fork's lane, stop <= last, within the
        target, by degree and then stop (memoised: the same for every in-flight count); with `loose`, those whose
        compute per sample alone is within it (`fork_floor`).

        A degree is left out where a smaller one of the same segment holds as many micro-batches: it comes
        first and costs fewer devices at every cell the larger one reaches, so the larger never wins one."""
        key = (info.content, last)
        memo = self.loose_fork_memo if loose else self.fork_memo
        hit = memo.get(key)
        if hit is None:
            tables, target = self.tables, self.target
            found = []
            held = [-1] * (last + 1)  # per stop, the most in flight of the smaller degrees kept
            for d1 in tables.degrees:
                compute, tps_row, k_maxes = tables.segment_rows(info, 0, d1, target)
                for idx in range(min(bisect_right(compute, target), last)):
                    k_max = k_maxes[idx]
                    if (loose or tps_row[idx] <= target) and k_max > held[idx + 1]:
                        held[idx + 1] = k_max
                        found.append((idx + 1, d1, k_max))
            hit = memo[key] = tuple(found)
        return hit

    # ---- reconstruction ----------------------------------------------------------------------
    def emit(self, solver: ChainSolver, block: Block, with_join: bool, k_after: int, v: int,
             out: list[StageSpec]) -> None:
        """Append the stages the block's cell v chose: F's stage and the rest of its lane, the other lanes,
        the merge stage, then the branches left whole."""
        pick = self.need(solver, block, with_join, k_after).choice[v]
        assert pick is not None, "reconstructing an infeasible block"
        layout, fork_choice = pick
        k_side = k_after + 1 if with_join else k_after
        shape = self.shapes.shape(block, layout)
        side_v = v
        size = self.tables.micro_batch_size
        if fork_choice is not None:
            stop, d1, side_v = fork_choice
            lane = shape.fork
            assert lane is not None and lane.chain is not None and lane.body is not None
            out.append(StageSpec(ops=lane.chain.ops(0, stop), num_devices=d1, micro_batch_size=size))
            solver.emit_chain(lane.body, k_side if lane.at_side else k_after, side_v, out, start=stop - 1,
                              end=None if lane.end is None else lane.end - 1)
        for lane in shape.rest:
            if lane.chain is not None:
                solver.emit_chain(lane.chain, k_side if lane.at_side else k_after, side_v, out, end=lane.end)
        if layout.merge is not None:
            s0, s1, devices = layout.merge
            assert block.join is not None
            out.append(StageSpec(ops=block.pinfo.merge_ops(block.join.ops, s0, s1), num_devices=devices,
                                 micro_batch_size=size))
        solver.emit_par(block.pinfo, k_side, side_v, out, mask=shape.others)
