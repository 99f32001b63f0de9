"""Make a schedule for a plan: pick the generator by name."""

from __future__ import annotations

from collections.abc import Callable

from graphpipe.errors import ScheduleError
from graphpipe.schedule.gpipe import make_gpipe
from graphpipe.schedule.kfkb import make_kfkb
from graphpipe.schedule.one_f_one_b import make_one_f_one_b
from graphpipe.schedule.schedule import Schedule
from graphpipe.stages.stage_graph import Plan

GENERATORS: dict[str, Callable[[Plan], Schedule]] = {
    "1f1b": make_one_f_one_b,
    "gpipe": make_gpipe,
    "kfkb": make_kfkb,
}


def make_schedule(plan: Plan, kind: str = "1f1b") -> Schedule:
    """The per-stage action lists of `kind` ("1f1b", "gpipe" or "kfkb") for `plan`."""
    try:
        generator = GENERATORS[kind]
    except KeyError:
        raise ScheduleError(f"unknown schedule {kind!r}; choose one of {', '.join(GENERATORS)}") from None
    return generator(plan)
