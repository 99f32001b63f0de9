"""Devices, the links between them, and clusters of nodes: the hardware the planner plans for.

A cluster is `num_nodes` nodes of `devices_per_node` identical devices; ranks are numbered
node by node, so ranks r and r' share a node iff r // devices_per_node == r' // devices_per_node.
`cores_per_node` is None for accelerators (each device computes on its own); a number says the
devices are worker processes that share that many host cores (the `local-cpu` cluster), so the
simulator lets at most that many of a node's ranks compute at once.
Presets live in `graphpipe.cost.presets`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from graphpipe.errors import ClusterError

__all__ = ["Cluster", "Device", "Link"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Device:
    """One accelerator (or CPU worker) as the roofline model sees it."""

    name: str
    peak_tflops: float  # dense matmul throughput in the training dtype
    mem_bandwidth_gb_per_s: float
    memory_bytes: int
    kernel_overhead_us: float  # fixed cost of launching one kernel
    elementwise_tflops: float = 0.0  # non-matmul throughput; 0 means peak_tflops / 8
    matmul_half_rows: float = 64.0  # GEMM rows (M) at which a matmul reaches half of peak_tflops
    # Fixed host cost of one forward / backward action of a stage, whatever its ops: the runtime's
    # dispatch of the stage module, slicing, the autograd.backward call. A per-op profile misses it.
    fwd_action_overhead_us: float = 0.0
    bwd_action_overhead_us: float = 0.0
    step_overhead_us: float = 0.0  # fixed cost of one optimizer step (on top of streaming the state)
    # What the optimizer streams its state at, where it is not `mem_bandwidth_gb_per_s` (0): a CPU host's Adam,
    # measured (`graphpipe calibrate`), runs far below the bandwidth an op profile's fit gives.
    step_bandwidth_gb_per_s: float = 0.0

    @property
    def host_calibrated(self) -> bool:
        """Whether the host costs a per-op model misses were measured (`benchmarks/runtime`): per-action and
        optimizer-step overheads. No preset has them, so a simulation of a preset device is of a model of
        that device, not of the machine it runs on."""
        return max(self.fwd_action_overhead_us, self.bwd_action_overhead_us, self.step_overhead_us) > 0

    def __post_init__(self) -> None:
        if min(self.peak_tflops, self.mem_bandwidth_gb_per_s) <= 0 or self.memory_bytes <= 0:
            raise ClusterError(f"device {self.name!r}: throughput, bandwidth and memory must be positive")
        if min(self.kernel_overhead_us, self.elementwise_tflops, self.matmul_half_rows) < 0:
            raise ClusterError(f"device {self.name!r}: kernel overhead, elementwise throughput and "
                               "matmul_half_rows must be >= 0")
        if min(self.fwd_action_overhead_us, self.bwd_action_overhead_us, self.step_overhead_us,
               self.step_bandwidth_gb_per_s) < 0:
            raise ClusterError(f"device {self.name!r}: action and step overheads and the step's bandwidth must be "
                               ">= 0, got "
                               f"{self.fwd_action_overhead_us}, {self.bwd_action_overhead_us} and "
                               f"{self.step_overhead_us} us")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "peak_tflops": self.peak_tflops,
                "mem_bandwidth_gb_per_s": self.mem_bandwidth_gb_per_s, "memory_bytes": self.memory_bytes,
                "kernel_overhead_us": self.kernel_overhead_us, "elementwise_tflops": self.elementwise_tflops,
                "matmul_half_rows": self.matmul_half_rows, "fwd_action_overhead_us": self.fwd_action_overhead_us,
                "bwd_action_overhead_us": self.bwd_action_overhead_us, "step_overhead_us": self.step_overhead_us,
                **({"step_bandwidth_gb_per_s": self.step_bandwidth_gb_per_s} if self.step_bandwidth_gb_per_s else {})}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Device:
        return cls(**dict(data))


@dataclass(frozen=True, slots=True, kw_only=True)
class Link:
    """A point-to-point link: sending n bytes takes latency_us + n / bandwidth."""

    name: str
    latency_us: float
    bandwidth_gb_per_s: float

    def __post_init__(self) -> None:
        if self.latency_us < 0 or self.bandwidth_gb_per_s <= 0:
            raise ClusterError(f"link {self.name!r}: latency must be >= 0 and bandwidth > 0")

    def transfer_ms(self, num_bytes: float) -> float:
        if num_bytes <= 0:
            return 0.0
        return self.latency_us / 1e3 + num_bytes / (self.bandwidth_gb_per_s * 1e9) * 1e3

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "latency_us": self.latency_us, "bandwidth_gb_per_s": self.bandwidth_gb_per_s}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Link:
        return cls(**dict(data))


@dataclass(frozen=True, slots=True, kw_only=True)
class Cluster:
    """`num_devices` identical devices, `devices_per_node` per node, two kinds of links."""

    name: str
    device: Device
    num_devices: int
    devices_per_node: int
    intra_node: Link
    inter_node: Link
    cores_per_node: int | None = None  # host cores a node's devices share; None = independent accelerators
    # The link on which the ring formula gives a collective inside one node, where it is not the point-to-point
    # one: gloo's all-reduce over loopback reduces on the host, slower than its sends (`runtime.loopback`).
    collective: Link | None = None

    def __post_init__(self) -> None:
        if self.num_devices < 1 or self.devices_per_node < 1:
            raise ClusterError(f"cluster {self.name!r}: needs >= 1 device and >= 1 device per node, "
                               f"got {self.num_devices} and {self.devices_per_node}")
        if self.cores_per_node is not None and self.cores_per_node < 1:
            raise ClusterError(f"cluster {self.name!r}: cores_per_node must be >= 1 or None, "
                               f"got {self.cores_per_node}")

    @property
    def num_nodes(self) -> int:
        return -(-self.num_devices // self.devices_per_node)

    def node_of(self, rank: int) -> int:
        return rank // self.devices_per_node

    def link(self, rank_a: int, rank_b: int) -> Link:
        return self.intra_node if self.node_of(rank_a) == self.node_of(rank_b) else self.inter_node

    def group_link(self, ranks: tuple[int, ...]) -> Link:
        """The slowest link inside a group of ranks (what a ring all-reduce over them runs at)."""
        nodes = {self.node_of(rank) for rank in ranks}
        return self.node_collective if len(nodes) <= 1 else self.inter_node

    @property
    def node_collective(self) -> Link:
        """The link a collective inside one node runs at (`collective`, else the intra-node link)."""
        return self.collective or self.intra_node

    def with_devices(self, num_devices: int) -> Cluster:
        return Cluster(name=self.name, device=self.device, num_devices=num_devices,
                       devices_per_node=self.devices_per_node, intra_node=self.intra_node,
                       inter_node=self.inter_node, cores_per_node=self.cores_per_node, collective=self.collective)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "device": self.device.to_dict(), "num_devices": self.num_devices,
                "devices_per_node": self.devices_per_node, "intra_node": self.intra_node.to_dict(),
                "inter_node": self.inter_node.to_dict(), "cores_per_node": self.cores_per_node,
                **({"collective": self.collective.to_dict()} if self.collective else {})}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Cluster:
        return cls(name=data["name"], device=Device.from_dict(data["device"]), num_devices=data["num_devices"],
                   devices_per_node=data["devices_per_node"], intra_node=Link.from_dict(data["intra_node"]),
                   inter_node=Link.from_dict(data["inter_node"]), cores_per_node=data.get("cores_per_node"),
                   collective=Link.from_dict(data["collective"]) if data.get("collective") else None)

    @staticmethod
    def preset(name: str, num_devices: int | None = None) -> Cluster:
        """A named cluster (`summit`, `local-cpu`, `dgx-a100`, ...); see `graphpipe.cost.presets`."""
        from graphpipe.cost.presets import cluster_preset

        return cluster_preset(name, num_devices)

    def __str__(self) -> str:
        return (f"{self.name}: {self.num_devices} x {self.device.name} "
                f"({self.num_nodes} nodes of {self.devices_per_node})")
