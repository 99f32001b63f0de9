"""A value whose first dimension flattens the batch with the tokens (`[batch x tokens, width]`, a mixture-of-
experts layer's input) crosses stages: the sender cuts its rows per sample, data-parallel senders included, and
training equals one device."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.corpus.training import train_both
from tests.runtime.helpers import by_target, plan_from

TOKENS = 3


class TokenMixer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 6)
        self.expert = nn.Linear(6, 6)
        self.head = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = self.embed(x).reshape(-1, 6)  # [batch x tokens, 6]: the stage boundary
        mixed = torch.relu(self.expert(flat))
        return self.head(mixed.reshape(-1, TOKENS, 6).mean(1))


@pytest.mark.parametrize(("ranks", "micro_batch"), [([(0,), (1,)], 2), ([(0, 1), (2,)], 4)])
def test_a_flattened_value_crosses_stages_like_one_device(ranks: list[tuple[int, ...]], micro_batch: int) -> None:
    torch.manual_seed(0)
    model = TokenMixer().double()
    plan = plan_from(model, by_target([("embed", 0), ("reshape_1", 1), ("reshape", 0), ("expert", 1)]), ranks,
                     micro_batch_size=micro_batch, global_batch_size=8)
    assert any("reshape" in edge.tensors for edge in plan.edges)
    batches = [(torch.randn(8, TOKENS, 4, dtype=torch.float64), torch.randn(8, 2, dtype=torch.float64))
               for _ in range(2)]
    losses, expected, worst = train_both(model, plan, batches, nn.functional.mse_loss)
    assert losses == pytest.approx(expected, rel=1e-12)
    assert worst < 1e-12
