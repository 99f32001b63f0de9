"""What a plan changes about the model's numbers, said once when the plan is made.

Every pipeline system computes a batch-coupled op on each micro-batch (and each data-parallel
share of it), not on the whole mini-batch: train-mode BatchNorm normalises with the statistics of
b / d samples. The plan still trains, but not exactly as single-device training on the mini-batch
would, so the planner says so.
"""

from __future__ import annotations

from graphpipe.cost.formulas.sample_split import share_size
from graphpipe.graph.op_graph import OpGraph, OpNode
from graphpipe.stages.stage_graph import Plan

__all__ = ["batch_coupled_ops", "batch_coupling_notes", "capture_notes"]

_NORM_MODULES = ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm", "LazyBatchNorm1d",
                 "LazyBatchNorm2d", "LazyBatchNorm3d")
_TRAINING_ARG = {"batch_norm": 5, "_native_batch_norm_legit": 5, "_native_batch_norm_legit_functional": 5,
                 "native_batch_norm": 5}


def batch_coupled_ops(graph: OpGraph) -> tuple[str, ...]:
    """Ops whose output depends on the other samples of their batch (train-mode batch norm)."""
    return tuple(op.name for op in graph.ops if _is_batch_norm_in_training(op))


def batch_coupling_notes(graph: OpGraph, plan: Plan) -> tuple[str, ...]:
    """One note when a batch-coupled op sees fewer samples per call than the mini-batch."""
    coupled = set(batch_coupled_ops(graph))
    shares = sorted({share_size(stage.micro_batch_size, len(stage.ranks)) for stage in plan.stages
                     if coupled & set(stage.ops)})
    if not shares or shares[-1] >= plan.global_batch_size:
        return ()
    sizes = ", ".join(map(str, shares))
    return (f"{len(coupled)} train-mode BatchNorm op(s) normalise each micro-batch share of {sizes} samples, not "
            f"the mini-batch of {plan.global_batch_size} (as in every pipeline system): the numbers differ from "
            "single-device training; plan with a micro-batch equal to the mini-batch on one device per stage "
            "for the exact statistics, or train with batch_norm='sync' (each micro-batch normalised whole) or "
            "'deferred' (running statistics over the whole mini-batch)",)


def _is_batch_norm_in_training(op: OpNode) -> bool:
    if op.kind == "call_module":
        return op.module_type in _NORM_MODULES
    position = _TRAINING_ARG.get(op.module_type)
    args = op.attrs.get("args") or []
    return position is not None and len(args) > position and args[position] is True


def capture_notes(graph: OpGraph, plan: Plan) -> tuple[str, ...]:
    """One note when the model's forward fixes the batch size: the graph was captured at one sample with static
    shapes, and each stage runs its share sample by sample."""
    if graph.capture != "export-static":
        return ()
    return (f"{graph.name}'s forward fixes the batch size, so its graph was captured at one sample with static "
            "shapes (torch.export) and every stage runs its share of a micro-batch sample by sample: the same "
            "numbers, less throughput than whole batches",)
