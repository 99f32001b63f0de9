"""Golden schedules for two small plans; regenerate with GRAPHPIPE_REGEN_GOLDEN=1, never by hand."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from graphpipe.schedule.generate import make_schedule
from graphpipe.schedule.schedule import Schedule
from graphpipe.stages.stage_graph import Plan
from tests.simulation.factories import diamond, make_plan

GOLDEN = Path(__file__).parent / "golden"
CASES: dict[str, tuple[Callable[[], Plan], str]] = {
    "diamond_1f1b": (lambda: diamond(1, 4), "1f1b"),
    "chain_kfkb_1_2_4": (lambda: make_plan([(0, 1), (1, 2)], [1, 2, 4], 8), "kfkb"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_schedule_matches_golden(name: str) -> None:
    make_plan_fn, kind = CASES[name]
    text = make_schedule(make_plan_fn(), kind).to_text()
    path = GOLDEN / f"{name}.txt"
    if os.environ.get("GRAPHPIPE_REGEN_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.read_text() == text, f"{path.name} changed; if intended, rerun with GRAPHPIPE_REGEN_GOLDEN=1"
    assert Schedule.from_text(path.read_text()).to_text() == text
