"""The pictures and the trace are produced and are not trivial."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphpipe.simulation.gantt import render_gantt
from graphpipe.simulation.layout import layered_positions, stage_depths
from graphpipe.simulation.simulator import simulate
from graphpipe.simulation.stage_picture import render_stage_graph
from graphpipe.simulation.trace import chrome_trace, write_chrome_trace
from tests.simulation.factories import fan, make_costs, make_plan

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def plan_and_result():  # type: ignore[no-untyped-def]
    plan = fan(4, 2, 2, 8, bytes_per_sample=1e6, ranks_per_stage=[1] * 8 + [2])
    return plan, simulate(plan, make_costs(plan, param_bytes=10**6))


def test_gantt_png_is_written(tmp_path: Path, plan_and_result) -> None:  # type: ignore[no-untyped-def]
    _, result = plan_and_result
    path = Path(render_gantt(result, tmp_path / "gantt.png", title="fan"))
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000


@pytest.mark.parametrize("suffix", ["png", "svg"])
def test_stage_graph_picture_is_written(tmp_path: Path, suffix: str, plan_and_result) -> None:  # type: ignore[no-untyped-def]
    plan, _ = plan_and_result
    path = Path(render_stage_graph(plan, tmp_path / f"stages.{suffix}"))
    data = path.read_bytes()
    assert len(data) > 10_000
    if suffix == "png":
        assert data.startswith(PNG_MAGIC)
    else:
        assert b"<svg" in data and b"s8" in data


def test_layout_puts_parallel_branches_in_one_column() -> None:
    plan = fan(4, 2, 1, 4)
    depths = stage_depths(plan)
    assert [depths[i] for i in (0, 2, 4, 6)] == [0] * 4 and [depths[i] for i in (1, 3, 5, 7)] == [1] * 4
    pos = layered_positions(plan)
    assert len({pos[i] for i in range(9)}) == 9
    assert all(pos[i][1] == pos[i + 1][1] for i in (0, 2, 4, 6))  # each branch on one row


def test_chrome_trace_has_a_process_per_stage_and_a_thread_per_rank(tmp_path: Path,
                                                                      plan_and_result) -> None:  # type: ignore[no-untyped-def]
    plan, result = plan_and_result
    path = write_chrome_trace(result, tmp_path / "trace.json")
    trace = json.loads(Path(path).read_text())
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in complete} == {s.idx for s in plan.stages}
    ranks = {e["tid"] for e in complete if e["cat"] != "transfer"}
    assert ranks == set(range(plan.world_size))
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in complete)
    forwards = [e for e in complete if e["cat"] == "forward" and e["pid"] == 8]
    assert len(forwards) == 2 * plan.num_micro_batches(8)  # two ranks
    assert chrome_trace(result) == trace


def test_skip_edges_are_drawn(tmp_path: Path) -> None:
    plan = make_plan([(0, 1), (1, 2), (0, 2)], [1, 1, 1], 2, bytes_per_sample=10.0)
    assert Path(render_stage_graph(plan, tmp_path / "skip.png")).stat().st_size > 5_000


def test_op_kinds_come_from_the_graph_modules_first(tmp_path: Path) -> None:
    from graphpipe.graph.op_graph import OpGraph, OpNode
    from graphpipe.simulation.stage_picture import _op_kinds
    from graphpipe.stages.stage_graph import Plan, Stage

    ops = (OpNode(name="x", kind="placeholder", target="x"),
           OpNode(name="fc1", kind="call_module", target="fc1", inputs=("x",), module_type="Linear"),
           OpNode(name="relu", kind="call_function", target="relu", inputs=("fc1",), module_type="relu"),
           OpNode(name="fc2", kind="call_module", target="fc2", inputs=("relu",), module_type="Linear"),
           OpNode(name="output", kind="output", target="output", inputs=("fc2",)))
    graph = OpGraph(name="mlp", ops=ops, example_batch_size=2)
    stage = Stage(idx=0, ops=graph.names, ranks=(0,), micro_batch_size=1, in_flight_samples=1)
    assert _op_kinds(stage, graph) == "Linear×2"
    assert _op_kinds(stage, None) == ""
    plan = Plan(graph_name="mlp", stages=(stage,), edges=(), global_batch_size=2, num_devices=1, planner="t")
    assert Path(render_stage_graph(plan, tmp_path / "one.png", graph=graph)).stat().st_size > 5_000


def test_gantt_draws_core_waits(tmp_path: Path) -> None:
    """Two stages on one shared core: the waits are drawn (light grey, in the legend), not left as white gaps."""
    import dataclasses

    from graphpipe.simulation.gantt import _rows
    from tests.simulation.factories import make_cluster

    cluster = dataclasses.replace(make_cluster(2, devices_per_node=2), cores_per_node=1)
    plan = make_plan([], [1, 1], 4, cluster=cluster)
    result = simulate(plan, make_costs(plan), cluster)
    waits = [e for _, _, events in _rows(result) for e in events if e.kind == "core_wait"]
    assert waits and all(e.duration_ms > 0 for e in waits)
    assert Path(render_gantt(result, tmp_path / "shared.png")).read_bytes().startswith(PNG_MAGIC)
