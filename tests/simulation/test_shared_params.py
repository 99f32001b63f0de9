"""A tied weight on several stages: the plan lists it, and the simulator charges each holder its copy and
every rank the all-reduce over the plan that sums its gradient."""

from __future__ import annotations

import torch

import graphpipe as gp
from graphpipe.simulation.comm_model import all_reduce_ms
from graphpipe.simulation.stage_cost import stage_cost, stage_costs
from tests.corpus.models import TiedTowers


def test_the_plan_lists_shared_weights_and_the_simulator_charges_them() -> None:
    torch.manual_seed(0)
    model = TiedTowers()
    graph = gp.capture(model, (torch.randint(0, 50, (8, 5)), torch.randint(0, 50, (8, 7))))
    cluster = gp.Cluster.preset("summit", num_devices=4)
    costs = gp.analytic_costs(graph, device="v100-16gb")
    plan = gp.plan(graph, costs, cluster, global_batch_size=8)
    assert set(plan.shared_params) == {"embed.weight"}
    entry = plan.shared_params["embed.weight"]
    assert len(entry["stages"]) > 1 and entry["bytes"] == 50 * 16 * 4
    assert gp.Plan.from_dict(plan.to_dict()) == plan

    with_copies = stage_costs(plan, costs, cluster.device)
    for stage in plan.stages:
        plain = stage_cost(stage, costs, cluster.device)
        cost = with_copies[stage.idx]
        holds_a_copy = stage.idx in entry["stages"] and stage.idx != entry["owner"]
        assert cost.param_bytes == plain.param_bytes + (entry["bytes"] if holds_a_copy else 0)
        assert cost.shared_reduce_bytes == entry["bytes"]
    result = gp.simulate(plan, costs, cluster)
    reduce = [e for e in result.timeline.events if e.kind == "all_reduce"]
    floor = all_reduce_ms(cluster, tuple(range(plan.world_size)), entry["bytes"])
    assert len(reduce) == plan.num_stages and all(e.end_ms - e.start_ms >= floor * (1 - 1e-9) for e in reduce)
