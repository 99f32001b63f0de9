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
what follows the block; F's stage is the first stage of its lane, and its count is one more
than the largest entry count of the rest of its lane and of everything else in the block. A
stage holding both F and J would hold every branch (the plain "whole block" segment), so F's
stage never reaches J while anything else runs beside it.

Merge tails are tried while they fit on their own: the tails and J within the target on the
widest degree, their weights, gradients and Adam state within the memory limit (longer tails
only cost more). Each tail position costs a prefix solve of its branch (the branch's own
tables, cut at the tail: `Probe.chain(..., end=)`), hence two branches only: with more, the
tails of every pair would multiply the DP's work.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from graphpipe.graph.sp import SPChain, SPLeaf, SPParallel
from graphpipe.planner.memory import OPTIMIZER_STATE_FACTOR, max_in_flight_micro_batches
from graphpipe.planner.stage_spec import StageSpec

if TYPE_CHECKING:
    from graphpipe.planner.probe import Probe

BIG = 1 << 40
MERGE_BRANCHES = 2


@dataclass(frozen=True, slots=True)
class ForkJoin:
    """A parallel block at `par_pos` of a chain, the fork run from `start`, the join run up to `stop`."""

    chain_id: int  # the chain the block sits in (a parallel block can sit in several extended chains)
    par: SPParallel
    fork: SPLeaf | None
    join: SPLeaf | None
    start: int
    par_pos: int
    stop: int


@dataclass(frozen=True, slots=True)
class Layout:
    """Which branch (by sorted position) takes the fork and which the join; or a merge stage: the items
    where the two branches' tails start and the devices of J's stage."""

    rf: int | None
    rj: int | None
    merge: tuple[int, int, int] | None = None  # (s_0, s_1, devices)


@dataclass(frozen=True, slots=True)
class _Lane:
    chain: SPChain | None  # None: empty (a branch wholly inside the merge stage)
    k_after: int
    has_fork: bool
    end: int | None = None  # solve items [0, end) only


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
    return ForkJoin(chain_id=id(chain), par=par, fork=fork, join=join, start=start, par_pos=pos, stop=stop)


def extended_chain(probe: Probe, block: ForkJoin, pos: int, with_fork: bool, with_join: bool) -> SPChain:
    """Branch at sorted position `pos` with the fork run prepended and/or the join run appended (cached)."""
    s = probe.s
    pinfo = s.pars[id(block.par)]
    fork = block.fork if with_fork else None
    join = block.join if with_join else None
    key = (block.chain_id, pos, block.start if with_fork else -1, with_join)
    chain = pinfo.extended.get(key)
    if chain is None:
        branch = pinfo.branch_infos[pos].chain
        if not fork and not join:
            return branch
        items = ((fork,) if fork else ()) + branch.items + ((join,) if join else ())
        chain = pinfo.extended[key] = SPChain(items=items)
        from graphpipe.planner.chain_info import ChainInfo

        s.infos[id(chain)] = ChainInfo(s.model, chain)
    return chain


def block_need(probe: Probe, block: ForkJoin, with_join: bool, k_after: int) -> tuple[list[int], list[tuple | None]]:
    """Need vector of the block (entry = F's stage with a fork, else the branches' entries)."""
    key = (block.chain_id, id(block.par), block.start if block.fork is not None else -1, with_join, k_after)
    hit = probe.block_memo.get(key)
    if hit is None:
        hit = probe.block_memo[key] = _solve_block(probe, block, with_join, k_after)
    return hit


def _add(a: list[int], b: list[int]) -> list[int]:
    return [x + y for x, y in zip(a, b)]


def _without(full: int, *positions: int | None) -> int:
    for pos in positions:
        if pos is not None:
            full &= ~(1 << pos)
    return full


def _plain_layouts(block: ForkJoin, with_join: bool) -> Iterator[Layout]:
    count = len(block.par.branches)
    forks: tuple[int | None, ...] = tuple(range(count)) if block.fork is not None else (None,)
    for rj in (range(count) if with_join else (None,)):
        for rf in forks:
            yield Layout(rf, rj)


def _merge_layouts(probe: Probe, block: ForkJoin, k_side: int) -> Iterator[Layout]:
    """Merge stages that meet the target and fit (see the module docstring)."""
    if block.join is None or len(block.par.branches) != MERGE_BRANCHES:
        return
    forks: tuple[int | None, ...] = (0, 1) if block.fork is not None else (None,)
    first, second = merge_tails(probe, block, 0), merge_tails(probe, block, 1)
    for s0, compute0, params0 in first:
        for s1, compute1, params1 in second:
            if compute0 + compute1 > probe.target or params0 + params1 > probe.s.memory_limit:
                break  # longer tails only cost more
            devices = _merge_devices(probe, block, s0, s1, k_side)
            if devices < BIG:
                for rf in forks:
                    yield Layout(rf, None, (s0, s1, devices))


def merge_tails(probe: Probe, block: ForkJoin, pos: int) -> list[tuple[int, float, float]]:
    """(s, compute per sample on the widest degree with J's share, static bytes with J's share) of the
    non-empty tails [s, end) of branch `pos` that could join J's stage alone, shortest first."""
    s = probe.s
    info = s.pars[id(block.par)].branch_infos[pos]
    assert block.join is not None
    b, widest = s.micro_batch_size, s.degrees[-1]
    times, _ = info.prefix_at(b / widest)
    join_ms = sum(sum(s.model.op_at(op, b / widest)[:2]) for op in block.join.ops) / 2
    join_params = sum(s.model.param_bytes[op] for op in block.join.ops) / 2
    end, out = info.num_items, []
    for start in range(end - 1, -1, -1):
        compute = (times[end] - times[start]) / b + join_ms / b
        params = OPTIMIZER_STATE_FACTOR * (info.param_prefix[end] - info.param_prefix[start] + join_params)
        if compute > probe.target or params > s.memory_limit:
            break
        out.append((start, compute, params))
    return out


def merge_ops(probe: Probe, block: ForkJoin, s0: int, s1: int) -> tuple[str, ...]:
    """Ops of the merge stage: the tails of both branches from items s0 and s1, then J."""
    infos = probe.s.pars[id(block.par)].branch_infos
    assert block.join is not None
    return infos[0].ops(s0, infos[0].num_items) + infos[1].ops(s1, infos[1].num_items) + block.join.ops


def _merge_devices(probe: Probe, block: ForkJoin, s0: int, s1: int, k_side: int) -> int:
    """Fewest data-parallel devices on which the merge stage meets the target and holds k_side micro-batches."""
    s = probe.s
    pinfo = s.pars[id(block.par)]
    for d1 in s.degrees:
        key = (block.chain_id, s0, s1, d1, s.micro_batch_size)
        cost = pinfo.merge_costs.get(key)
        if cost is None:
            cost = pinfo.merge_costs[key] = s.model.stage_cost(merge_ops(probe, block, s0, s1), d1,
                                                               s.micro_batch_size)
        if cost.tps_ms <= probe.target and max_in_flight_micro_batches(
                cost.param_bytes, cost.act_bytes, s.memory_limit, s.num_micro_batches) >= k_side:
            return d1
    return BIG


def _lanes(probe: Probe, block: ForkJoin, layout: Layout, k_after: int, k_side: int) -> tuple[list[_Lane], int]:
    """The layout's lanes (the fork's lane first, if any) and the mask of branches left whole."""
    rf, rj, merge = layout.rf, layout.rj, layout.merge
    lanes = []
    if merge is not None:
        for pos, cut in enumerate(merge[:2]):
            if rf == pos:
                lanes.append(_Lane(extended_chain(probe, block, pos, True, False), k_side, True, cut + 1))
            elif cut:
                lanes.append(_Lane(extended_chain(probe, block, pos, False, False), k_side, False, cut))
            else:
                lanes.append(_Lane(None, k_side, False))
        lanes.sort(key=lambda lane: not lane.has_fork)
        return lanes, 0
    if rj is not None:
        lanes.append(_Lane(extended_chain(probe, block, rj, rf == rj, True), k_after, rf == rj))
    if rf is not None and rf != rj:
        lanes.insert(0, _Lane(extended_chain(probe, block, rf, True, False), k_side, True))
    return lanes, _without((1 << len(block.par.branches)) - 1, rf, rj)


def _lane_need(probe: Probe, lane: _Lane) -> list[int]:
    if lane.chain is None:
        return [0 if v >= lane.k_after else BIG for v in range(probe.s.max_v + 1)]
    return probe.chain(lane.chain, lane.k_after, lane.end).need[0]


def _solve_block(probe: Probe, block: ForkJoin, with_join: bool, k_after: int) -> tuple[list[int], list[tuple | None]]:
    s = probe.s
    max_v = s.max_v
    k_side = k_after + 1 if with_join else k_after
    psol = probe.par(block.par, k_side)
    vec: list[int] = [BIG] * (max_v + 1)
    chosen: list[tuple | None] = [None] * (max_v + 1)
    merges = _merge_layouts(probe, block, k_side) if with_join else iter(())
    for layout in (*_plain_layouts(block, with_join), *merges):
        lanes, others = _lanes(probe, block, layout, k_after, k_side)
        rest = lanes[1:] if lanes and lanes[0].has_fork else lanes
        side = psol.need[others]
        for lane in rest:
            side = _add(side, _lane_need(probe, lane))
        if layout.merge is not None:
            side = [devices + layout.merge[2] for devices in side]
        if len(rest) == len(lanes):
            for v in range(max_v + 1):
                if side[v] < vec[v]:
                    vec[v], chosen[v] = side[v], (layout, None)
            continue
        holds_join = layout.rj is not None and layout.rf == layout.rj and (others != 0 or bool(rest))
        _fork_stage(probe, layout, lanes[0], side, holds_join, vec, chosen)
    for v in range(1, max_v + 1):
        if vec[v - 1] < vec[v]:
            vec[v], chosen[v] = vec[v - 1], chosen[v - 1]
    return [c if c <= s.num_devices else BIG for c in vec], chosen


def _fork_stage(probe: Probe, layout: Layout, lane: _Lane, side: list[int], stops_before_join: bool,
                vec: list[int], chosen: list[tuple | None]) -> None:
    """F's stage = the first items of the fork's lane; the rest of the lane and the side after it."""
    from graphpipe.planner.probe import breakpoints

    s = probe.s
    assert lane.chain is not None
    info = s.infos[id(lane.chain)]
    end = info.num_items if lane.end is None else lane.end
    need = probe.chain(lane.chain, lane.k_after, end).need
    last = end - 1 if stops_before_join else end
    combined: dict[int, list[tuple[int, int]]] = {}
    for d1 in s.degrees:
        compute, tps_row, k_maxes = s.segment_rows(info, 0, d1, probe.target)
        for idx in range(min(bisect_right(compute, probe.target), last)):
            stop, tps, k_max = idx + 1, tps_row[idx], k_maxes[idx]
            if tps > probe.target:
                continue
            breaks = combined.get(stop)
            if breaks is None:
                breaks = combined[stop] = breakpoints(_add(need[stop], side))
            for u, devices in breaks:
                if u >= k_max:
                    break
                cost = devices + d1
                if cost < vec[u + 1]:
                    vec[u + 1], chosen[u + 1] = cost, (layout, (stop, d1, u))


def emit_block(probe: Probe, block: ForkJoin, with_join: bool, k_after: int, v: int, out: list[StageSpec]) -> None:
    _, chosen = block_need(probe, block, with_join, k_after)
    pick = chosen[v]
    assert pick is not None, "reconstructing an infeasible block"
    layout, fork_choice = pick
    k_side = k_after + 1 if with_join else k_after
    lanes, others = _lanes(probe, block, layout, k_after, k_side)
    side_v = v
    size = probe.s.micro_batch_size
    if fork_choice is not None:
        stop, d1, side_v = fork_choice
        lane = lanes.pop(0)
        assert lane.chain is not None
        info = probe.s.infos[id(lane.chain)]
        out.append(StageSpec(ops=info.ops(0, stop), num_devices=d1, micro_batch_size=size))
        probe.emit_chain(lane.chain, lane.k_after, side_v, out, start=stop, end=lane.end)
    for lane in lanes:
        if lane.chain is not None:
            probe.emit_chain(lane.chain, lane.k_after, side_v, out, end=lane.end)
    if layout.merge is not None:
        s0, s1, devices = layout.merge
        out.append(StageSpec(ops=merge_ops(probe, block, s0, s1), num_devices=devices, micro_batch_size=size))
    probe.emit_par(block.par, k_side, side_v, out, mask=others)
