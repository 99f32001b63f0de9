"""One probe of the partitioner's DP: is there a stage graph with every stage's TPS <= target?

See `graphpipe.planner.partitioner` for the method; this module holds the DP itself over the
SP tree (need vectors per chain suffix and per parallel block) and the reconstruction of the
stages from the choices it recorded. A probe memoises every sub-problem by what its answer
depends on (`Probe.__init__`: chain suffixes, parallel blocks, fork/join blocks by content,
F's stage options and floors of fork lanes); the sizes of those tables are the DP's work (see
the partitioner's cost paragraph).
"""

from __future__ import annotations

import sys
from bisect import bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from graphpipe.graph.sp import SPChain, SPParallel
from graphpipe.planner.chain_info import ChainInfo
from graphpipe.planner.fork_join import ForkJoin, ForkLane, block_need, emit_block
from graphpipe.planner.stage_cost import CostModel, StageCost
from graphpipe.planner.stage_spec import StageSpec

if TYPE_CHECKING:
    from graphpipe.planner.partitioner import Search

BIG = 1 << 40
_NO_KEY = 1 << 62  # above every (cost, degree, stop) key of `Probe._segment_keys`
MAX_ENUMERATED_BRANCHES = 4
_SEG, _PAR, _BLOCK = 0, 1, 2


def divisors_up_to(value: int, limit: int) -> tuple[int, ...]:
    """Data-parallel degrees a stage with micro-batch `value` may use: divisors of it, at most `limit`."""
    return tuple(d for d in range(1, min(value, limit) + 1) if value % d == 0)


@dataclass(slots=True)
class ChainSol:
    need: list[list[int]]
    choice: list[list[tuple | None]]
    breaks: list[list[tuple[int, int]]]  # per row, its breakpoints (all feasible: the rows are settled)


@dataclass(slots=True)
class _ParSol:
    need: dict[int, list[int]]
    choice: dict[int, list[tuple | None]]
    full: int


@dataclass(slots=True)
class SegmentOffers:
    """Segments of one chain with a degree each (parallel lists), each start's in
    [offsets[start], offsets[start + 1]) ordered by TPS, for targets from `low` to `bound`: all with
    TPS <= `bound`. From a target of `until` on, a smaller degree of the same segment makes every
    offer of this one at fewer devices (`SizeTables._dominated_above`); offers dominated at `low` are
    left out. What `Probe._segment_keys` derives from an offer's degree is stored instead of the degree:
    `rooms` (devices left beside it) and `keys` (its part d1 * (unit + span) + stop of the cell key,
    with the chain's `span` and `unit`)."""
    low: float
    bound: float
    tps: list[float]
    rooms: list[int]
    stops: list[int]
    k_maxes: list[int]
    until: list[float]
    keys: list[int]
    offsets: list[int]
    span: int
    unit: int


def dominance_cap(target_ms: float) -> float:
    """An offer is dominated at `target_ms` when its `until` is at most this (an infinite `until`
    means never, even with no target at all)."""
    return min(target_ms, sys.float_info.max)


def breakpoints(need: list[int]) -> list[tuple[int, int]]:
    """(v, devices) where a non-increasing need vector drops."""
    out, last = [], BIG
    for v, devices in enumerate(need):
        if devices < last:
            out.append((v, devices))
            last = devices
    return out


def _feasible_breakpoints(need: list[int], num_devices: int) -> list[tuple[int, int]]:
    """Breakpoints of a need vector that fit on the devices."""
    return [point for point in breakpoints(need) if point[1] <= num_devices]


def _settle(row: list[int], chosen: list[tuple | None], num_devices: int) -> list[tuple[int, int]]:
    """Make a chain row non-increasing (a cell keeps its own choice unless a smaller v is strictly
    cheaper), mark what needs more than the devices infeasible, and return its feasible breakpoints."""
    out: list[tuple[int, int]] = []
    last = previous = BIG
    for v, devices in enumerate(row):
        if previous < devices:
            devices = previous
            chosen[v] = chosen[v - 1]
        previous = devices
        if devices > num_devices:
            row[v] = BIG
        else:
            row[v] = devices
            if devices < last:
                out.append((v, devices))
                last = devices
    return out


def _settle_keys(best: list[int], offers: SegmentOffers, row: list[int], chosen: list[tuple | None],
                 num_devices: int) -> list[tuple[int, int]]:
    """`Probe._segments` then `_settle` in one pass, for a row only segments write to (all infeasible
    before): the same cells, choices and breakpoints."""
    span, unit = offers.span, offers.unit
    out: list[tuple[int, int]] = []
    last = previous = BIG  # cell 0 stays infeasible
    for u in range(len(row) - 1):
        key, v = best[u], u + 1
        pick: tuple | None = None
        if key == _NO_KEY:
            devices = BIG
        else:
            devices, rest_key = divmod(key, unit)
            d1, stop = divmod(rest_key, span)
            pick = (_SEG, stop, d1, u)
        if previous < devices:
            devices, pick = previous, chosen[u]
        previous = devices
        chosen[v] = pick
        if devices <= num_devices:
            row[v] = devices
            if devices < last:
                out.append((v, devices))
                last = devices
    return out


class ParInfo:
    """Branch order and merged-group costs of one parallel block."""

    def __init__(self, model: CostModel, par: SPParallel, infos: dict[int, ChainInfo]) -> None:
        self.par = par
        ref = max(model.costs.micro_batch_sizes, default=1)
        weight = [sum(sum(model.op_at(op, ref)[:2]) for op in branch.ops) for branch in par.branches]
        self.order = sorted(range(len(par.branches)), key=lambda r: -weight[r])
        self.branch_infos = [infos[id(par.branches[r])] for r in self.order]
        self.model = model
        self.interval = len(par.branches) > MAX_ENUMERATED_BRANCHES
        self._groups: dict[int, tuple[tuple[str, ...], int, int, float]] = {}
        self._boundaries: dict[int, tuple[frozenset[str], frozenset[str]]] = {}
        self.extended: dict[tuple[int, tuple[str, ...], tuple[str, ...]], SPChain] = {}  # fork_join.extended_chain
        self.merge_costs: dict[tuple[tuple[str, ...], int, int, int, int], StageCost] = {}  # fork_join._merge_devices

    def group(self, mask: int) -> tuple[tuple[str, ...], int, int, float]:
        """(ops, param bytes, messages, bytes per sample) of the branches in `mask` as one stage."""
        hit = self._groups.get(mask)
        if hit is None:
            top = 1 << (mask.bit_length() - 1)
            if mask == top:
                ops = self.branch_infos[mask.bit_length() - 1].chain.ops
                params = sum(self.model.param_bytes[op] for op in ops)
            else:  # the lower branches, then the top one: branch order, as one pass over them would give
                (rest_ops, rest_params, *_), (top_ops, top_params, *_) = self.group(mask ^ top), self.group(top)
                ops, params = rest_ops + top_ops, rest_params + top_params
            messages, num_bytes = self.model.crossing(*self._sides(mask))
            hit = self._groups[mask] = (ops, params, messages, num_bytes)
        return hit

    def _sides(self, mask: int) -> tuple[frozenset[str], frozenset[str]]:
        """(received, sent) tensors of the branches in `mask` as one stage: the unions of the branches' own,
        as no edge joins two branches of a block (`CostModel.boundary_sides`, grown a branch at a time)."""
        hit = self._boundaries.get(mask)
        if hit is None:
            top = 1 << (mask.bit_length() - 1)
            if mask == top:
                hit = self.model.boundary_sides(self.branch_infos[mask.bit_length() - 1].chain.ops)
            else:
                (recv, send), (top_recv, top_send) = self._sides(mask ^ top), self._sides(top)
                hit = (recv | top_recv, send | top_send)
            self._boundaries[mask] = hit
        return hit

    def groups_of(self, mask: int) -> Iterator[int]:
        """Groups that contain the lowest branch of `mask`."""
        low = mask & -mask
        if self.interval:
            group = 0
            pos = low
            while pos and mask & pos:
                group |= pos
                yield group
                pos <<= 1
            return
        rest = mask ^ low
        sub = rest
        while True:
            yield sub | low
            if not sub:
                return
            sub = (sub - 1) & rest


def _block_vector(probe: Probe, block: ForkJoin, with_join: bool, k_after: int) -> list[int]:
    return block_need(probe, block, with_join, k_after)[0]


class Probe:
    """One DP run for a micro-batch size and a TPS target."""

    def __init__(self, search: Search, target_ms: float) -> None:
        self.s = search
        self.target = target_ms
        self.dominated = dominance_cap(target_ms)  # offers with `until` up to this are dominated
        self.chain_memo: dict[tuple[int, int, int], ChainSol] = {}  # (chain, k_after, end)
        self.par_memo: dict[tuple[int, int], _ParSol] = {}  # (parallel block, k_after)
        self.block_memo: dict[tuple[tuple, bool, int], tuple[list[int], list[tuple | None]]] = {}  # block_need
        self.fork_memo: dict[tuple[int, int], list[tuple[int, int, int]]] = {}  # see fork_join._fork_options
        self.lane_memo: dict[tuple[int, int, int], dict[int, ForkLane | None]] = {}  # see fork_join._fork_lane

    # ---- chains --------------------------------------------------------------------------
    def chain(self, chain: SPChain, k_after: int, end: int | None = None) -> ChainSol:
        """The chain's items [0, end) (all by default), followed by something holding `k_after` micro-batches."""
        end = self.s.infos[id(chain)].num_items if end is None else end
        key = (id(chain), k_after, end)
        sol = self.chain_memo.get(key)
        if sol is None:
            sol = self.chain_memo[key] = self._solve_chain(chain, k_after, end)
        return sol

    def _solve_chain(self, chain: SPChain, k_after: int, end: int) -> ChainSol:
        """Suffix need vectors from `end` back to item 0. Rows past `end` stay infeasible, so no segment,
        block or parallel item reaches beyond it (a prefix of a chain reuses the chain's tables)."""
        s = self.s
        info = s.infos[id(chain)]
        num_items, max_v, num_devices = info.num_items, s.max_v, s.num_devices
        need = [[BIG] * (max_v + 1) for _ in range(num_items + 1)]
        choice: list[list[tuple | None]] = [[None] * (max_v + 1) for _ in range(num_items + 1)]
        need[end] = [0 if v >= k_after else BIG for v in range(max_v + 1)]
        breaks: list[list[tuple[int, int]]] = [[] for _ in range(num_items + 1)]
        breaks[end] = _feasible_breakpoints(need[end], num_devices)
        fewest = [BIG] * (num_items + 1)  # the last breakpoint's devices
        fewest[end] = breaks[end][-1][1] if breaks[end] else BIG
        offers = s.offers(info, self.target)
        for start in range(end - 1, -1, -1):
            row, chosen = need[start], choice[start]
            if info.next_parallel[start] >= num_items:  # only segments start here: settle their keys directly
                best = self._segment_keys(offers, start, breaks, fewest, max_v + 1)
                found = [] if best is None else _settle_keys(best, offers, row, chosen, num_devices)
            else:
                self._segments(offers, start, breaks, fewest, row, chosen)
                item = chain.items[start]
                if isinstance(item, SPParallel):
                    self._open(item, need[start + 1], row, chosen)
                self._blocks(chain, start, need, row, chosen)
                found = _settle(row, chosen, num_devices)
            breaks[start] = found
            if found:
                fewest[start] = found[-1][1]
        return ChainSol(need=need, choice=choice, breaks=breaks)

    def _segments(self, offers: SegmentOffers, start: int, breaks: list[list[tuple[int, int]]], fewest: list[int],
                  row: list[int], chosen: list[tuple | None]) -> None:
        """Segments [start, stop) as the first stage, written into the row (see `_segment_keys`)."""
        best = self._segment_keys(offers, start, breaks, fewest, len(row))
        if best is None:
            return
        span, unit = offers.span, offers.unit
        for u, key in enumerate(best):
            if key != _NO_KEY:
                cost, rest_key = divmod(key, unit)
                d1, stop = divmod(rest_key, span)
                row[u + 1], chosen[u + 1] = cost, (_SEG, stop, d1, u)

    def _segment_keys(self, offers: SegmentOffers, start: int, breaks: list[list[tuple[int, int]]],
                      fewest: list[int], size: int) -> list[int] | None:
        """Per u, the key of the best segment [start, stop) as the first stage of cell u + 1 (None: no offer
        within the target). Only the breakpoints of the rest's vector matter (the monotone pass of `_settle`
        fills in the v between them). A candidate needing more than all the devices is never kept (`_settle`
        marks it infeasible), so it is not tried: the rest's fewest devices (its last breakpoint,
        `fewest[stop]`) must leave room for d1.

        Each cell keeps the cheapest offer, then the smallest degree, then the shortest segment, as one
        integer key (cost, d1, stop), so the offers can come in any order: here by TPS, so that those
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
        best = [_NO_KEY] * size  # per u, the key of cell u + 1
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
                    if key < best[u]:
                        best[u] = key
        return best

    def _open(self, par: SPParallel, rest: list[int], row: list[int], chosen: list[tuple | None]) -> None:
        def block_at(k_after: int) -> list[int]:
            sol = self.par(par, k_after)
            return sol.need[sol.full]

        self._before(rest, row, chosen, block_at, (_PAR,))

    def _before(self, rest: list[int], row: list[int], chosen: list[tuple | None],
                block_at: Callable[[int], list[int]], tag: tuple) -> None:
        """A block followed by `rest`: for every in-flight count k_after at which the rest needs fewer devices
        than at any smaller one, the block's need vector given k_after plus those devices; the choice is
        recorded as tag + (k_after, v)."""
        max_v = self.s.max_v
        previous = BIG
        for k_after in range(max_v + 1):
            devices = rest[k_after]
            if devices >= previous or devices >= BIG:
                continue
            previous = devices
            block = block_at(k_after)
            for v in range(k_after + 1, max_v + 1):
                cost = block[v] + devices
                if cost < row[v]:
                    row[v] = cost
                    chosen[v] = (*tag, k_after, v)

    def _blocks(self, chain: SPChain, start: int, need: list[list[int]], row: list[int],
                chosen: list[tuple | None]) -> None:
        """Blocks F + P, F + P + J and P + J starting at item `start` (see `fork_join`)."""
        info = self.s.infos[id(chain)]
        if info.next_parallel[start] >= info.num_items:
            return
        found = info.fork_join(start)
        if found is None or len(found.par.branches) > MAX_ENUMERATED_BRANCHES:
            return
        for with_join in (False, True) if found.join is not None else (False,):
            if found.fork is None and not with_join:
                continue
            rest = need[found.stop if with_join else found.par_pos + 1]
            self._before(rest, row, chosen, partial(_block_vector, self, found, with_join), (_BLOCK, with_join))

    # ---- parallel blocks -----------------------------------------------------------------
    def par(self, par: SPParallel, k_after: int) -> _ParSol:
        key = (id(par), k_after)
        sol = self.par_memo.get(key)
        if sol is None:
            sol = self.par_memo[key] = self._solve_par(par, k_after)
        return sol

    def _solve_par(self, par: SPParallel, k_after: int) -> _ParSol:
        s = self.s
        pinfo = s.pars[id(par)]
        max_v = s.max_v
        full = (1 << len(par.branches)) - 1
        base = [0 if (v >= k_after or not par.has_bypass) else BIG for v in range(max_v + 1)]
        need: dict[int, list[int]] = {0: base}
        choice: dict[int, list[tuple | None]] = {0: [None] * (max_v + 1)}
        masks = self._masks(pinfo, full)
        for mask in masks:
            row = [BIG] * (max_v + 1)
            chosen: list[tuple | None] = [None] * (max_v + 1)
            for group in pinfo.groups_of(mask):
                vec, extra = self._group_need(pinfo, group, k_after)
                rest = need[mask ^ group]
                for v in range(max_v + 1):
                    cost = vec[v] + rest[v]
                    if cost < row[v]:
                        row[v] = cost
                        chosen[v] = (group, extra[v])
            need[mask] = [c if c <= s.num_devices else BIG for c in row]
            choice[mask] = chosen
        return _ParSol(need=need, choice=choice, full=full)

    @staticmethod
    def _masks(pinfo: ParInfo, full: int) -> list[int]:
        """Sub-problems in the order they are needed (smaller first)."""
        if pinfo.interval:
            count = full.bit_length()
            return [full & ~((1 << pos) - 1) for pos in range(count - 1, -1, -1)]
        return sorted(range(1, full + 1), key=lambda m: bin(m).count("1"))

    def _group_need(self, pinfo: ParInfo, group: int, k_after: int) -> tuple[list[int], list[int]]:
        """Need vector of a group given k_after, and the devices of a merged group per v (0 for a branch)."""
        max_v = self.s.max_v
        if group & (group - 1) == 0:
            branch = pinfo.branch_infos[group.bit_length() - 1].chain
            return self.chain(branch, k_after).need[0], [0] * (max_v + 1)
        devices = self._merged_devices(pinfo, group, k_after)
        vec = [devices if v > k_after else BIG for v in range(max_v + 1)]
        return vec, [devices] * (max_v + 1)

    def _merged_devices(self, pinfo: ParInfo, group: int, k_after: int) -> int:
        for d1, tps, k_max in self.s.group_options(pinfo, group):
            if tps <= self.target and k_max >= k_after + 1:
                return d1
        return BIG

    # ---- result ----------------------------------------------------------------------------
    def best_entry(self, tree: SPChain) -> int | None:
        need = self.chain(tree, 0).need[0]
        for v in range(1, self.s.max_v + 1):
            if need[v] <= self.s.num_devices:
                return v
        return None

    def stages(self, tree: SPChain, v: int) -> list[StageSpec]:
        out: list[StageSpec] = []
        self.emit_chain(tree, 0, v, out)
        return out

    def emit_chain(self, chain: SPChain, k_after: int, v: int, out: list[StageSpec], start: int = 0,
                   end: int | None = None) -> None:
        info = self.s.infos[id(chain)]
        end = info.num_items if end is None else end
        sol = self.chain(chain, k_after, end)
        while start < end:
            chosen = sol.choice[start][v]
            assert chosen is not None, "reconstructing an infeasible DP state"
            if chosen[0] == _SEG:
                _, stop, d1, u = chosen
                out.append(StageSpec(ops=info.ops(start, stop), num_devices=d1,
                                     micro_batch_size=self.s.micro_batch_size))
                start, v = stop, u
            elif chosen[0] == _PAR:
                _, block_after, block_v = chosen
                item = chain.items[start]
                assert isinstance(item, SPParallel)
                self.emit_par(item, block_after, block_v, out)
                start, v = start + 1, block_after
            else:
                _, with_join, block_after, block_v = chosen
                found = info.fork_join(start)
                assert found is not None
                emit_block(self, found, with_join, block_after, block_v, out)
                start, v = (found.stop if with_join else found.par_pos + 1), block_after

    def emit_par(self, par: SPParallel, k_after: int, v: int, out: list[StageSpec], mask: int | None = None) -> None:
        sol = self.par(par, k_after)
        pinfo = self.s.pars[id(par)]
        mask = sol.full if mask is None else mask
        while mask:
            chosen = sol.choice[mask][v]
            assert chosen is not None, "reconstructing an infeasible parallel state"
            group, devices = chosen
            if group & (group - 1) == 0:
                self.emit_chain(pinfo.branch_infos[group.bit_length() - 1].chain, k_after, v, out)
            else:
                out.append(StageSpec(ops=pinfo.group(group)[0], num_devices=devices,
                                     micro_batch_size=self.s.micro_batch_size))
            mask ^= group
