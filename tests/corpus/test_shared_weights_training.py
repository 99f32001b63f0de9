"""Library models whose weights are read in several stages train like one device (fp64, Adam, 3 steps: 1e-10):
ALBERT, whose layers all share one layer's weights, and Llama, whose LM head is tied to its token embedding.
graphpipe's own plan at 4 devices places the readers of a shared weight in different stages; each holds it and
their gradients are summed."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import graphpipe as gp
from graphpipe.graph.capture import capture_module
from graphpipe.stages.validate import check_runtime_rules, validate_plan
from tests.corpus.models import BATCH, CORPUS
from tests.corpus.training import train_both

pytest.importorskip("transformers")

SHARED = {"albert": "encoder.albert_layer_groups.0.albert_layers.0.ffn.weight", "llama": "model.embed_tokens.weight"}


def _prediction(output: object) -> torch.Tensor:
    """What the loss reads: the last hidden state (ALBERT), else the logits (Llama's LM)."""
    hidden = getattr(output, "last_hidden_state", None)
    return output.logits if hidden is None else hidden  # type: ignore[attr-defined,no-any-return]


def _loss(output: object, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(_prediction(output), targets)


@pytest.mark.parametrize("name", sorted(SHARED))
def test_a_weight_read_in_several_stages_trains_like_one_device(name: str) -> None:
    torch.manual_seed(0)
    model, inputs, _ = next(entry for entry in CORPUS if entry.name == name).build()
    model = model.double()
    captured = capture_module(model, inputs)
    cluster = gp.Cluster.preset("summit", num_devices=4)
    plan = gp.plan(captured.graph, gp.analytic_costs(captured.graph, device="v100-16gb"), cluster,
                   global_batch_size=BATCH)
    validate_plan(plan, captured.graph, cluster)
    check_runtime_rules(plan, captured.graph)
    shared = plan.shared_params.get(SHARED[name])
    assert shared is not None and len(shared["stages"]) >= 2, plan.shared_params

    with torch.no_grad():
        shape = _prediction(model(*inputs)).shape
    gen = torch.Generator().manual_seed(1)
    batches = [(inputs, torch.randn(shape, generator=gen, dtype=torch.float64)) for _ in range(3)]
    losses, expected, worst = train_both(model, plan, batches, _loss)
    assert losses == pytest.approx(expected, rel=1e-10)
    assert worst < 1e-10

