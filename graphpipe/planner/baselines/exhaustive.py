"""Exhaustive search: every convex partition and every device assignment (tiny graphs only; the test oracle).

For each micro-batch size b: every set partition of the ops into at most as many blocks
as devices; blocks must be convex and the stage graph acyclic; each stage gets d devices
with d dividing b and the total at most the cluster. A candidate is feasible when every
stage's memory (with in-flight counts from docs/method.md §3 on its stage graph) fits; the best
minimises the bottleneck TPS, then the source's in-flight samples. `sp_aligned=True` keeps
only the partitions the GraphPipe DP can produce (see `graphpipe.planner.sp_dp`). With "recompute" among the
request's techniques, a stage whose activations do not fit recomputes its forward where that fits
(`_fitting_tps`): the exact optimum of the per-stage choice, the oracle of `graphpipe.planner.techniques`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

from graphpipe.cost.formulas.time_per_sample import action_overheads_ms, recompute_extra_ms
from graphpipe.errors import PlanningError
from graphpipe.graph.sp import SPChain, iter_chains
from graphpipe.planner.request import PlanRequest
from graphpipe.planner.sp_dp import MAX_ENUMERATED_BRANCHES, MERGE_BRANCHES, divisors_up_to, fork_join_items
from graphpipe.planner.stage_spec import Partition, StageSpec
from graphpipe.stages.in_flight import in_flight_samples
from graphpipe.stages.memory import stage_memory_bytes
from graphpipe.stages.stage_cost import StageCost

MAX_OPS = 10


def set_partitions(items: Sequence[str], max_blocks: int) -> Iterator[list[list[str]]]:
    """All partitions of `items` into at most `max_blocks` blocks (restricted growth strings)."""
    def grow(pos: int, blocks: list[list[str]]) -> Iterator[list[list[str]]]:
        if pos == len(items):
            yield [list(block) for block in blocks]
            return
        for block in blocks:
            block.append(items[pos])
            yield from grow(pos + 1, blocks)
            block.pop()
        if len(blocks) < max_blocks:
            blocks.append([items[pos]])
            yield from grow(pos + 1, blocks)
            blocks.pop()

    yield from grow(0, [])


def _runs(items: Sequence[tuple[str, ...]]) -> Iterator[frozenset[str]]:
    for start in range(len(items)):
        ops: set[str] = set()
        for item in items[start:]:
            ops |= set(item)
            yield frozenset(ops)


def aligned_sets(tree: SPChain) -> set[frozenset[str]]:
    """Op sets the GraphPipe DP can make a stage: runs of a chain's items, unions of whole branches,
    the same inside the extended chains of fork and join absorption, and merge stages of two-branch
    blocks (`graphpipe.planner.sp_dp.fork_join`)."""
    found: set[frozenset[str]] = set()
    todo = [(chain, False) for chain in iter_chains(tree)]
    while todo:
        chain, absorbed_fork = todo.pop()
        found.update(_runs([item.ops for item in chain.items]))
        for start in range(1 if absorbed_fork else 0, len(chain.items)):  # an absorbed fork starts F's stage
            block = fork_join_items(chain, start)
            if block is None or len(block.par.branches) > MAX_ENUMERATED_BRANCHES:
                continue
            for size in range(2, len(block.par.branches) + 1):
                for group in itertools.combinations(block.par.branches, size):
                    found.add(frozenset(op for branch in group for op in branch.ops))
            if block.join and len(block.par.branches) == MERGE_BRANCHES:  # merge stages: both tails + J
                first, second = (branch.items for branch in block.par.branches)
                found.update(frozenset(op for item in first[s0:] + second[s1:] + (block.join,) for op in item.ops)
                             for s0 in range(len(first)) for s1 in range(len(second)))
            forks = [(), (block.fork,)] if block.fork else [()]
            joins = [(), (block.join,)] if block.join else [()]
            for branch in block.par.branches:
                for fork in forks:
                    for join in joins:
                        if fork or join:
                            todo.append((SPChain(items=fork + branch.items + join), bool(fork)))
    return found


def plan_exhaustive(request: PlanRequest, sp_aligned: bool = False) -> list[Partition]:
    members = _items(request)
    if len(members) > MAX_OPS:
        raise PlanningError(f"the exhaustive planner enumerates every partition and takes graphs of at most "
                            f"{MAX_OPS} ops (layer blocks count as one); this one has {len(members)}: use planner "
                            "'graphpipe'")
    allowed = aligned_sets(request.sp_tree) if sp_aligned else None
    best: dict[int, tuple[float, int, Partition]] = {}
    cache: _Cache = {}
    for labels in set_partitions(list(members), request.num_devices):
        blocks = [[op for label in block for op in members[label]] for block in labels]
        if allowed is not None and any(frozenset(block) not in allowed for block in blocks):
            continue
        successors = _stage_dag(request, blocks)
        if successors is None:
            continue
        for size in request.micro_batch_sizes:
            found = _best_devices(request, blocks, successors, size, cache)
            if found and (size not in best or found[:2] < best[size][:2]):
                best[size] = found
    return [entry[2] for _, entry in sorted(best.items())]


def _items(request: PlanRequest) -> dict[str, tuple[str, ...]]:
    """What the partitions are made of, by a label: every op alone at op granularity (replicated ops too,
    so the oracle's space is the whole op graph's), and at layer granularity each layer block's ops
    together (`PlanRequest.blocks`), the other ops alone."""
    in_block = {op: block.ops for block in request.blocks for op in block.ops}
    items: dict[str, tuple[str, ...]] = {}
    for op in request.graph.names:
        group = in_block.get(op, (op,))
        items.setdefault(group[0], group)
    return items


def _stage_dag(request: PlanRequest, blocks: list[list[str]]) -> dict[int, tuple[int, ...]] | None:
    """Successors of each block in a topological numbering, or None if not convex/acyclic."""
    graph = request.graph
    block_of = {op: idx for idx, block in enumerate(blocks) for op in block}
    succ: dict[int, set[int]] = {idx: set() for idx in range(len(blocks))}
    for src, dst in graph.data_edges():
        if block_of[src] != block_of[dst]:
            succ[block_of[src]].add(block_of[dst])
    order: list[int] = []
    indeg = {idx: 0 for idx in succ}
    for targets in succ.values():
        for tgt in targets:
            indeg[tgt] += 1
    ready = [idx for idx, deg in indeg.items() if not deg]
    while ready:
        idx = ready.pop()
        order.append(idx)
        for tgt in succ[idx]:
            indeg[tgt] -= 1
            if not indeg[tgt]:
                ready.append(tgt)
    if len(order) != len(blocks):
        return None  # a cycle between blocks: some block is not convex
    renumber = {old: new for new, old in enumerate(order)}
    blocks[:] = [blocks[old] for old in order]
    return {renumber[old]: tuple(sorted(renumber[t] for t in succ[old])) for old in order}


_Cache = dict[tuple[frozenset[str], int, int], StageCost]


def _best_devices(request: PlanRequest, blocks: list[list[str]], successors: dict[int, tuple[int, ...]],
                  size: int, cache: _Cache) -> tuple[float, int, Partition] | None:
    model = request.model
    counts = in_flight_samples(successors, dict.fromkeys(range(len(blocks)), size), request.global_batch_size)
    options = divisors_up_to(size, request.num_devices)
    may_recompute = "recompute" in request.options.techniques
    best: tuple[float, int, Partition] | None = None
    for devices in itertools.product(options, repeat=len(blocks)):
        if sum(devices) > request.num_devices:
            continue
        worst, recomputing = 0.0, []
        for idx, block in enumerate(blocks):
            key = (frozenset(block), devices[idx], size)
            cost = cache.get(key)
            if cost is None:
                cost = cache[key] = model.stage_cost(block, devices[idx], size)
            tps = _fitting_tps(request, block, cost, devices[idx], size, counts[idx], may_recompute)
            if tps is None:
                break
            recomputing.append(tps > cost.tps_ms)
            worst = max(worst, tps)
        else:
            source = max(counts.values())
            if best is None or (worst, source) < best[:2]:
                stages = tuple(StageSpec(ops=tuple(block), num_devices=d, micro_batch_size=size, recompute=again)
                               for block, d, again in zip(blocks, devices, recomputing))
                best = (worst, source, Partition(stages=stages))
    return best


def _fitting_tps(request: PlanRequest, block: list[str], cost: StageCost, num_devices: int, size: int, held: int,
                 may_recompute: bool) -> float | None:
    """The stage's TPS keeping its activations where that fits the memory limit, else, where `may_recompute`,
    its TPS recomputing its forward (one more forward of its ops per micro-batch) where that fits; None where
    neither does. Keeping is never slower, so this per-stage choice is the best for every partition."""
    limit = request.memory_limit
    if stage_memory_bytes(cost.param_bytes, cost.act_bytes, held, size) <= limit:
        return cost.tps_ms
    if not may_recompute:
        return None
    inputs = request.model.recompute_input_bytes(block, size / num_devices)
    if stage_memory_bytes(cost.param_bytes, cost.act_bytes, held, size, recompute_input_bytes=inputs) > limit:
        return None
    ops_fwd_ms = cost.fwd_ms - action_overheads_ms(request.model.device)[0]
    return cost.tps_ms + recompute_extra_ms(ops_fwd_ms) / size
