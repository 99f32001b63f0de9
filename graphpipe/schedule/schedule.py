"""A schedule: for every stage, the ordered actions its ranks run in one iteration.

All ranks of a data-parallel stage run the same action list on their share of each
micro-batch, so the schedule is stored per stage; `for_rank` looks a rank's list up.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from graphpipe.errors import ScheduleError
from graphpipe.schedule.action import Action

__all__ = ["Schedule"]


@dataclass(frozen=True, kw_only=True)
class Schedule:
    kind: str  # the generator's name, one of `generate.SCHEDULE_NAMES`
    num_micro_batches: Mapping[int, int]  # per stage
    actions: Mapping[int, tuple[Action, ...]]  # per stage, in execution order

    def __post_init__(self) -> None:
        for stage, acts in self.actions.items():
            for action in acts:
                if action.stage != stage:
                    raise ScheduleError(f"action {action} is listed under stage {stage}")

    @property
    def stages(self) -> tuple[int, ...]:
        return tuple(sorted(self.actions))

    def for_stage(self, stage: int) -> tuple[Action, ...]:
        return self.actions[stage]

    def to_text(self) -> str:
        """One line per stage: `s0: s0.F0 s0.SF0>s1 ...`; parses back with `from_text`."""
        head = f"# schedule {self.kind} micro-batches " + " ".join(
            f"s{s}={n}" for s, n in sorted(self.num_micro_batches.items()))
        lines = [head] + [f"s{s}: " + " ".join(map(str, self.actions[s])) for s in self.stages]
        return "\n".join(lines) + "\n"

    @classmethod
    def from_text(cls, text: str) -> Schedule:
        lines = [line for line in text.strip().splitlines() if line.strip()]
        if not lines or not lines[0].startswith("# schedule "):
            raise ScheduleError("schedule text must start with '# schedule KIND micro-batches s0=N ...'")
        head = lines[0].split()
        kind = head[2]
        counts = {int(tok.split("=")[0][1:]): int(tok.split("=")[1]) for tok in head[4:]}
        actions: dict[int, tuple[Action, ...]] = {}
        for line in lines[1:]:
            label, _, body = line.partition(":")
            actions[int(label.strip()[1:])] = tuple(Action.parse(tok) for tok in body.split())
        return cls(kind=kind, num_micro_batches=counts, actions=actions)

    def to_dict(self) -> dict[str, Any]:
        return {"format": "graphpipe.schedule/1", "text": self.to_text()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Schedule:
        return cls.from_text(data["text"])

    def __str__(self) -> str:
        total = sum(len(a) for a in self.actions.values())
        return f"Schedule({self.kind}, {len(self.actions)} stages, {total} actions)"
