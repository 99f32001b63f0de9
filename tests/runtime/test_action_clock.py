"""When actions ran: the host's clock on the CPU, CUDA events (the kernels' time) on a GPU, resolved lazily."""

from __future__ import annotations

import itertools
import time

import pytest
import torch

from graphpipe.runtime.action_clock import CudaClock, HostClock, clock_for
from graphpipe.runtime.trace import rank_trace
from tests.runtime.scenarios import SCENARIOS, in_memory_trainers


def test_the_cpu_uses_the_hosts_monotonic_clock() -> None:
    clock = clock_for(torch.device("cpu"))
    assert isinstance(clock, HostClock)
    before = time.monotonic()
    mark = clock.mark()
    assert before <= clock.seconds(mark) <= time.monotonic()


def test_trained_steps_have_ordered_events() -> None:
    from tests.runtime.helpers import run_threads

    torch.set_num_threads(1)
    trainers = in_memory_trainers("chain2")
    (inputs, targets), = SCENARIOS["chain2"].make_batches(1)
    run_threads(2, lambda rank: trainers[rank].step(inputs, targets))
    for trainer in trainers:
        events = trainer.executor.events
        assert [event.action for event in events] == list(trainer.actions)
        assert all(a.start_s <= a.end_s <= b.start_s for a, b in itertools.pairwise(events))
        assert trainer.executor.recorded()() == events  # resolved again, later: the same times
        trace = rank_trace(trainer.rank, trainer.stage_idx, [events], events[0].start_s,
                           clock=trainer.executor.clock.source)
        assert trace["otherData"]["clock"] == "host monotonic clock"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_clock_resolves_after_the_kernels() -> None:
    """Marks are events on the device's stream, resolved once the kernels before them finished, on the host's
    monotonic axis after the clock's origin."""
    device = torch.device("cuda", 0)
    clock = clock_for(device)
    assert isinstance(clock, CudaClock)
    big = torch.randn(2048, 2048, device=device)
    start = clock.mark()
    for _ in range(20):
        big = big @ big / 64
    end = clock.mark()
    finished = clock.seconds(end)  # waits for the kernels
    assert clock.origin_s <= clock.seconds(start) < finished <= time.monotonic()
