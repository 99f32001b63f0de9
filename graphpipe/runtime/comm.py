"""Transports: point-to-point messages and sum all-reduces between ranks.

The executor only needs four operations: `send` (posted, never blocks), `recv` (blocks
until the matching send was posted), `all_reduce_sum_` inside a group of ranks, and
`flush` (wait until every posted send has completed). Messages between a pair of ranks
arrive in the order they were sent; there are no tags (NCCL has none).

`DistTransport` runs over torch.distributed. On NCCL, a send between two ranks can only
complete once the peer posts its receive, and a rank's sends and receives share one
stream, so sends are held back and posted together with the next receive (or flush) in
one `batch_isend_irecv` group; on gloo they are posted at once with `isend`.

`InMemoryHub` connects ranks that are threads of one process, for single-process tests.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist

from graphpipe.errors import TrainingError


class Transport(Protocol):
    rank: int
    device: torch.device

    def send(self, tensor: torch.Tensor, dst_rank: int) -> None: ...

    def recv(self, shape: Sequence[int], dtype: torch.dtype, src_rank: int) -> torch.Tensor: ...

    def all_reduce_sum_(self, tensor: torch.Tensor, ranks: Sequence[int]) -> None: ...

    def flush(self) -> None: ...


class DistTransport:
    """torch.distributed point-to-point and collectives; `groups` maps rank tuples to process groups."""

    def __init__(self, *, device: torch.device, groups: dict[tuple[int, ...], Any] | None = None,
                 coalesce: bool | None = None) -> None:
        self.rank = dist.get_rank()
        self.device = device
        self.groups = dict(groups or {})
        self.coalesce = dist.get_backend() == "nccl" if coalesce is None else coalesce
        self._held: list[dist.P2POp] = []
        self._works: list[tuple[Any, torch.Tensor]] = []

    def send(self, tensor: torch.Tensor, dst_rank: int) -> None:
        tensor = tensor.contiguous()
        if self.coalesce:
            self._held.append(dist.P2POp(dist.isend, tensor, dst_rank))
        else:
            self._works.append((_guard(lambda: dist.isend(tensor, dst_rank), self.rank, dst_rank, "send to"),
                                tensor))

    def recv(self, shape: Sequence[int], dtype: torch.dtype, src_rank: int) -> torch.Tensor:
        buffer = torch.empty(tuple(shape), dtype=dtype, device=self.device)
        if self.coalesce:
            ops = [*self._held, dist.P2POp(dist.irecv, buffer, src_rank)]
            self._held = []
            works = _guard(lambda: dist.batch_isend_irecv(ops), self.rank, src_rank, "exchange with")
            for work in works:  # NCCL: one coalesced work; its wait orders the stream, not the CPU
                _guard(lambda w=work: w.wait(), self.rank, src_rank, "receive from")
            return buffer
        work = _guard(lambda: dist.irecv(buffer, src_rank), self.rank, src_rank, "receive from")
        _guard(lambda: work.wait(), self.rank, src_rank, "receive from")
        return buffer

    def all_reduce_sum_(self, tensor: torch.Tensor, ranks: Sequence[int]) -> None:
        if len(ranks) <= 1:
            return
        self.flush()
        group = self.groups.get(tuple(ranks))
        if group is None and len(ranks) != dist.get_world_size():
            raise TrainingError(f"rank {self.rank}: no process group for ranks {list(ranks)}")
        _guard(lambda: dist.all_reduce(tensor, group=group), self.rank, -1, "all-reduce with")

    def flush(self) -> None:
        if self._held:
            works = _guard(lambda: dist.batch_isend_irecv(self._held), self.rank, -1, "send to")
            self._works += list(zip(works, (op.tensor for op in self._held)))
            self._held = []
        for work, _ in self._works:
            _guard(lambda w=work: w.wait(), self.rank, -1, "send to")
        self._works = []

    def destroy_groups(self) -> None:
        """Destroy this transport's process groups (made for it alone) and forget them: a group's threads
        end only once nothing refers to it."""
        groups, self.groups = self.groups, {}
        for group in groups.values():
            dist.destroy_process_group(group)


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
        self._queues: dict[tuple[int, int], queue.Queue[torch.Tensor]] = {}
        self._lock = threading.Lock()

    def transport(self, rank: int, device: torch.device | None = None) -> InMemoryTransport:
        return InMemoryTransport(self, rank, device or torch.device("cpu"))

    def _queue(self, src: int, dst: int) -> queue.Queue[torch.Tensor]:
        with self._lock:
            return self._queues.setdefault((src, dst), queue.Queue())

    def put(self, src: int, dst: int, tensor: torch.Tensor) -> None:
        self._queue(src, dst).put(tensor)

    def get(self, src: int, dst: int) -> torch.Tensor:
        try:
            return self._queue(src, dst).get(timeout=self.timeout_s)
        except queue.Empty:
            raise TrainingError(f"rank {dst}: nothing from rank {src} within {self.timeout_s:.0f} s "
                                "(deadlock or dead peer)") from None


class InMemoryTransport:
    """One rank's end of an InMemoryHub; all-reduce sums at the group's first rank, in rank order."""

    def __init__(self, hub: InMemoryHub, rank: int, device: torch.device) -> None:
        self.hub = hub
        self.rank = rank
        self.device = device

    def send(self, tensor: torch.Tensor, dst_rank: int) -> None:
        self.hub.put(self.rank, dst_rank, tensor.detach().clone())

    def recv(self, shape: Sequence[int], dtype: torch.dtype, src_rank: int) -> torch.Tensor:
        tensor = self.hub.get(src_rank, self.rank)
        if tuple(tensor.shape) != tuple(shape) or tensor.dtype != dtype:
            raise TrainingError(f"rank {self.rank}: expected {tuple(shape)} {dtype} from rank {src_rank}, got "
                                f"{tuple(tensor.shape)} {tensor.dtype}: message order differs between the ranks")
        return tensor.to(self.device)

    def all_reduce_sum_(self, tensor: torch.Tensor, ranks: Sequence[int]) -> None:
        """Gather to the first rank over a separate channel, sum in rank order, send the sum back."""
        if len(ranks) <= 1:
            return
        root = ranks[0]
        channel = self.hub.world_size  # collectives use offset rank ids, apart from pipeline messages
        if self.rank == root:
            total = tensor.detach().clone()
            for peer in ranks[1:]:
                total += self.hub.get(peer + channel, root)
            for peer in ranks[1:]:
                self.hub.put(root + channel, peer, total.clone())
            tensor.copy_(total)
        else:
            self.hub.put(self.rank + channel, root, tensor.detach().clone())
            tensor.copy_(self.hub.get(root + channel, self.rank))

    def flush(self) -> None:
        return None


def process_group_timeout(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)
