"""The engine: its compile step refuses an action kind it has no cost for instead of guessing one, times every
message as `message_ms` does, and stops a ranking's simulation early only when it is beaten."""

from __future__ import annotations

import pytest

from graphpipe.errors import ScheduleError
from graphpipe.schedule.action import ActionKind
from graphpipe.schedule.generate import compute_steps
from graphpipe.schedule.messages import message_samples
from graphpipe.simulation import engine
from graphpipe.simulation.comm_model import message_ms
from graphpipe.simulation.simulator import plan_bounds, simulate
from graphpipe.simulation.stage_cost import stage_costs
from tests.simulation.factories import chain, make_cluster, make_costs, make_plan


def test_a_kind_without_cost_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = chain(2, 1, 2)
    stream_kinds = engine._stream_kinds

    def without_step(*args: object, **kwargs: object) -> dict[ActionKind, tuple[float, str]]:
        table = stream_kinds(*args, **kwargs)  # type: ignore[arg-type]
        del table[ActionKind.STEP]
        return table

    monkeypatch.setattr(engine, "_stream_kinds", without_step)
    with pytest.raises(ScheduleError, match=r"stage 0: the simulator has no cost for action kind STEP \(s0\.STEP\)"):
        simulate(plan, make_costs(plan))


def test_every_compute_and_stream_kind_gets_its_event_kind() -> None:
    names = {kind: engine._event_kind(kind) for kind in ActionKind if not kind.is_message}
    assert names == {ActionKind.FORWARD: "forward", ActionKind.BACKWARD: "backward",
                     ActionKind.INPUT_GRAD: "backward", ActionKind.WEIGHT_GRAD: "backward",
                     ActionKind.ALL_REDUCE: "all_reduce", ActionKind.STEP: "step"}


def test_a_message_takes_what_its_pieces_take_whatever_its_position() -> None:
    """Each send's duration, read from the per-edge period (`_Transfers`), equals `message_ms` of its own samples,
    on stages of different micro-batch sizes and degrees (periods of several messages)."""
    plan = make_plan([(0, 1), (1, 2)], [4, 2, 8], 16, ranks_per_stage=[2, 1, 2], bytes_per_sample=3e5)
    cluster = make_cluster(plan.num_devices, latency_us=5.0)
    per_stage = stage_costs(plan, make_costs(plan), cluster.device)
    checked = 0
    for stage, steps in compute_steps(plan, "1f1b").items():
        for code, duration, key, *_ in engine._compile_compute(plan, stage, steps, per_stage[stage], cluster):
            if code != engine._SEND:
                continue
            assert key is not None
            sender, receiver, direction, message = key
            src, dst = (sender, receiver) if direction == "F" else (receiver, sender)
            per_message = message_samples(plan, src, dst)
            start = message * per_message
            assert duration == message_ms(cluster, plan.stages[sender], plan.stages[receiver], start,
                                          start + per_message, 3e5, 1)
            checked += 1
    assert checked == sum(2 * 16 // message_samples(plan, edge.src, edge.dst) for edge in plan.edges)  # both ways


def test_the_drain_counts_until_the_last_backward() -> None:
    run, send = engine._RUN, engine._SEND
    ops: list[engine.Op] = [(run, 1.0, None, None, "forward", 0), (send, 5.0, None, None, "send", 0),
                            (run, 2.0, None, None, "backward", 0), (run, 0.5, None, None, "all_reduce", -1),
                            (run, 0.25, None, None, "step", -1)]
    assert engine._least_ahead(ops, 0.0) == [3.75, 2.75, 2.75, 0.75, 0.25, 0.0]
    assert engine._least_ahead(ops, 10.0) == [13.0, 12.0, 12.0, 0.75, 0.25, 0.0]  # 10 beyond the 0.75 after it
    assert engine._least_ahead(ops, 0.5) == [3.75, 2.75, 2.75, 0.75, 0.25, 0.0]  # less than the stream's own


def test_the_drain_stops_a_beaten_simulation_sooner() -> None:
    """Past the time to beat, the engine stops; with the drain of the lower bound it stops after fewer actions,
    and it still runs to the end when not beaten."""
    plan = chain(6, 2, 48, bytes_per_sample=1e6)
    cluster = make_cluster(plan.num_devices)
    costs = make_costs(plan, fwd_ms=[1.0 + 0.5 * s.idx for s in plan.stages], bwd_ms=2.0)
    bounds = plan_bounds(plan, costs, cluster)
    compiled = {stage: engine._compile_compute(plan, stage, steps, bounds.per_stage[stage], cluster)
                for stage, steps in compute_steps(plan, "1f1b").items()}
    full = simulate(plan, costs, cluster).iteration_time_s * 1e3

    def actions_run(beat_ms: float, drain: dict[int, float] | None) -> int:
        runner = engine._Engine(plan, compiled, None, record=False, beat_ms=beat_ms, drain_ms=drain)
        with pytest.raises(engine._BeatenError):
            runner.run()
        return sum(runner.pos.values())

    beat = full * (1 - 1e-3)
    assert actions_run(beat, bounds.drain_ms) < actions_run(beat, None)
    unbeaten = engine._Engine(plan, compiled, None, record=False, beat_ms=full * (1 + 1e-9), drain_ms=bounds.drain_ms)
    assert unbeaten.run() == {}
