"""Start `python -m graphpipe.train` on this machine with torchrun, supervise it, and name the rank that failed.

torchrun stops every rank when one exits non-zero and prints a summary whose "Root
Cause" names the first failed rank and its exit code; `launch` passes the output through
and parses that summary (or a rank's own `rank R: error:` line) into a `LaunchResult`.
torchrun runs in a session of its own and its ranks in theirs, so the launcher owns their
end: on SIGINT, SIGTERM or SIGHUP it stops torchrun and every process under it (SIGTERM,
then SIGKILL after a grace period) and raises `Stopped`; a signal the caller ignores (nohup's SIGHUP)
stays ignored, and torchrun and the ranks, in sessions of their own, never see a terminal's hangup.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from graphpipe.runtime.process_tree import stop_process_tree

_ROOT_CAUSE = re.compile(r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.DOTALL)
_FAILURE = re.compile(r"rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-?\d+)")
_RANK_ERROR = re.compile(r"graphpipe train: rank (\d+): error: (.*)")
_PEER_DIED = "probably died"  # how a rank says it failed only because a peer did (runtime/comm.py)
# torchrun's own log once a rank has failed: it stops the others, then prints its traceback and a summary
_TORCHRUN_REPORT = re.compile(r"^[WE]\d{4} [^\n]*torch/distributed/elastic/[^\n]*(?:closing signal|failed \(exitcode)",
                              re.MULTILINE)


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchResult:
    returncode: int
    failed_rank: int | None = None
    rank_exitcode: int | None = None
    message: str = ""  # the failed rank's own error line, when it printed one

    def describe(self) -> str:
        """One sentence for the user: which rank failed and how."""
        if self.failed_rank is None:
            return f"torchrun exited with code {self.returncode}; see the log above"
        how = f"exit code {self.rank_exitcode}"
        if self.rank_exitcode is not None and self.rank_exitcode < 0:
            how = f"killed by {signal.Signals(-self.rank_exitcode).name}"
        detail = f": {self.message}" if self.message else ""
        return f"rank {self.failed_rank} failed ({how}){detail}; torchrun stopped the other ranks"


def torchrun_command(nproc: int, train_args: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "--max-restarts=0", "--monitor-interval=0.5", "-m", "graphpipe.train", *train_args]


class Stopped(KeyboardInterrupt):
    """The launcher got SIGINT, SIGTERM or SIGHUP and has stopped torchrun and the workers."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def launch(nproc: int, train_args: Sequence[str], *, env: dict[str, str] | None = None) -> LaunchResult:
    """Run torchrun to completion, forwarding its output (and the ranks' stdout) to stderr; parse the
    failure summary. torchrun runs in its own session, so a Ctrl-C reaches only this process: on SIGINT,
    SIGTERM or SIGHUP the launcher stops torchrun and every worker, then raises `Stopped`."""
    child_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    read_fd, write_fd = os.pipe()
    relay = _Relay(read_fd)
    relay.start()
    proc: subprocess.Popen[bytes] | None = None
    with _StopSignals() as stop:
        try:
            try:
                proc = subprocess.Popen(torchrun_command(nproc, train_args), stdout=write_fd, stderr=write_fd,
                                        env=child_env, start_new_session=True)
            finally:
                os.close(write_fd)  # the children hold the pipe now; the relay sees EOF when they are gone
            stop.arm()  # a signal that came while torchrun started raises here, with `proc` known
            returncode = proc.wait()
        except BaseException:
            stop.disarm()  # a second Ctrl-C must not cut the clean-up short
            relay.mute()
            if proc is not None:
                stop_process_tree(proc)
            raise
        finally:
            relay.join(timeout=_RELAY_JOIN_S)
    return parse_failure(returncode, relay.tail)


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_RELAY_JOIN_S = 5.0


class _StopSignals:
    """While supervising, SIGINT, SIGTERM and SIGHUP raise `Stopped` (the default SIGTERM would end this
    process at once and leave torchrun and the workers running). Unarmed, a signal is only recorded,
    to be raised by `arm`: nothing is raised between starting torchrun and knowing its pid."""

    def __init__(self) -> None:
        self._armed = False
        self._received: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _StopSignals:
        if threading.current_thread() is threading.main_thread():  # signal handlers live in the main thread
            # a signal the caller ignores stays ignored: `nohup graphpipe train ... &` survives the logout
            self._previous = {sig: signal.signal(sig, self._handle) for sig in _STOP_SIGNALS
                              if signal.getsignal(sig) is not signal.SIG_IGN}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._previous.items():
            signal.signal(sig, old)

    def _handle(self, signum: int, frame: Any) -> None:
        self._received = signum
        if self._armed:
            raise Stopped(signum)

    def arm(self) -> None:
        self._armed = True
        if self._received is not None:
            raise Stopped(self._received)

    def disarm(self) -> None:
        self._armed = False


class _Relay(threading.Thread):
    """Copies torchrun's output to stderr and keeps its tail for `parse_failure`; muted once the launcher
    stops the run, so an interrupt ends with one line, not every rank's traceback, and from torchrun's own
    report of a failed rank on (its traceback and summary; the ranks' own output before it is shown, and
    `LaunchResult.describe` says in one line what the report says), so the failed rank's error stays in view."""

    def __init__(self, fd: int) -> None:
        super().__init__(name="graphpipe-launch-relay", daemon=True)
        self._fd = fd
        self._muted = False
        self._at_line_start = True
        self.tail = ""

    def run(self) -> None:
        try:
            while chunk := os.read(self._fd, 65536):
                text = chunk.decode(errors="replace")
                self.tail = (self.tail + text)[-200_000:]
                if not self._muted:
                    report = _TORCHRUN_REPORT.search(text)
                    self._write(text[:report.start()] if report else text)
                    if report:
                        self.mute()
        finally:
            os.close(self._fd)

    def _write(self, text: str) -> None:
        if text:
            sys.stderr.write(text)
            sys.stderr.flush()
            self._at_line_start = text.endswith("\n")

    def mute(self) -> None:
        """Stop forwarding; end a half-written line (a progress bar) so what follows starts a line."""
        self._muted = True
        if not self._at_line_start:
            sys.stderr.write("\n")
            sys.stderr.flush()


def parse_failure(returncode: int, output: str) -> LaunchResult:
    """The rank that failed first in fact: torchrun's "Root Cause" is the first failure it observed,
    and a rank killed by a signal or by its own error often exits after the peers it broke. So a rank
    killed by a signal wins, then a rank whose error is its own (not "rank K probably died"), then
    torchrun's choice. SIGTERM is what torchrun stops the other ranks with once one has failed, so a rank
    it ended counts as killed only when no rank failed of its own accord."""
    if returncode == 0:
        return LaunchResult(returncode=0)
    messages = {int(rank): text.strip() for rank, text in _RANK_ERROR.findall(output)}
    codes = {int(rank): int(code) for rank, code in _FAILURE.findall(output)}
    root = _ROOT_CAUSE.search(output)
    order = [int(root[1])] if root else []
    order += sorted(codes)
    signalled = [rank for rank in order if codes.get(rank, 0) < 0 and codes[rank] != -signal.SIGTERM]
    own = [rank for rank in dict.fromkeys(order + sorted(messages)) if rank in messages
           and _PEER_DIED not in messages[rank]]
    stopped = [rank for rank in order if codes.get(rank) == -signal.SIGTERM]
    candidates = signalled or own or [rank for rank in order if rank not in stopped] or order or sorted(messages)
    if not candidates:
        return LaunchResult(returncode=returncode)
    chosen = candidates[0]
    return LaunchResult(returncode=returncode, failed_rank=chosen, rank_exitcode=codes.get(chosen),
                        message=messages.get(chosen, ""))
