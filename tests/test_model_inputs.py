"""Example inputs as positional and keyword arguments: one normal form, one order of leaves."""

from __future__ import annotations

import pytest
import torch

from graphpipe.errors import GraphCaptureError
from graphpipe.model_inputs import ModelInputs, as_model_inputs


def test_every_form_becomes_model_inputs() -> None:
    x, m = torch.zeros(3, 2), torch.ones(3)
    assert as_model_inputs(x).args == (x,)
    assert as_model_inputs([x, m]).args == (x, m)
    keyword = as_model_inputs({"x": x, "mask": m})
    assert keyword.kwargs == {"x": x, "mask": m} and keyword.batch_size() == 3
    both = ModelInputs(args=(x,), kwargs={"mask": m})
    assert as_model_inputs(both) is both and [t.shape for t in both.leaves()] == [(3, 2), (3,)]


def test_map_tensors_keeps_the_structure() -> None:
    both = ModelInputs(args=(torch.zeros(2, 2), 5), kwargs={"mask": torch.ones(2)})
    doubled = both.map_tensors(lambda t: t.double())
    assert doubled.args[0].dtype == torch.float64 and doubled.args[1] == 5
    assert doubled.kwargs["mask"].dtype == torch.float64


def test_inputs_without_a_batch_tensor_are_refused() -> None:
    with pytest.raises(GraphCaptureError, match="no tensor"):
        as_model_inputs({"scale": 2.0}).batch_size()
    with pytest.raises(GraphCaptureError, match="string keys"):
        as_model_inputs({1: torch.zeros(2)})
    with pytest.raises(GraphCaptureError, match="tensor, a tuple"):
        as_model_inputs(3.0)
