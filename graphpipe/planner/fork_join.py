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

Nesting. A block's need vector depends on its parallel block, the ops of F and J and k_after
only, so it is memoised by those (`ForkJoin.key`), as are the extended chains (per branch and
runs) and the merge stages' costs (per J and tails): the same block met in a branch and in that
branch's extended chains is solved once. A fork's lane is never solved as a chain: F's stage is
items [0, stop) of [F] + B (only its segments from item 0 are read), and the rest of the lane is
B from item stop - 1, whose suffix rows are B's own (or those of B + [J]). Solving [F] + B whole
would build its row 0, where blocks nested in B take F into their own fork runs, whose lanes
would do the same one level down: that made the work grow by a factor per level of nesting.
Now fork runs stay in their chain, and a join run travels only into the last block of a branch
(B + [J] is solved whole): a block at nesting depth t has at most t + 1 join runs. Per probe and
k_after, a block costs O(c^2 V) for its plain layouts plus, per layout with a fork, one O(V) test
against a floor (F's stage and the rest of its lane, per u, `ForkLane`), which most layouts fail
(they cannot better a cell of the block's vector), and O(stops x breakpoints) for the others.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from graphpipe.graph.sp import SPChain, SPLeaf, SPParallel
from graphpipe.planner.memory import OPTIMIZER_STATE_FACTOR, max_in_flight_micro_batches
from graphpipe.planner.stage_spec import StageSpec

if TYPE_CHECKING:
    from graphpipe.planner.probe import ChainSol, Probe

BIG = 1 << 40
MERGE_BRANCHES = 2


@dataclass(frozen=True, slots=True)
class ForkJoin:
    """A parallel block at `par_pos` of a chain, the fork run from `start`, the join run up to `stop`.

    What the DP finds for a block depends on its parallel block and the ops of its fork and join runs
    only, not on the chain it sits in nor on the positions: `key` (with the join, `key_alone` without),
    so the same block met in a branch and in the branch's extended chains is solved once."""

    par: SPParallel
    fork: SPLeaf | None
    join: SPLeaf | None
    start: int
    par_pos: int
    stop: int
    key: tuple[int, tuple[str, ...], tuple[str, ...]]  # (id(par), fork ops, join ops)
    key_alone: tuple[int, tuple[str, ...], tuple[str, ...]]  # the join left out (a block without J)
    shapes: dict[tuple[int | None, int | None, int, int], _Shape] = field(  # see `_shape`
        default_factory=dict, compare=False, repr=False)
    plain: dict[bool, list[tuple[Layout, _Shape]]] = field(  # see `_plain_shapes`
        default_factory=dict, compare=False, repr=False)


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
    at_side: bool  # followed by J's stage (given k_side), else by what follows the block (k_after)
    has_fork: bool
    end: int | None = None  # solve items [0, end) only
    body: SPChain | None = None  # a fork's lane: `chain` without its first item, the fork run (see `_fork_stage`)


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
    fork_ops = fork.ops if fork is not None else ()
    return ForkJoin(par=par, fork=fork, join=join, start=start, par_pos=pos, stop=stop,
                    key=(id(par), fork_ops, join.ops if join is not None else ()), key_alone=(id(par), fork_ops, ()))


def extended_chain(probe: Probe, block: ForkJoin, pos: int, with_fork: bool, with_join: bool) -> SPChain:
    """Branch at sorted position `pos` with the fork run prepended and/or the join run appended (cached by
    the runs' ops: blocks of the same content in different chains share their extended chains)."""
    s = probe.s
    pinfo = s.pars[id(block.par)]
    fork = block.fork if with_fork else None
    join = block.join if with_join else None
    if not fork and not join:
        return pinfo.branch_infos[pos].chain
    key = (pos, fork.ops if fork else (), join.ops if join else ())
    chain = pinfo.extended.get(key)
    if chain is None:
        branch = pinfo.branch_infos[pos].chain
        items = ((fork,) if fork else ()) + branch.items + ((join,) if join else ())
        chain = pinfo.extended[key] = SPChain(items=items)
        from graphpipe.planner.chain_info import ChainInfo

        s.infos[id(chain)] = ChainInfo(s.model, chain)
    return chain


def block_need(probe: Probe, block: ForkJoin, with_join: bool, k_after: int) -> tuple[list[int], list[tuple | None]]:
    """Need vector of the block (entry = F's stage with a fork, else the branches' entries), memoised by
    content (`ForkJoin.key`) and k_after."""
    key = (block.key if with_join else block.key_alone, with_join, k_after)
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
    assert block.join is not None
    for d1 in s.degrees:
        key = (block.join.ops, s0, s1, d1, s.micro_batch_size)
        cost = pinfo.merge_costs.get(key)
        if cost is None:
            cost = pinfo.merge_costs[key] = s.model.stage_cost(merge_ops(probe, block, s0, s1), d1,
                                                               s.micro_batch_size)
        if cost.tps_ms <= probe.target and max_in_flight_micro_batches(
                cost.param_bytes, cost.act_bytes, s.memory_limit, s.num_micro_batches) >= k_side:
            return d1
    return BIG


def _shape(probe: Probe, block: ForkJoin, layout: Layout) -> _Shape:
    """The layout's lanes (cached on the block: the same for every probe, size and in-flight count)."""
    rf, rj, merge = layout.rf, layout.rj, layout.merge
    key = (rf, rj, -1, -1) if merge is None else (rf, rj, merge[0], merge[1])
    hit = block.shapes.get(key)
    if hit is not None:
        return hit
    lanes = []
    others = 0
    if merge is not None:
        for pos, cut in enumerate(merge[:2]):
            if rf == pos:
                lanes.append(_Lane(extended_chain(probe, block, pos, True, False), True, True, cut + 1,
                                   extended_chain(probe, block, pos, False, False)))
            elif cut:
                lanes.append(_Lane(extended_chain(probe, block, pos, False, False), True, False, cut))
            else:
                lanes.append(_Lane(None, True, False))
        lanes.sort(key=lambda lane: not lane.has_fork)
    else:
        if rj is not None:
            lanes.append(_Lane(extended_chain(probe, block, rj, rf == rj, True), False, rf == rj, None,
                               extended_chain(probe, block, rj, False, True) if rf == rj else None))
        if rf is not None and rf != rj:
            lanes.insert(0, _Lane(extended_chain(probe, block, rf, True, False), True, True, None,
                                  extended_chain(probe, block, rf, False, False)))
        others = _without((1 << len(block.par.branches)) - 1, rf, rj)
    fork = lanes[0] if lanes and lanes[0].has_fork else None
    rest = tuple(lanes[1:] if fork is not None else lanes)
    if fork is None or fork.chain is None:
        hit = block.shapes[key] = _Shape(fork, rest, others)
        return hit
    end = probe.s.infos[id(fork.chain)].num_items if fork.end is None else fork.end
    holds_join = rj is not None and rf == rj and (others != 0 or bool(rest))
    last = end - 1 if holds_join else end
    hit = block.shapes[key] = _Shape(fork, rest, others, end, last, (id(fork.chain), end, last))
    return hit


def _plain_shapes(probe: Probe, block: ForkJoin, with_join: bool) -> list[tuple[Layout, _Shape]]:
    """The plain layouts (no merge stage) with their shapes, in `_plain_layouts` order (cached on the block)."""
    hit = block.plain.get(with_join)
    if hit is None:
        hit = block.plain[with_join] = [(layout, _shape(probe, block, layout))
                                        for layout in _plain_layouts(block, with_join)]
    return hit


def _lane_need(probe: Probe, lane: _Lane, k_after: int) -> list[int]:
    if lane.chain is None:
        return [0 if v >= k_after else BIG for v in range(probe.s.max_v + 1)]
    return probe.chain(lane.chain, k_after, lane.end).need[0]


def _solve_block(probe: Probe, block: ForkJoin, with_join: bool, k_after: int) -> tuple[list[int], list[tuple | None]]:
    s = probe.s
    max_v = s.max_v
    k_side = k_after + 1 if with_join else k_after
    psol = probe.par(block.par, k_side)
    vec: list[int] = [BIG] * (max_v + 1)
    chosen: list[tuple | None] = [None] * (max_v + 1)
    merges = ((layout, _shape(probe, block, layout)) for layout in _merge_layouts(probe, block, k_side))
    for layout, shape in (*_plain_shapes(probe, block, with_join), *(merges if with_join else ())):
        side = psol.need[shape.others]
        for lane in shape.rest:
            side = _add(side, _lane_need(probe, lane, k_side if lane.at_side else k_after))
        if layout.merge is not None:
            side = [devices + layout.merge[2] for devices in side]
        if shape.fork is None:
            for v in range(max_v + 1):
                if side[v] < vec[v]:
                    vec[v], chosen[v] = side[v], (layout, None)
            continue
        _fork_stage(probe, layout, shape, k_side if shape.fork.at_side else k_after, side, vec, chosen)
    for v in range(1, max_v + 1):
        if vec[v - 1] < vec[v]:
            vec[v], chosen[v] = vec[v - 1], chosen[v - 1]
    return [c if c <= s.num_devices else BIG for c in vec], chosen


def _fork_stage(probe: Probe, layout: Layout, shape: _Shape, k_lane: int, side: list[int], vec: list[int],
                chosen: list[tuple | None]) -> None:
    """F's stage = the first items [0, stop) of the fork's lane; the rest of the lane and the side after it.

    The rest of the lane is items [stop - 1, ...) of the lane's body (the lane without F), whose suffix
    rows are those of the lane from item 1 on: the body is solved, not the lane, so the lane's own
    row 0 (blocks whose fork runs would take F along, and their extended chains, level after level)
    is never built; only the segments from item 0 are read from the lane's tables.

    Most layouts better no cell of the block's vector: those are skipped in O(v) with a floor, per u,
    of F's stage and the rest of its lane (`ForkLane`). A candidate at cell u + 1 matters only if it
    is below the cell's best so far, within the devices and no more than every cell below it (else the
    monotone pass of `_solve_block` replaces it by the cell below, or the cell is infeasible whatever
    it holds), so a layout none of whose cells passes that test on its floor writes nothing that
    counts."""
    fork = _fork_lane(probe, shape, k_lane)
    if fork is None:
        return
    cap = probe.s.num_devices
    for u, least in enumerate(fork.floor):
        if vec[u] < cap:
            cap = vec[u]
        cost = least + side[u]
        if cost < vec[u + 1] and cost <= cap:
            break
    else:
        return
    need, row_breaks = fork.body.need, fork.body.breaks
    side_drops = _drops(side)
    combined: dict[int, list[tuple[int, int]]] = {}
    for stop, d1, k_max in fork.options:
        breaks = combined.get(stop)
        if breaks is None:
            breaks = combined[stop] = _sum_breakpoints(need[stop - 1], row_breaks[stop - 1], side, side_drops)
        for u, devices in breaks:
            if u >= k_max:
                break
            cost = devices + d1
            if cost < vec[u + 1]:
                vec[u + 1], chosen[u + 1] = cost, (layout, (stop, d1, u))


@dataclass(frozen=True, slots=True)
class ForkLane:
    """What `_fork_stage` reads of a fork's lane in a probe, the same for every layout and side: F's stage
    options (stop, d1, most in flight) by degree and then stop, the body's solution and the floor."""

    options: list[tuple[int, int, int]]
    body: ChainSol
    floor: list[int]


def _fork_lane(probe: Probe, shape: _Shape, k_lane: int) -> ForkLane | None:
    """The lane's `ForkLane` (None: no segment from item 0 meets the target), memoised in the probe: the
    layouts that give F to the same branch share it. The floor at u is the fewest devices over the options
    that hold u + 1 micro-batches, of F's stage plus the body's row after it at u: with the side's need
    at u added, no candidate at cell u + 1 costs less."""
    per_k = probe.lane_memo.get(shape.fork_key)
    if per_k is None:
        per_k = probe.lane_memo[shape.fork_key] = {}
    elif k_lane in per_k:
        return per_k[k_lane]
    lane, end, last = shape.fork, shape.fork_end, shape.fork_last
    assert lane is not None and lane.chain is not None and lane.body is not None
    options = _fork_options(probe, lane.chain, last)
    found = None
    if options:
        s = probe.s
        body = probe.chain(lane.body, k_lane, end - 1)  # the lane's row i is the body's row i - 1
        floor = [BIG] * s.max_v
        for stop, d1, k_max in options:
            row = body.need[stop - 1]
            for u in range(min(k_max, len(floor))):
                if row[u] + d1 < floor[u]:
                    floor[u] = row[u] + d1
        found = ForkLane(options, body, floor)
    per_k[k_lane] = found
    return found


def _fork_options(probe: Probe, chain: SPChain, last: int) -> list[tuple[int, int, int]]:
    """(stop, d1, most in flight) of the segments [0, stop) of a fork's lane, stop <= last, within the probe's
    target, by degree and then stop (memoised in the probe: the same for every in-flight count).

    A degree is left out where a smaller one of the same segment holds as many micro-batches: it comes
    first and costs fewer devices at every cell the larger one reaches, so the larger never wins one."""
    key = (id(chain), last)
    hit = probe.fork_memo.get(key)
    if hit is None:
        s, target = probe.s, probe.target
        info = s.infos[id(chain)]
        hit = probe.fork_memo[key] = []
        held = [-1] * (last + 1)  # per stop, the most in flight of the smaller degrees kept
        for d1 in s.degrees:
            compute, tps_row, k_maxes = s.segment_rows(info, 0, d1, target)
            for idx in range(min(bisect_right(compute, target), last)):
                k_max = k_maxes[idx]
                if tps_row[idx] <= target and k_max > held[idx + 1]:
                    held[idx + 1] = k_max
                    hit.append((idx + 1, d1, k_max))
    return hit


def _drops(need: list[int]) -> list[int]:
    """Where a need vector drops (v = 0 included)."""
    out, last = [], -1
    for v, devices in enumerate(need):
        if devices != last:
            out.append(v)
            last = devices
    return out


def _sum_breakpoints(row: list[int], row_breaks: list[tuple[int, int]], side: list[int],
                     side_drops: list[int]) -> list[tuple[int, int]]:
    """`probe.breakpoints` of row + side, two need vectors (non-increasing): their sum drops only where one
    of them does, so only the row's breakpoints (where it drops to a feasible count, the rest of it being
    infeasible) and the side's drops are read, not every v."""
    out, last = [], BIG
    for v in sorted([v for v, _ in row_breaks] + side_drops):
        devices = row[v] + side[v]
        if devices < last:
            out.append((v, devices))
            last = devices
    return out


def emit_block(probe: Probe, block: ForkJoin, with_join: bool, k_after: int, v: int, out: list[StageSpec]) -> None:
    _, chosen = block_need(probe, block, with_join, k_after)
    pick = chosen[v]
    assert pick is not None, "reconstructing an infeasible block"
    layout, fork_choice = pick
    k_side = k_after + 1 if with_join else k_after
    shape = _shape(probe, block, layout)
    side_v = v
    size = probe.s.micro_batch_size
    if fork_choice is not None:
        stop, d1, side_v = fork_choice
        lane = shape.fork
        assert lane is not None and lane.chain is not None and lane.body is not None
        info = probe.s.infos[id(lane.chain)]
        out.append(StageSpec(ops=info.ops(0, stop), num_devices=d1, micro_batch_size=size))
        probe.emit_chain(lane.body, k_side if lane.at_side else k_after, side_v, out, start=stop - 1,
                         end=None if lane.end is None else lane.end - 1)
    for lane in shape.rest:
        if lane.chain is not None:
            probe.emit_chain(lane.chain, k_side if lane.at_side else k_after, side_v, out, end=lane.end)
    if layout.merge is not None:
        s0, s1, devices = layout.merge
        out.append(StageSpec(ops=merge_ops(probe, block, s0, s1), num_devices=devices, micro_batch_size=size))
    probe.emit_par(block.par, k_side, side_v, out, mask=shape.others)
