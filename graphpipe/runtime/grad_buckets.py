"""Data-parallel gradient reduction in buckets, launched during the last backward (DDP's way).

A stage's replicas must sum their gradients once per step, after the last micro-batch's backward has added
its share. Waiting for that backward to end and then reducing everything leaves the network idle during the
backward and the devices idle during the reduction. Here the stage's own parameters (not the shared ones:
`graphpipe.runtime.shared_grads`) are cut into buckets of about `bucket_bytes`, in reverse order of
definition (the order a backward finishes them in); while the last backward runs, a hook on each parameter
notes when its gradient is final, and a bucket is launched as an asynchronous all-reduce once it and every
bucket before it are ready. Launching in bucket order keeps the collectives in the same order on every
replica, even where a replica's backward skips a parameter (a mixture-of-experts layer whose expert got no
token on its share): `finish` launches what is left, in order, waits for all and writes the sums back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from graphpipe.runtime.comm import Transport

__all__ = ["GradBuckets"]

BUCKET_BYTES = 25 * 2**20  # DDP's default


class GradBuckets:
    """The buckets of one rank's data-parallel parameters; `arm()` before the last backward, `finish()` after."""

    def __init__(self, params: Sequence[nn.Parameter], ranks: Sequence[int], transport: Transport,
                 bucket_bytes: int | None = None) -> None:
        self.ranks = tuple(ranks)
        self.transport = transport
        self.buckets = _cut(list(reversed(params)), BUCKET_BYTES if bucket_bytes is None else bucket_bytes)
        self.launched_early = 0  # buckets the last step launched during its backward (the rest: in finish)
        self._bucket_of = {id(param): index for index, bucket in enumerate(self.buckets) for param in bucket}
        self._armed = False
        self._ready: list[set[int]] = [set() for _ in self.buckets]
        self._launched: list[tuple[Any, torch.Tensor, list[torch.Tensor]]] = []
        for param in params:
            param.register_post_accumulate_grad_hook(self._on_grad)  # type: ignore[no-untyped-call]

    def arm(self) -> None:
        """The next backward is the step's last: launch each bucket once its gradients are final."""
        self._armed = True
        self._ready = [set() for _ in self.buckets]
        self._launched = []
        self.launched_early = 0

    def finish(self) -> None:
        """Launch the buckets not launched yet, in order, wait for every one and set the summed gradients."""
        self._armed = False
        while len(self._launched) < len(self.buckets):
            self._launch(len(self._launched))
        for (handle, flat, grads), bucket in zip(self._launched, self.buckets):
            handle.wait()
            position = 0
            for param, grad in zip(bucket, grads):
                count = grad.numel()
                param.grad = flat[position:position + count].view_as(grad)
                position += count
        self._launched = []

    def _on_grad(self, param: torch.Tensor) -> None:
        if not self._armed:
            return
        index = self._bucket_of[id(param)]
        self._ready[index].add(id(param))
        while len(self._launched) < len(self.buckets) and \
                len(self._ready[len(self._launched)]) == len(self.buckets[len(self._launched)]):
            self._launch(len(self._launched))
            self.launched_early += 1

    def _launch(self, index: int) -> None:
        bucket = self.buckets[index]
        grads = [param.grad if param.grad is not None else torch.zeros_like(param) for param in bucket]
        flat = torch.cat([grad.detach().reshape(-1) for grad in grads])
        self._launched.append((self.transport.all_reduce_sum_async(flat, self.ranks), flat, grads))


def _cut(params: list[nn.Parameter], bucket_bytes: int) -> list[list[nn.Parameter]]:
    """Consecutive parameters of one dtype, up to about `bucket_bytes` each (a larger parameter alone)."""
    buckets: list[list[nn.Parameter]] = []
    size = 0
    for param in params:
        nbytes = param.numel() * param.element_size()
        if not buckets or size + nbytes > bucket_bytes or buckets[-1][0].dtype != param.dtype:
            buckets.append([])
            size = 0
        buckets[-1].append(param)
        size += nbytes
    return buckets
