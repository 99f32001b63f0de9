"""Placement: ranks partitioned, data-parallel groups and heavy edges kept inside a node."""

from __future__ import annotations

from graphpipe.planner.placement import place
from tests.planner.factories import make_cluster


def nodes(ranks: tuple[int, ...], per_node: int = 4) -> set[int]:
    return {rank // per_node for rank in ranks}


def test_ranks_are_partitioned() -> None:
    ranks = place([1, 2, 3, 1, 1], {}, make_cluster(8))
    assert sorted(r for group in ranks for r in group) == list(range(8))
    assert [len(group) for group in ranks] == [1, 2, 3, 1, 1]


def test_data_parallel_groups_stay_in_one_node() -> None:
    ranks = place([1, 2, 1, 4], {}, make_cluster(8))
    assert len(nodes(ranks[3])) == 1 and len(nodes(ranks[1])) == 1


def test_heavy_neighbours_share_a_node() -> None:
    # four single-device stages, two pairs with heavy edges between them
    ranks = place([1, 1, 1, 1, 2, 2], {(0, 2): 100.0, (1, 3): 100.0, (0, 1): 1.0}, make_cluster(8))
    assert nodes(ranks[0]) == nodes(ranks[2]) and nodes(ranks[1]) == nodes(ranks[3])


def test_group_larger_than_a_node_takes_whole_nodes() -> None:
    ranks = place([8, 1], {}, make_cluster(9))
    assert ranks[0] == tuple(range(8)) and ranks[1] == (8,)
