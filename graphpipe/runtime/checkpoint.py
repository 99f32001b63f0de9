"""Checkpoints: one state file per stage, one RNG file per rank, then a `complete` marker.

Layout of a checkpoint directory (one per saved step):

    stage_0.pt ...      parameters and buffers (original names), optimizer and learning-rate scheduler
                        state, step; a parameter several stages hold (tied weights) only in the
                        first holder's file, with its optimizer state; the others name that stage
                        (`shared_from`); the keys of the model's own state_dict and its tied names
                        (`model_keys`), for `graphpipe export`
    rank_0_rng.pt ...   each rank's torch RNG state
    complete            JSON {"step", "num_stages", "world_size", "files": {name: {"bytes", "sha256"}}},
                        written last by rank 0

Every file is written to a temporary name and renamed, so a crash never leaves a
half-written file; a directory without `complete` is not a checkpoint. A file damaged
later (a disk filled up, a copy cut short) no longer matches the size and sha256 the
marker records: loading refuses it, and `latest_intact` skips to an older step. Every
rank checks every file, so all ranks pick the same step from the files alone. Files are
read with `torch.load(..., weights_only=True)`.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from graphpipe.atomic_file import write_atomic
from graphpipe.errors import GraphPipeError, TrainingError
from graphpipe.serde import read_json_object, write_json_atomic

if TYPE_CHECKING:
    from graphpipe.runtime.trainer import PipelineTrainer

COMPLETE = "complete"
_HASH_THREADS = 8  # hashlib releases the GIL: files are hashed in parallel


def save_stage(directory: str, trainer: PipelineTrainer, *, barrier: Callable[[], None]) -> None:
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    if trainer.is_stage_leader:
        torch_save_atomic(_stage_state(trainer), root / f"stage_{trainer.stage_idx}.pt")
    torch_save_atomic({"rng": torch.get_rng_state()}, root / f"rank_{trainer.rank}_rng.pt")
    barrier()
    if trainer.rank == 0:
        plan = trainer.plan
        write_json_atomic(root / COMPLETE, {"step": trainer.step_count, "num_stages": plan.num_stages,
                                            "world_size": plan.world_size,
                                            "files": file_records(root, checkpoint_files(plan.num_stages,
                                                                                         plan.world_size))})
    barrier()


def _stage_state(trainer: PipelineTrainer) -> dict[str, Any]:
    """The stage file's contents: shared parameters held by an earlier stage are left to that stage's file."""
    names = list(trainer.stage.spec.param_names)
    elsewhere = {name: owner for name, owner in trainer.shared_owner.items()
                 if owner != trainer.stage_idx and name in names}
    model = {name: tensor for name, tensor in trainer.state_dict().items() if name not in elsewhere}
    optimizer = trainer.optimizer.state_dict() if trainer.optimizer is not None else {}
    if optimizer:
        dropped = {names.index(name) for name in elsewhere}
        optimizer = {**optimizer, "state": {idx: value for idx, value in optimizer["state"].items()
                                            if idx not in dropped}}
    scheduler = trainer.lr_scheduler.state_dict() if trainer.lr_scheduler is not None else {}
    return {"model": model, "optimizer": optimizer, "lr_scheduler": scheduler, "step": trainer.step_count,
            "model_keys": trainer.model_keys, "ops": list(trainer.stage_info.ops),
            "param_names": names, "shared_from": elsewhere}


def checkpoint_files(num_stages: int, world_size: int) -> list[str]:
    """The files a complete checkpoint of a plan holds, besides its marker."""
    return [f"stage_{idx}.pt" for idx in range(num_stages)] + [f"rank_{rank}_rng.pt" for rank in range(world_size)]


def file_records(root: Path, names: list[str]) -> dict[str, dict[str, Any]]:
    """{name: {"bytes", "sha256"}} of files the ranks wrote into `root` (after the barrier: all there)."""
    missing = [name for name in names if not (root / name).is_file()]
    if missing:
        raise TrainingError(f"checkpoint {root}: {missing} were not written; is {root} on a file system every "
                            "rank shares?")
    digests = _sha256_all(root / name for name in names)
    return {name: {"bytes": (root / name).stat().st_size, "sha256": digest} for name, digest in zip(names, digests)}


def load_stage(directory: str, trainer: PipelineTrainer) -> None:
    root = Path(directory)
    marker = read_complete(root)
    if marker["num_stages"] != trainer.plan.num_stages or marker["world_size"] != trainer.plan.world_size:
        raise TrainingError(f"checkpoint {root} has {marker['num_stages']} stages on {marker['world_size']} ranks; "
                            f"the plan has {trainer.plan.num_stages} on {trainer.plan.world_size}: resume with the "
                            "plan it was saved with")
    stage_file, rng_file = f"stage_{trainer.stage_idx}.pt", f"rank_{trainer.rank}_rng.pt"
    owner_files = {f"stage_{owner}.pt" for owner in trainer.shared_owner.values() if owner != trainer.stage_idx}
    problem = checkpoint_damage(root, marker, only=(stage_file, rng_file, *owner_files))
    if problem:
        raise TrainingError(f"checkpoint {root} is damaged ({problem}); resume from an earlier step (`--resume` "
                            "picks the newest intact one)")
    state = torch.load(root / stage_file, map_location=trainer.device, weights_only=True)
    if tuple(state["ops"]) != trainer.stage_info.ops:
        raise TrainingError(f"checkpoint {root}: stage {trainer.stage_idx} holds other ops than the plan's; "
                            "resume with the plan it was saved with")
    _take_shared(state, root, trainer.device)
    _load_tensors(trainer, state["model"], root)
    if trainer.optimizer is not None:
        trainer.optimizer.load_state_dict(state["optimizer"])
    if trainer.lr_scheduler is not None and state.get("lr_scheduler"):
        trainer.lr_scheduler.load_state_dict(state["lr_scheduler"])
    trainer.step_count = int(state["step"])
    if (root / rng_file).exists():
        torch.set_rng_state(torch.load(root / rng_file, weights_only=True)["rng"])


def _take_shared(state: dict[str, Any], root: Path, device: torch.device) -> None:
    """Fill in the shared parameters (and their optimizer state) this stage file leaves to an earlier stage's."""
    shared_from: dict[str, int] = state.get("shared_from") or {}
    owners: dict[int, dict[str, Any]] = {}
    for name, owner in shared_from.items():
        if owner not in owners:  # mapped, not read whole: only the shared tensors are touched
            owners[owner] = torch.load(root / f"stage_{owner}.pt", map_location=device, weights_only=True, mmap=True)
        source = owners[owner]
        state["model"][name] = source["model"][name]
        moments = source["optimizer"].get("state", {}) if source["optimizer"] else {}
        kept = moments.get(source["param_names"].index(name))
        if kept is not None and state["optimizer"]:
            state["optimizer"]["state"][state["param_names"].index(name)] = kept


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
    return read_json_object(marker, "checkpoint marker")


def checkpoint_damage(root: Path, marker: dict[str, Any], only: Iterable[str] | None = None) -> str | None:
    """What is wrong with the files of a complete checkpoint ("stage_2.pt: 1234 of 5678 bytes"), or None.
    Checks the files the marker lists (`only`: just these); a marker older than the file records only
    says which stage files must exist."""
    records: dict[str, dict[str, Any]] = marker.get("files") or {
        name: {} for name in checkpoint_files(int(marker.get("num_stages", 0)), 0)}
    wanted = set(records) if only is None else set(only)
    names = [name for name in records if name in wanted]
    for name in names:
        path, want = root / name, records[name].get("bytes")
        if not path.is_file():
            return f"{name} is missing"
        size = path.stat().st_size
        if want is not None and size != want:
            return f"{name}: {size} of {want} bytes"
    hashed = [name for name in names if records[name].get("sha256")]
    for name, digest in zip(hashed, _sha256_all(root / name for name in hashed)):
        if digest != records[name]["sha256"]:
            return f"{name}: the bytes changed since it was saved (sha256 differs)"
    return None


def latest_complete(checkpoint_dir: str | os.PathLike[str]) -> Path | None:
    """The complete `step_N` directory with the highest N under `checkpoint_dir`, if any."""
    steps = complete_steps(checkpoint_dir)
    return steps[0] if steps else None


def complete_steps(checkpoint_dir: str | os.PathLike[str]) -> list[Path]:
    """The `step_N` directories with a `complete` marker under `checkpoint_dir`, newest (highest N) first."""
    return [path for path in _step_dirs(checkpoint_dir) if (path / COMPLETE).exists()]


def latest_intact(checkpoint_dir: str | os.PathLike[str]) -> tuple[Path | None, list[str]]:
    """The newest complete checkpoint whose files all match its marker, and a line for each newer one
    that does not ("step_5 is damaged (stage_2.pt: 1234 of 5678 bytes)"). Decided from the files alone,
    so every rank that calls it picks the same step."""
    damaged: list[str] = []
    for path in _step_dirs(checkpoint_dir):
        if not (path / COMPLETE).exists():
            damaged.append(f"{path.name} has no {COMPLETE} marker (its save was cut short)")
            continue
        try:
            problem = checkpoint_damage(path, read_complete(path))
        except GraphPipeError as err:
            problem = f"its {COMPLETE} marker is unreadable: {err}"
        if problem is None:
            return path, damaged
        damaged.append(f"{path.name} is damaged ({problem})")
    return None, damaged


def _step_dirs(checkpoint_dir: str | os.PathLike[str]) -> list[Path]:
    """Every `step_N` directory under `checkpoint_dir`, complete or not, newest (highest N) first."""
    root = Path(checkpoint_dir)
    if not root.is_dir():
        return []
    steps = [(int(p.name.split("_")[1]), p) for p in root.glob("step_*") if p.name.split("_")[1].isdigit()]
    return [path for _, path in sorted(steps, reverse=True)]


def _sha256_all(paths: Iterable[Path]) -> list[str]:
    paths = list(paths)
    if len(paths) <= 1:
        return [_sha256(path) for path in paths]
    with ThreadPoolExecutor(max_workers=min(_HASH_THREADS, len(paths))) as pool:
        return list(pool.map(_sha256, paths))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def torch_save_atomic(obj: Any, path: Path) -> None:
    write_atomic(path, lambda tmp: torch.save(obj, tmp))
