"""A kept host calibration makes `local-cpu` this machine; one from another machine, or none, leaves the preset."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphpipe.cost.cluster import Cluster, Link
from graphpipe.cost.host_cache import CACHE_ENV, CachedHost, cache_path, load_host, save_host
from graphpipe.cost.presets import DEVICE_PRESETS
from graphpipe.errors import GraphPipeError
from graphpipe.stages.stage_graph import Plan

LINK = Link(name="gloo-loopback-measured", latency_us=60.0, bandwidth_gb_per_s=2.5)
COLLECTIVE = Link(name="gloo-all-reduce-measured", latency_us=90.0, bandwidth_gb_per_s=1.0)


def calibrated() -> CachedHost:
    import dataclasses

    device = dataclasses.replace(DEVICE_PRESETS["cpu"], name="cpu-host", peak_tflops=0.05, step_overhead_us=500.0,
                                 fwd_action_overhead_us=40.0, bwd_action_overhead_us=60.0)
    alone = dataclasses.replace(device, step_overhead_us=100.0)
    return CachedHost(device=device, single_device=alone, link=LINK, collective=COLLECTIVE, details={"model": "mmt"})


def test_the_tests_see_no_calibration() -> None:
    assert not cache_path().exists()
    assert Cluster.preset("local-cpu", 2).device == DEVICE_PRESETS["cpu"]


def test_local_cpu_is_the_kept_calibration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    save_host(calibrated())
    cluster = Cluster.preset("local-cpu", 3)
    assert cluster.device == calibrated().device and cluster.device.host_calibrated
    assert cluster.intra_node == cluster.inter_node == LINK and cluster.collective == COLLECTIVE
    assert cluster.group_link((0, 1)) == COLLECTIVE and cluster.link(0, 1) == LINK
    assert Cluster.from_dict(cluster.to_dict()) == cluster
    assert Cluster.preset("local-cpu", 1).device == calibrated().single_device  # one worker alone


def test_a_calibration_of_another_machine_is_not_read(tmp_path: Path) -> None:
    path = save_host(calibrated(), tmp_path / "host.json")
    data = json.loads(path.read_text())
    data["machine"]["cpus"] = 1024
    path.write_text(json.dumps(data))
    assert load_host(path) is None


@pytest.mark.parametrize("damage", ["{", '{"format": "graphpipe.host-calibration/0"}'])
def test_a_damaged_calibration_is_an_error_naming_it(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "host.json"
    path.write_text(damage)
    with pytest.raises(GraphPipeError, match="host"):
        load_host(path)


def test_calibrate_then_plan_on_local_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """The command measures this host (its default model, few steps), keeps it, and a local-cpu plan is then of this
    host: its device has the measured overheads and its all-reduce the measured link; --show and --remove."""
    from graphpipe.cli import calibrate_cmd, plan_cmd
    from tests.cli.run_command import run_command

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    assert run_command(calibrate_cmd, ["calibrate", "--steps", "3", "--keep-noisy", "--json"]) == 0
    kept = json.loads(capsys.readouterr().out)
    assert kept["device"]["name"] == "cpu-host" and kept["details"]["host"]["workers"] == 2
    assert kept["details"]["host_single"]["workers"] == 1 and kept["single_device"]["name"] == "cpu-host"
    assert kept["link"]["bandwidth_gb_per_s"] > 0 and kept["collective"]["latency_us"] > 0
    assert kept["collective"]["latency_us"] >= kept["details"]["all_reduce_alone"]["latency_us"]
    plan_path = tmp_path / "plan.json"
    assert run_command(plan_cmd, ["plan", "--model", "toy_chain", "--cluster", "local-cpu", "--devices", "2",
                                  "-o", str(plan_path)]) == 0
    cluster = Cluster.from_dict(Plan.load(plan_path).cluster or {})
    assert cluster.device.to_dict() == kept["device"] and cluster.collective == Link.from_dict(kept["collective"])
    capsys.readouterr()
    assert run_command(calibrate_cmd, ["calibrate", "--show"]) == 0
    shown = capsys.readouterr().out
    assert "workers (a pipeline, data parallel): ops' per-sample time x" in shown and "all-reduce in training" in shown
    assert run_command(calibrate_cmd, ["calibrate", "--remove"]) == 0
    assert load_host() is None and Cluster.preset("local-cpu", 2).device == DEVICE_PRESETS["cpu"]
