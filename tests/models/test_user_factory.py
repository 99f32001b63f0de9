"""`path/to/file.py:factory` models: the user's contract, and what graphpipe does around it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from graphpipe.errors import ModelLoadError
from graphpipe.models import load_model

FACTORIES = '''
import torch
from torch import nn

def plain():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    return model, torch.randn(5, 3), torch.randn(5, 1), nn.MSELoss()

def sized(batch_size=2, width=3, device=None):
    model = nn.Linear(width, 1)
    x = torch.randn(batch_size, width)
    return model.to(device), (x.to(device),), torch.zeros(batch_size, 1), nn.MSELoss()

def broken():
    return nn.Linear(2, 2), torch.randn(2, 2)

def failing():
    raise ValueError("no data here")

class Masked(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x, mask=None, scale=1.0):
        out = self.fc(x) * scale
        return out if mask is None else out * mask

def keyword(batch_size=4):
    inputs = {"x": torch.randn(batch_size, 3), "mask": torch.ones(batch_size, 2)}
    return Masked(), inputs, torch.zeros(batch_size, 2), nn.MSELoss()

def no_tensor():
    return Masked(), {"scale": 2.0}, torch.zeros(2, 2), nn.MSELoss()
'''


@pytest.fixture()
def user_file(tmp_path: Path) -> Path:
    path = tmp_path / "user_models.py"
    path.write_text(FACTORIES)
    return path


def test_factory_result_becomes_a_zoo_model(user_file: Path) -> None:
    model, inputs, targets, loss_fn = load_model(f"{user_file}:plain")
    assert isinstance(inputs, tuple) and inputs[0].shape == (5, 3)
    assert loss_fn(model(*inputs), targets).dim() == 0


def test_batch_size_the_factory_cannot_make_repeats_its_rows(user_file: Path) -> None:
    base = load_model(f"{user_file}:plain")
    bigger = load_model(f"{user_file}:plain", batch_size=7)
    assert bigger.inputs[0].shape == (7, 3) and bigger.targets.shape == (7, 1)
    assert torch.equal(bigger.inputs[0][5:], base.inputs[0][:2])


def test_options_the_factory_takes_are_passed(user_file: Path) -> None:
    zoo = load_model(f"{user_file}:sized", batch_size=4, width=6)
    assert zoo.inputs[0].shape == (4, 6)
    assert load_model(f"{user_file}:sized", device="meta").inputs[0].is_meta
    with pytest.raises(ModelLoadError, match="takes no option"):
        load_model(f"{user_file}:sized", depth=3)


def test_same_seed_same_user_model(user_file: Path) -> None:
    first, second = load_model(f"{user_file}:sized", seed=1), load_model(f"{user_file}:sized", seed=1)
    assert torch.equal(first.model.weight, second.model.weight)


def test_bad_user_specs_say_what_to_change(user_file: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="no factory"):
        load_model(str(user_file))
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(f"{tmp_path / 'missing.py'}:plain")
    with pytest.raises(ModelLoadError, match=r"no callable 'nothing'.*'plain'"):
        load_model(f"{user_file}:nothing")
    with pytest.raises(ModelLoadError, match="length 2"):
        load_model(f"{user_file}:broken")
    with pytest.raises(ModelLoadError, match="no data here"):
        load_model(f"{user_file}:failing")


def test_keyword_inputs_are_kept_and_resized(user_file: Path) -> None:
    zoo = load_model(f"{user_file}:keyword", batch_size=6)
    assert set(zoo.inputs) == {"x", "mask"} and zoo.inputs["x"].shape == (6, 3) and zoo.batch_size == 6
    assert zoo.model(**zoo.inputs).shape == (6, 2)
    with pytest.raises(ModelLoadError, match="keyword"):
        load_model(f"{user_file}:no_tensor")
