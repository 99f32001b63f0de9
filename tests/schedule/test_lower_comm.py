"""Communication lowering: fan-out sends to every successor, fan-in receives from every one."""

from __future__ import annotations

import graphpipe.schedule.lower_comm as lower_comm_module
from graphpipe.schedule.action import Action
from graphpipe.schedule.generate import make_schedule
from graphpipe.schedule.grid import format_grid
from tests.schedule.docstring_tables import docstring_table
from tests.simulation.factories import chain, diamond, make_plan


def _texts(actions: tuple[Action, ...]) -> list[str]:
    return [str(a) for a in actions]


def test_lower_comm_docstring_table() -> None:
    assert format_grid(make_schedule(chain(2, 1, 2))) == docstring_table(lower_comm_module.__doc__)


def test_fan_out_sends_one_copy_to_each_successor_after_the_forward() -> None:
    s0 = _texts(make_schedule(diamond(1, 4)).actions[0])
    at = s0.index("s0.F0")
    assert s0[at:at + 3] == ["s0.F0", "s0.SF0>s1", "s0.SF0>s2"]
    assert s0.index("s0.RB0<s1") < s0.index("s0.B0") and s0.index("s0.RB0<s2") < s0.index("s0.B0")


def test_fan_in_receives_from_every_predecessor_before_the_forward() -> None:
    s3 = _texts(make_schedule(diamond(1, 4)).actions[3])
    assert s3[:5] == ["s3.RF0<s1", "s3.RF0<s2", "s3.F0", "s3.B0", "s3.SB0>s1"]
    assert s3[5] == "s3.SB0>s2"


def test_larger_downstream_micro_batch_receives_every_piece() -> None:
    """b_src=1 < b_dst=2: dst's micro-batch 1 is messages 2 and 3 (edge numbering)."""
    s1 = _texts(make_schedule(make_plan([(0, 1)], [1, 2], 4)).actions[1])
    assert s1[s1.index("s1.F1") - 2:s1.index("s1.F1") + 4] == [
        "s1.RF2<s0", "s1.RF3<s0", "s1.F1", "s1.B1", "s1.SB2>s0", "s1.SB3>s0"]


def test_larger_upstream_micro_batch_is_split_into_pieces() -> None:
    """b_src=4 > b_dst=2: src's micro-batch 1 is sent as messages 2 and 3."""
    s0 = _texts(make_schedule(make_plan([(0, 1)], [4, 2], 8)).actions[0])
    at = s0.index("s0.F1")
    assert s0[at:at + 3] == ["s0.F1", "s0.SF2>s1", "s0.SF3>s1"]
    assert s0[s0.index("s0.B1") - 2:s0.index("s0.B1")] == ["s0.RB2<s1", "s0.RB3<s1"]
