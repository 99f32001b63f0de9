"""torch.distributed's point-to-point calls staged through host memory, so that torch pipelining runs ranks
that share a GPU over gloo, as graphpipe's `HostStagedTransport` does for its own ranks.

gloo moves host memory only: given a CUDA tensor it would read the device pointer from the host. torch
pipelining sends and receives through `dist.isend`, `dist.irecv`, `dist.send` and `dist.recv` (directly, in
`P2POp`s and through `batch_isend_irecv`, and for its shape metadata through `send_object_list`), all looked
up at call time in `torch.distributed.distributed_c10d` or `torch.distributed`. Inside `host_staged_p2p()`
those four names (and `batch_isend_irecv`, which then calls them one by one) are replaced in both modules:
a send copies the tensor to the host first; a receive lands in a host buffer and is copied into the caller's
tensor when it completes (`wait` of the returned work, or at once for the blocking `recv`). With `force`,
host tensors are staged too (a fresh copy): the CPU rehearsal runs the same code.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

NAMES = ("isend", "irecv", "send", "recv", "batch_isend_irecv")
HOST = torch.device("cpu")


class StagedWork:
    """The work of a staged isend/irecv: `wait` waits for gloo, then (receive) copies the host buffer into the
    caller's tensor. Holds the host copy of a send until it completes."""

    def __init__(self, work: Any, host: torch.Tensor, into: torch.Tensor | None) -> None:
        self.work, self.host, self.into = work, host, into
        self._copied = False

    def wait(self, *args: Any, **kwargs: Any) -> bool:
        done = self.work.wait(*args, **kwargs) if self.work is not None else True
        if self.into is not None and not self._copied:
            with torch.no_grad():  # torch pipelining receives into leaves that require grad
                self.into.copy_(self.host)
            self._copied = True
        return bool(done) if done is not None else True

    def is_completed(self) -> bool:
        return bool(self.work.is_completed()) if self.work is not None else True


@contextlib.contextmanager
def host_staged_p2p(force: bool = False) -> Iterator[None]:
    """Within the block, torch.distributed's point-to-point calls stage device tensors (every tensor, with
    `force`) through host memory."""
    originals = {name: getattr(c10d, name) for name in NAMES}
    staged = make_staged(originals, force)
    try:
        for name in NAMES:
            setattr(c10d, name, staged[name])
            setattr(dist, name, staged[name])
        yield
    finally:
        for name in NAMES:
            setattr(c10d, name, originals[name])
            setattr(dist, name, originals[name])


def make_staged(originals: dict[str, Any], force: bool) -> dict[str, Any]:
    """The four staged calls, around `originals` (the real ones)."""

    def stages(tensor: torch.Tensor) -> bool:
        return force or tensor.device.type != "cpu"

    def isend(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if not stages(tensor):
            return originals["isend"](tensor, *args, **kwargs)
        host = to_host(tensor)
        return StagedWork(originals["isend"](host, *args, **kwargs), host, None)

    def irecv(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if not stages(tensor):
            return originals["irecv"](tensor, *args, **kwargs)
        host = torch.empty(tensor.shape, dtype=tensor.dtype, device=HOST)
        return StagedWork(originals["irecv"](host, *args, **kwargs), host, tensor)

    def send(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        return originals["send"](to_host(tensor) if stages(tensor) else tensor, *args, **kwargs)

    def recv(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if not stages(tensor):
            return originals["recv"](tensor, *args, **kwargs)
        host = torch.empty(tensor.shape, dtype=tensor.dtype, device=HOST)
        source = originals["recv"](host, *args, **kwargs)
        with torch.no_grad():
            tensor.copy_(host)
        return source

    def batch_isend_irecv(ops: list[Any]) -> list[Any]:
        """One call per operation, as gloo's own path does: every receive's work is the staged one (a backend
        that coalesced the batch would return one work of its own, and the copies back would never run)."""
        works = [op.op(op.tensor, op.peer, op.group, op.tag) for op in ops]
        return [work for work in works if work is not None]

    return {"isend": isend, "irecv": irecv, "send": send, "recv": recv, "batch_isend_irecv": batch_isend_irecv}


def to_host(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().to(HOST, copy=True, memory_format=torch.contiguous_format)
