"""A planner's raw answer before it becomes a `Plan`: op sets, device counts, micro-batch sizes."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class StageSpec:
    """One stage: its ops, how many data-parallel devices it gets, its micro-batch size, and whether it recomputes
    its forward in its backward (`Stage.recompute`)."""

    ops: tuple[str, ...]
    num_devices: int
    micro_batch_size: int
    recompute: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Partition:
    """Stages of one candidate; `sequential` plans are chains (ordering edges join consecutive stages)."""

    stages: tuple[StageSpec, ...]
    sequential: bool = False

