"""Edge message numbering: message n holds samples [n*g, (n+1)*g), g = the smaller micro-batch."""

from __future__ import annotations

import pytest

from graphpipe.errors import ScheduleError
from graphpipe.schedule.messages import message_samples, messages_of, micro_batch_of, num_messages
from tests.simulation.factories import make_plan


def test_equal_sizes_number_like_micro_batches() -> None:
    plan = make_plan([(0, 1)], [2, 2], 8)
    assert message_samples(plan, 0, 1) == 2 and num_messages(plan, 0, 1) == 4
    assert list(messages_of(plan, 0, 3, 0, 1)) == [3] == list(messages_of(plan, 1, 3, 0, 1))


@pytest.mark.parametrize("sizes", [(1, 4), (4, 1), (2, 8)])
def test_messages_and_micro_batches_cover_the_same_samples(sizes: tuple[int, int]) -> None:
    plan = make_plan([(0, 1)], list(sizes), 16)
    g = message_samples(plan, 0, 1)
    for stage in (0, 1):
        b = plan.stages[stage].micro_batch_size
        for mb in range(16 // b):
            msgs = list(messages_of(plan, stage, mb, 0, 1))
            assert (msgs[0] * g, (msgs[-1] + 1) * g) == (mb * b, (mb + 1) * b)
            assert all(micro_batch_of(plan, stage, n, 0, 1) == mb for n in msgs)


def test_sizes_that_do_not_divide_are_rejected() -> None:
    plan = make_plan([(0, 1)], [2, 3], 6)
    with pytest.raises(ScheduleError, match="do not divide"):
        message_samples(plan, 0, 1)
