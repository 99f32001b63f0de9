"""CostTable lookups, interpolation and JSON round-trip."""

from __future__ import annotations

import pytest

from graphpipe.cost.cost_table import CostTable, OpCost
from graphpipe.errors import CostError


def table() -> CostTable:
    def cost(ms: float, act: int) -> OpCost:
        return OpCost(fwd_ms=ms, bwd_ms=2 * ms, act_bytes=act, output_bytes=act, param_bytes=100)

    return CostTable(device="cpu", source="measured", entries={"a": {1: cost(1.0, 10), 4: cost(2.5, 40)}})


def test_exact_entries_are_returned_unchanged() -> None:
    assert table().at("a", 4).fwd_ms == 2.5
    assert table().micro_batch_sizes == (1, 4)


def test_interpolates_between_and_scales_beyond() -> None:
    mid = table().at("a", 2)
    assert mid.fwd_ms == pytest.approx(1.5) and mid.bwd_ms == pytest.approx(3.0) and mid.act_bytes == 20
    big = table().at("a", 8)
    assert big.fwd_ms == pytest.approx(5.0) and big.act_bytes == 80 and big.param_bytes == 100
    half = table().at("a", 0.5)
    assert half.fwd_ms == pytest.approx(0.5)


def test_unknown_op_names_the_fix() -> None:
    with pytest.raises(CostError, match="profile the same graph"):
        table().at("missing", 1)


def test_round_trip(tmp_path) -> None:
    path = str(tmp_path / "costs.json")
    table().save(path)
    assert CostTable.load(path).entries == table().entries


def test_negative_costs_are_rejected() -> None:
    with pytest.raises(CostError):
        OpCost(fwd_ms=-1, bwd_ms=0, act_bytes=0, output_bytes=0, param_bytes=0)


def test_cost_classes_group_exactly_the_ops_with_equal_entries() -> None:
    def cost(ms: float) -> OpCost:
        return OpCost(fwd_ms=ms, bwd_ms=2 * ms, act_bytes=8, output_bytes=8, param_bytes=100)

    entries = {"a": {1: cost(1.0), 4: cost(2.0)}, "b": {1: cost(1.0), 4: cost(2.0)},
               "c": {1: cost(1.0), 4: cost(2.5)}, "d": {1: cost(1.0)}}
    classes = CostTable(device="cpu", source="analytic", entries=entries).cost_classes
    assert classes["a"] == classes["b"]  # equal at every stored size
    assert len({classes["a"], classes["c"], classes["d"]}) == 3  # other costs at 4, or no entry at 4
