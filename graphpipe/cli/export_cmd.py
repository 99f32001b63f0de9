"""`graphpipe export CHECKPOINT -o model.safetensors`: the whole trained model from a run's checkpoint."""

from __future__ import annotations

import argparse
from typing import Any

from graphpipe.cli.common import print_json
from graphpipe.units import format_bytes


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "export", help="write the whole trained model's state_dict from a checkpoint",
        description="Gather the stages of a checkpoint (a step directory, or the newest intact step of a "
                    "--checkpoint-dir) into the model's own state_dict, under its original names, a tied weight "
                    "once: load a .safetensors file with safetensors.torch.load_model(model, path), a .pt file "
                    "with model.load_state_dict(torch.load(path, weights_only=True)).")
    parser.add_argument("checkpoint", help="step directory (.../step_N) or the --checkpoint-dir of a run")
    parser.add_argument("-o", "--output", default="model.safetensors", metavar="MODEL.safetensors",
                        help="file to write: .safetensors (default model.safetensors) or .pt")
    parser.add_argument("--json", action="store_true", help="print a summary as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from graphpipe.runtime.consolidate import consolidate, write_consolidated

    model = consolidate(args.checkpoint)
    written = write_consolidated(model, args.output)
    if args.json:
        print_json({"step_dir": str(model.step_dir), "step": model.step, "tensors": len(model.tensors),
                    "bytes": model.num_bytes, "tied": model.aliases, "not_held": list(model.missing),
                    "written": str(written)})
        return 0
    print(f"step {model.step} ({model.step_dir}): {len(model.tensors)} tensors, {format_bytes(model.num_bytes)}")
    for alias, source in model.aliases.items():
        print(f"  tied: {alias} is {source}")
    if model.missing:
        print(f"  not held by any stage (the forward never reads them, so they never trained): "
              f"{', '.join(model.missing[:5])}{' ...' if len(model.missing) > 5 else ''}; load with strict=False")
    if not model.recorded_keys:
        print("  this checkpoint predates recording the model's keys: every tensor a stage held is written")
    print(f"wrote {written}")
    return 0
