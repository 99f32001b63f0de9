"""The paper's case study (PAPER.md §6) on the zoo's `two_branch` model: 8 devices, memory-limited.

Two branches of 4 [attention + 2 linear] layers. At 0.4 GiB per device, weights and
activations force one layer per device: the sequential pipeline is 8 stages deep (micro-batch
1) and its first stage holds 8 micro-batches, while the graph pipeline runs the branches side
by side with micro-batch 2 and depth 5, not the paper's 4.

Why not 4: the depth-4 stage graph (A1 -> A2 -> A3 -> M, B1 -> B2 -> B3 -> M, 8 devices) needs a
merge stage M that holds the last layer of *both* branches plus the concat and the head. The
DP's fork/join absorption (`graphpipe.planner.fork_join`) lets the join run (concat + head)
share a stage with the last stage of *one* branch only; a stage made of the tails of several
branches plus the join is not SP-aligned, so the DP cannot produce M (checked below against
`aligned_sets`, the exact space the DP searches). Within that space the best plan on 8
devices puts one layer of each branch per device and the head on branch 0's last stage:
depth 4 + the head's stage boundary on the other branch = 5. Graph stages reach depth 4
only with more memory (0.6 GiB: 6 stages, micro-batch 4), where the sequential pipeline
is itself no longer 8 deep (depth 4, micro-batch 2), so the comparison of the issue
(depth 4 against 8) has no memory limit at which both hold under this cost model.
"""

from __future__ import annotations

import pytest

from graphpipe.cost.analytic import analytic_costs
from graphpipe.cost.presets import cluster_preset
from graphpipe.graph.capture import capture
from graphpipe.models import load_model
from graphpipe.planner.api import make_request
from graphpipe.planner.baselines.exhaustive import aligned_sets
from graphpipe.planning import plan

GiB = 2**30


@pytest.fixture(scope="module")
def two_branch() -> tuple:
    zoo = load_model("two_branch", "paper", device="meta")
    graph = capture(zoo.model, zoo.inputs)
    return graph, analytic_costs(graph, "v100-16gb")


def test_graph_pipeline_is_shallower_with_a_larger_micro_batch(two_branch: tuple) -> None:
    graph, costs = two_branch
    cluster = cluster_preset("summit", 8)
    kwargs = {"memory_limit": 0.4 * GiB, "rank_by": "tps"}
    gpp = plan(graph, costs, cluster, 128, **kwargs)
    spp = plan(graph, costs, cluster, 128, planner="sequential", **kwargs)
    assert spp.depth == spp.num_stages == 8
    assert gpp.depth == 5 < spp.depth
    assert gpp.stages[0].micro_batch_size > spp.stages[0].micro_batch_size
    assert gpp.predicted_samples_per_s > spp.predicted_samples_per_s


def test_depth_four_needs_a_merge_stage_the_dp_cannot_form(two_branch: tuple) -> None:
    """M = both branches' last layer + concat + head: not an SP-aligned op set."""
    graph, costs = two_branch
    request = make_request(graph, costs, cluster_preset("summit", 8), 128)

    def after(op: str) -> set[str]:
        seen: set[str] = set()
        todo = list(graph.successors(op))
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo.extend(graph.successors(name))
        return seen

    ends = [graph.predecessors(f"branches_{branch}_3_norm1")[0] for branch in (0, 1)]
    merge = frozenset(after(ends[0]) | after(ends[1]))
    assert {"cat", "head_fc", "branches_0_3_fc2", "branches_1_3_fc2"} <= merge
    allowed = aligned_sets(request.sp_tree)
    assert merge not in allowed
    assert frozenset(after(ends[0])) in allowed  # one branch's tail with the head: that the DP can do
