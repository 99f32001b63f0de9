"""This host's calibration, kept once `graphpipe calibrate` measured it, for the `local-cpu` cluster to read.

The `cpu` device preset is a model of a single-threaded CPU worker, not of this machine: plans made with it
rank by times that are not this machine's, and `graphpipe train` prints `uncal.` beside the measured
iteration. `graphpipe calibrate` measures this host (the op costs fitted to the `cpu` device's analytic model,
the runtime's overheads and the slowdown of workers computing at once, the gloo links:
`graphpipe.cost.host_calibration`, `graphpipe.runtime.loopback`) and saves them here; from then on the
`local-cpu` preset is this host: its device and links are the measured ones (the device of workers running a
pipeline, or of one worker alone for a one-device cluster). The file names the machine it
was made on (host name, cores, torch); on another machine, or under another torch, it is not read.

Where: `$GRAPHPIPE_CACHE_DIR/host-calibration.json`, else `$XDG_CACHE_HOME/graphpipe/...`, else
`~/.cache/graphpipe/...`.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graphpipe.cost.cluster import Device, Link
from graphpipe.errors import GraphPipeError
from graphpipe.serde import read_json_object, write_json_atomic

FORMAT = "graphpipe.host-calibration/1"
CACHE_ENV = "GRAPHPIPE_CACHE_DIR"
FILE_NAME = "host-calibration.json"


@dataclass(frozen=True, slots=True, kw_only=True)
class CachedHost:
    """What the `local-cpu` preset takes from a calibration of this host."""

    device: Device  # workers running a pipeline: host_calibrated, per-action and step overheads measured
    single_device: Device  # one worker alone (a one-device cluster): no neighbour shares the host, no messages
    link: Link  # gloo point-to-point between two worker processes
    collective: Link  # gloo's all-reduce, as the ring formula's link
    details: dict[str, Any]  # the fits and measurements, for `graphpipe calibrate --show`

    def device_for(self, num_devices: int) -> Device:
        """The device of a `local-cpu` cluster of `num_devices` workers."""
        return self.single_device if num_devices <= 1 else self.device

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "machine": this_machine(), "device": self.device.to_dict(),
                "single_device": self.single_device.to_dict(), "link": self.link.to_dict(),
                "collective": self.collective.to_dict(), "details": self.details}


def cache_path() -> Path:
    """Where this host's calibration is kept (see the module docstring)."""
    root = os.environ.get(CACHE_ENV)
    if root:
        return Path(root) / FILE_NAME
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "graphpipe" / FILE_NAME


def this_machine() -> dict[str, Any]:
    """What a calibration holds for: a different machine, core count or torch measures differently."""
    import torch

    return {"host": platform.node(), "cpus": os.cpu_count(), "torch": torch.__version__,
            "processor": platform.machine()}


def save_host(host: CachedHost, path: Path | None = None) -> Path:
    target = path or cache_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(target, host.to_dict())
    return target


def load_host(path: Path | None = None) -> CachedHost | None:
    """This host's calibration; None when there is none, or it was made on another machine or torch. A file
    that is there but unreadable is an error naming it (a calibration silently ignored would change plans)."""
    source = path or cache_path()
    if not source.exists():
        return None
    data = read_json_object(source, "host calibration", "graphpipe calibrate")
    if data.get("format") != FORMAT:
        raise GraphPipeError(f"host calibration {source} has format {data.get('format')!r}, not {FORMAT!r}; "
                             "run `graphpipe calibrate` again")
    if data.get("machine") != this_machine():
        return None
    try:
        return CachedHost(device=Device.from_dict(data["device"]),
                          single_device=Device.from_dict(data["single_device"]), link=Link.from_dict(data["link"]),
                          collective=Link.from_dict(data["collective"]), details=dict(data.get("details", {})))
    except (KeyError, TypeError, ValueError, GraphPipeError) as err:
        raise GraphPipeError(f"host calibration {source} is damaged ({err}); run `graphpipe calibrate` again") \
            from None
