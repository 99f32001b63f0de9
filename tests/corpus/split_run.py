"""Run a plan's stages one after the other in one process, as the runtime would: every received value
is a fresh autograd leaf, gradients flow back stage by stage. The result must equal the whole model."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from graphpipe.graph.capture import CapturedModule
from graphpipe.runtime.stage_module import MODEL_OUTPUT, split_stages
from graphpipe.stages.stage_graph import Plan


def split_forward_backward(captured: CapturedModule, plan: Plan, inputs: Any,
                           loss_fn: Callable[[Any], torch.Tensor]) -> torch.Tensor:
    """The loss of the split model on `inputs` (one micro-batch: the whole batch); gradients land in the
    model's parameters (the stage modules share them)."""
    stages = split_stages(captured, plan)
    data = captured.bind(inputs)
    values: dict[str, torch.Tensor] = {}
    received: list[dict[str, torch.Tensor]] = []
    outputs: list[dict[str, Any]] = []
    loss: torch.Tensor | None = None
    for stage in stages:
        leaves = {name: _leaf(values[name]) for name in stage.spec.inputs}
        result = stage({name: data[name] for name in stage.spec.data_inputs}, leaves)
        if stage.spec.is_sink:
            loss = loss_fn(result.pop(MODEL_OUTPUT))
        values.update(result)
        received.append(leaves)
        outputs.append(result)
    assert loss is not None
    grads: dict[str, torch.Tensor] = {}
    for stage in reversed(stages):
        roots = [loss] if stage.spec.is_sink else []
        root_grads: list[torch.Tensor | None] = [None] if stage.spec.is_sink else []
        for name in stage.spec.outputs:
            value = outputs[stage.spec.stage_idx][name]
            if value.requires_grad and name in grads:
                roots.append(value)
                root_grads.append(grads[name])
        if roots:
            torch.autograd.backward(roots, root_grads)
        for name, leaf in received[stage.spec.stage_idx].items():
            if leaf.grad is not None:
                grads[name] = grads[name] + leaf.grad if name in grads else leaf.grad
    return loss.detach()


def _leaf(value: torch.Tensor) -> torch.Tensor:
    leaf = value.detach()
    return leaf.requires_grad_(True) if leaf.is_floating_point() else leaf
