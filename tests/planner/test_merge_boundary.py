"""A merge stage's traffic on every pair of tails (`sp_dp.merge_boundary`): the graph's own boundary, and the
rectangles' sums equal to the sums producer by producer, float for float."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from graphpipe.planner.sp_dp import build_tables
from graphpipe.planner.sp_dp.merge_boundary import merge_boundary, merge_boundary_by_producer
from tests.planner.random_sp_graphs import Case, cases
from tests.planner.test_merge_tails import MERGING, NO_LIMIT, merge_blocks, request_for


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=cases(shapes=MERGING))
def test_boundary_matrices_are_the_graphs_traffic(case: Case) -> None:
    request = request_for(case, NO_LIMIT)
    chains, _ = build_tables(request.model, request.sp_tree)
    for block in merge_blocks(chains):
        assert block.join is not None
        first, second = block.pinfo.branch_infos
        rectangles = merge_boundary(block.pinfo, block.join.ops)
        by_producer = merge_boundary_by_producer(block.pinfo, block.join.ops)
        for mine, theirs in zip(rectangles, by_producer):
            np.testing.assert_array_equal(mine, theirs)
        for t0 in range(first.num_items):
            for t1 in range(second.num_items):
                ops = block.pinfo.merge_ops(block.join.ops, first.num_items - 1 - t0, second.num_items - 1 - t1)
                expected = request.model.boundary(ops)
                assert (rectangles[0][t0, t1], rectangles[1][t0, t1]) == pytest.approx(expected), (t0, t1, ops)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=cases(shapes=MERGING))
def test_sums_that_could_round_are_made_producer_by_producer(case: Case) -> None:
    request = request_for(case, NO_LIMIT)
    sizes = request.model.out_bytes_per_sample
    for op in sizes:
        sizes[op] = sizes[op] * 0.1 + 1e-7  # no longer dyadic with small denominators: a sum may round
    chains, _ = build_tables(request.model, request.sp_tree)
    for block in merge_blocks(chains):
        assert block.join is not None
        found = merge_boundary(block.pinfo, block.join.ops)
        for mine, theirs in zip(found, merge_boundary_by_producer(block.pinfo, block.join.ops)):
            np.testing.assert_array_equal(mine, theirs)
