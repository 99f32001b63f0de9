"""The model zoo: every builder's contract, presets, overrides, determinism, meta construction."""

from __future__ import annotations

import pytest
import torch

from graphpipe.errors import ModelLoadError
from graphpipe.models import ZOO_NAMES, ZooModel, load_model, zoo_config

PAPER_PARAMS_M = {"mmt": 407.2, "dlrm": 733.2, "candle_uno": 516.0, "transformer": 404.1, "two_branch": 102.8}


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_tiny_model_trains_one_step(name: str) -> None:
    zoo = load_model(name)
    assert isinstance(zoo, ZooModel)
    model, inputs, targets, loss_fn = zoo
    assert isinstance(inputs, tuple) and all(x.shape[0] == zoo.batch_size for x in inputs)
    loss = loss_fn(model(*inputs), targets)
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_same_seed_same_model_and_batch(name: str) -> None:
    first, second, other = load_model(name, seed=3), load_model(name, seed=3), load_model(name, seed=4)
    for a, b in zip(first.model.state_dict().values(), second.model.state_dict().values()):
        assert torch.equal(a, b)
    assert all(torch.equal(a, b) for a, b in zip(first.inputs, second.inputs))
    assert torch.equal(first.targets, second.targets)
    assert not all(torch.equal(a, b) for a, b in zip(first.model.parameters(), other.model.parameters()))


def test_loading_does_not_disturb_the_global_random_state() -> None:
    torch.manual_seed(11)
    expected = torch.rand(3)
    torch.manual_seed(11)
    load_model("toy_chain", seed=5)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("name", sorted(PAPER_PARAMS_M))
def test_paper_preset_has_the_paper_size_and_allocates_nothing_on_meta(name: str) -> None:
    model, inputs, _, _ = load_model(name, "paper", device="meta")
    num_params = sum(p.numel() for p in model.parameters())
    assert num_params / 1e6 == pytest.approx(PAPER_PARAMS_M[name], abs=0.1)
    assert all(t.is_meta for t in [*model.parameters(), *inputs])


def test_paper_configurations_match_the_paper() -> None:
    mmt = zoo_config("mmt", "paper")
    assert (mmt.num_branches, mmt.num_layers, mmt.seq_len, mmt.hidden, mmt.num_heads, mmt.ffn_hidden) == (
        4, 8, 256, 1024, 16, 4096)
    dlrm = zoo_config("dlrm", "paper")
    assert (dlrm.num_branches, dlrm.num_sparse_branches, dlrm.num_layers, dlrm.hidden) == (7, 7, 4, 4096)
    assert (dlrm.embedding_dim, dlrm.bag_size, dlrm.num_embeddings) == (64, 100, 1_000_000)
    uno = zoo_config("candle_uno", "paper")
    assert (uno.num_branches, uno.num_layers, uno.hidden) == (7, 4, 4096)
    assert zoo_config("transformer", "paper").num_layers == 32
    two = zoo_config("two_branch", "paper")
    assert (two.num_branches, two.num_layers) == (2, 4)


def test_overrides_and_batch_size_change_the_model() -> None:
    model, inputs, targets, _ = load_model("candle_uno", batch_size=6, num_branches=3, num_layers=2)
    assert len(inputs) == 3 and inputs[0].shape[0] == 6 and targets.shape[0] == 6
    assert len(model.branches) == 3 and len(model.branches[0]) == 4  # 2 x (Linear, ReLU)
    sparse = load_model("dlrm", batch_size=2).inputs[-1]
    assert sparse.dtype == torch.int64 and sparse.shape == (2, zoo_config("dlrm").bag_size)


def test_diamond_merges_by_cat_or_add() -> None:
    for merge in ("add", "cat"):
        model, inputs, targets, _ = load_model("toy_diamond", merge=merge)
        assert model(*inputs).shape == targets.shape
    with pytest.raises(ModelLoadError, match="merge"):
        load_model("toy_diamond", merge="mul")


def test_bad_specs_say_what_to_change() -> None:
    with pytest.raises(ModelLoadError, match="choose one of mmt"):
        load_model("resnet")
    with pytest.raises(ModelLoadError, match="no preset 'huge'"):
        load_model("mmt", "huge")
    with pytest.raises(ModelLoadError, match="num_branches"):
        load_model("mmt", hidden_size=3)
    with pytest.raises(ModelLoadError, match=">= 1"):
        load_model("mmt", batch_size=0)
