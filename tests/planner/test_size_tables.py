"""The segment tables' fewest degrees (`sp_dp.size_tables`): read from the least TPS per degree, they are the first
degree that meets the target, for any target, count and chain, as the mask over every degree gives them."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphpipe.planner.api import make_request
from graphpipe.planner.sp_dp import Search, build_tables
from graphpipe.planner.sp_dp.size_tables import SizeTables, fewest_degree, fewest_within, least_by_degree
from graphpipe.planner.sp_dp.tables import ChainTables
from tests.planner.random_sp_graphs import Case, cases


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_fewest_within_is_the_first_degree_that_meets_the_target(seed: int) -> None:
    """On random TPS planes (with inf and NaN) and masks: `fewest_within(least_by_degree(...))` equals `fewest_degree`
    of `usable & (tps <= target)`, at targets on, between and beyond the planes' values."""
    rng = np.random.default_rng(seed)
    count, rows, cols = (int(n) for n in rng.integers(1, 7, size=3))
    degrees = tuple(sorted(rng.choice(np.arange(1, 65), size=count, replace=False).tolist()))
    tps = rng.choice([0.5, 1.0, 1.5, 2.0, math.inf, math.nan], size=(count, rows, cols))
    usable = rng.random((count, rows, cols)) < 0.7
    least = least_by_degree(tps, usable.copy())
    for target in (0.0, 0.5, 0.75, 1.0, 1.75, 2.0, math.inf):
        expected = fewest_degree(usable & (tps <= target), degrees, axis=0)
        assert fewest_within(least, target, degrees).tolist() == expected.tolist(), target


def _tables(case: Case, limit: float) -> tuple[ChainTables, SizeTables]:
    """The case's SP tree's chains and its micro-batch size's tables, under `limit`."""
    request = make_request(case.graph, case.costs, case.cluster, case.global_batch_size,
                           micro_batch_sizes=[case.micro_batch_size], memory_limit=limit)
    chains, pars = build_tables(request.model, request.sp_tree)
    return chains, Search(request.model, request.sp_tree, request.num_devices, case.micro_batch_size, limit,
                          chains, pars).tables


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=cases())
def test_one_count_reads_the_same_fewest_degrees_as_many(case: Case) -> None:
    """`SizeTables.fewest_degrees` at one count (from its kept least TPS) equals the same count among several (the
    mask over every degree), on every chain of the tree, with and without a binding memory limit."""
    for limit in (1e18, case.cluster.device.memory_bytes * 0.05):
        chains, tables = _tables(case, limit)
        counts = np.array([1, 2, tables.max_v])
        for info in chains:
            if not info.num_items:
                continue
            for target in (math.inf, 1.0, 0.01):
                several = tables.fewest_degrees(info, target, counts)
                for row, held in enumerate(counts.tolist()):
                    one = tables.fewest_degrees(info, target, np.array([held]))[0]
                    assert one.tolist() == several[row].tolist(), (target, held)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=cases())
def test_fewest_free_is_the_fewest_degrees_where_no_count_changes_them(case: Case) -> None:
    """`SizeTables.fewest_free` is the fewest degrees at one micro-batch where they equal those at `max_v`, else
    None, by that definition, whether it skips the comparison (memory never binds: every segment holds every count)
    or not; with no limit it always skips it."""
    for limit in (1e18, case.cluster.device.memory_bytes * 0.05):
        chains, tables = _tables(case, limit)
        for info in chains:
            if not info.num_items:
                continue
            if limit == 1e18:
                assert tables._holds_every_count(info)
            for target in (math.inf, 1.0, 0.1, 0.01):
                one, most = (tables.fewest_degrees(info, target, np.array([held]))[0] for held in (1, tables.max_v))
                free = tables.fewest_free(info, target)
                if np.array_equal(one, most):
                    assert free is not None and free.tolist() == one.tolist(), target
                else:
                    assert free is None, target
