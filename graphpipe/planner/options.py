"""`PlanOptions`: how to plan, in one value checked once.

`gp.plan` and `plan_candidates` take one `PlanOptions` (or its fields as keywords, which
build one), instead of threading a dozen loose keywords and a dict of planner limits through
every layer below them. The planners read the checked value from their `PlanRequest`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from graphpipe.errors import PlanningError
from graphpipe.planner.granularity import check_granularity
from graphpipe.planner.progress import PlanProgressFn

RANKINGS = ("simulation", "tps")
TECHNIQUES = ("recompute", "zero-bubble")  # `graphpipe.planner.techniques`


def parse_techniques(text: str | Iterable[str]) -> tuple[str, ...]:
    """The techniques named by `text` ("none", "all", or a comma list such as "recompute,zero-bubble") or by
    an iterable of names, in `TECHNIQUES` order; PlanningError naming the known ones for any other."""
    names = [name.strip() for name in text.split(",")] if isinstance(text, str) else list(text)
    names = [name for name in names if name and name != "none"]
    if "all" in names:
        return TECHNIQUES
    unknown = sorted(set(names) - set(TECHNIQUES))
    if unknown:
        raise PlanningError(f"unknown technique(s) {', '.join(unknown)}; choose from none, all, "
                            f"{', '.join(TECHNIQUES)}")
    return tuple(name for name in TECHNIQUES if name in names)


@dataclass(frozen=True, kw_only=True)
class PlanOptions:
    """Fields:

    - planner: "graphpipe" (default) or a baseline: "sequential", "parallel-only", "pipedream",
      "piper", "exhaustive".
    - micro_batch_sizes: the sizes to try; None: the powers of two that divide the mini-batch.
    - per_stage_micro_batch: let each stage refine its own micro-batch size after the search.
    - memory_limit: bytes per device; None: the device's memory.
    - rank_by: "simulation" (default: the shortest simulated iteration among the best plan per
      size) or "tps" (the best bottleneck time per sample).
    - use_all_devices: keep only plans that use every device (default: a plan may leave some idle).
    - granularity: "op" (default), "layer" or "auto" (`graphpipe.planner.granularity`).
    - time_limit_s: Piper and PipeDream give up after this long; None: their own limits (Piper: 600 s).
    - max_downsets: Piper gives up on a graph with more downsets than this; None: Piper's own (40,000, the
      IDEALS_LIMIT of the original Piper).
    - max_explored: Piper stops counting downsets once it has found this many; None: Piper's own (200,000,
      the original's IDEALS_EXPLORATION_LIMIT).
    - fixed_micro_batch: parallel-only holds this micro-batch size; None: that of the sequential
      plan the same ranking picks.
    - techniques: what every planner may also choose, each adding the candidates it makes to the ranking
      (`graphpipe.planner.techniques`): "recompute" (stages that recompute their forward, where a plan needs
      more memory than the limit), "zero-bubble" (the split-backward schedule); "all"; () or "none": neither.
    - progress: called with a `graphpipe.planner.progress.PlanProgress` after each micro-batch size a search
      has done and each candidate the ranking has simulated (`graphpipe plan` shows it as a bar); None: silent.
    """

    planner: str = "graphpipe"
    micro_batch_sizes: tuple[int, ...] | None = None
    per_stage_micro_batch: bool = False
    memory_limit: float | None = None
    rank_by: str = "simulation"
    use_all_devices: bool = False
    granularity: str = "op"
    time_limit_s: float | None = None
    max_downsets: int | None = None
    max_explored: int | None = None
    fixed_micro_batch: int | None = None
    techniques: tuple[str, ...] | str = ()
    progress: PlanProgressFn | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.micro_batch_sizes is not None:
            object.__setattr__(self, "micro_batch_sizes", tuple(int(size) for size in self.micro_batch_sizes))
        if self.rank_by not in RANKINGS:
            raise PlanningError(f"unknown ranking {self.rank_by!r}; choose one of {', '.join(RANKINGS)}")
        check_granularity(self.granularity)
        object.__setattr__(self, "techniques", parse_techniques(self.techniques))
        for name in ("memory_limit", "time_limit_s", "max_downsets", "max_explored", "fixed_micro_batch"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise PlanningError(f"PlanOptions.{name} must be positive, got {value!r}")

    def with_fields(self, **fields: Any) -> PlanOptions:
        """A copy with `fields` replaced (and checked); an unknown field names the known ones."""
        unknown = sorted(set(fields) - {field.name for field in dataclasses.fields(self)})
        if unknown:
            known = ", ".join(field.name for field in dataclasses.fields(self))
            raise PlanningError(f"unknown plan option(s) {', '.join(unknown)}; the options are {known}")
        return dataclasses.replace(self, **fields) if fields else self


def plan_options(options: PlanOptions | None, fields: Mapping[str, Any]) -> PlanOptions:
    """`options` (default PlanOptions()) with the keyword `fields` a caller gave instead."""
    return (options or PlanOptions()).with_fields(**fields)
