"""Need-vector helpers (`sp_dp.need`): the breakpoints of a table of need vectors read at once are each row's own,
a row of segments settled from its written cells alone is the row the two-pass step makes, and need vectors
read once per run of cells where they are all constant are the same vectors."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from graphpipe.planner.sp_dp.blocks import BIG
from graphpipe.planner.sp_dp.need import (
    NO_KEY,
    CellRuns,
    ChainChoice,
    feasible_breakpoints,
    feasible_breakpoints_of_rows,
    settle,
    settle_segments,
    write_segments,
)


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


@given(seed=st.integers(0, 2**32 - 1), cells=st.integers(2, 40), num_devices=st.integers(1, 16),
       share=st.sampled_from([0.0, 0.1, 0.5, 1.0]))
def test_settle_segments_is_write_then_settle(seed: int, cells: int, num_devices: int, share: float) -> None:
    """Random cell keys (ties in cost, costs above the devices, unwritten cells, written in any order): the
    one-pass step gives the row, every choice and the breakpoints of `write_segments` then `settle`."""
    rng = np.random.default_rng(seed)
    span, unit = cells + 1, (num_devices + 1) * (cells + 1)
    best, written = [NO_KEY] * (cells - 1), []
    for u in rng.permutation(cells - 1).tolist():
        if rng.random() < share:
            cost, d1, stop = (int(x) for x in rng.integers(1, (num_devices * 2, num_devices + 1, cells + 1)))
            best[u] = cost * unit + d1 * span + stop
            written.append(u)
    expected_row = [BIG] * cells
    expected_chosen: list[ChainChoice | None] = [None] * cells
    write_segments(best, written, span, unit, expected_row, expected_chosen)
    expected = settle(expected_row, expected_chosen, num_devices)
    assert settle_segments(best, written, span, unit, num_devices, cells) == (expected_row, expected_chosen, expected)


@given(seed=st.integers(0, 2**32 - 1), cells=st.integers(1, 30), tables=st.integers(1, 3))
def test_cell_runs_keep_every_vector(seed: int, cells: int, tables: int) -> None:
    """Random need-vector tables (steps, BIG cells, empty tables): each vector, and a sum of vectors of different
    tables, is its per-run values expanded; a run starts only where some vector changes; `most` is each run's
    largest cell."""
    rng = np.random.default_rng(seed)
    vectors = []
    for _ in range(tables):
        values = rng.integers(0, 6, size=(int(rng.integers(0, 4)), cells))
        values[rng.random(values.shape) < 0.2] = BIG
        vectors.append(np.minimum.accumulate(values, axis=1))
    runs = CellRuns.of(vectors, cells)
    rows = [row for table in vectors for row in table]
    for row in rows:
        assert np.array_equal(runs.expand(runs.first(row)), row)
    if len(rows) > 1:
        assert np.array_equal(runs.expand(runs.first(rows[0]) + runs.first(rows[-1])), rows[0] + rows[-1])
    for start in runs.starts[1:].tolist():
        assert any(row[start] != row[start - 1] for row in rows)
    assert int(runs.lengths.sum()) == cells
    cell_values = rng.integers(0, 100, size=cells)
    assert runs.most(cell_values).tolist() == [int(cell_values[a:a + n].max()) for a, n in
                                               zip(runs.starts.tolist(), runs.lengths.tolist())]
