"""Merge stages, every pair of tails at once (`sp_dp.merge_tails`): the prefix floors never exceed the DP's need
(and equal it where memory does not bind), the prefix needs are the DP's, and pruning merge layouts by their floors
or writing them from the needs at once changes no plan."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphpipe.planner.api import make_request, plan_candidates
from graphpipe.planner.request import PlanRequest
from graphpipe.planner.sp_dp import Probe, Search, build_tables, fork_join, merge_tails, partition_sp
from graphpipe.planner.sp_dp.blocks import BIG, MERGE_BRANCHES
from graphpipe.planner.sp_dp.fork_join import ForkJoinSolver
from graphpipe.planner.sp_dp.merge_tails import (
    MergeTable,
    PrefixNeeds,
    block_steps,
    extend_floors,
    needs_after,
    prefix_floors,
    prefix_needs,
    shifted,
)
from graphpipe.planner.sp_dp.size_tables import fewest_degree
from graphpipe.planner.sp_dp.tables import Block, ChainInfo, ChainTables
from graphpipe.planner.stage_spec import StageSpec
from tests.planner.random_sp_graphs import Case, cases

NO_LIMIT = 1e18
MERGING = ("two_branch", "fork_join", "nested")  # the shapes with two-branch blocks and a join run


def request_for(case: Case, limit: float) -> PlanRequest:
    return make_request(case.graph, case.costs, case.cluster, case.global_batch_size,
                        micro_batch_sizes=[case.micro_batch_size], memory_limit=limit)


def merge_blocks(chains: ChainTables) -> Iterator[Block]:
    for info in list(chains):
        for start in range(info.num_items):
            block = info.fork_join(start)
            if block is not None and block.join is not None and block.num_branches == MERGE_BRANCHES:
                yield block


def _probe(request: PlanRequest, target_ms: float) -> Probe:
    chains, pars = build_tables(request.model, request.sp_tree)
    search = Search(request.model, request.sp_tree, request.num_devices, request.micro_batch_sizes[0],
                    request.memory_limit, chains, pars)
    return Probe(search, target_ms)


def _leaf_chains(probe: Probe) -> list[ChainInfo]:
    return [info for info in probe.host.shapes.chains if not info.has_parallel and info.num_items]


def _nested_chains(probe: Probe) -> list[ChainInfo]:
    return [info for info in probe.host.shapes.chains if info.has_parallel]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=cases(shapes=MERGING))
def test_prefix_floors_bound_the_need_and_equal_it_without_a_memory_limit(case: Case) -> None:
    """On every chain without parallel items, every prefix and every k_after: floor <= need (tight memory) and
    floor == need (no limit), above the devices read as infeasible, and `prefix_needs` and `PrefixNeeds` (from the
    floors where no count depends on memory, as with no limit) give the need itself; on chains with parallel items
    (blocks stepped over on their least work), floor <= need."""
    for limit, equal in ((NO_LIMIT, True), (_tight_limit(case), False)):
        request = request_for(case, limit)
        for target in (math.inf, _middling_target(request)):
            probe = _probe(request, target)
            for info in _leaf_chains(probe):
                held = prefix_needs(probe.tables.fewest_degrees(info, target, np.arange(probe.tables.max_v + 1)))
                needs = PrefixNeeds.of(probe.tables, info, target, probe.blocks.free_floors(info))
                assert needs is not None
                if equal:  # no limit: no stage's count depends on memory, so the floors are the needs
                    assert needs.floors is not None
                for k_after in range(probe.tables.max_v + 1):
                    fewest = probe.tables.fewest_degrees(info, target, np.array([k_after + 1]))[0]
                    bounds = shifted(prefix_floors(fewest, probe.tables.max_v), np.arange(info.num_items + 1), k_after)
                    exact = needs_after(held, k_after, probe.tables.num_devices)
                    after = needs.after(k_after, probe.tables.num_devices)
                    for end in range(info.num_items + 1):
                        need = np.array(probe.chain(info, k_after, end).need[0])
                        bound = np.where(bounds[end] <= probe.tables.num_devices, bounds[end], BIG)
                        assert (bound <= need).all(), (end, k_after, bound, need)
                        if equal:
                            assert (bound == need).all(), (end, k_after, bound, need)
                        assert exact[end].tolist() == need.tolist(), (end, k_after, exact[end], need)
                        assert after[end].tolist() == need.tolist(), (end, k_after, after[end], need)
            for info in _nested_chains(probe):
                steps = block_steps(probe.tables, info, target)
                for k_after in range(probe.tables.max_v + 1):
                    fewest = probe.tables.fewest_degrees(info, target, np.array([k_after + 1]))[0]
                    bounds = prefix_floors(fewest, probe.tables.max_v, steps)
                    floors = shifted(bounds, np.arange(info.num_items + 1), k_after)
                    for end in range(info.num_items + 1):
                        need = np.array(probe.chain(info, k_after, end).need[0])
                        assert (np.minimum(floors[end], BIG) <= need).all(), (end, k_after, floors[end], need)


def _floors_by_definition(fewest: np.ndarray, max_v: int, steps: dict[int, list[tuple[int, int]]]) -> list[list[int]]:
    """The module docstring's recurrence, read literally: floor[j][m] = min(floor[j][m - 1], min over i < j of
    floor[i][m - 1] + the fewest devices of [i, j), a segment or a step)."""
    size = fewest.shape[0]
    edge = {(i, j): int(fewest[i, j]) for i in range(size) for j in range(i + 1, size)}
    for start, reach in steps.items():
        for stop, devices in reach:
            edge[start, stop] = min(edge[start, stop], devices)
    floor = [[0 if j == 0 else BIG for j in range(size)]]
    for _ in range(max_v):
        last = floor[-1]
        floor.append([min([last[j], *(min(last[i] + edge[i, j], BIG) for i in range(j))]) for j in range(size)])
    return [[floor[m][j] for m in range(max_v + 1)] for j in range(size)]


def _random_fewest(rng: np.random.Generator, shortest: int) -> tuple[np.ndarray, int]:
    """A random segment table of fewest degrees (BIG where none meets) of `shortest` to 11 stops, and a max_v."""
    size = int(rng.integers(shortest, 12))
    fewest = rng.integers(1, 5, size=(size, size))
    fewest[rng.random((size, size)) < rng.random()] = BIG
    return fewest, int(rng.integers(1, 8))


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), sparse_share=st.sampled_from([0.0, merge_tails.SPARSE_SHARE, 1.0]))
def test_prefix_floors_follow_their_recurrence(seed: int, sparse_share: float) -> None:
    """Both ways of reading the segments (all starts against all stops, or the segments within reach by stop:
    `SPARSE_SHARE` 0 forces the first, 1 the second) give the recurrence's numbers."""
    rng = np.random.default_rng(seed)
    fewest, max_v = _random_fewest(rng, 1)
    size = len(fewest)
    steps = {start: [(int(stop), int(rng.integers(1, 4)))] for start in range(size - 1) if rng.random() < 0.3
             for stop in [rng.integers(start + 1, size)]}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(merge_tails, "SPARSE_SHARE", sparse_share)
        assert prefix_floors(fewest, max_v, steps).tolist() == _floors_by_definition(fewest, max_v, steps)


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_extended_floors_are_the_longer_chains_floors(seed: int) -> None:
    """`extend_floors` of a chain's floors and its appended item's segments is `prefix_floors` of the longer one."""
    fewest, max_v = _random_fewest(np.random.default_rng(seed), 2)
    shorter = prefix_floors(fewest[:-1, :-1], max_v)
    assert extend_floors(shorter, fewest[:-1, -1]).tolist() == prefix_floors(fewest, max_v).tolist()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=cases(shapes=MERGING))
def test_a_branch_with_its_join_extends_the_branchs_floors(case: Case) -> None:
    """Each branch of a two-branch block with its join run appended shares the branch's segment costs
    (`SizeTables.extends`), and its count-free floors built on the branch's are those of its own fewest degrees, or
    None alike, with and without a binding memory limit, at targets from none to tight."""
    for limit in (NO_LIMIT, _tight_limit(case)):
        request = request_for(case, limit)
        chains, pars = build_tables(request.model, request.sp_tree)
        search = Search(request.model, request.sp_tree, request.num_devices, case.micro_batch_size, limit,
                        chains, pars)
        for block in list(merge_blocks(chains)):
            for pos in (0, 1):
                chain = chains.extended(block, pos, False, True)
                assert chain.prefix_of is block.pinfo.branch_infos[pos]
                assert search.tables.extends(chain)
                for target in (math.inf, _middling_target(request), 0.01):
                    solver = ForkJoinSolver(search.tables, target, search.shapes, search.merges)
                    fewest = search.tables.fewest_free(chain, target)
                    expected = None if fewest is None else prefix_floors(fewest, search.tables.max_v).tolist()
                    found = solver.free_floors(chain)
                    assert (None if found is None else found.tolist()) == expected, target


def _tight_limit(case: Case) -> float:
    """Below the peak memory of the best plan with no limit, so that memory binds (`Case.tightness`)."""
    best = plan_candidates(case.graph, case.costs, case.cluster, case.global_batch_size,
                           micro_batch_sizes=[case.micro_batch_size], memory_limit=NO_LIMIT)[0]
    return math.floor(max(stage.memory_bytes for stage in best.stages) * case.tightness) + 0.5


def _middling_target(request: PlanRequest) -> float:
    """A target between the loosest and the tightest: the best plan's TPS over 0.9 (plans exist, fewer pass)."""
    found = partition_sp(request.model, request.sp_tree, request.num_devices, request.micro_batch_sizes,
                         request.memory_limit)
    plans = [plans[0] for plans in found.values() if plans]
    if not plans:
        return math.inf
    return max(request.model.stage_cost(s.ops, s.num_devices, s.micro_batch_size).tps_ms for s in plans[0]) / 0.9


def _no_floors(self: ForkJoinSolver, chain: ChainInfo, k_after: int) -> np.ndarray:
    """The weakest floor: nothing (every merge layout within the target and the devices is solved)."""
    return np.zeros((chain.num_items + 1, self.tables.max_v + 1), dtype=np.int64)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=cases(shapes=MERGING))
def test_pruning_merge_layouts_changes_no_plan(case: Case) -> None:
    """The same plans whichever way the merge layouts are written: pruned by their floors and placed one by one
    (never exact), each with both lanes solved rather than a lane left unsolved once the other's need and its
    floor say the pair betters no cell, from the lanes' exact needs at once wherever a block has no fork run
    (always exact), as the search chooses, and with no floors at all."""
    for limit in (NO_LIMIT, _tight_limit(case)):
        chosen = _plans(case, limit)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(fork_join, "EXACT_AFTER", 1 << 30)
            one_by_one = _plans(case, limit)
            patch.setattr(ForkJoinSolver, "_place_merge", _place_whole)
            whole = _plans(case, limit)
            patch.undo()
            patch.setattr(fork_join, "EXACT_AFTER", 1 << 30)
            patch.setattr(fork_join, "EXACT_AFTER", -1)
            at_once = _plans(case, limit)
            patch.setattr(fork_join, "EXACT_AFTER", 1 << 30)
            patch.setattr(ForkJoinSolver, "_floors", _no_floors)
            every = _plans(case, limit)
            patch.setattr(fork_join._Tails, "of", classmethod(_every_tail))
            every_tail = _plans(case, limit)
        assert chosen == one_by_one == whole == at_once == every == every_tail


def _place_whole(self: ForkJoinSolver, solver: fork_join.ChainSolver, layout: fork_join.Layout,
                 shape: fork_join._Shape, psol: fork_join.ParSol, k_side: int, vec: list[int],
                 chosen: list[fork_join.LayoutChoice | None], floors: list[list[int]]) -> None:
    """A merge layout placed with both lanes solved (`ForkJoinSolver._place`): every lane is at J's side."""
    del floors
    self._place(solver, layout, shape, psol, (k_side - 1, k_side), vec, chosen)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=cases(shapes=MERGING))
def test_merge_stage_devices_are_the_fewest_degree_that_meets_the_target(case: Case) -> None:
    """`MergeTable.devices` (read from the least TPS per degree, kept between probes) is, on every pair, the fewest
    degree whose TPS meets the target and that holds k_side, where both tails fit alone and together."""
    for limit in (NO_LIMIT, _tight_limit(case)):
        probe = _probe(request_for(case, limit), math.inf)
        for block in merge_blocks(probe.host.shapes.chains):
            assert block.join is not None
            table = MergeTable(probe.tables, block.pinfo, block.join.ops)
            for target in (math.inf, _middling_target(request_for(case, limit)), 1e-9):
                for k_side in (1, 2, probe.tables.max_v):
                    found = table.devices(target, k_side)
                    if found is None:
                        continue
                    count0, count1 = len(found[0]), len(found[1])
                    tps, k_max = table._costs(count0, count1)
                    meets = (tps[:, :count0, :count1] <= target) & (k_max[:, :count0, :count1] >= k_side)
                    expected = fewest_degree(meets, probe.tables.degrees, axis=0)
                    alone = table.compute[0][:count0, None] + table.compute[1][None, :count1] <= target
                    alone &= table.params[0][:count0, None] + table.params[1][None, :count1] <= limit
                    expected[~np.logical_and.accumulate(alone, axis=1)] = BIG
                    assert found[2].tolist() == expected.tolist(), (target, k_side)


def _every_tail(cls: type[fork_join._Tails], devices: np.ndarray, *_: object) -> fork_join._Tails:
    return cls(np.arange(devices.shape[0]), np.arange(devices.shape[1]))


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), fork=st.booleans())
def test_tails_left_out_have_no_pair_below_the_room(seed: int, fork: bool) -> None:
    """`_Tails.of` keeps both tails of every pair whose floor is below the room at some cell: the pair's floor
    written out cell by cell, with and without F (then per branch taking F, its lane's floor a cell up)."""
    rng = np.random.default_rng(seed)
    count0, count1, cells = (int(n) for n in rng.integers(1, 7, size=3))
    width = cells + 1 if fork else cells

    def some(*shape: int) -> np.ndarray:
        values = rng.integers(0, 6, size=shape)
        return np.where(rng.random(shape) < 0.2, BIG, values)

    devices = some(count0, count1)
    lanes, forks = [some(count0, width), some(count1, width)], [some(count0, width), some(count1, width)]
    room = rng.integers(-2, 14, size=cells)
    tails = fork_join._Tails.of(devices, lanes, forks if fork else None, room)
    for t0 in range(count0):
        for t1 in range(count1):
            if fork:
                floors = [forks[0][t0, 1:] + devices[t0, t1] + lanes[1][t1, :cells],
                          forks[1][t1, 1:] + devices[t0, t1] + lanes[0][t0, :cells]]
            else:
                floors = [devices[t0, t1] + lanes[0][t0] + lanes[1][t1]]
            if any((floor < room).any() for floor in floors):
                assert t0 in tails.rows and t1 in tails.cols, (t0, t1)


def test_a_merge_layout_is_solved_only_where_it_may_better_a_feasible_cell() -> None:
    """`_may_better`: a pair whose side and floors are below the block's vector only at cells above the devices
    betters nothing (those cells are infeasible whatever they hold, BIG once settled), so its lanes are not solved;
    below a feasible cell, or within the devices where the vector is still infeasible, it may better one. A tie
    betters nothing."""
    side, infeasible = [0, 0, 0], [BIG, BIG, BIG]
    assert not fork_join._may_better(side, [[70, 70, 70]], 0, infeasible, num_devices=64)
    assert not fork_join._may_better(side, [[40, 36, 35]], 30, infeasible, num_devices=64)
    assert fork_join._may_better(side, [[70, 60, 70]], 0, infeasible, num_devices=64)
    assert fork_join._may_better(side, [[40, 36, 35]], 30, infeasible, num_devices=70)
    assert fork_join._may_better([0, 0, 1], [[70, 50, 20], [0, 0, 18]], 0, [BIG, 50, 40], num_devices=64)
    assert not fork_join._may_better([0, 0, 1], [[70, 50, 20], [0, 0, 19]], 0, [BIG, 50, 40], num_devices=64)


def _plans(case: Case, limit: float) -> dict[int, list[list[StageSpec]]]:
    request = request_for(case, limit)  # fresh tables and memo
    return partition_sp(request.model, request.sp_tree, request.num_devices, request.micro_batch_sizes,
                        request.memory_limit, every_size=True)


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 6), counts=st.integers(1, 8), k_after=st.integers(0, 9), seed=st.integers(0, 2**16))
def test_fewer_cells_are_the_first_cells(rows: int, counts: int, k_after: int, seed: int) -> None:
    """`shifted` on the cells below `cells` only reads the stage counts below cells - k_after: the cells it gives
    are those of the whole table, so a rebuild that needs only the cells below v builds only as many counts."""
    floors = np.random.default_rng(seed).integers(0, 9, size=(rows, counts))
    ends = np.arange(rows)
    whole = shifted(floors, ends, k_after)
    for cells in range(counts + 1):
        short = shifted(floors[:, :max(cells - k_after, 0)], ends, k_after, cells)
        np.testing.assert_array_equal(short, whole[:, :cells])
