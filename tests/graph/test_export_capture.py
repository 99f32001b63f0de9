"""Capture with torch.export: keyword and partial inputs, the output object rebuilt, a dynamic batch."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from torch import nn

from graphpipe.errors import GraphCaptureError
from graphpipe.graph.capture import capture, capture_module
from graphpipe.model_inputs import ModelInputs


@dataclass
class Output:
    hidden: torch.Tensor
    pooled: torch.Tensor


class WithOutputObject(nn.Module):
    """fx cannot follow a dataclass output built from a dict; export can."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(6, 6)
        self.pool = nn.Linear(6, 3)
        self.register_buffer("positions", torch.arange(5))

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        hidden = self.proj(tokens + self.positions[: tokens.shape[1], None].float())
        if mask is not None:
            hidden = hidden * mask[..., None]
        return {"hidden": hidden, "pooled": self.pool(hidden.mean(1))}


def test_export_takes_keyword_inputs_and_rebuilds_the_output() -> None:
    model = WithOutputObject()
    inputs = {"tokens": torch.randn(4, 5, 6), "mask": torch.ones(4, 5)}
    captured = capture_module(model, inputs, method="export")
    assert captured.method == "export" and captured.graph.capture == "export"
    assert captured.input_names == ("tokens", "mask")
    flat = captured.module(*captured.bind({"tokens": torch.randn(3, 5, 6), "mask": torch.ones(3, 5)}).values())
    output = captured.model_output(flat)
    assert set(output) == {"hidden", "pooled"} and output["pooled"].shape == (3, 3)  # another batch size runs


def test_batch_axes_and_replicated_values_are_recorded() -> None:
    graph = capture(WithOutputObject(), {"tokens": torch.randn(4, 5, 6)}, capture="export")
    by_target = {op.module_type: op for op in graph.ops}
    assert graph.op("tokens").outputs[0].batch_axis == 0
    positions = next(op for op in graph.ops if op.kind == "get_attr")
    assert positions.replicated
    assert by_target["unsqueeze"].replicated and by_target["unsqueeze"].outputs[0].batch_axis is None  # positions
    assert by_target["add"].replicated and by_target["add"].outputs[0].batch_axis == 0  # input + positions: recomputed
    assert not by_target["linear"].replicated and by_target["linear"].outputs[0].batch_axis == 0


def test_a_default_argument_left_out_is_a_constant_not_an_input() -> None:
    graph = capture(WithOutputObject(), (torch.randn(4, 5, 6),), capture="export")
    assert graph.inputs == ("tokens",)


class Unexportable(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.gate(x)
        return h * 2 if h.sum() > 0 else h


def test_when_both_captures_fail_one_line_names_the_line_and_the_fix() -> None:
    with pytest.raises(GraphCaptureError) as info:
        capture(Unexportable(), (torch.randn(4, 4),))
    message = str(info.value)
    assert "\n" not in message
    assert "neither torch.fx nor torch.export" in message and "h.sum() > 0" in message
    assert "data-dependent" in message


def test_export_needs_a_batch_of_two() -> None:
    with pytest.raises(GraphCaptureError, match="at least 2 samples"):
        capture(WithOutputObject(), ModelInputs(args=(torch.randn(1, 5, 6),)), capture="export")


def test_unknown_capture_method() -> None:
    with pytest.raises(GraphCaptureError, match="unknown capture method"):
        capture(WithOutputObject(), (torch.randn(2, 5, 6),), capture="jit")
