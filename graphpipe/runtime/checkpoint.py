"""Checkpoints: one state file per stage, one RNG file per rank, then a `complete` marker.

Layout of a checkpoint directory (one per saved step):

    stage_0.pt ...      parameters and buffers (original names), optimizer state, step
    rank_0_rng.pt ...   each rank's torch RNG state
    complete            JSON {"step", "num_stages", "world_size"}, written last by rank 0

Every file is written to a temporary name and renamed, so a crash never leaves a
half-written file; a directory without `complete` is not a checkpoint. Files are read
with `torch.load(..., weights_only=True)`.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from graphpipe.errors import TrainingError
from graphpipe.serde import read_json, write_json_atomic

if TYPE_CHECKING:
    from graphpipe.runtime.trainer import PipelineTrainer

COMPLETE = "complete"


def save_stage(directory: str, trainer: PipelineTrainer, *, barrier: Callable[[], None]) -> None:
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    if trainer.is_stage_leader:
        optimizer = trainer.optimizer.state_dict() if trainer.optimizer is not None else {}
        state = {"model": trainer.state_dict(), "optimizer": optimizer,
                 "step": trainer.step_count, "ops": list(trainer.stage_info.ops)}
        torch_save_atomic(state, root / f"stage_{trainer.stage_idx}.pt")
    torch_save_atomic({"rng": torch.get_rng_state()}, root / f"rank_{trainer.rank}_rng.pt")
    barrier()
    if trainer.rank == 0:
        write_json_atomic(root / COMPLETE, {"step": trainer.step_count, "num_stages": trainer.plan.num_stages,
                                            "world_size": trainer.plan.world_size})
    barrier()


def load_stage(directory: str, trainer: PipelineTrainer) -> None:
    root = Path(directory)
    marker = read_complete(root)
    if marker["num_stages"] != trainer.plan.num_stages or marker["world_size"] != trainer.plan.world_size:
        raise TrainingError(f"checkpoint {root} has {marker['num_stages']} stages on {marker['world_size']} ranks; "
                            f"the plan has {trainer.plan.num_stages} on {trainer.plan.world_size}: resume with the "
                            "plan it was saved with")
    state = torch.load(root / f"stage_{trainer.stage_idx}.pt", map_location=trainer.device, weights_only=True)
    if tuple(state["ops"]) != trainer.stage_info.ops:
        raise TrainingError(f"checkpoint {root}: stage {trainer.stage_idx} holds other ops than the plan's; "
                            "resume with the plan it was saved with")
    _load_tensors(trainer, state["model"], root)
    if trainer.optimizer is not None:
        trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.step_count = int(state["step"])
    rng_path = root / f"rank_{trainer.rank}_rng.pt"
    if rng_path.exists():
        torch.set_rng_state(torch.load(rng_path, weights_only=True)["rng"])


def _load_tensors(trainer: PipelineTrainer, saved: dict[str, torch.Tensor], root: Path) -> None:
    own = trainer.state_dict()
    missing = sorted(set(own) - set(saved))
    if missing:
        raise TrainingError(f"checkpoint {root} lacks {len(missing)} tensors of stage {trainer.stage_idx} "
                            f"(first: {missing[:3]})")
    with torch.no_grad():
        for name, tensor in own.items():
            tensor.copy_(saved[name])


def read_complete(root: str | os.PathLike[str]) -> dict[str, Any]:
    """The `complete` marker of a checkpoint directory; TrainingError when the checkpoint is partial."""
    marker = Path(root) / COMPLETE
    if not marker.exists():
        raise TrainingError(f"{root} is not a complete checkpoint (no {COMPLETE!r} marker): the run that wrote it "
                            "stopped while saving; resume from an earlier step directory")
    data: dict[str, Any] = read_json(marker)
    return data


def latest_complete(checkpoint_dir: str | os.PathLike[str]) -> Path | None:
    """The complete `step_N` directory with the highest N under `checkpoint_dir`, if any."""
    root = Path(checkpoint_dir)
    if not root.is_dir():
        return None
    steps = [(int(p.name.split("_")[1]), p) for p in root.glob("step_*")
             if p.name.split("_")[1].isdigit() and (p / COMPLETE).exists()]
    return max(steps)[1] if steps else None


def torch_save_atomic(obj: Any, path: Path) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
