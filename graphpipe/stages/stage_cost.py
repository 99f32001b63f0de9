"""The cost of one micro-batch on one rank of a stage: one type for the planner and the simulator.

The planner (`graphpipe.planner.stage_cost.CostModel`) fills the times it optimises: communication,
the all-reduce and optimizer step it amortises, and TPS (`graphpipe.cost.formulas.time_per_sample`).
Both count the device's per-action overheads in `fwd_ms` and `bwd_ms`. The simulator
(`graphpipe.simulation.stage_cost`) times messages and all-reduces itself, on the placed ranks, and
fills instead which bytes each all-reduce sums: a parameter shared by several stages
(`Plan.shared_params`) leaves its stage's data-parallel all-reduce and is summed by one all-reduce
over the plan's ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphpipe.cost.formulas.memory import recompute_activation_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class StageCost:
    """One micro-batch on one rank of a stage."""

    fwd_ms: float
    bwd_ms: float
    act_bytes: int  # activations kept from the forward until the backward
    param_bytes: int  # weights of the stage (each rank holds a full copy), shared copies included
    comm_ms: float = 0.0  # planner: activations and gradients in and out, before placement
    all_reduce_ms: float = 0.0  # planner: the data-parallel gradient all-reduce, once per iteration
    step_ms: float = 0.0  # planner: the optimizer step, once per iteration
    tps_ms: float = 0.0  # planner: time per sample (`graphpipe.cost.formulas.time_per_sample`)
    local_reduce_bytes: int = -1  # simulator: what the stage's data-parallel all-reduce sums (-1: param_bytes)
    shared_reduce_bytes: int = 0  # simulator: every shared parameter of the plan, reduced by all of its ranks
    # Activation recomputation (`Stage.recompute`): `bwd_ms` then includes the forward run again, and a micro-batch
    # in flight holds `input_bytes` (what the stage receives and its model inputs), not `act_bytes`.
    recompute: bool = False
    input_bytes: int = 0

    def activation_bytes(self, held_micro_batches: int) -> float:
        """Activations alive while the stage holds `held_micro_batches` micro-batches (docs/method.md, "Memory")."""
        if self.recompute:
            return recompute_activation_bytes(self.input_bytes, self.act_bytes, held_micro_batches)
        return float(held_micro_batches * self.act_bytes)

    @property
    def data_parallel_bytes(self) -> int:
        return self.param_bytes if self.local_reduce_bytes < 0 else self.local_reduce_bytes
