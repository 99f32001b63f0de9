"""Device and cluster presets: names, topology, defaults, and errors that list the choices."""

from __future__ import annotations

import os

import pytest

from graphpipe.cost.cluster import Cluster, Device
from graphpipe.cost.presets import CLUSTER_PRESETS, DEVICE_PRESETS, cluster_preset, device_preset
from graphpipe.errors import ClusterError, CostError

GIB = 2**30


def test_every_named_device_exists_and_is_sane() -> None:
    assert set(DEVICE_PRESETS) == {"v100-16gb", "a100-40gb", "a100-80gb", "h100-80gb", "h200-141gb", "cpu"}
    for name, device in DEVICE_PRESETS.items():
        assert device_preset(name) is device and device.name == name
        assert device.kernel_overhead_us > 0 and device.elementwise_tflops < device.peak_tflops


def test_gpu_generations_get_faster_and_memory_matches_the_name() -> None:
    v100, a100, h100 = device_preset("v100-16gb"), device_preset("a100-80gb"), device_preset("h100-80gb")
    assert v100.peak_tflops < a100.peak_tflops < h100.peak_tflops
    assert v100.mem_bandwidth_gb_per_s == 900.0 and v100.memory_bytes == 16 * GIB
    assert device_preset("a100-40gb").memory_bytes == 40 * GIB and h100.memory_bytes == 80 * GIB
    assert device_preset("h200-141gb").mem_bandwidth_gb_per_s > h100.mem_bandwidth_gb_per_s
    assert v100.peak_tflops < 125.0  # an achievable peak, below the datasheet's tensor-core number


def test_unknown_device_lists_the_presets() -> None:
    with pytest.raises(CostError, match=r"v100-16gb.*h200-141gb"):
        device_preset("tpu-v9")


def test_summit_is_nodes_of_four_v100_with_nvlink_and_edr() -> None:
    summit = cluster_preset("summit", 32)
    assert summit.num_devices == 32 and summit.devices_per_node == 4 and summit.num_nodes == 8
    assert summit.device == device_preset("v100-16gb")
    assert summit.inter_node.bandwidth_gb_per_s == 12.5  # 100 Gb/s EDR InfiniBand
    assert summit.intra_node.bandwidth_gb_per_s > summit.inter_node.bandwidth_gb_per_s
    assert summit.link(0, 3) is summit.intra_node and summit.link(3, 4) is summit.inter_node


def test_defaults_and_the_cluster_preset_entry_point() -> None:
    assert cluster_preset("local-cpu").num_devices == 4
    local = cluster_preset("local-cpu", 3)
    assert local.num_nodes == 1 and local.device.name == "cpu"
    assert local.cores_per_node == (os.cpu_count() or 1)
    assert all(cluster_preset(name).cores_per_node is None for name in CLUSTER_PRESETS if name != "local-cpu")
    assert Cluster.preset("dgx-h100", num_devices=16).num_nodes == 2
    for name in CLUSTER_PRESETS:
        cluster = cluster_preset(name)
        assert Cluster.from_dict(cluster.to_dict()) == cluster


def test_unknown_cluster_and_bad_sizes_raise() -> None:
    with pytest.raises(ClusterError, match="summit"):
        cluster_preset("frontier")
    with pytest.raises(ClusterError, match="at least 1"):
        cluster_preset("summit", 0)


def test_device_round_trips_and_reads_older_json_without_new_fields() -> None:
    device = device_preset("cpu")
    assert Device.from_dict(device.to_dict()) == device
    old = {key: value for key, value in device_preset("v100-16gb").to_dict().items() if key != "matmul_half_rows"}
    assert Device.from_dict(old).matmul_half_rows == 64.0
