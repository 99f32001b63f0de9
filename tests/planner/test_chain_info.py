"""Per-chain tables: the vectorised boundary matrix against the item-by-item rows."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings

from graphpipe.cost.cost_table import CostTable
from graphpipe.graph.op_graph import OpGraph
from graphpipe.graph.sp import SPChain, SPLeaf, iter_chains
from graphpipe.planner.api import make_request
from graphpipe.planner.sp_dp.blocks import fork_join_items
from graphpipe.planner.sp_dp.tables import ChainInfo, boundary_rectangles
from graphpipe.planner.stage_cost import CostModel
from tests.planner.factories import make_cluster, make_costs, make_graph
from tests.planner.sp_graphs import sp_graphs


def skip_graph() -> OpGraph:
    """Two branches (one of them forked again), a skip edge over them and a head reading three ops."""
    return make_graph({"x": (), "a": ("x",), "b1": ("a",), "b2": ("b1",), "c1": ("a",), "c2": ("c1",),
                       "c3": ("c1",), "c4": ("c2", "c3"), "d": ("b2", "c4", "a"), "e": ("d", "a"), "f": ("e",)})


def chains_of(model: CostModel, tree: SPChain) -> list[ChainInfo]:
    """Every chain of the tree, and every branch with its fork and/or join run (fork/join absorption)."""
    out = []
    for chain in iter_chains(tree):
        out.append(ChainInfo(model, chain))
        for start in range(len(chain.items)):
            block = fork_join_items(chain, start)
            if block is None:
                continue
            for branch in block.par.branches:
                for fork in ((block.fork,) if block.fork else ()), ():
                    for join in ((block.join,) if block.join else ()), ():
                        out.append(ChainInfo(model, SPChain(items=fork + branch.items + join)))
    return out


def assert_rectangles_match_rows(graph: OpGraph, costs: CostTable) -> None:
    request = make_request(graph, costs, make_cluster(4), 8)
    for tree in (request.sp_tree, request.chain_tree):
        for info in chains_of(request.model, tree):
            found = boundary_rectangles(info)
            assert found is not None
            rows = info.boundary_matrix_by_rows()
            assert np.array_equal(found[0], rows[0]) and np.array_equal(found[1], rows[1])


def test_boundary_rectangles_equal_the_rows_on_a_branchy_graph() -> None:
    graph = skip_graph()
    assert_rectangles_match_rows(graph, make_costs(graph))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sp_graphs(max_ops=9))
def test_boundary_rectangles_equal_the_rows_on_sp_graphs(case: tuple[OpGraph, CostTable]) -> None:
    assert_rectangles_match_rows(*case)


def test_inexact_byte_sums_fall_back_to_the_rows() -> None:
    graph = skip_graph()
    request = make_request(graph, make_costs(graph), make_cluster(4), 8)
    request.model.out_bytes_per_sample["a"] = 0.1  # sums of 0.1 round: the order of the additions matters
    info = ChainInfo(request.model, request.chain_tree)
    assert boundary_rectangles(info) is None
    messages, num_bytes = info.boundary_matrix()
    for start in range(info.num_items):
        for stop in range(start + 1, info.num_items + 1):
            assert (messages[start, stop], num_bytes[start, stop]) == info.boundary(start, stop)


def equal_wiring_pairs(model: CostModel, tree: SPChain) -> list[tuple[ChainInfo, ChainInfo]]:
    """Pairs of distinct chains of the tree (`chains_of`) with the same wiring."""
    infos = [info for info in chains_of(model, tree) if not info.has_parallel]
    return [(mine, theirs) for idx, mine in enumerate(infos) for theirs in infos[idx + 1:]
            if mine.chain.ops != theirs.chain.ops and mine.wiring() == theirs.wiring()]


def assert_equal_wiring_equal_matrices(pairs: list[tuple[ChainInfo, ChainInfo]]) -> None:
    for mine, theirs in pairs:
        for build in (ChainInfo.boundary_matrix_by_rows, boundary_rectangles):
            found, other = build(mine), build(theirs)
            assert (found is None) == (other is None)
            if found is not None and other is not None:
                assert all(np.array_equal(a, b) for a, b in zip(found, other))


def test_branches_of_equal_wiring_have_equal_boundary_matrices() -> None:
    preds: dict[str, tuple[str, ...]] = {"x": ()}
    for r in range(3):
        preds.update({f"a{r}": ("x",), f"b{r}": (f"a{r}", "x"), f"c{r}": (f"b{r}", f"a{r}")})
    preds.update(cat=("c0", "c1", "c2"), head=("cat", "x"))
    graph = make_graph(preds)
    request = make_request(graph, make_costs(graph), make_cluster(4), 8)
    pairs = equal_wiring_pairs(request.model, request.sp_tree)
    assert len(pairs) >= 3  # the three branches, pairwise (and their extended chains)
    assert_equal_wiring_equal_matrices(pairs)


def test_a_shared_producer_is_other_wiring_than_two() -> None:
    """Chain 0 reads one outside tensor twice, chain 1 two tensors of the same size: other traffic."""
    graph = make_graph({"x": (), "p": ("x",), "q": ("x",), "a0": ("p",), "b0": ("a0", "p"), "a1": ("p",),
                        "b1": ("a1", "q"), "cat": ("b0", "b1", "q"), "head": ("cat",)})
    model = make_request(graph, make_costs(graph), make_cluster(4), 8).model
    first, second = (ChainInfo(model, SPChain(items=(SPLeaf(ops=(f"a{r}",)), SPLeaf(ops=(f"b{r}",)))))
                     for r in (0, 1))
    assert first.wiring() != second.wiring()
    assert not np.array_equal(first.boundary_matrix()[0], second.boundary_matrix()[0])
    swapped = make_graph({"x": (), "p": ("x",), "q": ("x",), "a0": ("p",), "b0": ("p", "a0"), "a1": ("p",),
                          "b1": ("a1", "p"), "cat": ("b0", "b1", "q"), "head": ("cat",)})
    model = make_request(swapped, make_costs(swapped), make_cluster(4), 8).model
    first, second = (ChainInfo(model, SPChain(items=(SPLeaf(ops=(f"a{r}",)), SPLeaf(ops=(f"b{r}",)))))
                     for r in (0, 1))
    assert first.wiring() == second.wiring()  # the same edges, listed in another order
    assert_equal_wiring_equal_matrices([(first, second)])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sp_graphs(max_ops=9))
def test_equal_wiring_means_equal_boundary_matrices_on_sp_graphs(case: tuple[OpGraph, CostTable]) -> None:
    request = make_request(*case, make_cluster(4), 8)
    assert_equal_wiring_equal_matrices(equal_wiring_pairs(request.model, request.sp_tree))
