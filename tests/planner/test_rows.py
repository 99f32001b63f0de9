"""A chain row where items start (`sp_dp.rows`): written as arrays, it is the row written cell by cell, with the
same values, choices and breakpoints; a block's vector settled as arrays is the one settled cell by cell; and the
search keeps the same plans with either form. A candidate the row says it overrides (`overridden`) changes nothing
when written, in either form, and skipping the items whose floors a row overrides changes no plan."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphpipe.cost.analytic import analytic_costs
from graphpipe.cost.presets import cluster_preset
from graphpipe.planner.api import make_request
from graphpipe.planner.request import PlanRequest
from graphpipe.planner.sp_dp import partition_sp, rows
from graphpipe.planner.sp_dp.blocks import BIG
from graphpipe.planner.sp_dp.need import BLOCK, JOINED, NO_KEY, OPEN, Layout, LayoutChoice, drops
from graphpipe.planner.sp_dp.rows import ArrayRow, ListRow, Segments, row_for, settle_block
from graphpipe.planner.stage_spec import StageSpec
from tests.planner.clip import clip_towers_graph
from tests.planner.random_sp_graphs import Case, cases


def _segments(rng: np.random.Generator, cells: int, num_devices: int, share: float) -> tuple[Segments, int, int]:
    """Cell keys as `Probe._segment_keys` makes them (ties in cost, costs above the devices, any order)."""
    span, unit = cells + 1, (num_devices + 1) * (cells + 1)
    best, written = [NO_KEY] * cells, []
    for u in rng.permutation(cells - 1).tolist():
        if rng.random() < share:
            cost, d1, stop = (int(x) for x in rng.integers(1, (num_devices * 2, num_devices + 1, cells + 1)))
            best[u] = cost * unit + d1 * span + stop
            written.append(u)
    return (None if share == 0.0 else (best, written)), span, unit


def _vector(rng: np.random.Generator, cells: int, num_devices: int) -> list[int]:
    """A need vector: BIG cells first, then steps down with plateaus, some settled, some not."""
    values = rng.integers(0, num_devices * 2, size=cells)
    values[: int(rng.integers(0, cells))] = BIG
    if rng.random() < 0.7:
        values = np.minimum.accumulate(values)
    return [int(x) for x in values]


@settings(max_examples=300)
@given(seed=st.integers(0, 2**32 - 1), cells=st.sampled_from([2, 3, 5, 9, 17, 40, 200]),
       num_devices=st.integers(1, 24), share=st.sampled_from([0.0, 0.1, 0.5, 1.0]), writes=st.integers(0, 8))
def test_an_array_row_is_the_list_row(seed: int, cells: int, num_devices: int, share: float, writes: int) -> None:
    """Random segments, then random items (every kind, k_after anywhere, rests needing 0 devices, vectors as lists
    for one form and arrays for the other): the same row, every cell's choice and the same breakpoints."""
    rng = np.random.default_rng(seed)
    segments, span, unit = _segments(rng, cells, num_devices, share)
    by_list, by_array = ListRow(cells, segments, span, unit), ArrayRow(cells, segments, span, unit)
    for _ in range(writes):
        kind = (OPEN, BLOCK, JOINED)[int(rng.integers(0, 3))]
        with_join, k_after = bool(rng.random() < 0.5), int(rng.integers(0, cells))
        devices, vector = int(rng.integers(0, num_devices + 1)), _vector(rng, cells, num_devices)
        by_list.write(kind, with_join, k_after, devices, vector)
        by_array.write(kind, with_join, k_after, devices, np.array(vector, dtype=np.int64))
    row, chosen, found = by_list.settle(num_devices)
    array_row, array_chosen, array_found = by_array.settle(num_devices)
    assert (array_row, array_found) == (row, found)
    assert [array_chosen[v] for v in range(cells)] == chosen
    assert len(array_chosen) == cells


def _written_rows(rng: np.random.Generator, cells: int, num_devices: int) -> tuple[ListRow, ArrayRow]:
    """The same random row in both forms: segments, then a few items."""
    segments, span, unit = _segments(rng, cells, num_devices, float(rng.choice([0.0, 0.1, 0.5, 1.0])))
    by_list, by_array = ListRow(cells, segments, span, unit), ArrayRow(cells, segments, span, unit)
    for _ in range(int(rng.integers(0, 5))):
        k_after, devices = int(rng.integers(0, cells)), int(rng.integers(0, num_devices + 1))
        vector = _vector(rng, cells, num_devices)
        by_list.write(OPEN, False, k_after, devices, vector)
        by_array.write(OPEN, False, k_after, devices, np.array(vector, dtype=np.int64))
    return by_list, by_array


@settings(max_examples=400)
@given(seed=st.integers(0, 2**32 - 1), cells=st.sampled_from([2, 3, 5, 9, 17, 40]), num_devices=st.integers(1, 24))
def test_a_candidate_the_row_overrides_changes_nothing(seed: int, cells: int, num_devices: int) -> None:
    """Both forms agree on `overridden` (the lists with the floor's changes found and given); where it holds, a
    vector at or above the floor written there, before or after other candidates, leaves the settled row, every
    choice and the breakpoints as they are without it."""
    rng = np.random.default_rng(seed)
    state = rng.bit_generator.state
    k_after, devices = int(rng.integers(0, cells)), int(rng.integers(0, num_devices + 1))
    floor = _vector(rng, cells, num_devices)
    above = [value if value >= BIG else value + int(rng.integers(0, 2)) for value in floor]
    later = [(int(rng.integers(0, cells)), int(rng.integers(0, num_devices + 1)), _vector(rng, cells, num_devices))
             for _ in range(int(rng.integers(0, 3)))]
    settled = []
    for candidate in (None, floor, above):
        rng.bit_generator.state = state  # the same row each time
        by_list, by_array = _written_rows(rng, cells, num_devices)
        verdict = by_list.overridden(k_after, devices, floor)
        assert by_list.overridden(k_after, devices, floor, drops(floor)) == verdict  # read per run of the floor
        assert by_array.overridden(k_after, devices, np.array(floor, dtype=np.int64)) == verdict
        if not verdict:
            return
        if candidate is not None:
            by_list.write(BLOCK, True, k_after, devices, candidate)
            by_array.write(BLOCK, True, k_after, devices, np.array(candidate, dtype=np.int64))
        for k, d, vector in later:
            by_list.write(JOINED, False, k, d, vector)
            by_array.write(JOINED, False, k, d, np.array(vector, dtype=np.int64))
        row, chosen, found = by_list.settle(num_devices)
        array_row, array_chosen, array_found = by_array.settle(num_devices)
        settled.append((row, chosen, found))
        assert (array_row, [array_chosen[v] for v in range(cells)], array_found) == settled[-1]
    assert settled[0] == settled[1] == settled[2]


def test_the_form_follows_the_cells() -> None:
    assert isinstance(row_for(rows.ARRAY_CELLS - 1, None, 1, 1), ListRow)
    assert isinstance(row_for(rows.ARRAY_CELLS, None, 1, 1), ArrayRow)


def _plans(case: Case, limit: float) -> dict[int, list[list[StageSpec]]]:
    request = make_request(case.graph, case.costs, case.cluster, case.global_batch_size,
                           micro_batch_sizes=[case.micro_batch_size], memory_limit=limit)
    return partition_sp(request.model, request.sp_tree, request.num_devices, request.micro_batch_sizes, limit,
                        every_size=True)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=cases(shapes=("fork_join", "two_branch", "nested", "wide5", "wide8")))
def test_the_search_plans_the_same_with_array_rows(case: Case) -> None:
    """Random graphs with fork runs, merge stages, nested and wide blocks, with and without a binding memory limit:
    every plan the search keeps (`every_size`) is the same with each block row built as arrays (ARRAY_CELLS 0)."""
    for limit in (1e18, case.cluster.device.memory_bytes * 0.05):
        expected = _plans(case, limit)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(rows, "ARRAY_CELLS", 0)
            assert _plans(case, limit) == expected


@given(seed=st.integers(0, 2**32 - 1), cells=st.integers(1, 40), num_devices=st.integers(1, 24))
def test_a_block_settled_as_arrays_is_settled_cell_by_cell(seed: int, cells: int, num_devices: int) -> None:
    """Random block vectors (BIG cells, ties, values above the devices) and choices: the same vector, choices and
    array either way."""
    rng = np.random.default_rng(seed)
    vector = [int(x) for x in rng.integers(0, num_devices * 2, size=cells)]
    for v in np.flatnonzero(rng.random(cells) < 0.3).tolist():
        vector[v] = BIG
    chosen: list[LayoutChoice | None] = [None if value >= BIG else (Layout(int(rng.integers(0, 3)), None), None)
                                         for value in vector]
    by_list = settle_block(list(vector), list(chosen), num_devices)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rows, "ARRAY_CELLS", 0)
        by_array = settle_block(list(vector), list(chosen), num_devices)
    assert by_array.need == by_list.need
    assert [by_array.choice[v] for v in range(cells)] == by_list.choice
    assert by_array.array().tolist() == by_list.array().tolist() == by_list.need



class _CountedVerdicts:
    """`ListRow.overridden` that counts the candidates it skips."""

    def __init__(self) -> None:
        self.skipped = 0
        self.verdict = ListRow.overridden

    def __call__(self, row: ListRow, *args: Any) -> bool:
        found = self.verdict(row, *args)
        self.skipped += found
        return found


def _every_plan(request: PlanRequest) -> dict[int, list[list[StageSpec]]]:
    return partition_sp(request.model, request.sp_tree, request.num_devices, request.micro_batch_sizes,
                        request.memory_limit, every_size=True)


def _same_plans_without_skipping(request: PlanRequest, counted: _CountedVerdicts) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ListRow, "overridden", lambda row, *args: counted(row, *args))
        expected = _every_plan(request)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ListRow, "overridden", lambda *args: False)
        assert _every_plan(request) == expected


def test_skipping_what_the_row_overrides_changes_no_plan() -> None:
    """`Probe._before` skips an item where the row overrides a floor of its vector: the block's fork floor
    (`ForkJoinSolver.fork_floor`) at a rest's first breakpoint, the vector at the breakpoint before at a later one.
    On Hugging Face CLIP's towers (2 layers, tiny) at op level on 32 devices, where every attention's q, k and v
    block has fork runs and the rests after them several breakpoints, blocks are skipped, and with nothing skipped
    every plan the search keeps is the same, with and without a binding memory limit."""
    graph = clip_towers_graph()
    costs, cluster = analytic_costs(graph, "v100-16gb"), cluster_preset("summit", 32)
    counted = _CountedVerdicts()
    for limit in (None, 2 * 2**30):
        _same_plans_without_skipping(make_request(graph, costs, cluster, 128, micro_batch_sizes=[8],
                                                  memory_limit=limit), counted)
    assert counted.skipped > 0


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=cases(shapes=("fork_join", "two_branch", "nested")))
def test_skipping_changes_no_plan_on_random_graphs(case: Case) -> None:
    """The same on random graphs with fork runs (where the fork floors skip blocks), with and without a binding
    memory limit."""
    for limit in (1e18, case.cluster.device.memory_bytes * 0.05):
        request = make_request(case.graph, case.costs, case.cluster, case.global_batch_size,
                               micro_batch_sizes=[case.micro_batch_size], memory_limit=limit)
        _same_plans_without_skipping(request, _CountedVerdicts())
