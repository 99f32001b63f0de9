"""One `StageCost` for the planner and the simulator: both read the same stage the same way."""

from __future__ import annotations

from graphpipe.planner.stage_cost import CostModel
from graphpipe.simulation.stage_cost import stage_cost
from graphpipe.stages.stage_cost import StageCost
from graphpipe.stages.stage_graph import Stage
from tests.planner.factories import chain_graph, make_cluster, make_costs


def test_planner_and_simulator_cost_a_stage_alike() -> None:
    graph = chain_graph(3)
    costs = make_costs(graph, fwd_ms=0.5)
    planned = CostModel(graph, costs, make_cluster(4), global_batch_size=8).stage_cost(("l0", "l1"), 2, 4)
    stage = Stage(idx=0, ops=("l0", "l1"), ranks=(0, 1), micro_batch_size=4, in_flight_samples=4)
    simulated = stage_cost(stage, costs)
    assert type(planned) is type(simulated) is StageCost
    for field in ("fwd_ms", "bwd_ms", "act_bytes", "param_bytes", "data_parallel_bytes"):
        assert getattr(planned, field) == getattr(simulated, field), field
    assert planned.tps_ms > 0 and simulated.tps_ms == 0.0  # the simulator times its own messages and all-reduces


def test_data_parallel_bytes_leave_out_shared_parameters() -> None:
    cost = StageCost(fwd_ms=1.0, bwd_ms=2.0, act_bytes=10, param_bytes=100)
    assert cost.data_parallel_bytes == 100
    assert StageCost(fwd_ms=1.0, bwd_ms=2.0, act_bytes=10, param_bytes=100, local_reduce_bytes=60,
                     shared_reduce_bytes=40).data_parallel_bytes == 60
