"""A probe's entry needs (`sp_dp.probe.Probe.entry_need`): read from a chain's prefix floors where no stage's degree
depends on its in-flight count, solved otherwise, they are the chain DP's own need vectors; the stages rebuilt from
its suffix floors there (`Probe._emit_from_floors`) are the DP's own choices; and the plans are the same whichever
way they are read."""

from __future__ import annotations

import math
from functools import partial

import pytest
from hypothesis import HealthCheck, given, settings

from graphpipe.planner.api import make_request
from graphpipe.planner.sp_dp import Probe, Search, build_tables, partition_sp, probe
from graphpipe.planner.sp_dp.size_tables import SegmentOffers
from graphpipe.planner.sp_dp.tables import ChainInfo
from graphpipe.planner.stage_spec import StageSpec
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
