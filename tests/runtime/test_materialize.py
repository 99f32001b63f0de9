"""Meta tensors get values by name, whoever asks: a seed per module name, or only the asked-for keys of a file."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
from torch import nn

from graphpipe.errors import TrainingError
from graphpipe.meta_weights import empty_weights, has_meta_tensors
from graphpipe.runtime.materialize import materialize, module_seed
from graphpipe.runtime.weights_file import WeightsFile
from tests.corpus.models import TiedTowers


class WithBuffers(nn.Module):
    """A BatchNorm (buffers set by reset_parameters) and a buffer computed at construction."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 6)
        self.norm = nn.BatchNorm1d(6)
        self.register_buffer("scale", torch.arange(6.0) + 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.a(x)) * self.scale


class NoInitialiser(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(3, 3))


def _empty(factory: type[nn.Module]) -> nn.Module:
    with empty_weights():
        return factory()


def test_empty_weights_puts_parameters_on_meta_and_keeps_buffers() -> None:
    model = _empty(WithBuffers)
    assert all(p.is_meta for p in model.parameters())
    assert torch.equal(model.scale, torch.arange(6.0) + 1) and not model.norm.running_var.is_meta
    assert has_meta_tensors(model) and not has_meta_tensors(WithBuffers())


def test_values_depend_on_the_name_only_not_on_who_asks() -> None:
    whole = _empty(TiedTowers)
    materialize(whole, seed=5)
    assert not has_meta_tensors(whole)
    parts = _empty(TiedTowers)
    materialize(parts, names=["right.2.weight", "embed.weight"], seed=5)
    assert parts.left[0].weight.is_meta  # nobody asked for it
    assert torch.equal(parts.right[2].weight, whole.right[2].weight)
    assert torch.equal(parts.embed.weight, whole.embed.weight)
    other_seed = _empty(TiedTowers)
    materialize(other_seed, names=["embed.weight"], seed=6)
    assert not torch.equal(other_seed.embed.weight, whole.embed.weight)
    assert module_seed(5, "left.0") != module_seed(5, "left.2")


def test_modules_initialise_as_their_own_initialisers_do() -> None:
    model = _empty(WithBuffers)
    materialize(model, seed=0)
    torch.manual_seed(module_seed(0, "a"))
    expected = nn.Linear(4, 6)  # the same draws: reset_parameters under the module's seed
    assert torch.equal(model.a.weight, expected.weight) and torch.equal(model.a.bias, expected.bias)
    assert torch.equal(model.norm.weight, torch.ones(6)) and torch.equal(model.norm.running_mean, torch.zeros(6))
    assert torch.equal(model.scale, torch.arange(6.0) + 1)  # real buffers are left as they are


def test_tied_weights_stay_tied() -> None:
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(5, 3)
            self.head = nn.Linear(3, 5, bias=False)
            self.head.weight = self.embed.weight

    model = _empty(Tied)
    materialize(model, names=["head.weight"], seed=1)
    assert model.head.weight is model.embed.weight and not model.embed.weight.is_meta


def test_a_parameter_no_initialiser_sets_is_named() -> None:
    model = _empty(NoInitialiser)
    with pytest.raises(TrainingError, match=r"NoInitialiser.table.*no reset_parameters.*--weights FILE"):
        materialize(model)


def test_unknown_names_are_refused() -> None:
    with pytest.raises(TrainingError, match="no parameter or buffer 'nope'"):
        materialize(_empty(WithBuffers), names=["nope"])


@pytest.mark.parametrize("kind", ["safetensors", "dcp"])
def test_weights_are_read_for_the_asked_names_only(kind: str, tmp_path: Path) -> None:
    source = TiedTowers().double()
    state = {name: tensor.detach().clone() for name, tensor in source.state_dict().items()}
    path = tmp_path / ("w.safetensors" if kind == "safetensors" else "w_dcp")
    if kind == "safetensors":
        save_file(state, str(path))
    else:
        dcp.save(state, checkpoint_id=str(path), no_dist=True)
    model = _empty(TiedTowers).double()
    materialize(model, names=["left.0.weight", "left.0.bias"], weights=path)
    assert torch.equal(model.left[0].weight, source.left[0].weight) and model.left[0].weight.dtype == torch.float64
    assert model.right[0].weight.is_meta
    assert WeightsFile(path).shapes["embed.weight"] == (50, 16)


def test_weights_that_do_not_fit_say_what_differs(tmp_path: Path) -> None:
    path = str(tmp_path / "w.safetensors")
    save_file({"left.0.weight": torch.zeros(2, 2)}, path)
    with pytest.raises(TrainingError, match=r"left.0.weight: \[2, 2\] in the file, \[16, 16\] in the model"):
        materialize(_empty(TiedTowers), names=["left.0.weight"], weights=path)
    with pytest.raises(TrainingError, match=r"lack 1 of the 2 tensors.*left.0.bias"):
        materialize(_empty(TiedTowers), names=["left.0.weight", "left.0.bias"], weights=path)
    with pytest.raises(TrainingError, match="does not exist"):
        WeightsFile(str(tmp_path / "missing.safetensors"))
