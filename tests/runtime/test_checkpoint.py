"""Checkpoints in one process (ranks as threads): a save/load round trip, and partial checkpoints refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from graphpipe.errors import TrainingError
from graphpipe.runtime.checkpoint import COMPLETE, latest_complete
from graphpipe.runtime.trainer import PipelineTrainer
from tests.runtime.helpers import run_threads
from tests.runtime.scenarios import SCENARIOS, in_memory_trainers, reference

NAME = "dp_stage3"  # a data-parallel stage: only its first rank writes the stage file


def _trainers() -> list[PipelineTrainer]:
    return in_memory_trainers(NAME)


def _steps(trainers: list[PipelineTrainer], batches: list, save_to: Path | None = None) -> list[float]:
    def body(rank: int) -> list[float]:
        losses = [trainers[rank].step(inputs, targets) for inputs, targets in batches]
        if save_to is not None:
            trainers[rank].save(str(save_to))
        return losses

    return run_threads(len(trainers), body)[0]


def test_save_then_load_in_fresh_trainers_continues_like_uninterrupted_training(tmp_path: Path) -> None:
    batches = SCENARIOS[NAME].make_batches(4)
    first = _steps(_trainers(), batches[:2], save_to=tmp_path / "step_2")
    assert sorted(p.name for p in (tmp_path / "step_2").iterdir()) == [
        "complete", "rank_0_rng.pt", "rank_1_rng.pt", "rank_2_rng.pt", "stage_0.pt", "stage_1.pt"]
    fresh = _trainers()
    for trainer in fresh:
        trainer.load(str(tmp_path / "step_2"))
        assert trainer.step_count == 2
    second = _steps(fresh, batches[2:])
    expected, _ = reference(SCENARIOS[NAME], 4)
    assert first + second == pytest.approx(expected, rel=1e-5)
    state = torch.load(tmp_path / "step_2" / "stage_0.pt", weights_only=True)
    assert set(state["model"]) == {name for name, _ in fresh[0].named_parameters()}
    assert latest_complete(tmp_path) == tmp_path / "step_2"


def test_a_checkpoint_without_its_complete_marker_is_refused(tmp_path: Path) -> None:
    trainers = _trainers()
    _steps(trainers, SCENARIOS[NAME].make_batches(1), save_to=tmp_path / "step_1")
    (tmp_path / "step_1" / COMPLETE).unlink()
    assert latest_complete(tmp_path) is None
    with pytest.raises(TrainingError, match="not a complete checkpoint"):
        _trainers()[0].load(str(tmp_path / "step_1"))


def test_state_dict_uses_the_original_parameter_names() -> None:
    trainers = _trainers()
    names = [set(t.state_dict()) for t in trainers]
    assert names[0] == names[1]  # the two data-parallel ranks of stage 0
    whole = {name for name, _ in SCENARIOS[NAME].model().named_parameters()}
    assert names[0] | names[2] == whole and not names[0] & names[2]


def test_step_refuses_a_batch_of_the_wrong_size() -> None:
    trainer = _trainers()[2]
    inputs, targets = SCENARIOS[NAME].make_batches(1)[0]
    with pytest.raises(TrainingError, match=r"mini-batches of 8 samples, got input 'x' with 4 .* or a multiple of 8"):
        trainer.step(inputs[:4], targets[:4])
    with pytest.raises(TrainingError, match="got input 'x' with 12"):
        trainer.step(torch.cat([inputs, inputs[:4]]), torch.cat([targets, targets[:4]]))
