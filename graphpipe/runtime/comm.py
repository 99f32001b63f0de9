"""Transports: point-to-point messages and sum all-reduces between ranks.

The executor only needs five operations: `send` (posted, never blocks), `recv_many` (every receive
of one schedule action, posted together; blocks until they arrived) and `recv` (one of them),
`all_reduce_sum_` inside a group of ranks, and `flush` (wait until every posted send has completed).
Each message travels on a *channel*: activations (and their headers and tokens) on `ACTIVATIONS`,
gradients on `GRADIENTS`. Between a pair of ranks, the messages of one channel arrive in the order
they were sent; the channels are independent (NCCL has no tags: a channel is a communicator).

`DistTransport` runs over torch.distributed, by torch pipelining's rule (`graphpipe.runtime.p2p_program`):
sends are launched at once, each alone; a call's receives are launched per peer in increasing order, each
alone, never coalesced into a batch (a batch completes as a whole: head-of-line blocking). On NCCL a send
completes only once the peer's receive runs and a communicator runs a pair's operations in launch order, so
one stream for both directions would couple them (a rank's second activation send queued behind the peer's
gradient send, which waits for our receive behind that send); each channel has its own point-to-point
group, which keeps every pair's stream one-directional, apart from the collectives' communicators.
`graphpipe.runtime.p2p_check` replays the launches of every rank under NCCL's semantics and proves, per
schedule and plan, that none waits forever. On gloo a channel is a tag.

`InMemoryHub` connects ranks that are threads of one process, for single-process tests.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist

from graphpipe.errors import TrainingError
from graphpipe.runtime.p2p_program import PeerOp, launches

RecvSpec = tuple[Sequence[int], torch.dtype, int]  # (shape, dtype, source rank) of one receive
ACTIVATIONS, GRADIENTS = 0, 1  # the channels: messages down the stage graph, and back up
CHANNELS = (ACTIVATIONS, GRADIENTS)


class Transport(Protocol):
    rank: int
    device: torch.device

    def send(self, tensor: torch.Tensor, dst_rank: int, channel: int = ACTIVATIONS) -> None: ...

    def recv(self, shape: Sequence[int], dtype: torch.dtype, src_rank: int,
             channel: int = ACTIVATIONS) -> torch.Tensor: ...

    def recv_many(self, specs: Sequence[RecvSpec], channel: int = ACTIVATIONS) -> list[torch.Tensor]: ...

    def all_reduce_sum_(self, tensor: torch.Tensor, ranks: Sequence[int]) -> None: ...

    def all_reduce_sum_async(self, tensor: torch.Tensor, ranks: Sequence[int]) -> Handle: ...

    def flush(self) -> None: ...


class Handle(Protocol):
    """An operation in flight; `wait()` returns once its result is in place."""

    def wait(self) -> Any: ...


class Done:
    """A handle of an operation that has nothing left to do."""

    def wait(self) -> None:
        return None


class DistTransport:
    """torch.distributed point-to-point and collectives; `groups` maps rank tuples to process groups,
    `p2p_groups` gives each channel its own (NCCL); without them a channel is a tag of the default group.
    `pin_memory`: receive into pinned host buffers (a `HostStagedTransport` copies them on to a GPU)."""

    def __init__(self, *, device: torch.device, groups: dict[tuple[int, ...], Any] | None = None,
                 p2p_groups: Sequence[Any] | None = None, pin_memory: bool = False) -> None:
        self.rank = dist.get_rank()
        self.device = device
        self.pin_memory = pin_memory and device.type == "cpu"
        self.groups = dict(groups or {})
        self.p2p_groups = list(p2p_groups) if p2p_groups else []
        self._works: list[tuple[Any, torch.Tensor]] = []

    def send(self, tensor: torch.Tensor, dst_rank: int, channel: int = ACTIVATIONS) -> None:
        tensor = tensor.contiguous()
        self._works += [(work, tensor) for work, _ in self._launch([PeerOp(True, dst_rank, tensor)], channel)]

    def recv(self, shape: Sequence[int], dtype: torch.dtype, src_rank: int,
             channel: int = ACTIVATIONS) -> torch.Tensor:
        return self.recv_many([(shape, dtype, src_rank)], channel)[0]

    def recv_many(self, specs: Sequence[RecvSpec], channel: int = ACTIVATIONS) -> list[torch.Tensor]:
        buffers = [torch.empty(tuple(shape), dtype=dtype, device=self.device, pin_memory=self.pin_memory)
                   for shape, dtype, _ in specs]
        receives = [PeerOp(False, src, buffer) for (_, _, src), buffer in zip(specs, buffers)]
        for work, peer in self._launch(receives, channel):  # NCCL: the wait orders the compute stream, not the CPU
            _guard(lambda w=work: w.wait(), self.rank, peer, "receive from")
        return buffers

    def _launch(self, ops: Sequence[PeerOp], channel: int) -> list[tuple[Any, int]]:
        """Launch `ops` on `channel` by the p2p rule; each launch's work and peer."""
        group = self.p2p_groups[channel] if self.p2p_groups else None
        tag = 0 if self.p2p_groups else channel
        out: list[tuple[Any, int]] = []
        for launch in launches(ops):
            p2p = [dist.P2POp(dist.isend if op.is_send else dist.irecv, op.payload, op.peer, group=group, tag=tag)
                   for op in launch.ops]
            if launch.batched:
                works = _guard(lambda p2p=p2p: dist.batch_isend_irecv(p2p), self.rank, launch.peer, "exchange with")
            else:
                works = [_guard(lambda op=p2p[0]: op.op(op.tensor, op.peer, group=op.group, tag=op.tag), self.rank,
                                launch.peer, "send to" if launch.ops[0].is_send else "receive from")]
            out += [(work, launch.peer) for work in works]
        return out

    def add_groups(self, groups: Sequence[tuple[int, ...]], *, among: int) -> None:
        """Create the process groups of `groups` that rank `among` belongs to and that do not exist yet, each
        by its members alone (`use_local_synchronization`): every member must pass the same groups in the
        same order; other ranks need not call."""
        for ranks in groups:
            if among in ranks and ranks not in self.groups and len(ranks) != dist.get_world_size():
                self.groups[ranks] = dist.new_group(list(ranks), use_local_synchronization=True)

    def all_reduce_sum_(self, tensor: torch.Tensor, ranks: Sequence[int]) -> None:
        if len(ranks) <= 1:
            return
        self.flush()
        group = self._group(ranks)
        _guard(lambda: dist.all_reduce(tensor, group=group), self.rank, -1, "all-reduce with")

    def all_reduce_sum_async(self, tensor: torch.Tensor, ranks: Sequence[int]) -> Handle:
        """Launch the sum of `tensor` over `ranks` (in place) and return at once; every rank of the group must
        launch its collectives in the same order. Sends need no flush: point-to-point has its own groups."""
        if len(ranks) <= 1:
            return Done()
        group = self._group(ranks)
        work = _guard(lambda: dist.all_reduce(tensor, group=group, async_op=True), self.rank, -1, "all-reduce with")
        return _GuardedWork(work, self.rank)

    def _group(self, ranks: Sequence[int]) -> Any:
        group = self.groups.get(tuple(ranks))
        if group is None and len(ranks) != dist.get_world_size():
            raise TrainingError(f"rank {self.rank}: no process group for ranks {list(ranks)}")
        return group

    def flush(self) -> None:
        for work, _ in self._works:
            _guard(lambda w=work: w.wait(), self.rank, -1, "send to")
        self._works = []

    def destroy_groups(self) -> None:
        """Destroy this transport's process groups (made for it alone) and forget them: a group's threads
        end only once nothing refers to it."""
        owned = [*self.groups.values(), *self.p2p_groups]
        self.groups, self.p2p_groups = {}, []
        for group in owned:
            dist.destroy_process_group(group)


class _GuardedWork:
    """A torch.distributed work whose failure, at `wait`, names the rank as `_guard` does."""

    def __init__(self, work: Any, rank: int) -> None:
        self.work, self.rank = work, rank

    def wait(self) -> None:
        _guard(self.work.wait, self.rank, -1, "all-reduce with")


def _guard(call: Any, rank: int, peer: int, what: str) -> Any:
    """Run a torch.distributed call; turn a peer failure into a TrainingError that names the ranks."""
    try:
        return call()
    except (RuntimeError, dist.DistBackendError) as err:
        who = f"rank {peer}" if peer >= 0 else "a peer rank"
        raise TrainingError(f"rank {rank}: {what} {who} failed ({type(err).__name__}: {err}); "
                            f"{who} probably died, see its log") from err


class InMemoryHub:
    """Queues between every ordered pair of ranks, for ranks running as threads of one process."""

    def __init__(self, world_size: int, *, timeout_s: float = 60.0) -> None:
        self.world_size = world_size
        self.timeout_s = timeout_s
        self._queues: dict[tuple[int, int, int], queue.Queue[torch.Tensor]] = {}
        self._last_activity = time.monotonic()  # the last send between any two ranks
        self._lock = threading.Lock()

    def transport(self, rank: int, device: torch.device | None = None) -> InMemoryTransport:
        return InMemoryTransport(self, rank, device or torch.device("cpu"))

    def _queue(self, src: int, dst: int, channel: int) -> queue.Queue[torch.Tensor]:
        with self._lock:
            return self._queues.setdefault((src, dst, channel), queue.Queue())

    def put(self, src: int, dst: int, tensor: torch.Tensor, channel: int = ACTIVATIONS) -> None:
        self._queue(src, dst, channel).put(tensor)
        self._last_activity = time.monotonic()

    def get(self, src: int, dst: int, channel: int = ACTIVATIONS) -> torch.Tensor:
        """The next tensor from `src`; fails only once no rank of the hub has sent anything for `timeout_s`
        (a deadlock or a dead peer), however slowly a loaded machine runs them."""
        box = self._queue(src, dst, channel)
        while True:
            try:
                return box.get(timeout=min(1.0, self.timeout_s))
            except queue.Empty:
                if time.monotonic() - self._last_activity > self.timeout_s:
                    raise TrainingError(f"rank {dst}: nothing from rank {src}, and no message between any ranks, "
                                        f"for {self.timeout_s:.0f} s (deadlock or dead peer)") from None


class InMemoryTransport:
    """One rank's end of an InMemoryHub; all-reduce sums at the group's first rank, in rank order."""

    def __init__(self, hub: InMemoryHub, rank: int, device: torch.device) -> None:
        self.hub = hub
        self.rank = rank
        self.device = device

    def send(self, tensor: torch.Tensor, dst_rank: int, channel: int = ACTIVATIONS) -> None:
        self.hub.put(self.rank, dst_rank, tensor.detach().clone(), channel)

    def recv(self, shape: Sequence[int], dtype: torch.dtype, src_rank: int,
             channel: int = ACTIVATIONS) -> torch.Tensor:
        tensor = self.hub.get(src_rank, self.rank, channel)
        if tuple(tensor.shape) != tuple(shape) or tensor.dtype != dtype:
            raise TrainingError(f"rank {self.rank}: expected {tuple(shape)} {dtype} from rank {src_rank}, got "
                                f"{tuple(tensor.shape)} {tensor.dtype}: message order differs between the ranks")
        return tensor.to(self.device)

    def recv_many(self, specs: Sequence[RecvSpec], channel: int = ACTIVATIONS) -> list[torch.Tensor]:
        return [self.recv(shape, dtype, src, channel) for shape, dtype, src in specs]

    def all_reduce_sum_(self, tensor: torch.Tensor, ranks: Sequence[int]) -> None:
        """Gather to the first rank over a separate channel, sum in rank order, send the sum back."""
        if len(ranks) <= 1:
            return
        root = ranks[0]
        offset = self.hub.world_size  # collectives use offset rank ids, apart from pipeline messages
        if self.rank == root:
            total = tensor.detach().clone()
            for peer in ranks[1:]:
                total += self.hub.get(peer + offset, root)
            for peer in ranks[1:]:
                self.hub.put(root + offset, peer, total.clone())
            tensor.copy_(total)
        else:
            self.hub.put(self.rank + offset, root, tensor.detach().clone())
            tensor.copy_(self.hub.get(root + offset, self.rank))

    def all_reduce_sum_async(self, tensor: torch.Tensor, ranks: Sequence[int]) -> Handle:
        """Deferred: the sum runs at `wait` (threads of one process gain nothing from overlapping it)."""
        return _Deferred(lambda: self.all_reduce_sum_(tensor, ranks))

    def flush(self) -> None:
        return None


class _Deferred:
    def __init__(self, run: Any) -> None:
        self.run: Any = run

    def wait(self) -> None:
        if self.run is not None:
            run, self.run = self.run, None
            run()


def process_group_timeout(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)
