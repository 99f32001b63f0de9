"""A probe's entry needs (`sp_dp.probe.Probe.entry_need`): read from a chain's prefix floors where no stage's degree
depends on its in-flight count, solved otherwise, they are the chain DP's own need vectors; the stages rebuilt from
its suffix floors there (`Probe._emit_from_floors`) are the DP's own choices; and the plans are the same whichever
way they are read. A chain's rows taken from the same chain solved to another end (`Probe._solve_chain`) are the
rows it would solve. A prefix's cut floor (`Probe.cut_floor`) is below its need, and reading it changes no plan."""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from graphpipe.cost.analytic import analytic_costs
from graphpipe.cost.presets import cluster_preset
from graphpipe.planner.api import make_request
from graphpipe.planner.request import PlanRequest
from graphpipe.planner.sp_dp import Probe, Search, build_tables, partition_sp, probe
from graphpipe.planner.sp_dp.need import ChainSol
from graphpipe.planner.sp_dp.size_tables import SegmentOffers
from graphpipe.planner.sp_dp.tables import ChainInfo
from graphpipe.planner.stage_spec import StageSpec
from tests.planner.clip import clip_towers_graph
from tests.planner.random_sp_graphs import Case, cases


def _sp_search(case: Case, limit: float) -> Search:
    """A search on the case's SP tree at its micro-batch size, under `limit`."""
    request = make_request(case.graph, case.costs, case.cluster, case.global_batch_size,
                           micro_batch_sizes=[case.micro_batch_size], memory_limit=limit)
    chains, pars = build_tables(request.model, request.sp_tree)
    return Search(request.model, request.sp_tree, request.num_devices, case.micro_batch_size, limit, chains, pars)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=cases())
def test_entry_needs_are_the_chain_dps_needs(case: Case) -> None:
    """On every chain of the tree, every k_after and every end, with and without a binding memory limit and at
    targets from none to tight: `entry_need` equals `chain(...).need[0]` of a fresh probe; with no limit, the
    floors answer for every chain without parallel items."""
    floors_used = 0
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(probe, "FLOOR_ITEMS", 1)  # every chain long enough, so that the floors are checked on all
        for limit in (1e18, case.cluster.device.memory_bytes * 0.05):
            search = _sp_search(case, limit)
            chains = search.chains
            for target in (math.inf, 1.0, 0.05):
                read, solved = Probe(search, target), Probe(search, target)
                for info in chains:
                    for k_after in range(search.tables.max_v + 1):
                        for end in range(info.num_items + 1):
                            need = read.entry_need(info, k_after, end)
                            assert need == solved.chain(info, k_after, end).need[0], (target, k_after, end)
                    if not info.has_parallel and info.num_items and read.blocks.free_memo.get(info.content) is not None:
                        floors_used += 1
                    if limit == 1e18 and not info.has_parallel and info.num_items:
                        assert read.blocks.free_memo.get(info.content) is not None
    assert floors_used


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=cases())
def test_reading_entry_needs_off_the_floors_changes_no_plan(case: Case) -> None:
    """Every size's plans of the SP search are the same with the floors read (entry needs and stages) for every
    chain and for none, with and without a binding memory limit."""
    for limit in (1e18, case.cluster.device.memory_bytes * 0.05):
        found = []
        for shortest in (1, 1 << 30):
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(probe, "FLOOR_ITEMS", shortest)
                patch.setattr(probe, "REBUILD_ITEMS", shortest)
                patch.setattr(probe, "REBUILD_STAGES", math.inf if shortest == 1 else 0.0)
                request = make_request(case.graph, case.costs, case.cluster, case.global_batch_size,
                                       micro_batch_sizes=[case.micro_batch_size], memory_limit=limit)
                found.append(partition_sp(request.model, request.sp_tree, request.num_devices,
                                          request.micro_batch_sizes, limit, every_size=True))
        assert found[0] == found[1]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=cases())
def test_stages_rebuilt_from_the_floors_are_the_dps(case: Case) -> None:
    """On every chain without parallel items, every k_after, end and feasible entry count, at targets from none to
    tight, with and without a binding memory limit: the stages `_emit_from_floors` rebuilds from the suffix floors
    are those the DP's rows choose (`emit_chain` of a probe that solved the chain); where it declines (the counts
    matter, only under a limit) it emits nothing."""
    rebuilt = 0
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(probe, "FLOOR_ITEMS", 1)
        patch.setattr(probe, "REBUILD_ITEMS", 1)
        patch.setattr(probe, "REBUILD_STAGES", math.inf)  # every plan, however many stages it has
        for limit in (1e18, case.cluster.device.memory_bytes * 0.05):
            search = _sp_search(case, limit)
            chains = search.chains
            tables = search.tables
            for target in (math.inf, 1.0, 0.05):
                read, solved = Probe(search, target), Probe(search, target)
                for info in chains:
                    if info.has_parallel or not info.num_items:
                        continue
                    for k_after in range(tables.max_v + 1):
                        for end in range(1, info.num_items + 1):
                            need = solved.chain(info, k_after, end).need[0]
                            for v in (v for v, devices in enumerate(need) if devices <= tables.num_devices):
                                expected: list[StageSpec] = []
                                solved.emit_chain(info, k_after, v, expected, end=end)
                                found: list[StageSpec] = []
                                if read._emit_from_floors(info, k_after, v, found, 0, end):
                                    assert found == expected, (target, k_after, end, v)
                                    rebuilt += 1
                                else:  # the counts matter, under a limit only
                                    assert limit < 1e18 and not found
    assert rebuilt


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=cases())
def test_a_probe_with_no_target_reads_only_what_it_needs(case: Case) -> None:
    """With no target every offer a smaller degree dominates somewhere is dominated there: the offers built for
    that target alone (`Search.offers`) give the plan that a window from the lower bound up gives, with and
    without a binding memory limit."""
    for limit in (1e18, case.cluster.device.memory_bytes * 0.05):
        lone, window = _sp_search(case, limit), _sp_search(case, limit)
        lone.lo = window.lo = lone.lower_bound_ms() * 0.999
        window.offers = partial(_window_offers, window)  # type: ignore[method-assign]
        assert lone.probe(math.inf) == window.probe(math.inf)
        assert all(math.isinf(offers.low) for offers in lone._offers.values())


def _window_offers(search: Search, info: ChainInfo, target_ms: float) -> SegmentOffers:
    """The offers of the window from the search's lower end to no bound, whatever the target."""
    return search.tables.build_offers(info, search.lo, math.inf)


class _Alone(Probe):
    """A probe that solves every chain from its end, never taking rows from the same chain solved to another end."""

    def _solve_chain(self, info: ChainInfo, k_after: int, end: int, other: ChainSol | None = None,
                     loose: np.ndarray | None = None) -> ChainSol:
        return super()._solve_chain(info, k_after, end, None, loose)


class _Counting(Probe):
    """The plain probe, counting the solves that took rows from another end."""

    taken = 0

    def _solve_chain(self, info: ChainInfo, k_after: int, end: int, other: ChainSol | None = None,
                     loose: np.ndarray | None = None) -> ChainSol:
        sol = super()._solve_chain(info, k_after, end, other, loose)
        if other is not None and end > 0 and sol.choice[0] is other.choice[0]:
            _Counting.taken += 1
        return sol


def _chain_rows(found: Probe) -> dict[tuple[int, int, int], tuple[Any, ...]]:
    """Every chain the probe solved: its rows' needs, breakpoints and every cell's choice, up to its end."""
    return {key: (sol.need[:key[2]], sol.breaks[:key[2]],
                  [[sol.choice[start][v] for v in range(len(sol.need[start]))] for start in range(key[2])])
            for key, sol in found.chain_memo.items()}


def _same_rows(search: Search) -> None:
    for target in (math.inf, search.hi, search.hi * 1.05, search.hi * 0.8):
        taking, alone = _Counting(search, target), _Alone(search, target)
        assert (taking.best_entry(), _chain_rows(taking)) == (alone.best_entry(), _chain_rows(alone))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=cases(shapes=("two_branch", "nested", "fork_join")))
def test_rows_taken_from_another_end_are_the_rows_solved(case: Case) -> None:
    """With and without a binding memory limit, at targets from none to below the optimum: every chain a probe
    solves (merge stages' lanes are prefixes of one branch cut at each tail) has the same rows, breakpoints and
    choices whether the rows below a point are taken from the chain solved to another end or solved."""
    for limit in (1e18, case.cluster.device.memory_bytes * 0.05):
        search = _sp_search(case, limit)
        if search.run() is not None:
            _same_rows(search)


def test_a_merge_stage_takes_its_lanes_rows_from_another_tail() -> None:
    """Hugging Face CLIP's towers (2 layers, tiny) at op level on 32 devices: each attention's q, k and v are a block
    inside a tower, so the merge stage's lanes are solved prefix by prefix, and some take rows from another."""
    graph = clip_towers_graph()
    request = make_request(graph, analytic_costs(graph, "v100-16gb"), cluster_preset("summit", 32), 128)
    chains, pars = build_tables(request.model, request.sp_tree)
    search = Search(request.model, request.sp_tree, 32, 8, request.memory_limit, chains, pars)
    assert search.run() is not None
    _Counting.taken = 0
    _same_rows(search)
    assert _Counting.taken > 0


def _cut_floors_checked(search: Search, targets: tuple[float, ...]) -> tuple[int, int]:
    """Every chain's cut floor (`Probe.cut_floor`) at a few in-flight counts, every end and each target, against the
    need of the prefix it floors, cell by cell: (floors checked, floors within the devices at some cell)."""
    checked = feasible = 0
    max_v, num_devices = search.tables.max_v, search.tables.num_devices
    for target in targets:
        found = Probe(search, target)
        for info in search.chains:
            for k_after in sorted({0, 1, 2, max_v // 2}):
                for end in range(1, info.num_items + 1):  # each end solved first: a cut is read once two are
                    need = found.chain(info, k_after, end).need[0]
                    floor = found.cut_floor(info, k_after, end)
                    if floor is None:
                        continue
                    assert all(low <= high for low, high in zip(floor, need)), (target, k_after, end)
                    checked += 1
                    feasible += min(floor) <= num_devices
    return checked, feasible


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=cases(shapes=("nested",)))
def test_a_cut_floor_is_below_the_need_of_every_prefix_it_floors(case: Case) -> None:
    """On random graphs whose branches hold blocks, with and without a binding memory limit, at targets from none to
    below the optimum: a chain's prefix cut where no join run spans it, its last stage judged without the tensors it
    sends, needs at most what every longer prefix up to the next cut needs, at every cell."""
    for limit in (1e18, case.cluster.device.memory_bytes * 0.05):
        search = _sp_search(case, limit)
        if search.run() is not None:
            _cut_floors_checked(search, (math.inf, search.hi, search.hi * 0.8))


def test_clips_cut_floors_are_below_the_needs_they_floor() -> None:
    """The same on Hugging Face CLIP's towers (2 layers, tiny) at op level on 32 devices, whose merge stage reads
    them: every tower prefix between two attention blocks, at the optimum and around it, with and without a
    binding memory limit. (A floor one device too high at every cell fails the random graphs' test above.)"""
    graph = clip_towers_graph()
    request = make_request(graph, analytic_costs(graph, "v100-16gb"), cluster_preset("summit", 32), 128)
    chains, pars = build_tables(request.model, request.sp_tree)
    checked = feasible = 0
    for limit in (request.memory_limit, 2 * 2**30):
        search = Search(request.model, request.sp_tree, 32, 8, limit, chains, pars)
        assert search.run() is not None
        counts = _cut_floors_checked(search, (search.hi * 1.05, search.hi, search.hi * 0.9))
        checked, feasible = checked + counts[0], feasible + counts[1]
    assert checked > 100 and feasible > 100, (checked, feasible)


def _every_plan(request: PlanRequest) -> dict[int, list[list[StageSpec]]]:
    return partition_sp(request.model, request.sp_tree, request.num_devices, request.micro_batch_sizes,
                        request.memory_limit, every_size=True)


def _same_plans_without_cut_floors(request: PlanRequest) -> int:
    """The plans with and without the merge stages' cut floors (`Probe.cut_floor`); the floors read."""
    read = 0
    cut_floor = Probe.cut_floor

    def counted(self: Probe, info: ChainInfo, k_after: int, end: int) -> list[int] | None:
        nonlocal read
        found = cut_floor(self, info, k_after, end)
        read += found is not None
        return found

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Probe, "cut_floor", counted)
        expected = _every_plan(request)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Probe, "cut_floor", lambda *args: None)
        assert _every_plan(request) == expected
    return read


def test_cut_floors_change_no_plan() -> None:
    """CLIP's towers (2 layers, tiny, 32 devices), with and without a binding memory limit: every plan the search
    keeps is the same with the merge stages' lanes tested against their cut floors before they are solved, and
    without; the floors are read."""
    graph = clip_towers_graph()
    costs, cluster = analytic_costs(graph, "v100-16gb"), cluster_preset("summit", 32)
    read = sum(_same_plans_without_cut_floors(make_request(graph, costs, cluster, 128, micro_batch_sizes=[8, 32],
                                                           memory_limit=limit)) for limit in (None, 2 * 2**30))
    assert read > 0


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=cases(shapes=("nested",)))
def test_cut_floors_change_no_plan_on_random_graphs(case: Case) -> None:
    """The same on random graphs whose branches hold blocks, with and without a binding memory limit."""
    for limit in (1e18, case.cluster.device.memory_bytes * 0.05):
        _same_plans_without_cut_floors(make_request(case.graph, case.costs, case.cluster, case.global_batch_size,
                                                    micro_batch_sizes=[case.micro_batch_size], memory_limit=limit))
