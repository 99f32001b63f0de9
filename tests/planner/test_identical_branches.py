"""Identical branches are twins (`tables.ChainTables.twin_of`): one segment table and one set of DP rows for
all of them, their groupings solved over counts (`Probe._solve_twins`), and no plan changes: the same
stages, on the same devices, as a search that tables and solves every branch on its own."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphpipe.cost.cost_table import CostTable
from graphpipe.graph.op_graph import OpGraph
from graphpipe.planner.api import make_request
from graphpipe.planner.sp_dp import Probe, Search, build_tables, partition_sp
from graphpipe.planner.sp_dp.size_tables import SizeTables
from graphpipe.planner.sp_dp.tables import ChainTables
from graphpipe.planner.stage_spec import StageSpec
from tests.planner.factories import make_cluster, make_costs, make_graph


def branches_graph(num_branches: int, branch_len: int) -> OpGraph:
    """Input x_r -> chain of `branch_len` ops, per branch r -> cat -> head: one input per branch, as a
    multi-modal model has (a shared input rides in the first branch's leaf, which sets that branch apart)."""
    preds: dict[str, tuple[str, ...]] = {}
    for r in range(num_branches):
        preds[f"x{r}"] = ()
        prev = f"x{r}"
        for idx in range(branch_len):
            preds[f"b{r}_{idx}"] = (prev,)
            prev = f"b{r}_{idx}"
    preds["cat"] = tuple(f"b{r}_{branch_len - 1}" for r in range(num_branches))
    preds["head"] = ("cat",)
    return make_graph(preds, name=f"modalities{num_branches}x{branch_len}")


def _costs(graph: OpGraph, profiles: Sequence[int], branch_len: int) -> CostTable:
    """Branch r costs as profile `profiles[r]`: branches of the same profile are identical."""
    fwd = {f"b{r}_{idx}": 1.0 + profile * 0.5 + (idx % 3) * 0.25
           for r, profile in enumerate(profiles) for idx in range(branch_len)}
    fwd.update(cat=0.25, head=0.5)
    return make_costs(graph, fwd, overhead_ms=0.125)


def _work(graph: OpGraph, costs: CostTable, num_devices: int) -> tuple[int, int]:
    """(segment tables built, chain solves) of one probe with no target."""
    request = make_request(graph, costs, make_cluster(num_devices), 16)
    chains, pars = build_tables(request.model, request.sp_tree)
    search = Search(request.model, request.sp_tree, num_devices, 4, request.memory_limit, chains, pars)
    probe = Probe(search, math.inf)
    assert probe.best_entry() is not None
    return len(search.tables._segments), len(probe.chain_memo)


def test_identical_branches_are_tabled_and_solved_once() -> None:
    graph = branches_graph(4, 5)
    same = _work(graph, _costs(graph, (0, 0, 0, 0), 5), 8)
    distinct = _work(graph, _costs(graph, (0, 1, 2, 3), 5), 8)
    assert distinct[0] == 9  # the root, 4 branches, and each branch with the join's stage appended (B + [J])
    assert same[0] == 3  # the root, one branch and one B + [J] for all four
    assert same[1] < distinct[1]


def test_a_twin_needs_equal_costs_and_equal_traffic() -> None:
    graph = branches_graph(3, 3)
    request = make_request(graph, _costs(graph, (0, 0, 1), 3), make_cluster(4), 16)
    chains = ChainTables(request.model, request.sp_tree)
    contents = sorted(info.content for info in chains if not info.has_parallel)
    assert len(set(contents)) == 2  # branches 0 and 1 are twins, branch 2 costs more
    wider = make_costs(graph, output_bytes=1 << 16)
    entries = {op: dict(per) for op, per in wider.entries.items()}
    request = make_request(graph, CostTable(device="test", source="analytic", entries=entries), make_cluster(4), 16)
    request.model.out_bytes_per_sample["b2_0"] *= 2  # branch 2 sends more: same compute, other traffic
    chains = ChainTables(request.model, request.sp_tree)
    assert len({info.content for info in chains if not info.has_parallel}) == 2


def _never_twins(self: ChainTables, info: object) -> None:
    return None


@settings(max_examples=25, deadline=None)
@given(profiles=st.lists(st.integers(0, 1), min_size=2, max_size=5), branch_len=st.integers(1, 6),
       num_devices=st.sampled_from([2, 4, 8, 16]), memory_gib=st.sampled_from([0.05, 0.2, 16.0]))
def test_twins_change_no_plan(profiles: list[int], branch_len: int, num_devices: int, memory_gib: float) -> None:
    graph = branches_graph(len(profiles), branch_len)
    costs = _costs(graph, profiles, branch_len)

    def plans() -> dict[int, list[list[StageSpec]]]:
        request = make_request(graph, costs, make_cluster(num_devices), 32, memory_limit=memory_gib * 2**30)
        return partition_sp(request.model, request.sp_tree, num_devices, request.micro_batch_sizes,
                            request.memory_limit, every_size=True)

    shared = plans()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ChainTables, "twin_of", _never_twins)
        alone = plans()
    assert shared == alone


def _no_counts(self: SizeTables, pinfo: object) -> None:
    return None


@settings(max_examples=25, deadline=None)
@given(num_branches=st.integers(2, 4), branch_len=st.integers(1, 5), num_devices=st.sampled_from([2, 4, 8, 16]),
       memory_gib=st.sampled_from([0.05, 0.2, 16.0]), slack=st.sampled_from([1.0, 1.2, 2.0, math.inf]))
def test_twin_groups_by_count_are_the_loop(num_branches: int, branch_len: int, num_devices: int, memory_gib: float,
                                            slack: float) -> None:
    """The grouping DP over counts (`Probe._solve_twins`) gives the loop's vector for every subset of the twin
    branches and every in-flight count after the block, and finds the loop's choice again in every feasible cell."""
    graph = branches_graph(num_branches, branch_len)
    request = make_request(graph, _costs(graph, [0] * num_branches, branch_len), make_cluster(num_devices), 32,
                           memory_limit=memory_gib * 2**30)
    chains, pars = build_tables(request.model, request.sp_tree)
    search = Search(request.model, request.sp_tree, num_devices, 4, request.memory_limit, chains, pars)
    (pinfo,) = pars
    assert search.tables.options_by_count(pinfo) is not None  # twins whose unions cost alike
    target = search.lower_bound_ms() * slack
    counts, loop = Probe(search, target), Probe(search, target)
    checked = 0
    for k_after in range(search.tables.max_v + 1):
        by_count = counts.par(pinfo, k_after)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(SizeTables, "options_by_count", _no_counts)
            looped = loop.par(pinfo, k_after)
        assert by_count.need == looped.need
        for mask, row in looped.need.items():
            for v, devices in enumerate(row):
                if mask and devices <= num_devices:
                    assert by_count.chosen(mask, v) == looped.choice[mask][v]
                    checked += 1
    assert checked or math.isfinite(slack)  # with no target every block fits on the devices somewhere
