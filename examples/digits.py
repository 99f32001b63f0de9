"""Handwritten digits with a two-input network: a real dataset that ships with scikit-learn (no download).

Each 8x8 image of scikit-learn's digits (1,797 images, 10 classes) enters as two inputs, its top and bottom
halves, each read by its own tower; a head classifies the joined features. graphpipe gives the towers stages
side by side. The data is split once, with a fixed seed, into 1,437 training and 360 test images.

    graphpipe plan --model examples/digits.py:factory --cluster local-cpu --devices 4 --mini-batch 64 -o digits.json
    graphpipe train --plan digits.json --nproc 4 --steps 300 --data examples/digits.py:train_data \\
        --eval-data examples/digits.py:test_data --eval-every 50 --checkpoint-dir digits-ckpt --log digits.jsonl
    graphpipe export digits-ckpt -o digits.safetensors
    python examples/digits.py evaluate digits.safetensors      # test accuracy on one device
    python examples/digits.py train-one-device --steps 300     # the same run on one device, to compare
    graphpipe plot-log digits.jsonl -o digits.png
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

NUM_TRAIN = 1437  # of 1,797 images; the other 360 are the test set
SPLIT_SEED = 2024
LEARNING_RATE = 1e-3  # graphpipe train's default --lr, which train-one-device uses too


class TwoHalves(nn.Module):
    """A tower per half image (32 pixels each), their features joined by a classifier head."""

    def __init__(self, width: int = 256) -> None:
        super().__init__()
        self.top = nn.Sequential(nn.Linear(32, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU())
        self.bottom = nn.Sequential(nn.Linear(32, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU())
        self.head = nn.Sequential(nn.Linear(2 * width, width), nn.ReLU(), nn.Linear(width, 10))

    def forward(self, top: torch.Tensor, bottom: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.top(top), self.bottom(bottom)], dim=1))


class Digits(Dataset[tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]]):
    """One split of the digits: ((top half, bottom half), label), pixels scaled to [0, 1]."""

    def __init__(self, part: str) -> None:
        from sklearn.datasets import load_digits

        images, labels = load_digits(return_X_y=True)
        order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(SPLIT_SEED))
        chosen = order[:NUM_TRAIN] if part == "train" else order[NUM_TRAIN:]
        pixels = torch.tensor(images, dtype=torch.float32)[chosen] / 16.0
        self.top, self.bottom = pixels[:, :32], pixels[:, 32:]
        self.labels = torch.tensor(labels, dtype=torch.int64)[chosen]

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
        return (self.top[index], self.bottom[index]), self.labels[index]


def train_data() -> Digits:
    return Digits("train")


def test_data() -> Digits:
    return Digits("test")


def factory(batch_size: int = 64, seed: int = 0, width: int = 256) -> tuple[Any, ...]:
    """The model (initialised from `seed`), a batch of training images, their labels and the loss."""
    torch.manual_seed(seed)
    model = TwoHalves(width)
    data = train_data()
    (top, bottom), labels = torch.utils.data.default_collate([data[i] for i in range(batch_size)])
    return model, (top, bottom), labels, nn.functional.cross_entropy


def accuracy(model: nn.Module, data: Digits) -> tuple[float, float]:
    """Mean loss and accuracy over every image of `data`, in eval mode on one device."""
    model.eval()
    with torch.no_grad():
        logits = model(data.top, data.bottom)
    return float(nn.functional.cross_entropy(logits, data.labels)), float((logits.argmax(1) == data.labels).float()
                                                                         .mean())


def train_one_device(steps: int, seed: int = 0, batch_size: int = 64) -> nn.Module:
    """The run `graphpipe train` makes, on one device: the same initial weights, Adam, mini-batches in the same
    order (`graphpipe.runtime.data.MiniBatches` with the same seed)."""
    from graphpipe.runtime.data import MiniBatches

    model = factory(batch_size, seed)[0]
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    batches = MiniBatches(train_data(), batch_size, seed)
    for step in range(steps):
        (top, bottom), labels = batches.at(step)
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(top, bottom), labels).backward()
        optimizer.step()
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description="The digits example on one device.")
    commands = parser.add_subparsers(dest="command", required=True)
    evaluate = commands.add_parser("evaluate", help="test loss and accuracy of exported weights")
    evaluate.add_argument("weights", help="a .safetensors file from `graphpipe export`")
    single = commands.add_parser("train-one-device", help="train as graphpipe train does, on one device")
    single.add_argument("--steps", type=int, default=300)
    single.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.command == "evaluate":
        from safetensors.torch import load_model

        model = factory()[0]
        load_model(model, args.weights)
    else:
        model = train_one_device(args.steps, args.seed)
    loss, correct = accuracy(model, test_data())
    print(f"test images: {len(test_data())}  loss: {loss:.4f}  accuracy: {correct:.2%}")


if __name__ == "__main__":
    main()
