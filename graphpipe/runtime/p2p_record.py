"""A transport that records the launches a rank makes on NCCL, for `graphpipe.runtime.p2p_check`.

It wraps another transport (the in-process `InMemoryHub`'s, which moves the data, so a recorded run is a real
run) and writes down, call by call, what `DistTransport` launches on NCCL for the same calls: each call's
operations by the `launch` rule (`graphpipe.runtime.p2p_program.launches`), each channel on its own
communicator; the computation waits for a call's receives; a flush (and every all-reduce, which flushes
first) waits for the sends launched so far; an all-reduce is a collective the computation waits for.
`one_channel=True`, `hold_sends=True` (sends launched with the next receives, as a former rule did) and
another `launch` rule record variants the checker must refuse.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from graphpipe.runtime.comm import ACTIVATIONS, Handle, RecvSpec, Transport
from graphpipe.runtime.p2p_check import Op, Post, Step, Wait
from graphpipe.runtime.p2p_program import Launch, PeerOp, launches

__all__ = ["RecordingTransport", "coalesced"]

LaunchRule = Callable[[Sequence[PeerOp]], list[Launch]]


class RecordingTransport:
    """`inner`'s transport, recording this rank's program in `steps`."""

    def __init__(self, inner: Transport, *, launch: LaunchRule = launches, hold_sends: bool = False,
                 one_channel: bool = False) -> None:
        self.inner = inner
        self.rank = inner.rank
        self.device = inner.device
        self.launch = launch
        self.hold_sends = hold_sends
        self.one_channel = one_channel
        self.steps: list[Step] = []
        self._held: list[tuple[PeerOp, int]] = []
        self._unwaited_sends: list[int] = []

    def send(self, tensor: torch.Tensor, dst_rank: int, channel: int = ACTIVATIONS) -> None:
        self.inner.send(tensor, dst_rank, channel)
        self._held.append((PeerOp(True, dst_rank), self._lane(channel)))
        if not self.hold_sends:
            self._post([], self._lane(channel))

    def recv(self, shape: Sequence[int], dtype: torch.dtype, src_rank: int,
             channel: int = ACTIVATIONS) -> torch.Tensor:
        return self.recv_many([(shape, dtype, src_rank)], channel)[0]

    def recv_many(self, specs: Sequence[RecvSpec], channel: int = ACTIVATIONS) -> list[torch.Tensor]:
        waited = self._post([PeerOp(False, src) for _, _, src in specs], self._lane(channel))
        self.steps.append(Wait(tuple(waited)))
        return self.inner.recv_many(specs, channel)

    def all_reduce_sum_(self, tensor: torch.Tensor, ranks: Sequence[int]) -> None:
        if len(ranks) > 1:
            self.flush()
            self.steps.append(Post((Op("all_reduce", group=tuple(sorted(ranks))),)))
            self.steps.append(Wait((len(self.steps) - 1,)))
        self.inner.all_reduce_sum_(tensor, ranks)

    def all_reduce_sum_async(self, tensor: torch.Tensor, ranks: Sequence[int]) -> Handle:
        if len(ranks) <= 1:
            return self.inner.all_reduce_sum_async(tensor, ranks)
        self.steps.append(Post((Op("all_reduce", group=tuple(sorted(ranks))),)))
        return _RecordedWait(self, len(self.steps) - 1, self.inner.all_reduce_sum_async(tensor, ranks))

    def flush(self) -> None:
        for lane in sorted({lane for _, lane in self._held}):
            self._post([], lane)
        if self._unwaited_sends:
            self.steps.append(Wait(tuple(self._unwaited_sends)))
            self._unwaited_sends = []
        self.inner.flush()

    def _lane(self, channel: int) -> int:
        return ACTIVATIONS if self.one_channel else channel

    def _post(self, receives: list[PeerOp], lane: int) -> list[int]:
        """Launch the held sends of `lane` with `receives`; the indices of the posts that hold a receive."""
        held = [op for op, op_lane in self._held if op_lane == lane]
        self._held = [(op, op_lane) for op, op_lane in self._held if op_lane != lane]
        with_receives = []
        for launch in self.launch([*held, *receives]):
            self.steps.append(Post(tuple(Op("send" if op.is_send else "recv", op.peer, channel=lane)
                                         for op in launch.ops)))
            index = len(self.steps) - 1
            if any(not op.is_send for op in launch.ops):
                with_receives.append(index)
            else:
                self._unwaited_sends.append(index)
        return with_receives


class _RecordedWait:
    """An asynchronous collective's handle: its wait is recorded where the computation waits."""

    def __init__(self, recorder: RecordingTransport, post: int, inner: Handle) -> None:
        self.recorder, self.post, self.inner = recorder, post, inner

    def wait(self) -> None:
        self.recorder.steps.append(Wait((self.post,)))
        self.inner.wait()


def coalesced(ops: Sequence[PeerOp]) -> list[Launch]:
    """Every op of a call in one launch, whatever its peers: a rule `check` must refuse (head-of-line)."""
    return [Launch(ops[0].peer, tuple(ops))] if ops else []
