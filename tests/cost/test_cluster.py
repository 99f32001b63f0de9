"""Cluster topology: links by node and JSON round-trip."""

from __future__ import annotations

import pytest

from graphpipe.cost.cluster import Cluster, Device, Link
from graphpipe.errors import ClusterError

NVLINK = Link(name="nvlink", latency_us=5, bandwidth_gb_per_s=50)
IB = Link(name="ib", latency_us=10, bandwidth_gb_per_s=12.5)


def cluster() -> Cluster:
    device = Device(name="gpu", peak_tflops=100, mem_bandwidth_gb_per_s=900, memory_bytes=16 * 2**30,
                    kernel_overhead_us=5)
    return Cluster(name="c", device=device, num_devices=8, devices_per_node=4, intra_node=NVLINK, inter_node=IB)


def test_links_follow_nodes() -> None:
    c = cluster()
    assert c.num_nodes == 2
    assert c.link(0, 3) is NVLINK and c.link(3, 4) is IB
    assert c.group_link((0, 1)) is NVLINK and c.group_link((0, 5)) is IB


def test_transfer_time_is_latency_plus_bytes_over_bandwidth() -> None:
    assert IB.transfer_ms(12.5e9) == pytest.approx(1000.01)
    assert IB.transfer_ms(0) == 0.0


def test_round_trip_and_resize() -> None:
    c = cluster()
    assert Cluster.from_dict(c.to_dict()) == c
    assert c.with_devices(16).num_nodes == 4


def test_bad_values_raise() -> None:
    with pytest.raises(ClusterError):
        Link(name="x", latency_us=1, bandwidth_gb_per_s=0)


def test_shared_cores_and_overheads_round_trip_and_old_json_loads() -> None:
    c = cluster()
    assert c.cores_per_node is None and c.device.fwd_action_overhead_us == 0.0
    device = Device(name="cpu", peak_tflops=0.05, mem_bandwidth_gb_per_s=20, memory_bytes=2**30,
                    kernel_overhead_us=30, fwd_action_overhead_us=400, bwd_action_overhead_us=900,
                    step_overhead_us=1500)
    shared = Cluster(name="cpu", device=device, num_devices=4, devices_per_node=4, intra_node=NVLINK,
                     inter_node=NVLINK, cores_per_node=2)
    assert Cluster.from_dict(shared.to_dict()) == shared
    assert shared.with_devices(8).cores_per_node == 2
    old = c.to_dict()
    del old["cores_per_node"]
    for key in ("fwd_action_overhead_us", "bwd_action_overhead_us", "step_overhead_us"):
        del old["device"][key]
    assert Cluster.from_dict(old) == c


def test_bad_cores_and_overheads_raise() -> None:
    with pytest.raises(ClusterError, match="cores_per_node"):
        Cluster(name="c", device=cluster().device, num_devices=2, devices_per_node=2, intra_node=NVLINK,
                inter_node=IB, cores_per_node=0)
    with pytest.raises(ClusterError, match="overheads"):
        Device(name="d", peak_tflops=1, mem_bandwidth_gb_per_s=1, memory_bytes=1, kernel_overhead_us=0,
               step_overhead_us=-1)
