"""One probe of the DP: is there a stage graph with every stage's TPS <= T, and which one has the
fewest micro-batches in flight at its source?

The probe solves need vectors (`need`) bottom-up over the SP tree, each sub-problem memoised by
what its answer depends on. Vectors run over v = 0 .. devices + 1 (`SizeTables.max_v`), BIG marks
an infeasible cell, b is the micro-batch, and every vector is capped at the devices (BIG above).
The minima below run over the breakpoints of the vector after the candidate only (where it
drops): `settle` fills in the v between them.

Chain (series case), the suffix of items [i, end) followed by something holding k_after
micro-batches (`Probe._solve_chain`), rows from the end back to item 0:

    base:     need_end[v] = 0 if v >= k_after else BIG
    segment:  need_i[u + 1] = min over j > i, d1 | b with TPS(i, j, d1) <= T and k_max(i, j, d1) >= u + 1
                              of d1 + need_j[u]         (the stage [i, j) holds one more than what follows)
    parallel: need_i[v] = min over k < v of par_k(P)[v] + need_{i+1}[k]       (item i = P, given k after it)
    block:    need_i[v] = min over k < v of block_k[v] + need_stop[k]          (`fork_join`, from item i)
    joined:   need_i[v] = min over k < v of joined_k(P, J)[v] + need_stop[k]   (item i = P, J its join run,
                                                                                 more than 4 branches: `joined`)
    settle:   need_i[v] = min(need_i[v], need_i[v - 1])   (more in flight allowed never costs devices)

Parallel block P given k_after (`Probe._solve_par`), over subsets M of its branches (bit masks
in sorted order, smaller first; G runs over the groups holding M's lowest branch: any subset
with up to 4 branches, runs of consecutive sorted branches above, where M is a suffix of the
sorted order, or for `joined` a prefix, G then the runs ending at M's last branch):

    base:     par[{}][v] = 0 if v >= k_after or P has no bypass edge else BIG
    group:    par[M][v] = min over G of g_G[v] + par[M \\ G][v]     (runs: one numpy minimum per M, `runs`)
              g_G = the branch's chain need_0 given k_after        (G one branch)
              g_G[v] = fewest d1 with TPS <= T and k_max >= k_after + 1, for v > k_after  (G merged)

The tree's entry is the smallest v with need_0[v] within the devices; the stages are rebuilt
from the recorded choices (`need.ChainChoice`, `need.GroupChoice`, `need.LayoutChoice`).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Protocol

import numpy as np

from graphpipe.graph.sp import SPChain
from graphpipe.planner.sp_dp.blocks import BIG, MAX_ENUMERATED_BRANCHES
from graphpipe.planner.sp_dp.fork_join import ForkJoinSolver, ForkLane, Shapes
from graphpipe.planner.sp_dp.merge_tails import MergeTables, floor_needs, suffix_floors
from graphpipe.planner.sp_dp.need import (
    BLOCK,
    JOINED,
    NO_KEY,
    OPEN,
    SEG,
    BlockSol,
    CellChoices,
    ChainChoice,
    ChainSol,
    GroupChoice,
    ItemKind,
    JoinedChoice,
    JoinedSol,
    ParSol,
    feasible_breakpoints,
    feasible_breakpoints_of_rows,
    settle_segments,
)
from graphpipe.planner.sp_dp.rows import ArrayRow, ListRow, Vector, row_for
from graphpipe.planner.sp_dp.runs import fewest_per_run, solve_runs
from graphpipe.planner.sp_dp.size_tables import SegmentOffers, SizeTables, cell_key_scale, dominance_cap
from graphpipe.planner.sp_dp.tables import BlockKey, ChainInfo, ParInfo
from graphpipe.planner.stage_spec import StageSpec

FLOOR_ITEMS = 16  # the shortest chain whose entry need comes from its floors (`Probe.entry_need`): below it the
# DP's few rows cost less than the numpy passes' fixed work (measured: slower at 4-8 items, break-even at 16-32)
REBUILD_ITEMS = 24  # the shortest chain whose stages are rebuilt from its floors (`_emit_from_floors`): below it the
# DP's rows cost less than the suffix floors (measured: slower at 16-17 items, faster at 32 and above)
REBUILD_STAGES = 0.5  # the most stages, per item, a plan rebuilt from floors may have (v - k_after bounds them): with
# more, it reads about as many rows as the DP solves (mmt 4 x 32 layers at 1,024 devices: a stage per layer)


@dataclass(slots=True)
class _FloorRows:
    """A chain's rows rebuilt from its suffix floors (`Probe._emit_from_floors`), cells 0 to v: every suffix's
    feasible breakpoints below v (by start, to the end the plan reaches) and the choices of the rows built so far,
    by start."""

    v: int
    breaks: list[list[tuple[int, int]]]
    chosen: dict[int, list[ChainChoice | None]]


def _with_last_stage(segments: tuple[list[int], list[int]] | None, d1: int, k_after: int, end: int, span: int,
                     unit: int, cells: int) -> tuple[list[int], list[int]]:
    """`segments` with the stage [start, end) on d1 devices as the candidate of cell k_after + 1 (the row `end` needs
    nothing from k_after on), as a cell key (`SegmentOffers`)."""
    best, written = segments if segments is not None else ([NO_KEY] * cells, [])
    if k_after < cells - 1:
        key = d1 * (unit + span) + end  # the rest after it needs no devices
        if key < best[k_after]:
            if best[k_after] == NO_KEY:
                written = [*written, k_after]
            best[k_after] = key
    return best, written


class ProbeHost(Protocol):
    """What a probe reads of its search (`search.Search`): the size's tables and merge stages, the tree's root
    chain, the fork/join shapes shared by the sizes, and the segment offers for a target."""

    tables: SizeTables
    root: ChainInfo
    shapes: Shapes
    merges: MergeTables

    def offers(self, info: ChainInfo, target_ms: float) -> SegmentOffers: ...


class Probe:
    """One DP run for a micro-batch size and a TPS target; its memo tables are the DP's work."""

    def __init__(self, host: ProbeHost, target_ms: float) -> None:
        self.host = host
        self.tables = host.tables
        self.target = target_ms
        self.dominated = dominance_cap(target_ms)  # offers with `until` up to this are dominated
        self.chain_memo: dict[tuple[int, int, int], ChainSol] = {}  # (chain's content, k_after, end)
        self.par_memo: dict[tuple[int, int, bool], ParSol] = {}  # (parallel block, k_after, prefixes)
        self.joined_memo: dict[tuple[int, tuple[str, ...], int], JoinedSol] = {}  # (parallel block, join ops, k_after)
        self.entry_memo: dict[tuple[int, int, int], list[int]] = {}  # (chain's content, k_after, end)
        self.floor_rows_memo: dict[tuple[int, int, int, int], _FloorRows] = {}  # (chain's content, k_after, end, v)
        self.ends_memo: dict[tuple[int, int], list[int]] = {}  # (chain's content, k_after): the ends solved
        self.reach_memo: dict[int, list[int]] = {}  # chain's content: `_reach`
        self.cut_memo: dict[tuple[int, int, int], list[int]] = {}  # (chain's content, k_after, cut): `cut_floor`
        self.blocks = ForkJoinSolver(self.tables, target_ms, host.shapes, host.merges)

    @property
    def block_memo(self) -> dict[tuple[BlockKey, bool, int], BlockSol]:
        return self.blocks.block_memo

    @property
    def lane_memo(self) -> dict[tuple[int, int, int], dict[int, ForkLane | None]]:
        return self.blocks.lane_memo

    # ---- chains --------------------------------------------------------------------------
    def chain(self, info: ChainInfo, k_after: int, end: int | None = None) -> ChainSol:
        """The chain's items [0, end) (all by default), followed by something holding `k_after` micro-batches."""
        end = info.num_items if end is None else end
        key = (info.content, k_after, end)  # twins (`ChainTables.twin_of`) share their rows
        sol = self.chain_memo.get(key)
        if sol is None:
            ends = self.ends_memo.setdefault((info.content, k_after), [])
            other = min(ends, key=lambda solved: abs(solved - end), default=None)
            sol = self.chain_memo[key] = self._solve_chain(
                info, k_after, end, None if other is None else self.chain_memo[(info.content, k_after, other)])
            ends.append(end)
        return sol

    def entry_need(self, info: ChainInfo, k_after: int, end: int | None = None) -> list[int]:
        """The need vector at the entry of a chain inside the tree (a branch, a lane), `chain(...).need[0]`, which is
        all its parents read. A chain without parallel items whose stages' degrees do not depend on their in-flight
        counts at this target (`SizeTables.fewest_free`) needs at v what its prefix [0, end) needs staged in at most
        v - k_after stages, each on its segment's fewest degree: its prefix floors (`merge_tails.prefix_floors`),
        one numpy pass for every end and k_after instead of the DP's rows; a chain with parallel items, or whose
        counts matter, is solved. Its stages are rebuilt (`emit_chain`) only where a plan found uses it (of a
        two-branch block's lanes, a tower and the tower with the head, one or two), from its suffix floors where
        these are its needs (`_emit_from_floors`). The root
        chain is always solved (`best_entry`): a plan found is rebuilt from it at once."""
        end = info.num_items if end is None else end
        key = (info.content, k_after, end)
        if info.has_parallel or key in self.chain_memo:
            return self.chain(info, k_after, end).need[0]
        need = self.entry_memo.get(key)
        if need is None:
            floors = self._floors(info)
            if floors is None:
                return self.chain(info, k_after, end).need[0]
            row = floor_needs(floors, np.array([end]), k_after, self.tables.num_devices)[0]
            need = self.entry_memo[key] = row.tolist()
        return need

    def cut_floor(self, info: ChainInfo, k_after: int, end: int) -> list[int] | None:
        """A floor of `entry_need(info, k_after, end)` from a shorter prefix, None where the chain has no cut before
        `end` (`ChainInfo.cut_at`).

        Cut a staging of [0, end) at a position c <= end that no join run spans: the stages before c stay as they
        are, the one across c keeps its items before c, the rest go. Every block stays whole or goes, so this is a
        staging of [0, c) that the DP can express, each stage holding what it held (the rest after each is smaller,
        and a need vector never rises with the cell) on at most the devices it had. The cut stage's compute,
        weights, activations and the tensors it receives are at most the whole stage's; only what it sends may
        grow (a tensor to the items it lost now leaves it). So [0, c) solved with its last stage judged without what
        it sends (`SizeTables.loose_last`) needs at most what [0, end) needs at every cell. Memoised per cut: one
        solve floors every end up to the next cut (on CLIP's towers at op level, a transformer layer's ops)."""
        cut = info.cut_at(end)
        if cut == end or cut == 0:
            return None
        key = (info.content, k_after, cut)
        hit = self.cut_memo.get(key)
        if hit is None:
            ends = self.ends_memo.get((info.content, k_after), [])
            if not any(solved != end and info.cut_at(solved) == cut for solved in ends):
                return None  # the first prefix up to the next cut: the cut's solve would cost about what it saves
            loose = self.tables.loose_last(info, cut, self.target, k_after + 1)
            other = min(ends, key=lambda solved: abs(solved - cut), default=None)
            sol = self._solve_chain(info, k_after, cut, None if other is None else
                                    self.chain_memo[(info.content, k_after, other)], loose)
            hit = self.cut_memo[key] = sol.need[0]
        return hit

    def _floors(self, info: ChainInfo) -> np.ndarray | None:
        """The chain's prefix floors where they are its needs (`ForkJoinSolver.free_floors`) and it has at least
        FLOOR_ITEMS items, else None."""
        return None if info.num_items < FLOOR_ITEMS else self.blocks.free_floors(info)

    def _solve_chain(self, info: ChainInfo, k_after: int, end: int, other: ChainSol | None = None,
                     loose: np.ndarray | None = None) -> ChainSol:
        """Suffix need vectors from `end` back to item 0. Rows past `end` stay infeasible, so no segment,
        block or parallel item reaches beyond it (a prefix of a chain reuses the chain's tables); they are
        only read, so they share one row (a merge stage's prefixes solve many short ends of a long chain),
        as do the rows where no stage starts within the target. A row where no block starts holds only
        segments, built settled from the cells they write (`need.settle_segments`).

        `other` is the same chain and k_after solved to another end (a merge stage's lanes are prefixes of a
        tower cut at one tail after another). A row is computed from the rows it reads only (`_reach`); so
        once every row that the rows below `start` read is the same in both, all the rows below are `other`'s,
        which are taken as they are (on CLIP's towers, most prefixes of one tower meet the last one's rows a
        few dozen items before their ends).

        `loose` (`cut_floor`): per start, the fewest degree of a last stage [start, end) judged without the tensors
        it sends (`SizeTables.loose_last`), a candidate of the start's row; rows from the first such start on are
        not `other`'s."""
        t = self.tables
        num_items, max_v, num_devices = info.num_items, t.max_v, t.num_devices
        cells = max_v + 1
        dead: list[int] = [BIG] * cells
        need = [dead] * (num_items + 1)  # a row nothing reaches stays this one, only read (`ChainSol`)
        choice: list[CellChoices] = [[None] * cells] * (num_items + 1)
        need[end] = [0 if v >= k_after else BIG for v in range(cells)]
        breaks: list[list[tuple[int, int]]] = [[] for _ in range(num_items + 1)]
        breaks[end] = feasible_breakpoints(need[end], num_devices)
        fewest = [BIG] * (num_items + 1)  # the last breakpoint's devices
        fewest[end] = breaks[end][-1][1] if breaks[end] else BIG
        offers = self.host.offers(info, self.target)
        span, unit = offers.span, offers.unit
        reach = self._reach(info, offers) if other is not None else []
        differs = end  # the lowest row solved so far that is not `other`'s (row `end` is not: it ends this chain)
        first_loose = np.flatnonzero(loose < BIG) if loose is not None else np.zeros(0, dtype=np.int64)
        own = int(first_loose[0]) if first_loose.size else end  # rows from here on hold a loose last stage
        for start in range(end - 1, -1, -1):
            if other is not None and reach[start] < differs and start < own:  # rows [0, start] read the same rows
                need[:start + 1], choice[:start + 1] = other.need[:start + 1], other.choice[:start + 1]
                breaks[:start + 1] = other.breaks[:start + 1]
                break
            segments = self._segment_keys(offers, start, breaks, fewest, cells)
            if loose is not None and loose[start] < BIG:
                segments = _with_last_stage(segments, int(loose[start]), k_after, end, span, unit, cells)
            written = None
            if info.next_parallel[start] < num_items:  # a parallel item at or after `start`: blocks may start here
                written = row_for(cells, segments, span, unit)
                pinfo = info.par_infos[start]
                if pinfo is not None:
                    self._open(pinfo, breaks[start + 1], written)
                    self._join_run(info, start, pinfo, breaks, written)
                self._blocks(info, start, breaks, written)
            if written is not None and written.holds_items:
                row, chosen, found = written.settle(num_devices)
            elif segments is not None:  # no item written (none, or each skipped: `_before`): the segments alone
                row, chosen, found = settle_segments(*segments, span, unit, num_devices, cells)
            else:  # no stage starts here within the target: the dead row
                if other is not None and other.need[start] != dead:
                    differs = start
                continue
            need[start], choice[start], breaks[start] = row, chosen, found
            if found:
                fewest[start] = found[-1][1]
            if other is not None and (found != other.breaks[start] or row != other.need[start]):
                differs = start
        return ChainSol(need=need, choice=choice, breaks=breaks)

    def _reach(self, info: ChainInfo, offers: SegmentOffers) -> list[int]:
        """Per start s, the highest row that rows [0, s] read (`_solve_chain`): the stops of the segments within
        the target, the row after the parallel item, the rows after the blocks starting there; per probe."""
        found = self.reach_memo.get(info.content)
        if found is None:
            found, highest, target = [], 0, self.target
            for start in range(info.num_items):
                lo, hi = offers.offsets[start], bisect_right(offers.tps, target, offers.offsets[start],
                                                             offers.offsets[start + 1])
                block = info.fork_join(start)
                highest = max(highest, start + 1, max(offers.stops[lo:hi], default=0),
                              0 if block is None else block.stop)
                found.append(highest)
            self.reach_memo[info.content] = found
        return found

    def _segment_keys(self, offers: SegmentOffers, start: int, breaks: list[list[tuple[int, int]]],
                      fewest: list[int], size: int) -> tuple[list[int], list[int]] | None:
        """Per u, the key of the best segment [start, stop) as the first stage of cell u + 1, and the u that have
        one (None: no offer within the target). Only the breakpoints of the rest's vector matter (the monotone
        pass of `settle` fills in the v between them). A candidate needing more than all the devices is never
        kept (`settle` marks it infeasible), so it is not tried: the rest's fewest devices (its last
        breakpoint, `fewest[stop]`) must leave room for d1.

        Each cell keeps the cheapest offer, then the smallest degree, then the shortest segment, as one
        integer key (`SegmentOffers`), so the offers can come in any order: here by TPS, so that those
        within the target are a prefix of the start's. A degree is skipped where a smaller degree of the
        same segment is within the target and holds as many micro-batches in flight (it makes every
        offer of this one at fewer devices); the rest are all tried, so a degree also tries the v
        that a smaller one already covers (they never win a cell)."""
        target = self.target
        lo = offers.offsets[start]
        hi = bisect_right(offers.tps, target, lo, offers.offsets[start + 1])
        if lo == hi:
            return None
        unit = offers.unit
        best = [NO_KEY] * size  # per u, the key of cell u + 1
        written: list[int] = []
        dominated = self.dominated
        for room, stop, k_max, until, base in zip(offers.rooms[lo:hi], offers.stops[lo:hi], offers.k_maxes[lo:hi],
                                                  offers.until[lo:hi], offers.keys[lo:hi]):
            if until <= dominated or fewest[stop] > room:
                continue
            for u, devices in breaks[stop]:
                if u >= k_max:
                    break
                if devices <= room:
                    key = devices * unit + base
                    held = best[u]
                    if key < held:
                        if held == NO_KEY:
                            written.append(u)
                        best[u] = key
        return best, written

    def _open(self, pinfo: ParInfo, rest: list[tuple[int, int]], row: ListRow | ArrayRow) -> None:
        """The row's parallel item solved as a plain parallel block, then the rest of the chain."""
        def block_at(k_after: int) -> list[int]:
            sol = self.par(pinfo, k_after)
            return sol.need[sol.full]

        self._before(rest, row, block_at, OPEN, False)

    def _join_run(self, info: ChainInfo, start: int, pinfo: ParInfo, breaks: list[list[tuple[int, int]]],
                  row: ListRow | ArrayRow) -> None:
        """The row's parallel item (of runs, `ParInfo.interval`) with its join run, whose stage takes the lightest
        branches whole (`joined`), then the rest of the chain."""
        found = info.fork_join(start) if pinfo.interval else None
        if found is not None and found.join is not None:
            self._before(breaks[found.stop], row, partial(self.joined, pinfo, found.join.ops), JOINED, True)

    @staticmethod
    def _before(rest: list[tuple[int, int]], row: ListRow | ArrayRow, block_at: Callable[[int], Vector],
                kind: ItemKind, with_join: bool,
                floor_at: Callable[[int], tuple[list[int], list[int]] | None] | None = None) -> None:
        """A block followed by the rest, whose feasible breakpoints are `rest`: for every in-flight count k_after at
        which the rest needs fewer devices than at any smaller one (a breakpoint), the block's need vector given
        k_after plus those devices, written into the row (`rows`) as (kind, with_join, k_after, v).

        Where the row shows (`overridden`) that nothing at or above a floor of the block's vector would change it,
        the block is neither solved nor written there. A need vector never falls as k_after grows (every stage holds
        at least as many micro-batches), so the vector at a smaller k_after is a floor for the next breakpoints;
        `floor_at` gives one for the first (`ForkJoinSolver.fork_floor`, one for every fork run into a block, with
        the cells where it changes), or None. On CLIP's towers at op level (64 devices, a probe at the optimum)
        9,929 of 10,413 candidates are skipped so, and all but 232 of the probe's 1,195 block solves with them."""
        floor: Vector | None = None
        changes: list[int] | None = None
        for k_after, devices in rest:
            if floor is None and floor_at is not None:
                found = floor_at(k_after)
                if found is not None:
                    floor, changes = found
            if floor is not None and row.overridden(k_after, devices, floor, changes):
                continue
            floor, changes = block_at(k_after), None
            row.write(kind, with_join, k_after, devices, floor)

    def _blocks(self, info: ChainInfo, start: int, breaks: list[list[tuple[int, int]]],
                row: ListRow | ArrayRow) -> None:
        """Blocks F + P, F + P + J and P + J starting at item `start` (see `fork_join`), `breaks` the feasible
        breakpoints of the chain's rows; a row of arrays reads each block's vector as an array (made once)."""
        found = info.fork_join(start)
        if found is None or found.num_branches > MAX_ENUMERATED_BRANCHES:
            return
        read = self.blocks.array if isinstance(row, ArrayRow) else self.blocks.vector
        shortest = info.fork_join(found.par_pos - 1) if found.fork is not None else None
        for with_join in (False, True) if found.join is not None else (False,):
            if found.fork is None and not with_join:
                continue
            rest = breaks[found.stop if with_join else found.par_pos + 1]
            floor_at = None if shortest is None else partial(self.blocks.fork_floor, self, found, shortest, with_join)
            self._before(rest, row, partial(read, self, found, with_join), BLOCK, with_join, floor_at)

    # ---- parallel blocks -----------------------------------------------------------------
    def par(self, pinfo: ParInfo, k_after: int, prefixes: bool = False) -> ParSol:
        """The block's branches grouped, given k_after; with `prefixes` (runs only), the sub-problems are the
        prefixes of the sorted order instead of its suffixes (what `joined` reads), same optimum per mask."""
        key = (pinfo.index, k_after, prefixes)
        sol = self.par_memo.get(key)
        if sol is None:
            sol = self.par_memo[key] = self._solve_par(pinfo, k_after, prefixes)
        return sol

    def _solve_par(self, pinfo: ParInfo, k_after: int, prefixes: bool) -> ParSol:
        t = self.tables
        max_v = t.max_v
        full = (1 << len(pinfo.par.branches)) - 1
        base = [0 if (v >= k_after or not pinfo.par.has_bypass) else BIG for v in range(max_v + 1)]
        if pinfo.interval:
            return self._solve_runs(pinfo, k_after, prefixes, base)
        assert not prefixes, "prefixes are the sub-problems of a block of runs (`joined`)"
        by_count = t.options_by_count(pinfo)
        if by_count is not None:
            return self._solve_twins(pinfo, k_after, base, by_count)
        need: dict[int, list[int]] = {0: base}
        choice: dict[int, list[GroupChoice | None]] = {0: [None] * (max_v + 1)}
        cells = range(k_after + 1, max_v + 1)  # a group's entry holds at least k_after + 1: BIG below
        for mask in sorted(range(1, full + 1), key=lambda m: bin(m).count("1")):  # smaller first
            row = [BIG] * (max_v + 1)
            chosen: list[GroupChoice | None] = [None] * (max_v + 1)
            for group in pinfo.groups_of(mask):
                rest = need[mask ^ group]
                if group & (group - 1) == 0:  # one branch, staged as its chain
                    vec = self.entry_need(pinfo.branch_infos[group.bit_length() - 1], k_after)
                    for v in cells:
                        cost = vec[v] + rest[v]
                        if cost < row[v]:
                            row[v] = cost
                            chosen[v] = (group, 0)
                    continue
                devices = self._fewest(t.group_options(pinfo, group), k_after + 1)
                if devices >= BIG:
                    continue
                for v in cells:
                    cost = devices + rest[v]
                    if cost < row[v]:
                        row[v] = cost
                        chosen[v] = (group, devices)
            need[mask] = [c if c <= t.num_devices else BIG for c in row]
            choice[mask] = chosen
        return ParSol(need=need, choice=choice, full=full)

    def _solve_twins(self, pinfo: ParInfo, k_after: int, base: list[int],
                     by_count: list[list[tuple[int, float, int]]]) -> ParSol:
        """`_solve_par` for a block of twin branches whose merged groups cost alike by size
        (`SizeTables.options_by_count`): a subset's vector depends only on its size, so the DP runs over counts,

            par[c][v] = min over g = 1 .. c of g_g[v] + par[c - g][v]     (g_1: the branch's chain, else merged),

        in O(n^2 V) instead of O(3^n V), with the same vectors per mask. A cell's choice is found again on demand
        (`pick`): the first group of the loop's order (`ParInfo.groups_of`) that meets the cell's value."""
        t = self.tables
        max_v, count = t.max_v, len(pinfo.branch_infos)
        vec = self.entry_need(pinfo.branch_infos[0], k_after)
        merged = [BIG, BIG] + [self._fewest(by_count[size], k_after + 1) for size in range(2, count + 1)]
        cells = range(k_after + 1, max_v + 1)
        by_size = [base]
        for size in range(1, count + 1):
            row = [BIG] * (max_v + 1)
            rest = by_size[size - 1]
            for v in cells:  # one branch, staged as its chain
                cost = vec[v] + rest[v]
                if cost < row[v]:
                    row[v] = cost
            for group in range(2, size + 1):  # that many branches merged into one stage
                rest, devices = by_size[size - group], merged[group]
                if devices < BIG:
                    for v in cells:
                        cost = devices + rest[v]
                        if cost < row[v]:
                            row[v] = cost
            by_size.append([c if c <= t.num_devices else BIG for c in row])
        full = (1 << count) - 1
        need = {mask: by_size[mask.bit_count()] for mask in range(full + 1)}

        def pick(mask: int, v: int) -> GroupChoice:
            for group in pinfo.groups_of(mask):
                single = group & (group - 1) == 0
                devices = 0 if single else merged[group.bit_count()]
                if devices < BIG and (vec[v] if single else devices) + need[mask ^ group][v] == need[mask][v]:
                    return group, devices
            raise AssertionError(f"no group of mask {mask} meets cell {v}")  # a feasible cell always has one

        return ParSol(need=need, choice={}, full=full, pick=pick)

    def _solve_runs(self, pinfo: ParInfo, k_after: int, prefixes: bool, base: list[int]) -> ParSol:
        """`_solve_par` for a block of runs (`ParInfo.interval`), as arrays (`runs`): the same vectors and choices."""
        t = self.tables
        tps, k_max = t.run_options(pinfo)
        fewest = fewest_per_run(tps, k_max, t.degrees, self.target, k_after + 1, cut_after_first_miss=not prefixes)
        chains = np.array([self.entry_need(info, k_after) for info in pinfo.branch_infos], dtype=np.int64)
        sol = solve_runs(fewest, chains, base, k_after, t.num_devices, prefixes)
        return ParSol(need=sol.need(), choice={}, full=(1 << len(chains)) - 1, pick=sol.pick)

    def _fewest(self, options: list[tuple[int, float, int]], held: int) -> int:
        """The fewest devices of a stage's options (`SizeTables.group_options`) that meet the target and hold
        `held` micro-batches (BIG: none)."""
        for d1, tps, k_max in options:
            if tps <= self.target and k_max >= held:
                return d1
        return BIG

    # ---- a join run's stage with the lightest branches ---------------------------------------
    def joined(self, pinfo: ParInfo, join_ops: tuple[str, ...], k_after: int) -> list[int]:
        """Need vector of the block and its join run J, J's stage taking the sorted branches from some g on
        whole, followed by something holding k_after:

            joined[v] = min over g of d_g + par_{k_after + 1}[branches [0, g)][v]     (v > k_after)

        d_g the fewest devices on which J and branches [g, n) meet the target and hold k_after + 1; the
        branches before g feed J's stage, grouped in runs (`_solve_par`, whose masks are those prefixes)."""
        return self._joined_sol(pinfo, join_ops, k_after).need

    def _joined_sol(self, pinfo: ParInfo, join_ops: tuple[str, ...], k_after: int) -> JoinedSol:
        key = (pinfo.index, join_ops, k_after)
        sol = self.joined_memo.get(key)
        if sol is None:
            sol = self.joined_memo[key] = self._solve_joined(pinfo, join_ops, k_after)
        return sol

    def _solve_joined(self, pinfo: ParInfo, join_ops: tuple[str, ...], k_after: int) -> JoinedSol:
        t, held = self.tables, k_after + 1
        row = [BIG] * (t.max_v + 1)
        chosen: list[JoinedChoice | None] = [None] * (t.max_v + 1)
        feeding = self.par(pinfo, held, prefixes=True).need
        for first in pinfo.join_groups():
            devices = self._fewest(t.joined_options(pinfo, first, join_ops), held)
            if devices >= BIG:
                continue
            rest = feeding[(1 << first) - 1]
            for v in range(held, t.max_v + 1):
                cost = devices + rest[v]
                if cost < row[v]:
                    row[v] = cost
                    chosen[v] = (first, devices)
        return JoinedSol(need=[c if c <= t.num_devices else BIG for c in row], choice=chosen)

    # ---- result ----------------------------------------------------------------------------
    def best_entry(self, tree: SPChain | None = None) -> int | None:
        """Fewest micro-batches in flight at the entry of the search's tree (`tree`, if given, must be it)
        among the plans within the target; None: no plan."""
        root = self._root(tree)
        need = self.chain(root, 0).need[0]  # solved: a plan found is rebuilt from it at once
        for v in range(1, self.tables.max_v + 1):
            if need[v] <= self.tables.num_devices:
                return v
        return None

    def stages(self, tree: SPChain | None, v: int) -> list[StageSpec]:
        """The stages of the plan whose entry holds v micro-batches (`best_entry`)."""
        out: list[StageSpec] = []
        self.emit_chain(self._root(tree), 0, v, out)
        return out

    def _root(self, tree: SPChain | None) -> ChainInfo:
        root = self.host.root
        assert tree is None or tree is root.chain, "a probe solves its search's tree"
        return root

    def emit_chain(self, info: ChainInfo, k_after: int, v: int, out: list[StageSpec], start: int = 0,
                   end: int | None = None) -> None:
        end = info.num_items if end is None else end
        if (info.content, k_after, end) not in self.chain_memo and self._emit_from_floors(info, k_after, v, out,
                                                                                          start, end):
            return
        sol = self.chain(info, k_after, end)
        while start < end:
            chosen = sol.choice[start][v]
            assert chosen is not None, "reconstructing an infeasible DP state"
            if chosen[0] == SEG:
                _, stop, d1, u = chosen
                out.append(StageSpec(ops=info.ops(start, stop), num_devices=d1,
                                     micro_batch_size=self.tables.micro_batch_size))
                start, v = stop, u
            elif chosen[0] == OPEN:
                _, _, block_after, block_v = chosen
                pinfo = info.par_infos[start]
                assert pinfo is not None
                self.emit_par(pinfo, block_after, block_v, out)
                start, v = start + 1, block_after
            elif chosen[0] == JOINED:
                _, _, block_after, block_v = chosen
                pinfo, found = info.par_infos[start], info.fork_join(start)
                assert pinfo is not None and found is not None and found.join is not None
                self.emit_joined(pinfo, found.join.ops, block_after, block_v, out)
                start, v = found.stop, block_after
            else:
                _, with_join, block_after, block_v = chosen
                found = info.fork_join(start)
                assert found is not None
                self.blocks.emit(self, found, with_join, block_after, block_v, out)
                start, v = (found.stop if with_join else found.par_pos + 1), block_after

    def _emit_from_floors(self, info: ChainInfo, k_after: int, v: int, out: list[StageSpec], start: int,
                          end: int) -> bool:
        """The stages of a chain whose entry need came from its floors (`entry_need`), without the DP's rows: where
        no stage's degree depends on its count, the need of every suffix [s, end) is its suffix floor
        (`merge_tails.suffix_floors`) as the entry need is its prefix floor, so the rows of the starts the plan
        visits are the DP's rows, one row per stage instead of one per item, each kept for the chain's twins
        (`_FloorRows`): the same choices (`_floor_row`). Only the cells up to the entry's v are built: v only
        falls along the stages (a choice at cell v leaves u < v to the rest), a row's cell v reads the rest's
        cells below v only, and settling is a pass upwards, so these cells and their choices are the full rows'
        (and the suffix floors need only v - k_after stages). False (nothing emitted) where the floors are not the
        needs, the chain is shorter than REBUILD_ITEMS, or the plan may have more stages than REBUILD_STAGES of its
        items (v - k_after bounds them): there the DP's rows cost no more."""
        if info.has_parallel or info.num_items < REBUILD_ITEMS or v - k_after > REBUILD_STAGES * (end - start):
            return False
        key = (info.content, k_after, end, v)
        rows = self.floor_rows_memo.get(key)
        if rows is None:
            if self._floors(info) is None:
                return False
            rows = self.floor_rows_memo[key] = self._floor_rows(info, k_after, end, v)
        size = self.tables.micro_batch_size
        while start < end:
            picked = rows.chosen.get(start)
            if picked is None:
                picked = rows.chosen[start] = self._floor_row(info, rows, start)
            choice = picked[v]
            assert choice is not None and choice[0] == SEG, "reconstructing an infeasible DP state"
            _, stop, d1, u = choice
            out.append(StageSpec(ops=info.ops(start, stop), num_devices=d1, micro_batch_size=size))
            start, v = stop, u
        return True

    def _floor_rows(self, info: ChainInfo, k_after: int, end: int, v: int) -> _FloorRows:
        """The breakpoints of every suffix's need vector at the cells below v, read off the suffix floors (past `end`
        there are no suffixes: the DP's rows are infeasible there)."""
        t = self.tables
        fewest = self.blocks.free_fewest(info)
        assert fewest is not None  # count-free, as `_floors` found
        floors = suffix_floors(fewest, end, v - 1 - k_after)
        needs = floor_needs(floors, np.arange(end + 1), k_after, t.num_devices, cells=v)
        return _FloorRows(v, feasible_breakpoints_of_rows(needs, t.num_devices), {})

    def _floor_row(self, info: ChainInfo, rows: _FloorRows, start: int) -> list[ChainChoice | None]:
        """The choices of the DP's row at `start`, cells 0 to `rows.v`, from the suffixes' needs (`_FloorRows`).

        `_segment_keys` reads the offers of `start` within the target; where no stage's degree depends on its
        count, the offer a segment [start, stop) wins a cell with is its fewest degree (`fewest_free`): any
        wider one of the same segment is dominated by it, or costs more at every count it holds, and it holds
        every count the DP asks for. So each cell u + 1 takes, over the stops, the least cell key (devices,
        then degree, then stop) of that degree plus the rest's need at a breakpoint u of the rest's vector,
        within the devices: `_segment_keys`'s cell without the offers (a lane rebuilt here needs none)."""
        t = self.tables
        fewest = self.blocks.free_fewest(info)
        assert fewest is not None  # count-free, as `_floor_rows` found
        cap, cells = t.num_devices, rows.v + 1
        span, unit = cell_key_scale(info.num_items, cap)
        best = [NO_KEY] * rows.v  # per u, the key of cell u + 1
        written: list[int] = []
        for stop, d1 in enumerate(fewest[start, start + 1:len(rows.breaks)].tolist(), start + 1):
            if d1 > cap:
                continue
            base, room = d1 * (unit + span) + stop, cap - d1
            for u, devices in rows.breaks[stop]:
                if devices <= room:
                    key = devices * unit + base
                    held = best[u]
                    if key < held:
                        if held == NO_KEY:
                            written.append(u)
                        best[u] = key
        return settle_segments(best, written, span, unit, cap, cells)[1]

    def emit_par(self, pinfo: ParInfo, k_after: int, v: int, out: list[StageSpec], mask: int | None = None,
                 prefixes: bool = False) -> None:
        sol = self.par(pinfo, k_after, prefixes)
        mask = sol.full if mask is None else mask
        while mask:
            chosen = sol.chosen(mask, v)
            assert chosen is not None, "reconstructing an infeasible parallel state"
            group, devices = chosen
            if group & (group - 1) == 0:
                self.emit_chain(pinfo.branch_infos[group.bit_length() - 1], k_after, v, out)
            else:
                out.append(StageSpec(ops=pinfo.group_ops(group), num_devices=devices,
                                     micro_batch_size=self.tables.micro_batch_size))
            mask ^= group

    def emit_joined(self, pinfo: ParInfo, join_ops: tuple[str, ...], k_after: int, v: int,
                    out: list[StageSpec]) -> None:
        chosen = self._joined_sol(pinfo, join_ops, k_after).choice[v]
        assert chosen is not None, "reconstructing an infeasible join stage"
        first, devices = chosen
        out.append(StageSpec(ops=pinfo.with_join(first, join_ops)[0], num_devices=devices,
                             micro_batch_size=self.tables.micro_batch_size))
        self.emit_par(pinfo, k_after + 1, v, out, mask=(1 << first) - 1, prefixes=True)
