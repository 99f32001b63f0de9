"""--share-gpu and --log-every, decided before any process starts: more ranks than GPUs is refused with the way
out named, --share-gpu lets them share; the steps that sum the loss and report."""

from __future__ import annotations

import argparse

import pytest
import torch

from graphpipe.cli.train_cmd import _forwarded
from graphpipe.train import EVERY_STEP_UP_TO, LOG_EVERY_LONG, _reports, build_parser, cuda_devices_problem, log_every


def test_more_ranks_than_gpus_names_share_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    problem = cuda_devices_problem(4)
    assert problem is not None and "4 ranks" in problem and "1 CUDA device" in problem and "--share-gpu" in problem
    assert cuda_devices_problem(4, share_gpu=True) is None
    assert cuda_devices_problem(1) is None


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["--plan", "plan.json", *argv])


def test_log_every_defaults_to_every_step_of_a_short_run() -> None:
    assert log_every(_args("--steps", str(EVERY_STEP_UP_TO))) == 1
    assert log_every(_args("--steps", str(EVERY_STEP_UP_TO + 1))) == LOG_EVERY_LONG
    assert log_every(_args("--steps", "1000", "--log-every", "7")) == 7


def test_reported_steps_are_every_nth_the_first_the_last_and_the_saved() -> None:
    args = _args("--steps", "10", "--log-every", "4", "--checkpoint-dir", "ckpt", "--save-every", "3")
    reported = [done for done in range(1, 11) if _reports(args, done, 4, evaluating=False)]
    assert reported == [1, 3, 4, 6, 8, 9, 10]


def test_share_gpu_and_log_every_reach_the_ranks() -> None:
    from graphpipe.cli.main import build_parser as cli_parser

    args = cli_parser().parse_args(["train", "--model", "mmt", "--nproc", "2", "--share-gpu", "--log-every", "3"])
    forwarded = _forwarded(args)
    assert "--share-gpu" in forwarded and forwarded[forwarded.index("--log-every") + 1] == "3"
