"""The engine's compile step refuses an action kind it has no cost for instead of guessing one."""

from __future__ import annotations

import pytest

from graphpipe.errors import ScheduleError
from graphpipe.schedule.action import ActionKind
from graphpipe.simulation import engine
from graphpipe.simulation.simulator import simulate
from tests.simulation.factories import chain, make_costs


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
                     ActionKind.ALL_REDUCE: "all_reduce", ActionKind.STEP: "step"}
