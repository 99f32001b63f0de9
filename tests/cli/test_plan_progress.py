"""The plan's progress bar: a line per phase once the phase has run past the delay, cleared when it ends; nothing
for a quick phase, nothing where stderr is not a terminal; `graphpipe plan` draws it from the planners' reports."""

from __future__ import annotations

import io
import time

import pytest

import graphpipe.cli.plan_cmd as plan_cmd
import graphpipe.cli.plan_progress as plan_progress
from graphpipe.cli.plan_progress import PlanProgressBar
from graphpipe.planner.progress import PlanProgress
from tests.cli.run_command import run_command


def run_phase(bar: PlanProgressBar, phase: str, total: int, pause_s: float = 0.0) -> None:
    bar(PlanProgress(phase, 0, total))
    for done in range(1, total + 1):
        time.sleep(pause_s)
        bar(PlanProgress(phase, done, total, f"micro-batch {2 ** done}"))


def test_a_phase_past_the_delay_is_drawn_then_cleared_and_a_quick_one_is_not_drawn() -> None:
    out = io.StringIO()
    with PlanProgressBar("graphpipe", file=out, enabled=True, delay_s=60.0) as bar:
        run_phase(bar, "stage graphs", 2)  # done long before the delay
    assert out.getvalue() == ""
    with PlanProgressBar("graphpipe", file=out, enabled=True, delay_s=0.05) as bar:
        run_phase(bar, "chains", 2, pause_s=0.12)  # past the delay and tqdm's 0.1 s between draws
    text = out.getvalue()
    assert "graphpipe: chains 1/2" in text and "micro-batch 2" in text
    assert text.endswith("\r")  # the last line is blanked: what follows starts clean


def test_nothing_is_drawn_where_the_file_is_not_a_terminal() -> None:
    out = io.StringIO()
    with PlanProgressBar("graphpipe", file=out, delay_s=0.0) as bar:
        run_phase(bar, "chains", 3, pause_s=0.11)
    assert out.getvalue() == ""


def test_graphpipe_plan_draws_the_planners_phases(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """With the bar forced on and no delay, stderr carries each phase of the plan; stdout the plan alone."""
    drawn: list[PlanProgress] = []

    class Recorded(PlanProgressBar):
        def __call__(self, event: PlanProgress) -> None:
            drawn.append(event)
            super().__call__(event)

    monkeypatch.setattr(plan_cmd, "PlanProgressBar", lambda label: Recorded(label, enabled=True, delay_s=0.0))
    assert run_command(plan_cmd, ["plan", "--model", "toy_branches", "--preset", "tiny", "--cluster", "local-cpu",
                                  "--devices", "4", "--batch", "8"]) == 0
    captured = capsys.readouterr()
    own = {"stage graphs", "chains", "ranking"}
    searches = own | {"chains (rival: sequential)", "ranking (rival: sequential)"} | {
        f"{phase} (rival: held to the chain's micro-batch)" for phase in own}
    assert {event.phase for event in drawn} == searches | {f"{phase} (rival: layer level)" for phase in searches}
    assert "graphpipe: stage graphs 0/4" in captured.err and "graphpipe: stage graphs" not in captured.out
    assert "in-flight" in captured.out
    assert plan_progress.DELAY_S > 0  # by default a quick plan draws nothing
