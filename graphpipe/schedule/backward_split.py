"""How a split backward's time divides between its halves: the input gradients (I) and the weight gradients (W).

A layer's backward is two products of the same size: the gradient of its input (grad_out @ weight) and
that of its weight (input^T @ grad_out), so I and W each cost half a backward (`INPUT_GRAD_SHARE`),
the split of Qi et al. (ICLR 2024) and of `torch.distributed.pipelining`'s zero-bubble schedules. A stage
that receives nothing from another stage (a source) has no input gradient to compute: its I is empty and
its W the whole backward. The zero-bubble generator places W's with these times and the simulator prices
I and W with them (`graphpipe.simulation.engine`).
"""

from __future__ import annotations

INPUT_GRAD_SHARE = 0.5  # of a backward's time, its input-gradient half; the weight-gradient half is the rest


def split_backward_ms(bwd_ms: float, receives_inputs: bool) -> tuple[float, float]:
    """(I, W) milliseconds of a backward of `bwd_ms`; `receives_inputs`: the stage has predecessors."""
    input_ms = bwd_ms * INPUT_GRAD_SHARE if receives_inputs else 0.0
    return input_ms, bwd_ms - input_ms
