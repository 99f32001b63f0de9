"""The floor that skips a ceiling probe (`sp_dp.search.Search.may_meet`): where it says no plan meets a target, the
probe finds none, on the SP tree and on the chain, with and without a memory limit; the chain search with the
ceiling finds the same plans without it; and on a chain it reads the segments within the target as a band
(`sp_dp.band`) whose fewest degrees are the whole table's, nothing outside it meeting the target, and whose least
staging is the whole table's shortest path, deciding like `merge_tails.prefix_floors` at `max_v` stages whether it
fits on the devices."""

from __future__ import annotations

import math
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from graphpipe.cost.formulas.memory import static_memory_bytes
from graphpipe.planner.api import make_request
from graphpipe.planner.graphpipe_planner import chain_ceiling
from graphpipe.planner.request import PlanRequest
from graphpipe.planner.sp_dp import Search, band, build_tables, partition_sp
from graphpipe.planner.sp_dp.band import (
    PASS_CELLS,
    Band,
    _band_groups,
    band_widths,
    chain_band,
    chain_floor,
    least_staging_in_band,
)
from graphpipe.planner.sp_dp.blocks import BIG
from graphpipe.planner.sp_dp.merge_tails import prefix_floors
from graphpipe.planner.sp_dp.size_tables import SegmentOffers
from graphpipe.planner.stage_spec import StageSpec
from tests.planner.random_sp_graphs import Case, cases

NO_LIMIT = 1e18
SCALES = (0.5, 0.8, 0.95, 1.0, 1.05, 1.3, 2.0)  # targets around the best plan's bottleneck


def _request(case: Case, limit: float) -> PlanRequest:
    return make_request(case.graph, case.costs, case.cluster, case.global_batch_size,
                        micro_batch_sizes=[case.micro_batch_size], memory_limit=limit)


def _chain_search(case: Case, limit: float) -> tuple[PlanRequest, Search, float]:
    """The case's request, a search on its chain at the case's micro-batch size, and the best chain plan's
    bottleneck (1.0 where none fits): the targets the band tests sweep around."""
    request = _request(case, limit)
    found = partition_sp(request.model, request.chain_tree, request.num_devices, request.micro_batch_sizes, limit)
    plans = [plans[0] for plans in found.values() if plans]
    best = 1.0 if not plans else max(
        request.model.stage_cost(s.ops, s.num_devices, s.micro_batch_size).tps_ms for s in plans[0])
    chains, pars = build_tables(request.model, request.chain_tree)
    return request, Search(request.model, request.chain_tree, request.num_devices, case.micro_batch_size, limit,
                           chains, pars), best


def _limits(case: Case) -> tuple[float, ...]:
    """No limit, and one that binds: the static state and one micro-batch of the heaviest op, times 1 plus the
    case's tightness (so a stage holds few ops and few micro-batches)."""
    model = _request(case, NO_LIMIT).model
    heaviest = max(static_memory_bytes(model.param_bytes[op]) + model.op_at(op, case.micro_batch_size)[2]
                   for op in case.graph.names)
    return NO_LIMIT, heaviest * (1 + case.tightness)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=cases())
def test_a_target_the_floor_rules_out_has_no_plan(case: Case) -> None:
    for limit in _limits(case):
        request = _request(case, limit)
        found = partition_sp(request.model, request.sp_tree, request.num_devices, request.micro_batch_sizes,
                             request.memory_limit)
        plans = [plans[0] for plans in found.values() if plans]
        best = math.inf if not plans else max(
            request.model.stage_cost(s.ops, s.num_devices, s.micro_batch_size).tps_ms for s in plans[0])
        targets = [math.inf] if math.isinf(best) else [best * scale for scale in SCALES]
        for tree in (request.sp_tree, request.chain_tree):
            chains, pars = build_tables(request.model, tree)
            search = Search(request.model, tree, request.num_devices, case.micro_batch_size, limit, chains, pars)
            for target in targets:
                if not search.may_meet(target):
                    assert search.probe(target) is None, (target, best)


def _with_ceiling(request: PlanRequest) -> dict[int, list[list[StageSpec]]]:
    model, devices, sizes, limit = request.model, request.num_devices, request.micro_batch_sizes, request.memory_limit
    found = partition_sp(model, request.sp_tree, devices, sizes, limit, every_size=True)
    return partition_sp(model, request.chain_tree, devices, sizes, limit, ceiling_ms=chain_ceiling(model, found),
                        every_size=True)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=cases())
def test_the_ceiling_search_finds_the_same_plans_without_the_floor(case: Case) -> None:
    """The chain pass finds the same plans with the floor (and the lone probe's offers from its band) as with
    neither (every target probed, offers from the whole table)."""
    for limit in _limits(case):
        with_floor = _with_ceiling(_request(case, limit))
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(Search, "may_meet", lambda self, target_ms: True)
            without = _with_ceiling(_request(case, limit))
        assert with_floor == without


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=cases())
def test_the_band_is_the_tables_segments_within_the_target(case: Case) -> None:
    for limit in _limits(case):
        request, search, best = _chain_search(case, limit)
        tables, info = search.tables, search.root
        for target in (math.inf, best * 2, best, best * 0.7, best * 0.3):
            whole = tables.fewest_degrees(info, target, np.array([1]))[0]
            widths = band_widths(tables, info, target)
            band = Band(tables, info, target, widths).fewest()
            width = max(widths)
            assert band.shape == (info.num_items + 1, width)
            for start in range(info.num_items + 1):
                for stop in range(start + 1, info.num_items + 1):
                    if stop <= start + width:
                        assert int(band[start, stop - start - 1]) == int(whole[start, stop]), (target, start, stop)
                    else:
                        assert int(whole[start, stop]) == BIG, (target, start, stop)  # outside: nothing meets
                assert (band[start, info.num_items - start:] == BIG).all()  # past the chain's end
            _, tps, k_max, fits = tables._table(info)
            for pos, reach in enumerate(widths):  # each degree's band: no segment beyond it meets on that degree
                beyond = np.triu(np.ones(tps.shape[1:], dtype=bool), reach + 1)
                meets = (tps[pos] <= target) & fits[pos] & (k_max[pos] >= 1)
                assert not meets[beyond].any(), (target, tables.degrees[pos], reach)
            floors = prefix_floors(whole, tables.max_v)
            least = least_staging_in_band(band)
            assert least == _least_staging(whole), target
            if floors[-1, -1] <= request.num_devices:  # a staging that fits has fewer than max_v stages
                assert least == floors[-1, -1], target
            fits = chain_floor(tables, info, target, chain_band(tables, info, target)) <= request.num_devices
            assert fits == (floors[-1, -1] <= request.num_devices), target


def _least_staging(fewest: np.ndarray) -> int:
    """The least devices staging a whole chain in any number of stages, by the definition: a shortest path through
    the stops, from the whole table fewest[start, stop]."""
    size = fewest.shape[0]
    least = [0] + [BIG] * (size - 1)
    for stop in range(1, size):
        least[stop] = min([BIG] + [least[start] + int(fewest[start, stop]) for start in range(stop)])
    return min(least[-1], BIG)


def _all_runs(count: int) -> list[list[tuple[int, int]]]:
    """Every split of `count` positions into runs of consecutive ones, as (start, stop) pairs."""
    if count == 0:
        return [[]]
    return [[*head, (start, count)] for start in range(count) for head in _all_runs(start)]


@pytest.mark.parametrize("widths,size", [([5], 38), ([6, 7, 10, 15, 22, 30], 38), ([6, 8, 11, 16, 27, 37], 38),
                                         ([43, 80, 147, 263, 437, 655], 262), ([8, 12, 19, 32, 51, 69], 70),
                                         ([3, 3, 40, 41], 100)])
def test_band_groups_are_runs_of_degrees_at_the_least_cost(widths: list[int], size: int) -> None:
    """`_band_groups` splits the degrees into runs, each at its widest width, at the least cost by its own cost
    model (a pass's fixed cells plus its cells), checked against every split."""
    degrees = tuple(2**pos for pos in range(len(widths)))
    groups = _band_groups(degrees, widths, size)
    assert [d1 for run, _ in groups for d1 in run] == list(degrees)

    def cost(runs: list[tuple[int, int]]) -> int:
        return sum(PASS_CELLS + (stop - start) * size * max(widths[start:stop]) for start, stop in runs)

    starts = [degrees.index(run[0]) for run, _ in groups]
    chosen = list(zip(starts, [*starts[1:], len(degrees)]))
    assert [width for _, width in groups] == [max(widths[start:stop]) for start, stop in chosen]
    assert cost(chosen) == min(cost(runs) for runs in _all_runs(len(widths)))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=cases())
def test_the_band_is_the_same_however_the_degrees_are_grouped(case: Case) -> None:
    """`Band.fewest` gives the same fewest degrees with one pass for all degrees and with a pass per degree."""
    request = _request(case, case.cluster.device.memory_bytes)
    chains, pars = build_tables(request.model, request.chain_tree)
    search = Search(request.model, request.chain_tree, request.num_devices, case.micro_batch_size,
                    request.memory_limit, chains, pars)
    tables, info = search.tables, search.root
    lone = search.lower_bound_ms()
    for target in (math.inf, lone * 4, lone * 1.5, lone):
        widths = band_widths(tables, info, target)
        found = []
        for grouping in (lambda d, w, n: [(d, max(w))], lambda d, w, n: [((d1,), x) for d1, x in zip(d, w)]):
            with mock.patch.object(band, "_band_groups", grouping):
                found.append(Band(tables, info, target, widths).fewest())
        assert (found[0] == found[1]).all(), target


def _offers_by_start(offers: SegmentOffers, target: float) -> list[list[tuple[int, int, float, int, bool]]]:
    """Per start, its offers as (stop, devices left beside it, TPS, most in flight, dominated at `target`), sorted:
    what a probe at `target` reads of them, whatever their order among equal TPS."""
    out = []
    for start in range(len(offers.offsets) - 1):
        lo, hi = offers.offsets[start], offers.offsets[start + 1]
        assert offers.tps[lo:hi] == sorted(offers.tps[lo:hi])  # by TPS within a start, as `_segment_keys` bisects
        out.append(sorted((offers.stops[at], offers.rooms[at], offers.tps[at], offers.k_maxes[at],
                           offers.until[at] <= target) for at in range(lo, hi)))
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=cases())
def test_the_bands_offers_are_the_tables_at_its_target(case: Case) -> None:
    """`Band.offers` holds the offers `SizeTables.build_offers` builds from the whole table at the band's target alone:
    per start the same segments, degrees, TPS and in-flight counts, each dominated there or not alike, with and
    without a binding memory limit, at targets from loose to tight (the plans the chain pass finds with them:
    `test_the_ceiling_search_finds_the_same_plans_without_the_floor`)."""
    for limit in _limits(case):
        _, search, best = _chain_search(case, limit)
        tables, info = search.tables, search.root
        for target in (best * 2, best, best * 0.7, best * 0.3):
            band = Band(tables, info, target, band_widths(tables, info, target))
            assert _offers_by_start(band.offers(), target) == _offers_by_start(
                tables.build_offers(info, target, target), target), target
