"""A parametrised tensor (weight norm) built without weights gets values on one rank: its module's own
`reset_parameters` under the module's seed, then the parametrisation's right inverse."""

from __future__ import annotations

import torch
from torch import nn

import graphpipe as gp
from graphpipe.runtime.materialize import module_seed


def test_a_weight_normed_convolution_is_initialised_as_its_module_would_be() -> None:
    with gp.empty_weights():
        model = nn.Sequential(nn.utils.parametrizations.weight_norm(nn.Conv1d(4, 4, 3), dim=2))
    gp.materialize(model, seed=3)
    originals = dict(model[0].parametrizations.weight.named_parameters())
    assert set(originals) == {"original0", "original1"}
    assert all(torch.isfinite(value).all() for value in originals.values())
    reference = nn.Conv1d(4, 4, 3)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(module_seed(3, "0"))
        reference.reset_parameters()
    torch.testing.assert_close(model[0].weight, reference.weight, rtol=1e-6, atol=1e-7)
