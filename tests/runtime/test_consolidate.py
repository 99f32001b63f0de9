"""`graphpipe export`: a checkpoint's stages gathered into the model's own state_dict, loadable on one device:
original names, a tied weight once (safetensors) or under each name (.pt), no non-persistent buffer, and a
parameter the forward never reads reported as not held."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_model
from torch import nn

from graphpipe.cli import export_cmd
from graphpipe.errors import InputFileError, UsageError
from graphpipe.runtime.comm import InMemoryHub
from graphpipe.runtime.consolidate import consolidate, write_consolidated
from graphpipe.runtime.model_keys import model_keys
from graphpipe.runtime.trainer import PipelineTrainer
from tests.cli.run_command import run_command
from tests.runtime.helpers import by_target, plan_from, run_threads


class TiedHead(nn.Module):
    """An embedding tied to the output layer, a non-persistent buffer and a parameter the forward never reads."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.body = nn.Sequential(nn.Linear(16, 16), nn.Tanh())
        self.head = nn.Linear(16, 50, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("scale", torch.full((16,), 0.5), persistent=False)
        self.unused = nn.Linear(3, 3)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.embed(tokens).mean(1)) * self.scale)


def _trained(tmp_path: Path) -> tuple[dict[str, torch.Tensor], Path]:
    """Two steps of a 2-stage split (the tied weight in both stages), saved; the trained tensors."""
    torch.manual_seed(0)
    plan = plan_from(TiedHead(), by_target([("embed", 0), ("body", 0), ("head", 1)]), [(0,), (1,)],
                     micro_batch_size=2, global_batch_size=4)
    hub = InMemoryHub(2, timeout_s=15)
    trainers = []
    for rank in range(2):
        torch.manual_seed(0)
        trainers.append(PipelineTrainer(TiedHead(), plan, optimizer=lambda ps: torch.optim.Adam(ps, lr=1e-2),
                                        loss_fn=lambda out, target: nn.functional.cross_entropy(out, target),
                                        transport=hub.transport(rank), rank=rank))
    tokens, targets = torch.randint(0, 50, (4, 3)), torch.randint(0, 50, (4,))

    def body(rank: int) -> None:
        for _ in range(2):
            trainers[rank].step(tokens, targets)
        trainers[rank].save(str(tmp_path / "ckpt" / "step_2"))

    run_threads(2, body)
    trained = {key: value.detach().clone() for trainer in trainers for key, value in trainer.named_parameters()}
    return trained, tmp_path / "ckpt"


def test_model_keys_names_the_tied_weight_and_leaves_out_non_persistent_buffers() -> None:
    keys = model_keys(TiedHead())
    assert "scale" not in keys["keys"] and keys["aliases"] == {"head.weight": "embed.weight"}


def test_an_export_loads_into_the_model_on_one_device(tmp_path: Path) -> None:
    trained, ckpt = _trained(tmp_path)
    model = consolidate(ckpt)  # the checkpoint directory: its newest intact step
    assert model.step == 2 and model.aliases == {"head.weight": "embed.weight"}
    assert model.missing == ("unused.weight", "unused.bias") and "scale" not in model.tensors
    assert list(model.tensors) == ["embed.weight", "body.0.weight", "body.0.bias"]
    for suffix in (".safetensors", ".pt"):
        path = write_consolidated(model, tmp_path / f"model{suffix}")
        fresh = TiedHead()
        if suffix == ".safetensors":
            missing, unexpected = load_model(fresh, path, strict=False)
        else:
            missing, unexpected = fresh.load_state_dict(torch.load(path, weights_only=True), strict=False)
        assert sorted(missing) == ["unused.bias", "unused.weight"] and not unexpected
        assert fresh.head.weight is fresh.embed.weight
        for key, value in trained.items():
            torch.testing.assert_close(dict(fresh.named_parameters())[key], value, rtol=0, atol=0)


def test_graphpipe_export_writes_the_file_and_refuses_what_is_not_a_checkpoint(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, ckpt = _trained(tmp_path)
    out = tmp_path / "model.safetensors"
    assert run_command(export_cmd, ["export", str(ckpt / "step_2"), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "step 2" in text and "tied: head.weight is embed.weight" in text and "unused.weight" in text
    assert out.stat().st_size > 0
    with pytest.raises(InputFileError, match="is not a checkpoint"):
        run_command(export_cmd, ["export", str(tmp_path / "nothing")])
    with pytest.raises(UsageError, match=r"export writes \.safetensors or \.pt"):
        run_command(export_cmd, ["export", str(ckpt), "-o", str(tmp_path / "model.bin")])
