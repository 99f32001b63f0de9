"""Named devices and clusters, with where their numbers come from.

Device numbers are what a training step can *achieve*, not the datasheet's headline:
`peak_tflops` is the dense-matmul throughput large GEMMs reach in the training dtype
(fp16 on V100, bf16 on A100/H100/H200), about 60-70% of the datasheet tensor-core peak,
because whole layers (bias, layouts, tile quantisation) never reach the headline number.
`mem_bandwidth_gb_per_s` is the datasheet HBM bandwidth, `elementwise_tflops` the
non-tensor-core (CUDA core, fp32) datasheet number, and `kernel_overhead_us` the fixed
cost of one eager PyTorch kernel (CPU dispatch plus launch, a few microseconds).
Link bandwidths are per direction between one pair of devices.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from graphpipe.cost.cluster import Cluster, Device, Link
from graphpipe.errors import ClusterError, CostError

GIB = 2**30
DEFAULT_DEVICE = "v100-16gb"  # analytic costs when neither a device nor a cluster is named (the paper's GPU)

DEVICE_PRESETS: dict[str, Device] = {
    # NVIDIA V100 SXM2 16 GB (Tesla V100 datasheet): 125 TFLOP/s fp16 tensor, 15.7 TFLOP/s fp32,
    # 900 GB/s HBM2, 16 GiB. Large fp16 GEMMs reach roughly 60-70% of the tensor peak: 80 TFLOP/s.
    "v100-16gb": Device(name="v100-16gb", peak_tflops=80.0, mem_bandwidth_gb_per_s=900.0,
                        memory_bytes=16 * GIB, kernel_overhead_us=5.0, elementwise_tflops=15.7),
    # NVIDIA A100 SXM4 40 GB (A100 datasheet): 312 TFLOP/s bf16 tensor (dense), 19.5 TFLOP/s fp32,
    # 1555 GB/s HBM2, 40 GiB. Achievable large bf16 GEMM: about 200 TFLOP/s.
    "a100-40gb": Device(name="a100-40gb", peak_tflops=200.0, mem_bandwidth_gb_per_s=1555.0,
                        memory_bytes=40 * GIB, kernel_overhead_us=5.0, elementwise_tflops=19.5),
    # NVIDIA A100 SXM4 80 GB: the same compute, 2039 GB/s HBM2e, 80 GiB.
    "a100-80gb": Device(name="a100-80gb", peak_tflops=200.0, mem_bandwidth_gb_per_s=2039.0,
                        memory_bytes=80 * GIB, kernel_overhead_us=5.0, elementwise_tflops=19.5),
    # NVIDIA H100 SXM5 80 GB (H100 datasheet): 989 TFLOP/s bf16 tensor (dense), 67 TFLOP/s fp32,
    # 3350 GB/s HBM3, 80 GiB. Achievable large bf16 GEMM: about 600 TFLOP/s.
    "h100-80gb": Device(name="h100-80gb", peak_tflops=600.0, mem_bandwidth_gb_per_s=3350.0,
                        memory_bytes=80 * GIB, kernel_overhead_us=4.0, elementwise_tflops=67.0),
    # NVIDIA H200 SXM 141 GB (H200 datasheet): H100's compute, 4800 GB/s HBM3e, 141 GB. The faster
    # memory keeps the tensor cores fed a little better: about 650 TFLOP/s on large bf16 GEMMs.
    "h200-141gb": Device(name="h200-141gb", peak_tflops=650.0, mem_bandwidth_gb_per_s=4800.0,
                         memory_bytes=141 * 10**9, kernel_overhead_us=4.0, elementwise_tflops=67.0),
    # One single-threaded fp32 CPU worker process of the machine the tests run on (the `local-cpu`
    # cluster's device). Rounded from `calibrate_device` fits to measured profiles (1 thread, micro-
    # batches 1-16) of a mid-sized mmt (--set seq_len=32 hidden=128 num_heads=4 ffn_hidden=512
    # num_branches=2: 53 GFLOP/s, 47 us per kernel, half peak at 32 rows) and candle_uno (--set
    # hidden=512 in_features=256 head_hidden=256: 71 GFLOP/s, 20 us, 16 rows, 19 GB/s):
    #   graphpipe profile --model mmt --set ... --batch 16 --micro-batch-sizes 1,2,4,8,16 --calibrate
    # Small tensors stay in cache, so the bandwidth is that of one core streaming from DRAM.
    # Memory: 4 GiB per worker, a share of a small machine's RAM.
    "cpu": Device(name="cpu", peak_tflops=0.06, mem_bandwidth_gb_per_s=20.0, memory_bytes=4 * GIB,
                  kernel_overhead_us=30.0, elementwise_tflops=0.005, matmul_half_rows=16.0),
}


def device_preset(name: str) -> Device:
    """The named device; raises CostError listing the presets for an unknown name."""
    try:
        return DEVICE_PRESETS[name]
    except KeyError:
        raise CostError(f"unknown device preset {name!r}; choose one of {', '.join(DEVICE_PRESETS)}") from None


# NVLink 2.0 on Summit: two bricks of 25 GB/s per direction between GPUs of one socket = 50 GB/s;
# a few microseconds per message through NCCL.
_NVLINK2 = Link(name="nvlink2", latency_us=3.0, bandwidth_gb_per_s=50.0)
# EDR InfiniBand, 100 Gb/s = 12.5 GB/s; about 1-2 us on the wire and switch, ~5 us through the stack.
_EDR_IB = Link(name="edr-ib", latency_us=5.0, bandwidth_gb_per_s=12.5)
# NVLink 3 through NVSwitch (DGX A100): 600 GB/s bidirectional per GPU = 300 GB/s per direction.
_NVLINK3 = Link(name="nvlink3-nvswitch", latency_us=3.0, bandwidth_gb_per_s=300.0)
# DGX A100: one 200 Gb/s HDR InfiniBand adapter per GPU = 25 GB/s per GPU between nodes.
_HDR_IB = Link(name="hdr-ib", latency_us=5.0, bandwidth_gb_per_s=25.0)
# NVLink 4 through NVSwitch (DGX H100): 900 GB/s bidirectional per GPU = 450 GB/s per direction.
_NVLINK4 = Link(name="nvlink4-nvswitch", latency_us=3.0, bandwidth_gb_per_s=450.0)
# DGX H100: one 400 Gb/s NDR InfiniBand adapter per GPU = 50 GB/s per GPU between nodes.
_NDR_IB = Link(name="ndr-ib", latency_us=5.0, bandwidth_gb_per_s=50.0)
# gloo over loopback TCP between two single-threaded worker processes on this 2-core machine:
# send/recv ping-pong measured ~200-250 us one way for small messages and ~2.3 GB/s for
# 16-64 MiB messages; rounded to 200 us and 2 GB/s (workers share the cores).
_LOOPBACK = Link(name="gloo-loopback", latency_us=200.0, bandwidth_gb_per_s=2.0)


def _summit(num_devices: int) -> Cluster:
    # Summit (OLCF): the paper uses nodes of 4 x V100 16 GB with NVLink inside a node and EDR
    # InfiniBand between nodes (Summit's nodes hold 6 GPUs; we follow the paper's 4).
    return Cluster(name="summit", device=DEVICE_PRESETS["v100-16gb"], num_devices=num_devices,
                   devices_per_node=4, intra_node=_NVLINK2, inter_node=_EDR_IB)


def _dgx_a100(num_devices: int) -> Cluster:
    return Cluster(name="dgx-a100", device=DEVICE_PRESETS["a100-80gb"], num_devices=num_devices,
                   devices_per_node=8, intra_node=_NVLINK3, inter_node=_HDR_IB)


def _dgx_h100(num_devices: int) -> Cluster:
    return Cluster(name="dgx-h100", device=DEVICE_PRESETS["h100-80gb"], num_devices=num_devices,
                   devices_per_node=8, intra_node=_NVLINK4, inter_node=_NDR_IB)


def _local_cpu(num_devices: int) -> Cluster:
    # Every worker is on this one machine: one node, loopback on both link kinds, and the workers
    # share the machine's cores (os.cpu_count() when the preset is built). Once `graphpipe calibrate`
    # has measured this host, its device and links are the measured ones (`graphpipe.cost.host_cache`).
    from graphpipe.cost.host_cache import load_host

    host = load_host()
    device, link = (host.device_for(num_devices), host.link) if host else (DEVICE_PRESETS["cpu"], _LOOPBACK)
    return Cluster(name="local-cpu", device=device, num_devices=num_devices,
                   devices_per_node=num_devices, intra_node=link, inter_node=link,
                   cores_per_node=os.cpu_count() or 1, collective=host.collective if host else None)


# name -> (builder, default number of devices)
CLUSTER_PRESETS: dict[str, tuple[Callable[[int], Cluster], int]] = {
    "summit": (_summit, 32),  # the paper's largest runs
    "dgx-a100": (_dgx_a100, 8),
    "dgx-h100": (_dgx_h100, 8),
    "local-cpu": (_local_cpu, 4),
}


def cluster_device(name: str) -> str:
    """The device preset a cluster preset is built from (local-cpu: cpu, summit: v100-16gb): the device
    analytic costs default to when a command names the cluster but no device."""
    return cluster_preset(name, 1).device.name


def cluster_preset(name: str, num_devices: int | None = None) -> Cluster:
    """The named cluster with `num_devices` devices (the preset's default when None)."""
    try:
        build, default_devices = CLUSTER_PRESETS[name]
    except KeyError:
        raise ClusterError(f"unknown cluster preset {name!r}; choose one of {', '.join(CLUSTER_PRESETS)}") from None
    count = default_devices if num_devices is None else num_devices
    if count < 1:
        raise ClusterError(f"cluster {name!r} needs at least 1 device, got num_devices={count}")
    return build(count)
