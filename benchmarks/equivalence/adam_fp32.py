"""Why fp32 Adam has a looser tolerance: the same drift appears on one device, without any pipeline.

    .venv/bin/python benchmarks/equivalence/adam_fp32.py

One device, one model, the same mini-batches; the only change is summing the gradient over two
halves of each mini-batch (gradient accumulation, what a pipeline's micro-batches do) instead of
the whole mini-batch at once. Reported: the largest relative error of any parameter tensor
(norm-wise) after 10 steps, for SGD and Adam, in fp32 and fp64.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

STEPS = 10


def make_model() -> nn.Module:
    """A CNN as ResNets are built: the second convolution's bias is cancelled by the normalisation after it
    (a per-sample GroupNorm here, so splitting the batch changes nothing but the summation order), so its
    true gradient is zero and what it gets is rounding noise."""
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(inplace=True), nn.Conv2d(8, 8, 3, padding=1),
                         nn.GroupNorm(8, 8), nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(8, 4))


def train(model: nn.Module, optimizer_name: str, chunks: int, batches: list[tuple[torch.Tensor, torch.Tensor]]
          ) -> nn.Module:
    model = copy.deepcopy(model)
    params = list(model.parameters())
    optimizer = torch.optim.Adam(params, lr=1e-2) if optimizer_name == "adam" else torch.optim.SGD(params, lr=1e-2)
    for x, y in batches:
        optimizer.zero_grad()
        for xs, ys in zip(x.chunk(chunks), y.chunk(chunks)):
            (nn.functional.mse_loss(model(xs), ys) / chunks).backward()
        optimizer.step()
    return model


def worst_error(a: nn.Module, b: nn.Module) -> tuple[float, str]:
    """The largest norm-wise relative error of a parameter tensor, and its name."""
    errors = [(float((pa.detach() - pb.detach()).norm() / pb.detach().norm().clamp_min(1e-30)), name)
              for (name, pa), pb in zip(a.named_parameters(), b.parameters())]
    return max(errors)


def main() -> None:
    print("| dtype | optimizer | worst relative error, whole vs 2 accumulated halves | in |")
    print("|---|---|---|---|")
    for dtype in (torch.float32, torch.float64):
        torch.manual_seed(0)
        model = make_model().to(dtype)
        gen = torch.Generator().manual_seed(1)
        batches = [(torch.randn(16, 3, 8, 8, generator=gen).to(dtype), torch.randn(16, 4, generator=gen).to(dtype))
                   for _ in range(STEPS)]
        for name in ("sgd", "adam"):
            error, where = worst_error(train(model, name, 2, batches), train(model, name, 1, batches))
            print(f"| {str(dtype).removeprefix('torch.')} | {name} | {error:.2g} | {where} |")


if __name__ == "__main__":
    main()
