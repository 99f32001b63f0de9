"""Ranks that share a GPU: every message and collective staged through host memory over gloo.

NCCL refuses two ranks on one device, and gloo moves host memory only (it reads and writes a tensor's
pointer from its own threads: a CUDA tensor there is not an error, it is a crash). So when several ranks
compute on one CUDA device (`graphpipe train --share-gpu`, or a `PipelineTrainer` on a gloo group with a
CUDA `device`), `HostStagedTransport` sits between the executor and a gloo `DistTransport` whose device is
the host:

- a send copies the tensor to the host first (the copy waits for the kernels that made it, so gloo
  reads finished values), and the host copy lives until the send completes (`DistTransport` holds it);
- a receive lands in pinned host buffers, then goes to the device without blocking the host (the caching
  host allocator keeps a pinned buffer until the copy that reads it has run);
- an all-reduce sums a host copy and writes the sum back; launched asynchronously (the gradient buckets),
  the copy back runs at `wait`, when the sum is there.

The rank's compute stays on its GPU; only the transport pays the host round trip. With `host` equal to
`device` (the CPU), the same code runs on a machine without CUDA: that is how the tests and the CPU
rehearsal of `make gpu-check` exercise it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from graphpipe.runtime.comm import ACTIVATIONS, Done, Handle, RecvSpec, Transport

HOST = torch.device("cpu")


class HostStagedTransport:
    """A `Transport` on `device` whose messages and collectives travel through `inner`, a transport on the host."""

    def __init__(self, inner: Transport, device: torch.device) -> None:
        self.inner = inner
        self.rank = inner.rank
        self.device = torch.device(device)

    def send(self, tensor: torch.Tensor, dst_rank: int, channel: int = ACTIVATIONS) -> None:
        self.inner.send(to_host(tensor), dst_rank, channel)

    def recv(self, shape: Sequence[int], dtype: torch.dtype, src_rank: int,
             channel: int = ACTIVATIONS) -> torch.Tensor:
        return self.recv_many([(shape, dtype, src_rank)], channel)[0]

    def recv_many(self, specs: Sequence[RecvSpec], channel: int = ACTIVATIONS) -> list[torch.Tensor]:
        return [to_device(tensor, self.device) for tensor in self.inner.recv_many(specs, channel)]

    def all_reduce_sum_(self, tensor: torch.Tensor, ranks: Sequence[int]) -> None:
        if len(ranks) <= 1:
            return
        staged = to_host(tensor)
        self.inner.all_reduce_sum_(staged, ranks)
        tensor.copy_(staged, non_blocking=staged.is_pinned())

    def all_reduce_sum_async(self, tensor: torch.Tensor, ranks: Sequence[int]) -> Handle:
        if len(ranks) <= 1:
            return Done()
        staged = to_host(tensor)
        return _CopyBack(self.inner.all_reduce_sum_async(staged, ranks), staged, tensor)

    def flush(self) -> None:
        self.inner.flush()

    # the process groups belong to the inner transport (`PipelineTrainer` creates and destroys them)
    def add_groups(self, groups: Sequence[tuple[int, ...]], *, among: int) -> None:
        self.inner.add_groups(groups, among=among)  # type: ignore[attr-defined]

    def destroy_groups(self) -> None:
        self.inner.destroy_groups()  # type: ignore[attr-defined]


class _CopyBack:
    """An all-reduce of a host copy in flight; `wait` writes the sum into the device tensor."""

    def __init__(self, handle: Handle, staged: torch.Tensor, tensor: torch.Tensor) -> None:
        self.handle, self.staged, self.tensor = handle, staged, tensor

    def wait(self) -> Any:
        self.handle.wait()
        self.tensor.copy_(self.staged, non_blocking=self.staged.is_pinned())


def to_host(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous host copy of `tensor` (always a copy: gloo may still read it after the caller changes the
    original). From a GPU the copy is synchronous, so it holds the finished values when gloo reads it."""
    return tensor.detach().to(HOST, copy=True, memory_format=torch.contiguous_format)


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`tensor` (received on the host) on `device`; from pinned memory without blocking the host."""
    if tensor.device == device:
        return tensor
    return tensor.to(device, non_blocking=tensor.is_pinned())


def pins_host_buffers(device: torch.device) -> bool:
    """Whether receive buffers on the host should be pinned: when they go on to a CUDA device."""
    return device.type == "cuda" and torch.cuda.is_available()
