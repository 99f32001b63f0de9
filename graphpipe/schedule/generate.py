"""Make a schedule for a plan: pick the generator by name.

`GENERATORS` is the registry: the one list of schedule names. The command line's choices,
help texts and error messages read `SCHEDULE_NAMES`, so a new schedule is added here only.
"""

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
SCHEDULE_NAMES: tuple[str, ...] = tuple(GENERATORS)
DEFAULT_SCHEDULE = "1f1b"


def make_schedule(plan: Plan, kind: str = DEFAULT_SCHEDULE) -> Schedule:
    """The per-stage action lists of `kind` (one of `SCHEDULE_NAMES`) for `plan`."""
    try:
        generator = GENERATORS[kind]
    except KeyError:
        raise ScheduleError(f"unknown schedule {kind!r}; choose one of {', '.join(SCHEDULE_NAMES)}") from None
    return generator(plan)
