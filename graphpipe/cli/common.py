"""Arguments, loading and checks shared by the commands: --model, --preset, --batch; usage errors."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from graphpipe.errors import GraphCaptureError, GraphPipeError, ModelLoadError, PlanValidationError, UsageError
from graphpipe.graph.op_graph import OpGraph
from graphpipe.models import ZOO_NAMES, ZooModel, load_model
from graphpipe.models.user_factory import is_file_spec
from graphpipe.stages.stage_graph import Plan


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


_GIB_PER_UNIT = {"": 1.0, "g": 1.0, "gib": 1.0, "gb": 1e9 / 2**30, "m": 2**-10, "mib": 2**-10, "mb": 1e6 / 2**30,
                 "t": 2**10, "tib": 2**10, "tb": 1e12 / 2**30}


def memory_gib(text: str) -> float:
    """A memory size in GiB: a plain number is GiB; with a unit, 512MiB, 0.38GiB, 16GB (G and M are binary)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _GIB_PER_UNIT:
        raise argparse.ArgumentTypeError(f"{text!r} is not a memory size: give GiB (0.5) or a number with a unit "
                                         "(512MiB, 0.5GiB, 16GB)")
    value = float(match.group(1)) * _GIB_PER_UNIT[unit]
    if value <= 0:
        raise argparse.ArgumentTypeError(f"the memory size must be above 0, got {text!r}")
    return value


def check_output_files(*outputs: tuple[str, str | None, str]) -> None:
    """UsageError for the first (option, path, example file name) that could not be written, said before the
    command captures, plans or simulates rather than after."""
    from graphpipe.runtime.output_paths import output_file_problem

    for option, path, example in outputs:
        problem = output_file_problem(option, path, example) if path else None
        if problem:
            raise UsageError(problem)


@contextmanager
def writing(option: str, path: str) -> Iterator[None]:
    """An OSError while writing `path` (a disk that filled, a folder removed meanwhile) as one line."""
    try:
        yield
    except OSError as err:
        raise GraphPipeError(f"{option} {path} could not be written ({err.strerror or err})") from err


def add_model_args(parser: argparse.ArgumentParser, *, default_model: str | None = None,
                   default_preset: str = "tiny") -> None:
    """--model (zoo name or file.py:factory), --preset, --batch, --set KEY=VALUE, --leaf-module NAME, --capture."""
    parser.add_argument("--model", default=default_model, required=default_model is None,
                        help=f"zoo model ({', '.join(ZOO_NAMES)}) or path/to/file.py:factory returning "
                             "(model, inputs, targets, loss_fn)" + (f" (default {default_model})" if default_model
                                                                     else ""))
    parser.add_argument("--preset", default=default_preset,
                        help=f"model size: tiny (seconds on a CPU) or paper (the paper's sizes); "
                             f"default {default_preset}")
    parser.add_argument("--batch", type=positive_int, default=None,
                        help="example batch size (default: the preset's)")
    parser.add_argument("--set", dest="model_options", action="append", default=[], metavar="KEY=VALUE",
                        help="override a model option, e.g. --set num_branches=8 (repeatable)")
    parser.add_argument("--leaf-module", dest="leaf_modules", action="append", default=[], metavar="NAME",
                        help="keep this submodule (qualified name or class name) as one op (repeatable)")
    parser.add_argument("--capture", choices=("auto", "fx", "export"), default="auto",
                        help="how to capture the model: torch.fx, torch.export (models fx cannot trace, such as "
                             "Hugging Face transformers), or auto (fx, then export if fx fails; default)")


def add_granularity_arg(parser: argparse.ArgumentParser) -> None:
    """--granularity op|layer|auto: what the planner cuts between (`graphpipe.planner.granularity`)."""
    parser.add_argument("--granularity", choices=("op", "layer", "auto"), default="op",
                        help="what the planner cuts between: single ops (default), whole layers (each instance "
                             "of the innermost repeated module: much faster on deep models), or auto (whole "
                             "layers, then the layers at the stage boundaries opened to ops, the better kept)")


def model_options(args: argparse.Namespace) -> dict[str, Any]:
    """The --set KEY=VALUE pairs, values parsed as JSON where they parse (8, 0.5, true) and text otherwise."""
    from graphpipe.models.user_factory import parse_model_options

    return parse_model_options(getattr(args, "model_options", None) or ())


def load_model_from_args(args: argparse.Namespace, device: str | torch.device | None = None,
                         empty: bool = False) -> ZooModel:
    """The model and example batch named by --model/--preset/--batch/--set (seed from --seed if defined); with
    `empty`, or where the command builds without values (`train.builds_empty`), its parameters on meta."""
    from graphpipe.train import builds_empty

    return load_model(args.model, args.preset, batch_size=args.batch, device=device,
                      seed=getattr(args, "seed", 0), empty=empty or builds_empty(args), **model_options(args))


def capture_from_args(args: argparse.Namespace, device: str | torch.device | None = None) -> tuple[ZooModel, OpGraph]:
    """Load and capture the model. By default no weights are allocated: zoo models are built on `meta`, a user's
    factory under `graphpipe.empty_weights()` (parameters on meta, buffers and example data real), so a model
    larger than this machine's memory captures; a factory that needs its weights' values to build or to run
    (lazy modules, say) is built again on CPU. Pass `device="cpu"` to get a model that can run."""
    if device is None and is_file_spec(args.model):
        try:
            return _capture(args, load_model_from_args(args, device="cpu", empty=True))
        except (ModelLoadError, GraphCaptureError):
            pass  # built again with values, below: its own error, if any, is the one to report
    return _capture(args, load_model_from_args(args, device=device or ("cpu" if is_file_spec(args.model) else "meta")))


def _capture(args: argparse.Namespace, zoo: ZooModel) -> tuple[ZooModel, OpGraph]:
    from graphpipe.graph.capture import capture

    graph = capture(zoo.model, zoo.inputs, leaf_modules=getattr(args, "leaf_modules", None) or (),
                    name=graph_name(args), capture=getattr(args, "capture", None) or "auto")
    return zoo, graph


def graph_name(args: argparse.Namespace) -> str:
    if is_file_spec(args.model):
        path, _, factory = args.model.rpartition(":")
        return f"{Path(path).stem}.{factory}"
    return f"{args.model}-{args.preset}"


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=1)
    sys.stdout.write("\n")


def format_count(count: float, unit: str = "") -> str:
    """1234567 -> '1.23 M', with SI prefixes up to P."""
    for prefix in ("", "k", "M", "G", "T", "P"):
        if abs(count) < 1000 or prefix == "P":
            return f"{count:.0f} {prefix}{unit}".rstrip() if prefix == "" else f"{count:.2f} {prefix}{unit}"
        count /= 1000
    return f"{count:.2f} P{unit}"


def check_plan_fits_graph(plan: Plan, graph: OpGraph, plan_path: str) -> None:
    """UsageError unless the plan covers `graph` as the runtime and the simulator need (`validate_structure`:
    the in-flight counts and memory are the planner's predictions, not a contract, so a hand-made plan may
    differ there)."""
    from graphpipe.stages.validate import validate_structure

    try:
        validate_structure(plan, graph)
    except PlanValidationError as err:
        raise UsageError(f"plan {plan_path} does not fit the model: {_which_graphs(plan, graph)}{err}; re-plan "
                         f"the model (`graphpipe plan --model ... -o {Path(plan_path).name}`) or give the "
                         "--model/--preset/--set/--leaf-module the plan was made with") from err


def _which_graphs(plan: Plan, graph: OpGraph) -> str:
    if plan.graph_name == graph.name:
        return f"it does not cover graph {graph.name!r} ({len(graph.ops)} ops): "
    return f"it is for graph {plan.graph_name!r} but the model is {graph.name!r}: "
