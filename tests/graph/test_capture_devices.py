"""torch.export sees the host, whatever device the model's tensors are on, so the graph `plan` captures without
weights is op for op the graph a rank captures with them; the graph names the device it runs on."""

from __future__ import annotations

import torch

import graphpipe as gp
from graphpipe.graph.capture import capture, capture_module
from graphpipe.graph.fingerprint import fingerprint_of
from graphpipe.graph.host_state import all_on_host
from tests.corpus.cli_factories import olmoe, qwen2


def _devices_named(gm: torch.fx.GraphModule) -> set[str]:
    return {str(value) for node in gm.graph.nodes for value in node.kwargs.values()
            if isinstance(value, torch.device)}


def test_a_decoder_planned_without_weights_has_the_graph_it_trains_with() -> None:
    """Qwen2 with grouped-query attention and an untied head: export on meta weights added a `contiguous`."""
    model, inputs, _, _ = qwen2(dtype="float32")
    with gp.empty_weights():
        empty, _, _, _ = qwen2(dtype="float32")
    assert fingerprint_of(capture(empty, inputs)) == fingerprint_of(capture(model, inputs))


def test_a_router_that_branches_on_the_device_gets_the_hosts_branch() -> None:
    """OLMoE picks histc's dtype by `device.type`; the graph planned on meta weights runs on the CPU."""
    with gp.empty_weights():
        empty, inputs, _, _ = olmoe(dtype="float32")
    model, _, _, _ = olmoe(dtype="float32")
    assert fingerprint_of(capture(empty, inputs)) == fingerprint_of(capture(model, inputs))
    captured = capture_module(model, inputs, with_graph=False)
    logits = captured.model_output(captured.module(*captured.bind(inputs).values())).logits
    assert torch.equal(logits, model(**inputs).logits)


def test_the_graph_creates_its_tensors_on_the_models_device() -> None:
    model, inputs, _, _ = qwen2(dtype="float32")
    assert _devices_named(capture_module(model, inputs, with_graph=False).module) == {"cpu"}
    meta = capture_module(model.to("meta"), inputs, with_graph=False).module
    assert _devices_named(meta) == {"meta"}


def test_host_placeholders_keep_ties_and_are_put_back() -> None:
    with gp.empty_weights():
        model = torch.nn.Sequential(torch.nn.Embedding(5, 3), torch.nn.Linear(3, 5))
    model[1].weight = model[0].weight
    with all_on_host(model):
        assert model[0].weight.device.type == "cpu" and model[1].weight is model[0].weight
    assert model[0].weight.is_meta and model[1].weight is model[0].weight
