"""batch_norm="sync" on gloo: three processes, BnNet's first stage on two data-parallel ranks.

Each micro-batch of that stage is normalised whole across the two processes (all-reduces in the
forward and the backward over the stage's process group), and the running statistics move once
per mini-batch; parameters and buffers equal the single-device reference of
tests/runtime/test_batch_norm.py (plain BatchNorm per micro-batch, gradient accumulation).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from tests.dist.harness import run_world
from tests.runtime.test_batch_norm import LR, MICRO, TOL, make_batches, make_model, make_plan, mse, reference

pytestmark = pytest.mark.dist
RANKS = [(0, 1), (2,)]
NUM_STEPS = 2


def train_sync(rank: int) -> dict[str, Any]:
    """Runs in each spawned rank: the losses and this rank's parameters and buffers (numpy, by name)."""
    from graphpipe.runtime.trainer import PipelineTrainer

    del rank
    model = make_model()
    trainer = PipelineTrainer(model, make_plan(model, RANKS), optimizer=lambda ps: torch.optim.SGD(ps, lr=LR),
                              loss_fn=mse, batch_norm="sync")
    losses = [trainer.step(x, y) for x, y in make_batches(NUM_STEPS)]
    return {"losses": losses, "state": {k: v.detach().numpy().copy() for k, v in trainer.state_dict().items()}}


def test_sync_batch_norm_on_gloo_equals_micro_batch_reference() -> None:
    per_rank = run_world(3, [("sync", train_sync, ())])["sync"]
    want_losses, want_params, want_buffers = reference(make_model(), make_batches(NUM_STEPS), MICRO)
    assert per_rank[0]["losses"] == pytest.approx(want_losses, rel=TOL)
    want = {**want_params, **want_buffers}
    seen = set()
    for rank, result in enumerate(per_rank):
        for name, value in result["state"].items():
            expected = want[name].double()
            error = float(np.linalg.norm(np.asarray(value, dtype=np.float64) - expected.numpy())
                          / max(float(expected.norm()), 1e-12))
            assert error < TOL, (rank, name, error)
            seen.add(name)
    assert seen == set(want)
