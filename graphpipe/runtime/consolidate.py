"""The whole trained model's `state_dict` from a checkpoint's stage files (`graphpipe export`).

Each stage file holds its stage's tensors under the model's names, a weight several stages share once (in
its first holder's file), and the keys of the model's own `state_dict` with its tied names
(`graphpipe.runtime.model_keys`). Their union, kept to those keys and in their order, is the model's
`state_dict` with a tied weight once: `safetensors.torch.load_model(model, path)` ties it again, and a `.pt`
export holds every tied name pointing at the one tensor, for `model.load_state_dict`. A tensor no stage
holds (a parameter the forward never reads) is not in any file: it is reported, not invented. Files are
checked against the checkpoint's `complete` marker and read with `weights_only=True`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from graphpipe.errors import InputFileError, UsageError
from graphpipe.runtime.checkpoint import COMPLETE, checkpoint_damage, latest_intact, read_complete

__all__ = ["Consolidated", "consolidate", "write_consolidated"]

FORMATS = (".safetensors", ".pt")


@dataclass(frozen=True, slots=True)
class Consolidated:
    """The model's tensors from one checkpoint step."""

    step_dir: Path
    step: int
    tensors: dict[str, torch.Tensor]  # in the model's state_dict order, a tied weight under its first name
    aliases: dict[str, str] = field(default_factory=dict)  # tied name -> the name it is stored under
    missing: tuple[str, ...] = ()  # keys of the model's state_dict that no stage held
    recorded_keys: bool = True  # the checkpoint recorded the model's keys (older ones did not: all tensors kept)

    @property
    def num_bytes(self) -> int:
        return sum(tensor.numel() * tensor.element_size() for tensor in self.tensors.values())


def consolidate(path: str | os.PathLike[str]) -> Consolidated:
    """The model's state from a step directory (`.../step_N`) or the newest intact step of a checkpoint
    directory."""
    root = _step_dir(Path(path))
    marker = read_complete(root)
    stage_files = [f"stage_{idx}.pt" for idx in range(int(marker["num_stages"]))]
    problem = checkpoint_damage(root, marker, only=stage_files)
    if problem:
        raise InputFileError(f"checkpoint {root} is damaged ({problem}); export an earlier step")
    held: dict[str, torch.Tensor] = {}
    recorded = None
    for name in stage_files:
        state = torch.load(root / name, map_location="cpu", weights_only=True)
        recorded = recorded or state.get("model_keys")
        for key, tensor in state["model"].items():
            held.setdefault(key, tensor)
    if not recorded:
        return Consolidated(step_dir=root, step=int(marker["step"]), tensors=held, recorded_keys=False)
    keys, aliases = list(recorded["keys"]), dict(recorded["aliases"])
    tensors = {key: held[key] for key in keys if key in held and key not in aliases}
    tied = {alias: source for alias, source in aliases.items() if source in tensors}
    missing = tuple(key for key in keys if key not in tensors and key not in tied)
    return Consolidated(step_dir=root, step=int(marker["step"]), tensors=tensors, aliases=tied, missing=missing)


def write_consolidated(model: Consolidated, output: str | os.PathLike[str]) -> Path:
    """Write `.safetensors` (a tied weight once; its other names in the metadata) or `.pt` (every name)."""
    path = Path(output)
    if path.suffix not in FORMATS:
        raise UsageError(f"export writes {' or '.join(FORMATS)}, not {path.name!r}: name the output e.g. "
                         f"{path.with_suffix('.safetensors').name}")
    tensors = {key: tensor.detach().contiguous() for key, tensor in model.tensors.items()}
    try:
        if path.suffix == ".pt":
            torch.save({**tensors, **{alias: tensors[source] for alias, source in model.aliases.items()}}, path)
        else:
            from safetensors.torch import save_file

            save_file(tensors, path, metadata={"format": "pt", "graphpipe.step": str(model.step),
                                               "graphpipe.tied": json.dumps(model.aliases)})
    except OSError as err:
        raise UsageError(f"cannot write {path}: {err.strerror or err}") from err
    return path


def _step_dir(path: Path) -> Path:
    if (path / COMPLETE).is_file():
        return path
    if not path.is_dir():
        raise InputFileError(f"{path} is not a checkpoint: give a step directory (.../step_N) or the "
                             "--checkpoint-dir of a run")
    step, skipped = latest_intact(path)
    if step is None:
        raise InputFileError(f"{path} holds no complete, intact checkpoint step"
                             + (f" ({'; '.join(skipped)})" if skipped else ""))
    return step
