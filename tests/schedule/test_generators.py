"""The generators draw the tables in their docstrings, and every stage follows the contract's shape."""

from __future__ import annotations

import pytest

import graphpipe.schedule.gpipe as gpipe_module
import graphpipe.schedule.kfkb as kfkb_module
import graphpipe.schedule.one_f_one_b as one_f_one_b_module
from graphpipe.errors import ScheduleError
from graphpipe.schedule.action import ActionKind
from graphpipe.schedule.generate import make_schedule
from graphpipe.schedule.grid import format_grid
from graphpipe.schedule.kfkb import group_size
from graphpipe.schedule.one_f_one_b import order_steps
from graphpipe.schedule.warmup import in_flight_rule, warmup_counts
from tests.schedule.docstring_tables import docstring_table
from tests.simulation.factories import chain, diamond, fan, make_plan


def test_one_f_one_b_docstring_table() -> None:
    drawn = format_grid(make_schedule(chain(3, 1, 4), "1f1b"), compute_only=True)
    assert drawn == docstring_table(one_f_one_b_module.__doc__)


def test_gpipe_docstring_table() -> None:
    drawn = format_grid(make_schedule(chain(3, 1, 3), "gpipe"), compute_only=True)
    assert drawn == docstring_table(gpipe_module.__doc__)


def test_kfkb_docstring_table() -> None:
    drawn = format_grid(make_schedule(make_plan([(0, 1)], [1, 2], 8), "kfkb"), compute_only=True)
    assert drawn == docstring_table(kfkb_module.__doc__)


def test_paper_in_flight_examples() -> None:
    """docs/method.md §3: chain of 3, b=4 -> 12, 8, 4; b = 1, 2, 4 -> 10, 8, 4 (first to last)."""
    assert in_flight_rule(chain(3, 4, 16)) == {0: 12, 1: 8, 2: 4}
    assert in_flight_rule(make_plan([(0, 1), (1, 2)], [1, 2, 4], 16)) == {0: 10, 1: 8, 2: 4}


def test_warmup_is_longest_path_to_sink_with_one_micro_batch_size() -> None:
    assert warmup_counts(fan(4, 2, 2, 32)) == {i: (3 if i % 2 == 0 else 2) for i in range(8)} | {8: 1}
    assert warmup_counts(diamond(1, 8)) == {0: 3, 1: 2, 2: 2, 3: 1}


def test_warmup_never_exceeds_the_micro_batch_count() -> None:
    assert warmup_counts(chain(6, 1, 2)) == {0: 2, 1: 2, 2: 2, 3: 2, 4: 2, 5: 1}


@pytest.mark.parametrize(("num_micro_batches", "warmup", "group"), [(1, 1, 1), (5, 3, 1), (8, 4, 2), (6, 6, 3)])
def test_compute_order_runs_each_micro_batch_once_in_order(num_micro_batches: int, warmup: int, group: int) -> None:
    order = order_steps(num_micro_batches, warmup, group)
    fwd = [m for kind, m in order if kind is ActionKind.FORWARD]
    bwd = [m for kind, m in order if kind is ActionKind.BACKWARD]
    assert fwd == bwd == list(range(num_micro_batches))
    live = peak = 0
    for kind, _ in order:
        live += 1 if kind is ActionKind.FORWARD else -1
        peak = max(peak, live)
        assert live >= 0
    assert peak == warmup


def test_kfkb_group_is_the_successor_ratio() -> None:
    plan = make_plan([(0, 1), (1, 2)], [1, 4, 4], 16)
    assert [group_size(plan, s) for s in range(3)] == [4, 1, 1]


@pytest.mark.parametrize("kind", ["1f1b", "gpipe", "kfkb"])
def test_every_stage_ends_with_all_reduce_then_step(kind: str) -> None:
    schedule = make_schedule(diamond(2, 8), kind)
    for actions in schedule.actions.values():
        assert [a.kind for a in actions[-2:]] == [ActionKind.ALL_REDUCE, ActionKind.STEP]


def test_unknown_kind_is_rejected() -> None:
    with pytest.raises(ScheduleError, match="unknown schedule 'zb'"):
        make_schedule(chain(2, 1, 2), "zb")
