"""Per-chain tables: the vectorised boundary matrix against the item-by-item rows."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings

from graphpipe.cost.cost_table import CostTable
from graphpipe.graph.op_graph import OpGraph
from graphpipe.graph.sp import SPChain, iter_chains
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
