"""The fingerprint a plan records of its graph: a rank computes the same structure from its own capture without
a forward pass, and a different graph is named at its first differing op."""

from __future__ import annotations

from graphpipe.graph.capture import capture, capture_module
from graphpipe.graph.fingerprint import GraphFingerprint, difference, fingerprint_of, structure_of
from graphpipe.models import load_model
from tests.corpus.cli_factories import qwen2


def test_a_rank_computes_the_structure_the_plan_records_with_fx() -> None:
    zoo = load_model("toy_diamond", "tiny")
    planned = fingerprint_of(capture(zoo.model, zoo.inputs))
    module = capture_module(zoo.model, zoo.inputs, with_graph=False).module
    assert planned.capture == "fx"
    assert structure_of(module, zoo.model) == planned.ops
    assert difference(planned, planned.ops, planned.shapes) is None


def test_a_rank_computes_the_structure_the_plan_records_with_export() -> None:
    model, inputs, _, _ = qwen2()
    planned = fingerprint_of(capture(model, inputs))
    module = capture_module(model, inputs, with_graph=False, method="export").module
    assert planned.capture == "export"
    assert structure_of(module, model) == planned.ops
    assert GraphFingerprint.from_dict(planned.to_dict()) == planned


def test_another_config_is_named_at_its_first_differing_op() -> None:
    narrow, wide = load_model("toy_diamond", "tiny", width=8), load_model("toy_diamond", "tiny", width=16)
    planned = fingerprint_of(capture(narrow.model, narrow.inputs))
    other = fingerprint_of(capture(wide.model, wide.inputs))
    found = difference(planned, other.ops, other.shapes)
    assert found is not None and found.startswith("op 2 of ")
    assert "stem.0.weight 8x8" in found and "stem.0.weight 16x16" in found


def test_output_shapes_count_where_the_structure_is_the_same() -> None:
    zoo = load_model("toy_diamond", "tiny")
    planned = fingerprint_of(capture(zoo.model, zoo.inputs))
    shapes = list(planned.shapes)
    shapes[3] = "float32[9, 9]"
    found = difference(planned, planned.ops, shapes)
    assert found is not None and "float32[9, 9] here" in found


def test_a_longer_graph_says_how_many_ops_each_has() -> None:
    zoo = load_model("toy_diamond", "tiny")
    planned = fingerprint_of(capture(zoo.model, zoo.inputs))
    found = difference(planned, (*planned.ops, "extra = call_function f()"))
    assert found is not None and f"{len(planned.ops)} ops, this model's {len(planned.ops) + 1}" in found
