"""Make a schedule for a plan: pick the generator by name.

`GENERATORS` is the registry: the one list of schedule names. The command line's choices,
help texts and error messages read `SCHEDULE_NAMES`, so a new schedule is added here only.
A generator gives each stage's compute order as steps (kind, micro-batch); `lower_comm` inserts the
communication into their actions (`make_schedule`), or the simulator's ranking path compiles the steps
directly (`compute_steps`), without an `Action` per compute.
"""

from __future__ import annotations

from collections.abc import Callable

from graphpipe.errors import ScheduleError
from graphpipe.schedule.action import Action, Step, actions_of
from graphpipe.schedule.gpipe import gpipe_compute
from graphpipe.schedule.kfkb import kfkb_compute
from graphpipe.schedule.lower_comm import lower_comm
from graphpipe.schedule.one_f_one_b import one_f_one_b_compute
from graphpipe.schedule.schedule import Schedule
from graphpipe.schedule.zero_bubble import zero_bubble_compute
from graphpipe.stages.stage_graph import Plan

GENERATORS: dict[str, Callable[[Plan], dict[int, list[Step]]]] = {
    "1f1b": one_f_one_b_compute,
    "gpipe": gpipe_compute,
    "kfkb": kfkb_compute,
    "zero-bubble": zero_bubble_compute,
}
SCHEDULE_NAMES: tuple[str, ...] = tuple(GENERATORS)
DEFAULT_SCHEDULE = "1f1b"
SPLIT_BACKWARD_SCHEDULES = frozenset({"zero-bubble"})  # those whose stages run input- and weight-gradient halves


def make_schedule(plan: Plan, kind: str = DEFAULT_SCHEDULE) -> Schedule:
    """The per-stage action lists of `kind` (one of `SCHEDULE_NAMES`) for `plan`."""
    return lower_comm(plan, compute_orders(plan, kind), kind)


def compute_orders(plan: Plan, kind: str = DEFAULT_SCHEDULE) -> dict[int, tuple[Action, ...]]:
    """Each stage's compute actions in `kind`'s order, before communication is inserted."""
    return {stage: actions_of(stage, steps) for stage, steps in compute_steps(plan, kind).items()}


def compute_steps(plan: Plan, kind: str = DEFAULT_SCHEDULE) -> dict[int, list[Step]]:
    """Each stage's compute order in `kind` as steps (kind, micro-batch)."""
    try:
        generator = GENERATORS[kind]
    except KeyError:
        raise ScheduleError(f"unknown schedule {kind!r}; choose one of {', '.join(SCHEDULE_NAMES)}") from None
    return generator(plan)
