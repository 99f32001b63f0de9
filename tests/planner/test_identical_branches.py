"""Identical branches share their DP rows (`size_tables.OfferRegistry`, `Probe.identity`), and the sharing
changes no plan: the same stages, on the same devices, as a search that solves every branch on its own."""

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
from graphpipe.planner.sp_dp.size_tables import OfferRegistry, SegmentOffers
from tests.planner.factories import branches_graph, make_cluster, make_costs


def _costs(graph: OpGraph, profiles: Sequence[int], branch_len: int) -> CostTable:
    """Branch r costs as profile `profiles[r]`: branches of the same profile are identical."""
    fwd = {f"b{r}_{idx}": 1.0 + profile * 0.5 + (idx % 3) * 0.25
           for r, profile in enumerate(profiles) for idx in range(branch_len)}
    fwd.update(cat=0.25, head=0.5)
    return make_costs(graph, fwd, overhead_ms=0.125)


def _branch_rows(graph: OpGraph, costs: CostTable, num_devices: int) -> int:
    """Chain solves without parallel items (the branches) in one probe with no target."""
    request = make_request(graph, costs, make_cluster(num_devices), 16)
    chains, pars = build_tables(request.model, request.sp_tree)
    search = Search(request.model, request.sp_tree, num_devices, 4, request.memory_limit, chains, pars)
    probe = Probe(search, math.inf)
    assert probe.best_entry() is not None
    return sum(1 for (identity, _, _) in probe.chain_memo if identity[0] == "offers")


def test_identical_branches_are_solved_once() -> None:
    graph = branches_graph(4, 5)
    same = _branch_rows(graph, _costs(graph, (0, 0, 0, 0), 5), 8)
    distinct = _branch_rows(graph, _costs(graph, (0, 1, 2, 3), 5), 8)
    assert distinct >= 4 * same > 0  # each solve of a branch is shared by all four


def test_offers_are_named_by_equal_fields_not_by_hash(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(SegmentOffers, "fingerprint", lambda self: 0)  # every offer collides
    def offers(stop: int) -> SegmentOffers:
        return SegmentOffers(low=0.0, bound=1.0, tps=[0.5], rooms=[3], stops=[stop], k_maxes=[2],
                             until=[math.inf], keys=[stop], offsets=[0, 1, 1], span=4, unit=16)
    registry = OfferRegistry()
    first, second, again = registry.name(offers(1)), registry.name(offers(2)), registry.name(offers(1))
    assert first.content == again.content != second.content


def _never_share(monkeypatch: pytest.MonkeyPatch) -> None:
    def fresh(self: OfferRegistry, offers: SegmentOffers) -> SegmentOffers:
        offers.content = self._count
        self._count += 1
        return offers
    monkeypatch.setattr(OfferRegistry, "name", fresh)


@settings(max_examples=25, deadline=None)
@given(profiles=st.lists(st.integers(0, 1), min_size=2, max_size=5), branch_len=st.integers(1, 6),
       num_devices=st.sampled_from([2, 4, 8, 16]), memory_gib=st.sampled_from([0.05, 0.2, 16.0]))
def test_sharing_rows_changes_no_plan(profiles: list[int], branch_len: int, num_devices: int,
                                      memory_gib: float) -> None:
    graph = branches_graph(len(profiles), branch_len)
    costs = _costs(graph, profiles, branch_len)
    request = make_request(graph, costs, make_cluster(num_devices), 32, memory_limit=memory_gib * 2**30)

    def plans() -> dict[int, list[list[object]]]:
        model = make_request(graph, costs, make_cluster(num_devices), 32).model  # a fresh model: no shared memo
        return partition_sp(model, request.sp_tree, num_devices, request.micro_batch_sizes, request.memory_limit,
                            every_size=True)  # type: ignore[return-value]

    shared = plans()
    with pytest.MonkeyPatch.context() as patch:
        _never_share(patch)
        alone = plans()
    assert shared == alone
