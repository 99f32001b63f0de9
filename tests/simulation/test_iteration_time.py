"""`iteration_time_s`, the ranking's simulation, equals `simulate`'s iteration, and stops only past the time to beat."""

from __future__ import annotations

import dataclasses

import pytest

from graphpipe.cost.cluster import Cluster
from graphpipe.schedule.generate import SCHEDULE_NAMES
from graphpipe.simulation.simulator import iteration_time_s, simulate
from graphpipe.stages.stage_graph import Plan
from tests.simulation.factories import chain, diamond, fan, make_cluster, make_costs, make_plan

PLANS = {
    "chain": lambda: chain(4, 2, 16, bytes_per_sample=1e6),
    "diamond": lambda: diamond(2, 12, bytes_per_sample=4e5),
    "fan": lambda: fan(3, 2, 1, 6),
    "sizes": lambda: make_plan([(0, 1), (1, 2)], [4, 2, 8], 16, ranks_per_stage=[2, 1, 2], bytes_per_sample=3e5),
}


def _cases(plan: Plan) -> list[tuple[Plan, Cluster]]:
    """The plan on its cluster, and on one whose nodes have a single core (the engine's time-ordered mode)."""
    one_core = dataclasses.replace(make_cluster(plan.num_devices), cores_per_node=1)
    return [(plan, make_cluster(plan.num_devices)), (plan, one_core)]


@pytest.mark.parametrize("schedule", SCHEDULE_NAMES)
@pytest.mark.parametrize("name", sorted(PLANS))
def test_equals_the_full_simulation_and_stops_only_when_beaten(name: str, schedule: str) -> None:
    for plan, cluster in _cases(PLANS[name]()):
        costs = make_costs(plan, fwd_ms=[1.0 + 0.5 * s.idx for s in plan.stages], bwd_ms=2.0)
        full = simulate(plan, costs, cluster, schedule).iteration_time_s
        assert iteration_time_s(plan, costs, cluster, schedule) == full
        for beat_s, expected in ((full * (1 + 1e-9), full), (full * (1 - 1e-9), None), (full / 2, None)):
            assert iteration_time_s(plan, costs, cluster, schedule, beat_s) == expected
