"""Learning-rate schedules by name for `graphpipe train`; the Python API takes any `torch.optim.lr_scheduler`.

`lr_factor(kind, warmup_steps, total_steps)` is the multiplier of the base learning rate at each step, for
`torch.optim.lr_scheduler.LambdaLR`: a linear warm-up from 1/(warm-up + 1) of the rate to all of it over the
first `warmup_steps` steps, then `constant`, or a `linear` or `cosine` decay to 0 at `total_steps`. Every rank
builds the same schedule for its own optimizer and steps it after each optimizer step, so the whole model
follows one schedule, as on one device.
"""

from __future__ import annotations

import math
from collections.abc import Callable

SCHEDULES = ("constant", "linear", "cosine")


def lr_factor(kind: str, warmup_steps: int, total_steps: int) -> Callable[[int], float]:
    """The multiplier of the base rate after `step` optimizer steps (`LambdaLR`'s lambda)."""
    if kind not in SCHEDULES:
        raise ValueError(f"unknown learning-rate schedule {kind!r}; choose one of {', '.join(SCHEDULES)}")

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        if kind == "constant":
            return 1.0
        left = max(total_steps - warmup_steps, 1)
        done = min(step - warmup_steps, left) / left
        return 1.0 - done if kind == "linear" else 0.5 * (1.0 + math.cos(math.pi * done))

    return factor
