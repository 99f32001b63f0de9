"""Need-vector helpers (`sp_dp.need`): the breakpoints of a table of need vectors read at once are each row's own."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from graphpipe.planner.sp_dp.blocks import BIG
from graphpipe.planner.sp_dp.need import feasible_breakpoints, feasible_breakpoints_of_rows


@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 12), cells=st.integers(1, 12),
       num_devices=st.integers(1, 16))
def test_breakpoints_of_rows_are_each_rows_breakpoints(seed: int, rows: int, cells: int, num_devices: int) -> None:
    """Non-increasing rows with BIG cells, plateaus and values above the devices: the same breakpoints as
    `feasible_breakpoints` row by row."""
    rng = np.random.default_rng(seed)
    values = rng.integers(0, num_devices * 2, size=(rows, cells))
    values[rng.random((rows, cells)) < 0.3] = BIG
    needs = np.minimum.accumulate(values, axis=1).astype(np.int64)  # non-increasing, as need vectors are
    expected = [feasible_breakpoints(row.tolist(), num_devices) for row in needs]
    assert feasible_breakpoints_of_rows(needs, num_devices) == expected
