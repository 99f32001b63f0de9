"""Fork and join absorption: a parallel block's fork and join may share a stage with one branch.

In an SP chain `... F, P, J ...` (P a parallel block with at most 4 branches), the plain DP
puts the leaves before P (the fork side) and after P (the join side) in stages of the outer
chain. Often they are a cheap input and a cheap concat + head, and a stage of their own
wastes a device; so the DP may also take a *block*:

- F + P: F is a run of leaf items ending right before P (any start); it joins the first
  stage of one branch r_f: the extended chain [F] + B_rf;
- P + J: J is the whole run of leaf items right after P; it joins the last stage of one
  branch r_j: B_rj + [J];
- F + P + J: both (r_f and r_j may be the same branch: [F] + B_r + [J]).

In-flight counts stay exact: the other branches feed J's stage, whose count is one more
than what follows the block; F's stage is the fork of all branches, so its count is one
more than the largest entry count of its own chain's rest and of the other branches. A
stage holding both F and J would have to hold every branch (that is the plain "whole
block" segment), so F's stage never reaches J while other branches exist.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import TYPE_CHECKING

from graphpipe.graph.sp import SPChain, SPLeaf, SPParallel
from graphpipe.planner.stage_spec import StageSpec

if TYPE_CHECKING:
    from graphpipe.planner.probe import Probe

BIG = 1 << 40


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


def _others(full: int, rf: int | None, rj: int | None) -> int:
    return full & ~(1 << rf if rf is not None else 0) & ~(1 << rj if rj is not None else 0)


def _solve_block(probe: Probe, block: ForkJoin, with_join: bool, k_after: int) -> tuple[list[int], list[tuple | None]]:
    s = probe.s
    max_v = s.max_v
    k_side = k_after + 1 if with_join else k_after
    psol = probe.par(block.par, k_side)
    count = len(block.par.branches)
    vec: list[int] = [BIG] * (max_v + 1)
    chosen: list[tuple | None] = [None] * (max_v + 1)
    for rj in (range(count) if with_join else (None,)):
        for rf in (range(count) if block.fork is not None else (None,)):
            others_mask = _others(psol.full, rf, rj)
            side = psol.need[others_mask]
            if rj is not None and rj != rf:
                side = _add(side, probe.chain(extended_chain(probe, block, rj, False, True), k_after).need[0])
            if rf is None:
                for v in range(max_v + 1):
                    if side[v] < vec[v]:
                        vec[v], chosen[v] = side[v], (rf, rj)
                continue
            _fork_stage(probe, block, rf, rj, side, k_after if rj == rf else k_side, others_mask != 0, vec, chosen)
    for v in range(1, max_v + 1):
        if vec[v - 1] < vec[v]:
            vec[v], chosen[v] = vec[v - 1], chosen[v - 1]
    return [c if c <= s.num_devices else BIG for c in vec], chosen


def _fork_stage(probe: Probe, block: ForkJoin, rf: int, rj: int | None, side: list[int], ext_after: int,
                has_others: bool, vec: list[int], chosen: list[tuple | None]) -> None:
    """F's stage = F + the first items of the extended chain of branch rf; the rest and the side after it."""
    from graphpipe.planner.probe import breakpoints

    s = probe.s
    chain = extended_chain(probe, block, rf, True, rj == rf)
    info = s.infos[id(chain)]
    need = probe.chain(chain, ext_after).need
    last = info.num_items - 1 if (rj == rf and has_others) else info.num_items
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
                    vec[u + 1], chosen[u + 1] = cost, (rf, rj, stop, d1, u)


def emit_block(probe: Probe, block: ForkJoin, with_join: bool, k_after: int, v: int, out: list[StageSpec]) -> None:
    _, chosen = block_need(probe, block, with_join, k_after)
    pick = chosen[v]
    assert pick is not None, "reconstructing an infeasible block"
    k_side = k_after + 1 if with_join else k_after
    psol = probe.par(block.par, k_side)
    rf, rj = pick[0], pick[1]
    side_v = v
    if rf is not None:
        _, _, stop, d1, side_v = pick
        chain = extended_chain(probe, block, rf, True, rj == rf)
        info = probe.s.infos[id(chain)]
        out.append(StageSpec(ops=info.ops(0, stop), num_devices=d1, micro_batch_size=probe.s.micro_batch_size))
        probe.emit_chain(chain, k_after if rj == rf else k_side, side_v, out, start=stop)
    if rj is not None and rj != rf:
        probe.emit_chain(extended_chain(probe, block, rj, False, True), k_after, side_v, out)
    probe.emit_par(block.par, k_side, side_v, out, mask=_others(psol.full, rf, rj))
