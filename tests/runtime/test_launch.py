"""The launcher names the failed rank from torchrun's summary or the rank's own error line."""

from __future__ import annotations

import os
import sys

import pytest

from graphpipe.runtime.launch import _Relay, parse_failure, torchrun_command

TORCHRUN_SUMMARY = """
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
graphpipe.train FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-01-01_00:00:00
  host      : box
  rank      : 2 (local_rank: 2)
  exitcode  : -9 (pid: 4242)
  error_file: <N/A>
============================================================
"""


def test_a_killed_rank_is_named_with_its_signal() -> None:
    result = parse_failure(1, "train: 40%\n" + TORCHRUN_SUMMARY)
    assert (result.failed_rank, result.rank_exitcode) == (2, -9)
    assert result.describe() == "rank 2 failed (killed by SIGKILL); torchrun stopped the other ranks"


def test_a_rank_that_raised_is_named_with_its_message() -> None:
    output = "graphpipe train: rank 1: error: the plan was made for 3 ranks\n" + TORCHRUN_SUMMARY.replace(
        "rank      : 2 (local_rank: 2)", "rank      : 1 (local_rank: 1)").replace("-9", "1")
    result = parse_failure(1, output)
    assert result.failed_rank == 1
    assert result.describe() == ("rank 1 failed (exit code 1): the plan was made for 3 ranks; torchrun stopped "
                                 "the other ranks")


def test_success_and_unknown_failures() -> None:
    assert parse_failure(0, "").failed_rank is None
    assert "exited with code 3" in parse_failure(3, "nothing useful").describe()


def test_torchrun_command_runs_the_train_module_with_this_python() -> None:
    command = torchrun_command(4, ["--plan", "p.json"])
    assert command[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert "--nproc-per-node=4" in command
    assert command[-4:] == ["-m", "graphpipe.train", "--plan", "p.json"]


def test_the_rank_that_broke_the_others_is_named_not_torchruns_first_observation() -> None:
    """All ranks seen failing at once: torchrun's root cause is rank 0, which only lost its peer."""
    failures = """
Failures:
[1]:
  time      : 2026-01-01_00:00:00
  host      : box
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 4243)  (SIGKILL)
  error_file: <N/A>
[2]:
  time      : 2026-01-01_00:00:00
  host      : box
  rank      : 2 (local_rank: 2)
  exitcode  : 1 (pid: 4244)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-01-01_00:00:00
  host      : box
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 4242)
"""
    lost = "graphpipe train: rank 0: error: rank 0: receive from rank 1 failed (closed); rank 1 probably died\n"
    result = parse_failure(1, lost + failures)
    assert (result.failed_rank, result.rank_exitcode) == (1, -9)
    own = "graphpipe train: rank 2: error: stage 1 ran out of memory\n"
    result = parse_failure(1, lost + own + failures.replace("-9 (pid: 4243)  (SIGKILL)", "1 (pid: 4243)"))
    assert result.failed_rank == 2 and result.message == "stage 1 ran out of memory"


def test_a_rank_torchrun_stopped_is_not_named_when_another_failed_of_its_own_accord() -> None:
    """torchrun ends the other ranks with SIGTERM once one fails: the rank with the error is the one to name."""
    stopped = TORCHRUN_SUMMARY.replace("rank      : 2 (local_rank: 2)", "rank      : 0 (local_rank: 0)").replace(
        "-9 (pid: 4242)", "-15 (pid: 4242)")
    own = "graphpipe train: rank 1: error: this model's graph is not the one the plan was made for\n"
    result = parse_failure(1, own + stopped)
    assert result.failed_rank == 1 and result.message.startswith("this model's graph")
    alone = parse_failure(1, stopped)
    assert (alone.failed_rank, alone.rank_exitcode) == (0, -15)


def test_the_relay_shows_the_ranks_output_but_not_torchruns_own_failure_report(
        capsys: pytest.CaptureFixture[str]) -> None:
    """torchrun's traceback and summary after a rank failed are held back (the launcher says it in one line);
    the rank's own error before it stays on stderr, and the tail keeps everything for `parse_failure`."""
    ranks = "train:   0%|          | 0/1graphpipe train: rank 0: error: rank 0: the loss is a vector\n"
    report = ("E1207 10:09:20.515000 2485 torch/distributed/elastic/multiprocessing/api.py:1002] failed "
              "(exitcode: 1) local_rank: 0 (pid: 2491) of binary: python\nTraceback (most recent call last):\n"
              + TORCHRUN_SUMMARY.replace("-9", "1"))
    read_fd, write_fd = os.pipe()
    relay = _Relay(read_fd)
    relay.start()
    os.write(write_fd, ranks.encode())
    os.write(write_fd, report.encode())
    os.close(write_fd)
    relay.join(timeout=5)
    assert capsys.readouterr().err == ranks
    assert parse_failure(1, relay.tail).message == "rank 0: the loss is a vector"


def test_a_signal_the_caller_ignores_stays_ignored_while_supervising() -> None:
    """`nohup graphpipe train ... &`: nohup ignores SIGHUP, and the launcher must not take it back."""
    import signal

    from graphpipe.runtime.launch import _StopSignals

    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with _StopSignals():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL  # still supervised
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)
