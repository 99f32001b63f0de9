"""Shared host cores: compute actions of a node's ranks compete for `cores_per_node` core tokens."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphpipe.cost.cluster import Cluster
from graphpipe.simulation.cores import cores_are_shared
from graphpipe.simulation.result import SimResult
from graphpipe.simulation.simulator import simulate
from graphpipe.stages.stage_graph import Plan
from tests.simulation.factories import chain, diamond, fan, make_cluster, make_costs, make_plan


def _with_cores(cluster: Cluster, cores: int | None) -> Cluster:
    return dataclasses.replace(cluster, cores_per_node=cores)


def _independent(num_micro_batches: int) -> Plan:
    """Two stages with no edge between them, on one node of two ranks."""
    return make_plan([], [1, 1], num_micro_batches, cluster=make_cluster(2, devices_per_node=2))


def _max_concurrent_compute(result: SimResult) -> int:
    spans = [(e.start_ms, e.end_ms, len(e.ranks)) for e in result.timeline.events
             if e.kind in ("forward", "backward", "step") and e.end_ms > e.start_ms]
    points = sorted({start for start, _, _ in spans})
    return max((sum(n for s, end, n in spans if s <= t < end) for t in points), default=0)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_two_concurrent_stages_on_one_core_take_twice_as_long(schedule: str) -> None:
    plan = _independent(4)
    costs = make_costs(plan, 1.0, 2.0)
    base = make_cluster(2, devices_per_node=2)
    alone = simulate(plan, costs, base, schedule)
    assert alone.iteration_time_s * 1e3 == pytest.approx(4 * (1.0 + 2.0))
    shared = simulate(plan, costs, _with_cores(base, 1), schedule)
    assert shared.iteration_time_s == pytest.approx(2 * alone.iteration_time_s)
    assert _max_concurrent_compute(shared) == 1
    assert any(e.kind == "core_wait" for e in shared.timeline.events)


@pytest.mark.parametrize("make", [lambda: chain(4, 2, 16), lambda: diamond(2, 12), lambda: fan(3, 2, 1, 6)])
@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_enough_cores_change_nothing(make: object, schedule: str) -> None:
    plan = make()  # type: ignore[operator]
    costs = make_costs(plan, 1.5, 2.5)
    base = make_cluster(plan.world_size, devices_per_node=plan.world_size)
    assert not cores_are_shared(plan, _with_cores(base, plan.world_size))
    reference = simulate(plan, costs, base, schedule)
    assert simulate(plan, costs, _with_cores(base, plan.world_size), schedule) == reference
    assert simulate(plan, costs, _with_cores(base, 64), schedule) == reference


def test_cores_are_counted_per_node() -> None:
    """Two ranks per node, one core each: ranks on different nodes do not compete."""
    plan = _independent(3)
    costs = make_costs(plan, 1.0, 1.0)
    split = make_cluster(2, devices_per_node=1)
    assert not cores_are_shared(plan, _with_cores(split, 1))
    assert simulate(plan, costs, _with_cores(split, 1)) == simulate(plan, costs, split)


def test_a_data_parallel_stage_holds_a_core_per_rank() -> None:
    """A stage of 2 ranks on a 2-core node leaves no core to a third rank's stage while it computes."""
    plan = make_plan([], [2, 1], 4, ranks_per_stage=[2, 1], cluster=make_cluster(3, devices_per_node=3))
    costs = make_costs(plan, 1.0, 1.0)
    base = make_cluster(3, devices_per_node=3)
    alone = simulate(plan, costs, base)
    shared = simulate(plan, costs, _with_cores(base, 2))
    assert _max_concurrent_compute(shared) == 2
    assert shared.iteration_time_s > alone.iteration_time_s


def test_a_stage_wider_than_the_node_time_shares_its_cores() -> None:
    """One stage of 4 ranks on a 2-core node: every compute action takes twice as long."""
    plan = make_plan([], [4], 8, ranks_per_stage=[4], cluster=make_cluster(4, devices_per_node=4))
    costs = make_costs(plan, 1.0, 2.0)
    base = make_cluster(4, devices_per_node=4)
    alone = simulate(plan, costs, base)
    shared = simulate(plan, costs, _with_cores(base, 2))
    assert shared.iteration_time_s == pytest.approx(2 * alone.iteration_time_s)


@settings(max_examples=40, deadline=None)
@given(num_stages=st.integers(2, 6), cores=st.integers(1, 3), num_micro=st.integers(1, 4),
       schedule=st.sampled_from(["1f1b", "gpipe"]), bytes_per_sample=st.sampled_from([0.0, 1e6]))
def test_shared_cores_never_oversubscribe_and_bound_the_iteration(num_stages: int, cores: int, num_micro: int,
                                                                  schedule: str, bytes_per_sample: float) -> None:
    """At no instant do more actions compute than there are cores; the iteration is at least the
    total compute divided by the cores, and at least the unshared iteration."""
    base = make_cluster(num_stages, devices_per_node=num_stages, latency_us=50.0)
    plan = chain(num_stages, 1, num_micro, cluster=base, bytes_per_sample=bytes_per_sample)
    costs = make_costs(plan, [1.0 + i for i in range(num_stages)], 2.0)
    free = simulate(plan, costs, base, schedule)
    shared = simulate(plan, costs, _with_cores(base, cores), schedule)
    assert _max_concurrent_compute(shared) <= cores
    busy_ms = sum(e.duration_ms for e in shared.timeline.events if e.kind in ("forward", "backward", "step"))
    assert shared.iteration_time_s * 1e3 >= busy_ms / cores - 1e-9
    assert shared.iteration_time_s >= free.iteration_time_s - 1e-12
    assert shared.critical_path and shared.critical_path[-1].endswith("STEP")
