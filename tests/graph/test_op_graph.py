"""OpGraph invariants and its JSON round-trip."""

from __future__ import annotations

import pytest

from graphpipe.errors import GraphValidationError
from graphpipe.graph.op_graph import OpGraph, OpNode, ParamRef
from graphpipe.graph.tensor_meta import TensorMeta


def _op(name: str, kind: str = "call_module", inputs: tuple[str, ...] = (),
        params: tuple[ParamRef, ...] = ()) -> OpNode:
    return OpNode(name=name, kind=kind, target=name, inputs=inputs, params=params,
                  outputs=(TensorMeta(shape=(4, 8)),), module_type="Linear", attrs={"in_features": 8})


def diamond() -> OpGraph:
    weight = ParamRef(name="a.weight", num_bytes=256, shape=(8, 8))
    return OpGraph(name="diamond", example_batch_size=4, ops=(
        _op("x", "placeholder"), _op("a", inputs=("x",), params=(weight,)), _op("b", inputs=("x",)),
        _op("c", "call_function", inputs=("a", "b")), _op("output", "output", inputs=("c",))))


def test_lookups_follow_the_edges() -> None:
    graph = diamond()
    assert graph.successors("x") == ("a", "b")
    assert graph.predecessors("c") == ("a", "b")
    assert graph.inputs == ("x",) and graph.output == "output"
    assert graph.param_bytes == 256 and graph.param_names == ("a.weight",)
    assert sorted(graph.edges()) == [("a", "c"), ("b", "c"), ("c", "output"), ("x", "a"), ("x", "b")]


def test_json_round_trip_is_exact() -> None:
    graph = diamond()
    again = OpGraph.from_dict(graph.to_dict())
    assert again.to_dict() == graph.to_dict()
    assert again.ops == graph.ops


def test_save_and_load(tmp_path) -> None:
    graph = diamond()
    graph.save(str(tmp_path / "g.json"))
    assert OpGraph.load(str(tmp_path / "g.json")).ops == graph.ops


def test_rejects_duplicate_names_cycles_and_double_owners() -> None:
    ops = diamond().ops
    with pytest.raises(GraphValidationError, match="duplicate"):
        OpGraph(name="g", example_batch_size=1, ops=(*ops, ops[1]))
    with pytest.raises(GraphValidationError, match="not an earlier op"):
        OpGraph(name="g", example_batch_size=1, ops=(ops[0], _op("a", inputs=("b",)), _op("b", inputs=("a",))))
    weight = ParamRef(name="w", num_bytes=4)
    with pytest.raises(GraphValidationError, match="owned by both"):
        OpGraph(name="g", example_batch_size=1, ops=(ops[0], _op("a", inputs=("x",), params=(weight,)),
                                                     _op("b", inputs=("a",), params=(weight,))))


def test_tensor_meta_bytes() -> None:
    assert TensorMeta(shape=(2, 3), dtype="float16").num_bytes == 12
    assert str(TensorMeta(shape=(2, 3))) == "float32[2x3]"
