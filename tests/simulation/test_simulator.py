"""The simulator against closed forms, the in-flight rule, and hand-computed communication times."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphpipe.errors import ClusterError, ScheduleError
from graphpipe.schedule.action import Action
from graphpipe.schedule.generate import make_schedule
from graphpipe.schedule.schedule import Schedule
from graphpipe.schedule.validate import validate_schedule
from graphpipe.simulation.result import SimResult
from graphpipe.simulation.simulator import simulate
from graphpipe.stages.memory import stage_memory_bytes
from graphpipe.stages.stage_graph import Plan
from tests.simulation.factories import GiB, chain, diamond, fan, make_cluster, make_costs, make_plan

F_MS, B_MS = 1.5, 2.5  # per sample


@pytest.mark.parametrize("kind", ["1f1b", "gpipe"])
@pytest.mark.parametrize(("num_stages", "num_micro_batches"), [(1, 1), (2, 3), (4, 4), (4, 8), (5, 12), (3, 2)])
def test_uniform_chain_closed_forms(kind: str, num_stages: int, num_micro_batches: int) -> None:
    """Makespan (m + p - 1)(f + b); bubble (p - 1)/(m + p - 1) on every stage."""
    plan = chain(num_stages, 2, 2 * num_micro_batches)
    result = simulate(plan, make_costs(plan, F_MS, B_MS), schedule=kind)
    f, b = 2 * F_MS, 2 * B_MS
    expected_ms = (num_micro_batches + num_stages - 1) * (f + b)
    assert result.iteration_time_s * 1e3 == pytest.approx(expected_ms)
    bubble = (num_stages - 1) / (num_micro_batches + num_stages - 1)
    assert all(v == pytest.approx(bubble) for v in result.bubble_fraction.values())
    assert result.samples_per_s == pytest.approx(plan.global_batch_size / (expected_ms / 1e3))


def test_first_stage_in_flight_is_p_under_1f1b_and_m_under_gpipe() -> None:
    plan = chain(4, 1, 10)
    costs = make_costs(plan)
    assert simulate(plan, costs, schedule="1f1b").peak_in_flight_samples[0] == 4
    assert simulate(plan, costs, schedule="gpipe").peak_in_flight_samples[0] == 10


PLANS = {
    "chain": lambda b, n: chain(4, b, b * n),
    "diamond": lambda b, n: diamond(b, b * n),
    "fan4": lambda b, n: fan(4, 2, b, b * n),
    "skip": lambda b, n: make_plan([(0, 1), (1, 2), (0, 2), (2, 3)], [b] * 4, b * n),
    "kfkb-up": lambda b, n: make_plan([(0, 1), (1, 2)], [b, 2 * b, 4 * b], 4 * b * n),
    "kfkb-fan": lambda b, n: make_plan([(0, 2), (1, 2), (2, 3)], [b, 2 * b, 2 * b, 2 * b], 2 * b * n),
    "kfkb-down": lambda b, n: make_plan([(0, 1), (1, 2)], [4 * b, 2 * b, b], 4 * b * n),
}


def _rule_peak(plan: Plan, stage_idx: int, kind: str) -> int:
    """The planner's in-flight samples, in whole micro-batches and at most the mini-batch."""
    stage = plan.stages[stage_idx]
    if kind == "gpipe":
        return plan.global_batch_size
    return min(math.ceil(stage.in_flight_samples / stage.micro_batch_size) * stage.micro_batch_size,
               plan.global_batch_size)


@pytest.mark.parametrize("kind", ["1f1b", "kfkb", "gpipe"])
@pytest.mark.parametrize("num_micro_batches", [1, 3, 8])
@pytest.mark.parametrize("name", sorted(PLANS))
def test_grid_validates_simulates_and_matches_the_in_flight_rule(name: str, num_micro_batches: int,
                                                                  kind: str) -> None:
    plan = PLANS[name](2, num_micro_batches)
    schedule = make_schedule(plan, kind)
    validate_schedule(schedule, plan)
    result = simulate(plan, make_costs(plan, 1.0, 2.0), schedule=schedule)
    assert result.iteration_time_s > 0
    for stage in plan.stages:
        assert result.peak_in_flight_samples[stage.idx] == _rule_peak(plan, stage.idx, kind)
    compute_ms = sum(plan.num_micro_batches(s.idx) * 3.0 * s.micro_batch_size for s in plan.stages)
    assert result.iteration_time_s * 1e3 >= compute_ms / plan.num_stages - 1e-9


def test_in_flight_matches_the_rule_exactly_when_sizes_grow_downstream() -> None:
    """docs/method.md §3: b = 1, 2, 4 gives 10, 8, 4 samples (whole micro-batches here)."""
    plan = make_plan([(0, 1), (1, 2)], [1, 2, 4], 32)
    result = simulate(plan, make_costs(plan))
    assert dict(result.peak_in_flight_samples) == {0: 10, 1: 8, 2: 4}


def test_parallel_branches_beat_the_same_stages_in_a_chain() -> None:
    """Four independent branches of two stages: depth 3 instead of 9, so less bubble."""
    graph_plan = fan(4, 2, 1, 8)
    chain_plan = chain(9, 1, 8)
    graph_time = simulate(graph_plan, make_costs(graph_plan)).iteration_time_s
    chain_time = simulate(chain_plan, make_costs(chain_plan)).iteration_time_s
    assert graph_time < chain_time


def test_transfers_use_the_link_between_the_ranks() -> None:
    """One micro-batch through two stages: f0 + t + f1 + b1 + t + b0, t = latency + bytes / bandwidth."""
    bytes_per_sample = 1e8
    for per_node, bw in ((2, 100.0), (1, 10.0)):
        cluster = make_cluster(2, devices_per_node=per_node, latency_us=50.0)
        plan = chain(2, 1, 1, bytes_per_sample=bytes_per_sample, cluster=cluster)
        result = simulate(plan, make_costs(plan, 1.0, 2.0))
        transfer_ms = 0.05 + bytes_per_sample / (bw * 1e9) * 1e3
        assert result.iteration_time_s * 1e3 == pytest.approx(1 + 1 + 2 + 2 + 2 * transfer_ms)
        transfers = [e for e in result.timeline.events if e.kind == "transfer"]
        assert [e.action for e in transfers] == ["s0.SF0>s1", "s1.SB0>s0"]
        assert all(e.duration_ms == pytest.approx(transfer_ms) for e in transfers)


def test_a_send_does_not_occupy_the_senders_compute() -> None:
    plan = chain(2, 1, 2, bytes_per_sample=1e9, cluster=make_cluster(2, devices_per_node=1))
    result = simulate(plan, make_costs(plan, 1.0, 2.0))
    forwards = result.timeline.of_stage(0, "forward")
    assert forwards[1].start_ms == pytest.approx(forwards[0].end_ms)


def test_data_parallel_all_reduce_is_a_ring() -> None:
    param_bytes = 10**9
    cluster = make_cluster(4, devices_per_node=4, latency_us=10.0, intra_gb_per_s=100.0)
    plan = make_plan([], [4], 4, ranks_per_stage=[4], cluster=cluster)
    result = simulate(plan, make_costs(plan, param_bytes=param_bytes))
    (event,) = result.timeline.of_stage(0, "all_reduce")
    expected_ms = 2 * 3 / 4 * param_bytes / 100e9 * 1e3 + 2 * 3 * 10.0 / 1e3
    assert event.duration_ms == pytest.approx(expected_ms)
    assert event.ranks == (0, 1, 2, 3)


def test_data_parallel_stage_computes_its_share() -> None:
    plan = make_plan([], [4], 4, ranks_per_stage=[2])
    (fwd,) = simulate(plan, make_costs(plan, 1.0, 2.0)).timeline.of_stage(0, "forward")
    assert fwd.duration_ms == pytest.approx(2.0)  # 2 samples per rank


def test_peak_memory_is_static_state_plus_live_activations() -> None:
    plan = chain(3, 2, 8)
    result = simulate(plan, make_costs(plan, act_bytes=1000, param_bytes=10**6))
    in_flight = (3, 2, 1)  # micro-batches of 2 samples
    assert result.peak_memory_bytes == tuple(4 * 10**6 + n * 2 * 1000 for n in in_flight)
    assert result.static_memory_bytes == (4 * 10**6,) * 3
    assert result.device_memory_bytes == 16 * GiB and result.fits_in_memory


@pytest.mark.parametrize("name", ["chain", "diamond", "fan4", "kfkb-up"])
def test_peak_memory_agrees_with_the_planners_formula(name: str) -> None:
    plan = PLANS[name](2, 8)
    costs = make_costs(plan, act_bytes=1000, param_bytes=10**6)
    result = simulate(plan, costs)
    for stage in plan.stages:
        act = costs.at(stage.ops[0], stage.micro_batch_size / stage.data_parallel_degree).act_bytes
        expected = stage_memory_bytes(10**6, act, stage.in_flight_samples, stage.micro_batch_size)
        assert all(result.peak_memory_bytes[rank] == expected for rank in stage.ranks)


def test_critical_path_runs_from_the_first_forward_to_a_step() -> None:
    plan = chain(3, 1, 4)
    path = simulate(plan, make_costs(plan)).critical_path
    assert path[0] == "s0.F0" and path[-1].endswith(".STEP")
    assert "s2.F0" in path and "s0.B3" in path


def test_result_round_trips() -> None:
    plan = diamond(1, 4, bytes_per_sample=1e6)
    result = simulate(plan, make_costs(plan))
    again = SimResult.from_dict(result.to_dict())
    assert again == result
    assert "timeline" not in result.summary()


def test_cluster_defaults_to_the_plans_and_must_exist() -> None:
    plan = chain(2, 1, 2)
    bare = Plan(graph_name="x", stages=plan.stages, edges=plan.edges, global_batch_size=2, num_devices=2,
                planner="test")
    with pytest.raises(ClusterError, match="records no cluster"):
        simulate(bare, make_costs(plan))
    assert simulate(bare, make_costs(plan), make_cluster(2)) == simulate(plan, make_costs(plan))


def test_a_deadlocking_schedule_is_refused() -> None:
    plan = chain(2, 1, 1)
    good = make_schedule(plan)
    actions = dict(good.actions)
    actions[0] = tuple(Action.parse(t) for t in ["s0.RB0<s1", "s0.F0", "s0.SF0>s1", "s0.B0", "s0.AR", "s0.STEP"])
    with pytest.raises(ScheduleError):
        simulate(plan, make_costs(plan), schedule=Schedule(kind="1f1b", num_micro_batches=good.num_micro_batches,
                                                           actions=actions))


@st.composite
def _random_dags(draw: st.DrawFn) -> Plan:
    """Random stage DAGs with one sink; every stage reaches the last one."""
    num_stages = draw(st.integers(1, 7))
    edges = set()
    for dst in range(1, num_stages):
        for src in range(dst):
            if draw(st.booleans()):
                edges.add((src, dst))
    for src in range(num_stages - 1):
        if not any(e[0] == src for e in edges):
            edges.add((src, draw(st.integers(src + 1, num_stages - 1))))
    exps = [draw(st.integers(0, 2)) for _ in range(num_stages)]
    sizes = [2**e for e in exps]
    num_micro = draw(st.integers(1, 4))
    return make_plan(sorted(edges), sizes, 4 * num_micro, bytes_per_sample=draw(st.sampled_from([0.0, 1e6])))


@pytest.mark.parametrize("kind", ["1f1b", "kfkb", "gpipe"])
def test_a_skip_edge_to_a_larger_micro_batch_does_not_deadlock(kind: str) -> None:
    """Stage 0 feeds stage 1 (the same size) and stage 3 (4 times larger): kFkB grouped stage 0's backwards
    4 at a time while stage 1, in 1F1B order, waited for stage 0's next forward before its next backward."""
    plan = make_plan([(0, 1), (0, 3), (1, 2), (2, 3)], [1, 1, 1, 4], 12)
    schedule = make_schedule(plan, kind)
    validate_schedule(schedule, plan)
    result = simulate(plan, make_costs(plan), schedule=schedule)
    for stage in plan.stages:
        assert result.peak_in_flight_samples[stage.idx] == _rule_peak(plan, stage.idx, kind)


@settings(max_examples=60, deadline=None)
@given(plan=_random_dags(), kind=st.sampled_from(["1f1b", "kfkb", "gpipe"]))
def test_random_stage_dags_schedule_without_deadlock(plan: Plan, kind: str) -> None:
    schedule = make_schedule(plan, kind)
    validate_schedule(schedule, plan)
    result = simulate(plan, make_costs(plan), schedule=schedule)
    for stage in plan.stages:
        assert result.peak_in_flight_samples[stage.idx] == _rule_peak(plan, stage.idx, kind)


@pytest.mark.parametrize("kind", ["1f1b", "gpipe", "kfkb"])
@pytest.mark.parametrize("case", ["chain", "diamond", "fan", "data_parallel", "per_stage_sizes", "shared_cores"])
def test_iteration_lower_bound_is_never_above_the_simulated_iteration(kind: str, case: str) -> None:
    """The bound that lets `gp.plan` skip candidates: at most the simulated time, and tight on a balanced chain
    with one micro-batch (nothing but the stage's own work)."""
    from graphpipe.cost.cluster import Cluster
    from graphpipe.simulation.simulator import iteration_lower_bound_s

    cluster = None
    if case == "chain":
        plan = chain(4, 2, 16, bytes_per_sample=4096.0)
    elif case == "diamond":
        plan = diamond(2, 8, bytes_per_sample=1e6)
    elif case == "fan":
        plan = fan(3, 2, 4, 32, bytes_per_sample=1e5)
    elif case == "data_parallel":
        plan = make_plan([(0, 1), (1, 2)], [4, 4, 4], 16, ranks_per_stage=[1, 2, 1], bytes_per_sample=1e5)
    elif case == "per_stage_sizes":
        plan = make_plan([(0, 1), (1, 2)], [2, 4, 8], 16, ranks_per_stage=[1, 2, 1])
    else:
        cluster = Cluster.preset("local-cpu", 4)
        plan = chain(4, 2, 8, cluster=cluster)
    costs = make_costs(plan, [1.0 + 0.5 * s.idx for s in plan.stages], 2.0, param_bytes=2**20)
    simulated = simulate(plan, costs, cluster, schedule=kind).iteration_time_s
    assert 0 < iteration_lower_bound_s(plan, costs, cluster) <= simulated * (1 + 1e-12)
    single = chain(1, 4, 4)
    single_costs = make_costs(single, param_bytes=2**20)
    alone = simulate(single, single_costs).iteration_time_s
    assert iteration_lower_bound_s(single, single_costs) == pytest.approx(alone)


@settings(max_examples=40, deadline=None)
@given(plan=_random_dags(), kind=st.sampled_from(["1f1b", "kfkb", "gpipe"]), first_ms=st.floats(0.1, 5.0))
def test_iteration_lower_bound_holds_on_random_stage_dags(plan: Plan, kind: str, first_ms: float) -> None:
    """With transfers (the DAGs carry 0 or 1e6 bytes per sample) and mixed micro-batch sizes, the bound, which
    counts the transfers of equal-size hops, stays at most the simulated iteration."""
    from graphpipe.simulation.simulator import iteration_lower_bound_s

    costs = make_costs(plan, [first_ms + 0.5 * s.idx for s in plan.stages], 2.0, param_bytes=2**20)
    simulated = simulate(plan, costs, schedule=make_schedule(plan, kind)).iteration_time_s
    assert iteration_lower_bound_s(plan, costs) <= simulated * (1 + 1e-12)


@pytest.mark.parametrize("kind", ["1f1b", "gpipe"])
@pytest.mark.parametrize("bytes_per_sample", [0.0, 1e6])
def test_iteration_lower_bound_counts_fill_and_drain(kind: str, bytes_per_sample: float) -> None:
    """One micro-batch through a chain of 4 stages: nothing overlaps, so the simulated iteration is the
    forwards and their transfers, the backwards and theirs, and stage 0's all-reduce and step in a row, and
    the bound, which counts the fill and the drain with their transfers, equals it."""
    from graphpipe.simulation.simulator import iteration_lower_bound_s

    plan = chain(4, 4, 4, bytes_per_sample=bytes_per_sample)
    costs = make_costs(plan, [1.0 + 0.5 * s.idx for s in plan.stages], 2.0, param_bytes=2**20)
    simulated = simulate(plan, costs, schedule=kind).iteration_time_s
    assert iteration_lower_bound_s(plan, costs) == pytest.approx(simulated)
