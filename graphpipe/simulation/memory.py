"""Per-device memory in the simulation: static state plus the activations alive at the peak.

Static state is weights + gradients + Adam's two moments = 4 × the stage's parameter
bytes (`graphpipe.cost.formulas.memory`, the planner's formula). A micro-batch's activations are
alive from the start of its forward to the end of its backward; a stage's list runs in
order, so the peak count follows from the list alone. Under a split backward a micro-batch stays alive
until its weight-gradient half W, not its I: W reads what the forward saved. A recomputing stage holds only
the inputs of each live micro-batch, plus one micro-batch's activations (`StageCost.activation_bytes`).
"""

from __future__ import annotations

from graphpipe.cost.formulas.memory import static_memory_bytes
from graphpipe.schedule.action import Action


def static_bytes(param_bytes: int) -> int:
    """Weights, gradients and optimizer state: the planner's formula, so plan and simulation agree."""
    return int(static_memory_bytes(param_bytes))


def peak_live_micro_batches(actions: tuple[Action, ...]) -> int:
    """Most micro-batches forwarded and not yet done with at any point of one stage's list: a micro-batch is
    held from its forward to its backward, or under a split backward to its W (`Traits.held_change`)."""
    live = peak = 0
    for action in actions:
        live += action.kind.held_change
        peak = max(peak, live)
    return peak
