"""Ranks sharing a GPU: `HostStagedTransport` stages every message and collective through host memory.

On the CPU the logic is checked with a recording host transport (copies, not aliases; an asynchronous sum lands
in the caller's tensor at `wait`, not before), with the meta device standing in for a GPU (where a receive lands),
and by training fork/join plans with a shared weight and a data-parallel stage through it, equal to one device.
On a GPU the same training runs on cuda:0 (`make gpu-check` runs this file).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch

from graphpipe.runtime.comm import ACTIVATIONS, Done, InMemoryHub, RecvSpec
from graphpipe.runtime.host_staging import HostStagedTransport
from graphpipe.runtime.trainer import PipelineTrainer
from tests.runtime.helpers import run_threads
from tests.runtime.scenarios import LR, SCENARIOS, compare, float64_scenario, reference

CPU = torch.device("cpu")


class Recorder:
    """A host transport that keeps what it was given; its sums add `offset`, when the handle is waited on."""

    def __init__(self, offset: float = 10.0) -> None:
        self.rank, self.device, self.offset = 0, CPU, offset
        self.sent: list[torch.Tensor] = []
        self.reduced: list[torch.Tensor] = []
        self.flushed = 0

    def send(self, tensor: torch.Tensor, dst_rank: int, channel: int = ACTIVATIONS) -> None:
        self.sent.append(tensor)

    def recv_many(self, specs: Sequence[RecvSpec], channel: int = ACTIVATIONS) -> list[torch.Tensor]:
        return [torch.full(tuple(shape), 3, dtype=dtype) for shape, dtype, _ in specs]

    def all_reduce_sum_(self, tensor: torch.Tensor, ranks: Sequence[int]) -> None:
        self.reduced.append(tensor)
        tensor.add_(self.offset)

    def all_reduce_sum_async(self, tensor: torch.Tensor, ranks: Sequence[int]) -> Any:
        self.reduced.append(tensor)

        class Later:
            def wait(inner) -> None:  # noqa: N805
                tensor.add_(self.offset)

        return Later()

    def flush(self) -> None:
        self.flushed += 1


def test_a_send_hands_the_host_transport_a_copy() -> None:
    inner = Recorder()
    staged = HostStagedTransport(inner, CPU)  # type: ignore[arg-type]
    value = torch.arange(12.0).reshape(3, 4)[:, :2]  # not contiguous
    staged.send(value, 1)
    sent = inner.sent[0]
    assert sent.is_contiguous() and sent.device == CPU
    assert sent.untyped_storage().data_ptr() != value.untyped_storage().data_ptr()
    value.zero_()  # the caller may reuse its tensor: what gloo reads stays
    assert sent.sum() == sum(range(0, 12, 4)) + sum(range(1, 12, 4))


def test_an_async_sum_lands_in_the_callers_tensor_at_wait() -> None:
    inner = Recorder()
    staged = HostStagedTransport(inner, CPU)  # type: ignore[arg-type]
    grads = torch.ones(4)
    handle = staged.all_reduce_sum_async(grads, (0, 1))
    assert inner.reduced[0] is not grads and torch.equal(grads, torch.ones(4))  # summed on a copy
    handle.wait()
    assert torch.equal(grads, torch.full((4,), 11.0))
    staged.all_reduce_sum_(grads, (0, 1))
    assert torch.equal(grads, torch.full((4,), 21.0))
    assert isinstance(staged.all_reduce_sum_async(grads, (0,)), Done)  # alone: nothing to sum, no copy
    staged.flush()
    assert inner.flushed == 1


def test_a_receive_lands_on_the_ranks_device() -> None:
    """The meta device stands in for a GPU: what the host transport received ends on it, shape and dtype kept."""
    staged = HostStagedTransport(Recorder(), torch.device("meta"))  # type: ignore[arg-type]
    first, second = staged.recv_many([((2, 3), torch.float32, 1), ((4,), torch.int64, 2)])
    assert (first.device.type, tuple(first.shape), first.dtype) == ("meta", (2, 3), torch.float32)
    assert (second.device.type, tuple(second.shape), second.dtype) == ("meta", (4,), torch.int64)


def _train_staged(name: str, device: torch.device, steps: int = 3) -> tuple[list[float], list[PipelineTrainer]]:
    scenario = float64_scenario(SCENARIOS[name])
    plan = scenario.plan()
    hub = InMemoryHub(plan.world_size, timeout_s=30)
    example = scenario.make_batches(1)[0][0]
    trainers = [PipelineTrainer(scenario.model(), plan, optimizer=lambda ps: torch.optim.Adam(ps, lr=LR),
                                loss_fn=scenario.loss_fn, example_inputs=example, device=device, rank=rank,
                                transport=HostStagedTransport(hub.transport(rank, CPU), device))
                for rank in range(plan.world_size)]
    batches = scenario.make_batches(steps)
    losses = run_threads(plan.world_size, lambda rank: [trainers[rank].step(x, y) for x, y in batches])
    return losses[0], trainers


def _assert_like_one_device(name: str, device: torch.device, rtol: float) -> None:
    losses, trainers = _train_staged(name, device)
    expected, expected_params = reference(float64_scenario(SCENARIOS[name]), 3)
    params = {key: param.detach().cpu() for trainer in trainers for key, param in trainer.named_parameters()}
    assert all(param.device.type == device.type for trainer in trainers for _, param in trainer.named_parameters())
    assert sorted(params) == sorted(expected_params)
    problems = compare(losses, params, expected, expected_params, rtol=rtol)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", ["tied_towers3", "dp_sink4"])
def test_staged_training_equals_one_device(name: str) -> None:
    """A weight shared by three stages (fork/join), and a data-parallel sink (bucketed gradient sums)."""
    torch.set_num_threads(1)
    _assert_like_one_device(name, CPU, rtol=1e-10)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_host_staging_on_cuda() -> None:
    """Every rank computes on cuda:0, the messages and sums go through host memory: equal to one device."""
    for name in ("tied_towers3", "dp_sink4"):
        _assert_like_one_device(name, torch.device("cuda", 0), rtol=1e-9)  # the GPU's float64 sums, not the CPU's
