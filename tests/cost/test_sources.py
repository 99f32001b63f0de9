"""Cost sources: one choice of costs from the inputs, a record that makes the same table again, and
warnings that name both sources when the costs used differ from the recorded ones."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pytest

from graphpipe.cost.analytic import analytic_costs
from graphpipe.cost.cluster import Cluster, Device
from graphpipe.cost.cost_table import CostTable
from graphpipe.cost.presets import cluster_device
from graphpipe.cost.sources import CostSource, choose_costs, costs_as_recorded
from graphpipe.errors import CostError, UsageError
from graphpipe.graph.op_graph import OpGraph
from tests.cost.graphs import mlp_graph

GRAPH = mlp_graph(batch=8)


def graph() -> OpGraph:
    return GRAPH


@pytest.fixture()
def costs_file(tmp_path: Path) -> Path:
    path = tmp_path / "costs.json"
    CostTable(device="cpu", source="measured", entries=analytic_costs(GRAPH, "cpu").entries).save(str(path))
    return path


# ---- the choice -----------------------------------------------------------------------------
@pytest.mark.parametrize(("cluster", "device"), [("local-cpu", "cpu"), ("summit", "v100-16gb"),
                                                 ("dgx-h100", "h100-80gb"), (None, "v100-16gb")])
def test_a_cluster_implies_its_device(cluster: str | None, device: str) -> None:
    table, source = choose_costs(GRAPH, cluster=cluster)
    assert source == CostSource(kind="analytic", device=device) and table.device == device
    assert table.entries == analytic_costs(GRAPH, device).entries
    if cluster:
        assert cluster_device(cluster) == device
        assert choose_costs(GRAPH, cluster=Cluster.preset(cluster, 2))[1] == source


def test_a_named_device_wins_over_the_cluster() -> None:
    _, source = choose_costs(GRAPH, device="a100-80gb", cluster="local-cpu")
    assert source.device == "a100-80gb" and str(source) == "analytic costs on a100-80gb"


def test_a_file_is_recorded_with_its_path_and_hash(costs_file: Path) -> None:
    table, source = choose_costs(costs_file=str(costs_file), cluster="summit")
    assert table == CostTable.load(str(costs_file))
    assert source.kind == "file" and source.path == str(costs_file) and source.device == "cpu"
    assert source.sha256 == hashlib.sha256(costs_file.read_bytes()).hexdigest()
    assert str(source) == f"costs file {costs_file} (cpu, sha256 {source.sha256[:12]})"


def test_measured_tables_and_tables_handed_over() -> None:
    measured = CostTable(device="cpu", source="measured", entries=analytic_costs(GRAPH, "cpu").entries)
    assert choose_costs(measured=measured) == (measured, CostSource(kind="measured", device="cpu"))
    assert CostSource.of_table(measured) == CostSource(kind="measured", device="cpu")
    assert CostSource.of_table(analytic_costs(GRAPH, "cpu")) == CostSource(kind="analytic", device="cpu")


def test_low_precision_activations_are_part_of_the_source() -> None:
    table, source = choose_costs(GRAPH, device="cpu", dtype="bfloat16")
    assert str(source) == "analytic costs on cpu, bfloat16 activations"
    assert table.at("fc1", 8).output_bytes == analytic_costs(GRAPH, "cpu").at("fc1", 8).output_bytes // 2


def test_two_sources_at_once_are_refused(costs_file: Path) -> None:
    with pytest.raises(UsageError, match="a costs file and a device"):
        choose_costs(GRAPH, costs_file=str(costs_file), device="cpu")
    with pytest.raises(CostError, match="unknown device preset"):
        choose_costs(GRAPH, device="tpu")


def test_sources_round_trip_and_compare() -> None:
    file = CostSource(kind="file", device="cpu", path="c.json", sha256="ab" * 32)
    analytic = CostSource(kind="analytic", device="cpu", dtype="bfloat16")
    for source in (file, analytic, CostSource(kind="measured", device="cpu")):
        assert CostSource.from_dict(source.to_dict()) == source
    assert file.same_costs(CostSource(kind="file", device="cpu", path="elsewhere.json", sha256="ab" * 32))
    assert not analytic.same_costs(CostSource(kind="analytic", device="cpu"))
    assert not CostSource(kind="measured", device="cpu").same_costs(CostSource(kind="measured", device="cpu"))
    with pytest.raises(CostError, match="path and sha256"):
        CostSource(kind="file", device="cpu")


# ---- made again from the record -------------------------------------------------------------
def test_recorded_analytic_costs_are_the_same_table_without_a_warning() -> None:
    table, recorded = choose_costs(GRAPH, cluster="local-cpu", dtype="bfloat16")
    again, used, warning = costs_as_recorded(recorded, graph, cluster=Cluster.preset("summit", 4))
    assert (again, used, warning) == (table, recorded, None)


def test_a_calibrated_device_is_taken_from_the_plans_cluster() -> None:
    calibrated = Device(name="cpu", peak_tflops=0.2, mem_bandwidth_gb_per_s=10.0, memory_bytes=2**30,
                        kernel_overhead_us=10.0)
    cluster = dataclasses.replace(Cluster.preset("local-cpu", 2), device=calibrated)
    table, recorded = choose_costs(GRAPH, cluster=cluster)
    assert table != analytic_costs(GRAPH, "cpu")
    assert costs_as_recorded(recorded, graph, cluster=cluster)[0] == table


def test_asking_for_other_costs_warns_with_both_sources(costs_file: Path) -> None:
    _, recorded = choose_costs(GRAPH, cluster="local-cpu")
    table, used, warning = costs_as_recorded(recorded, graph, device="v100-16gb", label="plan p.json")
    assert used.device == "v100-16gb" and table.device == "v100-16gb"
    assert warning == ("plan p.json was costed with analytic costs on cpu; using analytic costs on v100-16gb "
                       "as asked")
    _, used, warning = costs_as_recorded(recorded, graph, costs_file=str(costs_file))
    assert used.kind == "file" and warning and "analytic costs on cpu" in warning and str(used) in warning
    assert costs_as_recorded(recorded, graph, device="cpu")[2] is None


def test_a_changed_costs_file_warns_with_both_hashes(costs_file: Path) -> None:
    _, recorded = choose_costs(costs_file=str(costs_file))
    assert costs_as_recorded(recorded, graph)[2] is None
    costs_file.write_text(costs_file.read_text().replace('"source": "measured"', '"source": "measured again"'))
    table, used, warning = costs_as_recorded(recorded, graph, label="plan p.json")
    assert table.source == "measured again" and used.sha256 != recorded.sha256
    assert warning and "plan p.json was costed with" in warning and str(recorded.sha256)[:12] in warning
    assert str(used.sha256)[:12] in warning


def test_a_relative_costs_path_is_also_found_beside_the_plan(costs_file: Path, monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Path) -> None:
    recorded = CostSource(kind="file", device="cpu", path="costs.json",
                          sha256=hashlib.sha256(costs_file.read_bytes()).hexdigest())
    monkeypatch.chdir(tmp_path.parent)
    table, used, warning = costs_as_recorded(recorded, graph, near=str(tmp_path / "plan.json"))
    assert used == recorded and warning is None and table.device == "cpu"
    with pytest.raises(UsageError, match=r"which is not there \(nor beside the plan\); put it back"):
        costs_as_recorded(recorded, graph, label="plan p.json")


def test_measured_costs_cannot_be_made_again_and_say_so() -> None:
    recorded = CostSource(kind="measured", device="cpu")
    table, used, warning = costs_as_recorded(recorded, graph, label="plan p.json")
    assert used == CostSource(kind="analytic", device="cpu") and table.source == "analytic"
    assert warning is not None and warning.startswith(
        "plan p.json was costed with costs measured on cpu, which cannot be recreated identically; using "
        "analytic costs on cpu instead")


def test_an_unknown_recorded_device_falls_back_to_the_cluster_with_a_warning() -> None:
    recorded = CostSource(kind="analytic", device="tpu-v9")
    _, used, warning = costs_as_recorded(recorded, graph, cluster=Cluster.preset("local-cpu", 2))
    assert used.device == "cpu" and warning and "tpu-v9" in warning and "analytic costs on cpu" in warning


def test_a_plan_without_a_record_costs_on_its_cluster_silently() -> None:
    table, used, warning = costs_as_recorded(None, graph, cluster=Cluster.preset("local-cpu", 2))
    assert used.device == "cpu" and table.device == "cpu" and warning is None
