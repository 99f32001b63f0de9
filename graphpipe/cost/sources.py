"""Where a plan's op costs come from: chosen in one place, recorded in the plan, made again from it.

A plan's predictions hold only for the costs it was searched with: the same plan simulated with
another table predicts another time. So every command gets its costs from `choose_costs`, the
plan records the `CostSource`, and the commands that read a plan make the same table again with
`costs_as_recorded`, with a warning naming both sources whenever they cannot or are told to use
others.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graphpipe.cost.analytic import analytic_costs
from graphpipe.cost.cluster import Cluster, Device
from graphpipe.cost.cost_table import CostTable
from graphpipe.cost.presets import DEFAULT_DEVICE, DEVICE_PRESETS, cluster_preset, device_preset
from graphpipe.errors import CostError, UsageError
from graphpipe.graph.op_graph import OpGraph
from graphpipe.graph.precision import with_activation_dtype

KINDS = ("analytic", "measured", "file")
HASH_SHOWN = 12  # hex digits of a file's sha256 in messages


@dataclass(frozen=True, slots=True, kw_only=True)
class CostSource:
    """How a cost table was made: enough to make the same one again, or to say why it cannot be."""

    kind: str  # "analytic" (the cost model), "measured" (profiled in-process) or "file" (a saved table)
    device: str  # analytic: the device modelled; measured: the device timed; file: the table's device
    dtype: str = "float32"  # analytic: the activation dtype counted (bfloat16 when training under autocast)
    path: str | None = None  # file: as it was given
    sha256: str | None = None  # file: its content when the plan was made

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise CostError(f"unknown cost source kind {self.kind!r}; one of {', '.join(KINDS)}")
        if self.kind == "file" and not (self.path and self.sha256):
            raise CostError("a cost source of kind 'file' needs the file's path and sha256")

    def same_costs(self, other: CostSource) -> bool:
        """Both give the same table: the same file content, or the model on the same device and dtype.
        Measured costs are never the same twice (timings vary from run to run)."""
        if self.kind != other.kind or self.kind == "measured":
            return False
        if self.kind == "file":
            return self.sha256 == other.sha256
        return (self.device, self.dtype) == (other.device, other.dtype)

    def __str__(self) -> str:
        if self.kind == "file":
            return f"costs file {self.path} ({self.device}, sha256 {str(self.sha256)[:HASH_SHOWN]})"
        if self.kind == "measured":
            return f"costs measured on {self.device}"
        activations = "" if self.dtype == "float32" else f", {self.dtype} activations"
        return f"analytic costs on {self.device}{activations}"

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"kind": self.kind, "device": self.device}
        if self.kind == "analytic":
            data["dtype"] = self.dtype
        if self.kind == "file":
            data.update(path=self.path, sha256=self.sha256)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CostSource:
        return cls(kind=data["kind"], device=data["device"], dtype=data.get("dtype", "float32"),
                   path=data.get("path"), sha256=data.get("sha256"))

    @classmethod
    def of_table(cls, table: CostTable) -> CostSource:
        """The source of a table handed over as it is (the API): the model on its device, or measured."""
        return cls(kind="analytic" if table.source == "analytic" else "measured", device=table.device)


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The sha256 of a file's bytes: what tells a plan's costs file from the same name rewritten."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def choose_costs(graph: OpGraph | None = None, *, costs_file: str | os.PathLike[str] | None = None,
                 device: str | Device | None = None, cluster: Cluster | str | None = None,
                 measured: CostTable | None = None, dtype: str = "float32",
                 micro_batch_sizes: Sequence[int] | None = None) -> tuple[CostTable, CostSource]:
    """The costs the inputs ask for, and their source. Give at most one of a costs file, a measured table
    and a device; with none, the analytic model of `graph` on the cluster's device (a `Cluster` or a preset
    name: local-cpu costs as cpu, summit as v100-16gb), else on v100-16gb. `dtype` is the activation dtype
    the analytic model counts."""
    given = [name for name, value in (("a costs file", costs_file), ("measured costs", measured),
                                      ("a device", device)) if value is not None]
    if len(given) > 1:
        raise UsageError(f"costs come from one source, but {' and '.join(given)} were given: pass --costs FILE "
                         "or --device DEVICE, not both")
    if costs_file is not None:
        table = CostTable.load(costs_file)
        return table, CostSource(kind="file", device=table.device, path=os.fspath(costs_file),
                                 sha256=file_sha256(costs_file))
    if measured is not None:
        return measured, CostSource(kind="measured", device=measured.device)
    if graph is None:
        raise CostError("analytic costs need the op graph")
    modelled = _device(device, cluster)
    table = analytic_costs(with_activation_dtype(graph, dtype), modelled, micro_batch_sizes=micro_batch_sizes)
    return table, CostSource(kind="analytic", device=table.device, dtype=dtype)


def _device(device: str | Device | None, cluster: Cluster | str | None) -> Device:
    if isinstance(device, Device):
        return device
    if device:
        return device_preset(device)
    if isinstance(cluster, Cluster):
        return cluster.device
    return cluster_preset(cluster, 1).device if cluster else device_preset(DEFAULT_DEVICE)


def costs_as_recorded(recorded: CostSource | None, graph: Callable[[], OpGraph], *, cluster: Cluster | None = None,
                      costs_file: str | None = None, device: str | None = None, label: str = "the plan",
                      near: str | None = None, micro_batch_sizes: Sequence[int] | None = None,
                      ) -> tuple[CostTable, CostSource, str | None]:
    """The costs a plan was made with, made again, unless the caller asks for others (`costs_file`,
    `device`); the third value is a warning naming both sources when the costs used differ from the
    recorded ones. `graph` is called only for analytic costs; `near` is the plan file, where a recorded
    relative costs path is also looked for; a plan without a record costs as `cluster`'s device."""
    if costs_file is not None or device is not None:
        asked_graph = graph() if device is not None else None
        table, used = choose_costs(asked_graph, costs_file=costs_file, device=device,
                                   dtype=recorded.dtype if recorded else "float32", micro_batch_sizes=micro_batch_sizes)
        differs = recorded is not None and not recorded.same_costs(used)
        return table, used, f"{label} was costed with {recorded}; using {used} as asked" if differs else None
    if recorded is None:
        return (*choose_costs(graph(), cluster=cluster, micro_batch_sizes=micro_batch_sizes), None)
    if recorded.kind == "file":
        return _recorded_file(recorded, label, near)
    modelled = _recorded_device(recorded.device, cluster)
    table, used = choose_costs(graph(), device=modelled, cluster=cluster, dtype=recorded.dtype,
                               micro_batch_sizes=micro_batch_sizes)
    if recorded.kind == "measured":
        return table, used, (f"{label} was costed with {recorded}, which cannot be recreated identically; using "
                             f"{used} instead (pass --costs FILE with a saved profile to use measured costs)")
    if modelled is None:
        return table, used, f"{label} was costed with {recorded}, a device not known here; using {used} instead"
    return table, used, None


def _recorded_device(name: str, cluster: Cluster | None) -> Device | None:
    """The device a plan's costs name: the plan's cluster's when the names agree (a calibrated device
    keeps its numbers), else the preset; None when neither knows the name."""
    if cluster is not None and cluster.device.name == name:
        return cluster.device
    return DEVICE_PRESETS.get(name)


def _recorded_file(recorded: CostSource, label: str, near: str | None) -> tuple[CostTable, CostSource, str | None]:
    path = Path(str(recorded.path))
    if not path.exists() and not path.is_absolute() and near is not None:
        path = Path(near).parent / path
    if not path.exists():
        raise UsageError(f"{label} was costed with {recorded}, which is not there (nor beside the plan); put it "
                         "back, or give other costs (--costs FILE or --device DEVICE)")
    table, used = choose_costs(costs_file=path)
    if used.sha256 == recorded.sha256:
        return table, recorded, None
    return table, used, (f"{label} was costed with {recorded}, but that file has changed since (now sha256 "
                         f"{str(used.sha256)[:HASH_SHOWN]}); using {used} as it is now")
