"""Checks `graphpipe train` makes in its own process before it starts any rank: the loss and the --weights.

A rank finds the same problems, but only after torchrun has started every rank, each has built the
model and joined the process group; and a rank's error is a failed run (exit 1), not bad input (exit 2).
Nothing here needs parameter values: the model is built without them (on `meta`), its forward and loss
run on `meta` tensors (shapes only), and the weights file's header is read, not its tensors.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils import _pytree as pytree

from graphpipe.errors import WeightsError
from graphpipe.model_inputs import as_model_inputs
from graphpipe.models import ZooModel, load_model
from graphpipe.models.user_factory import parse_model_options
from graphpipe.runtime.weights_file import WeightsFile
from graphpipe.stages.stage_graph import Plan

__all__ = ["loss_problem", "model_problem", "weights_problem"]


def model_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the model the ranks would train (its loss, the --weights for it), in one line, or
    None. The model is resolved as `graphpipe.train` resolves it: --model/--preset/--set over the plan's
    `model_spec`. A model that cannot be built raises its own ModelLoadError."""
    zoo = _empty_model(args)
    if zoo is None:
        return None  # no model named: `graphpipe train` says so itself
    return loss_problem(zoo) or (weights_problem(args.weights, zoo.model) if args.weights else None)


def _empty_model(args: argparse.Namespace) -> ZooModel | None:
    spec = dict(Plan.load(args.plan).model_spec) if getattr(args, "plan", None) else {}
    name = args.model or spec.get("model")
    if not name:
        return None
    options = {**dict(spec.get("options") or {}), **parse_model_options(args.model_options)}
    return load_model(name, args.preset or spec.get("preset") or "tiny", device="cpu", seed=args.seed, empty=True,
                      **options)


def loss_problem(zoo: ZooModel) -> str | None:
    """A loss_fn that does not return a scalar on the example batch, found on `meta` (shapes only). A model
    or loss that cannot run on `meta` (data-dependent routing, a loss holding CPU tensors) is left to the
    ranks, which check every micro-batch's loss."""
    model = zoo.model.to("meta")
    inputs = as_model_inputs(zoo.inputs).map_tensors(lambda t: t.to("meta"))
    targets = pytree.tree_map_only(torch.Tensor, lambda t: t.to("meta"), zoo.targets)
    try:
        with torch.no_grad():
            loss = zoo.loss_fn(model(*inputs.args, **inputs.kwargs), targets)
    except Exception:
        return None
    if isinstance(loss, torch.Tensor) and loss.dim() == 0:
        return None
    got = f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else f"a {type(loss).__name__}"
    return (f"the model's loss_fn returns {got} on its example batch of {zoo.batch_size}, not a scalar: the ranks "
            "backpropagate it and sum it over micro-batches, so it must be the mean over the samples it gets "
            "(e.g. nn.MSELoss(), not reduction='none'; or end it with .mean())")


def weights_problem(path: str, model: nn.Module) -> str | None:
    """What keeps the ranks from starting `model` from the weights file `path`, in one line, or None: a file
    that is not readable, a parameter it lacks (a tied one under any of its names), a tensor of another shape,
    or integers for a float parameter. Buffers the file lacks are left to the ranks (a stage may not need
    them)."""
    try:
        source = WeightsFile(path)
        source.check(_wanted(model, set(source.shapes)), what="the model")
    except WeightsError as err:
        return str(err)
    return None


def _wanted(model: nn.Module, held: set[str]) -> dict[str, tuple[torch.Size, torch.dtype]]:
    """{file key: (shape, dtype)}: every parameter once (under the name the file holds it by, else its
    first), and the buffers the file holds."""
    names: dict[int, list[str]] = {}
    tensors: dict[int, torch.Tensor] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
        tensors[id(param)] = param
    wanted = {next((n for n in found if n in held), found[0]): (tensors[key].shape, tensors[key].dtype)
              for key, found in names.items()}
    wanted.update({name: (buffer.shape, buffer.dtype) for name, buffer in model.named_buffers(remove_duplicate=False)
                   if name in held})
    return wanted
