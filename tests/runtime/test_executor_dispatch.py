"""The executor runs actions through its dispatch table and refuses a kind it has no handler for."""

from __future__ import annotations

import pytest
import torch

from graphpipe.errors import TrainingError
from graphpipe.schedule.action import ActionKind
from tests.runtime.scenarios import SCENARIOS, in_memory_trainers


def test_every_action_kind_has_a_handler() -> None:
    trainer = in_memory_trainers("chain2")[0]
    assert set(trainer.executor.handlers) == set(ActionKind)


def test_a_kind_without_handler_is_refused_before_any_action_runs() -> None:
    torch.set_num_threads(1)
    trainer = in_memory_trainers("chain2")[0]  # stage 0; never reaches a send, so no peer thread is needed
    del trainer.executor.handlers[ActionKind.ALL_REDUCE]
    inputs, targets = SCENARIOS["chain2"].make_batches(1)[0]
    with pytest.raises(TrainingError, match=r"stage 0 has no handler for action kind ALL_REDUCE \(s0\.AR\)"):
        trainer.step(inputs, targets)
    assert trainer.executor.events == []
