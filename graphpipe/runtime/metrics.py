"""Per-step training metrics (rank 0 reports them) and the peak memory of this rank."""

from __future__ import annotations

import resource
import sys
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True, slots=True, kw_only=True)
class StepMetrics:
    step: int  # steps done after this one
    loss: float
    iteration_s: float
    samples_per_s: float
    simulated_iteration_s: float | None  # the simulator's prediction for the plan, if it could run
    peak_memory_bytes: tuple[int, ...]  # per rank
    simulation_calibrated: bool = False  # the simulated machine's host costs were measured (`Device.host_calibrated`)
    grad_norm: float | None = None  # the global gradient norm before clipping (with --clip-grad-norm)
    learning_rate: float | None = None  # the rate this step used (rank 0's stage)
    eval_loss: float | None = None  # the mean loss on --eval-data after this step, where evaluated
    steps_timed: int = 1  # iteration_s is the mean over this many steps, up to this one (`--log-every`)
    # per rank, on CUDA: the caching allocator's reserved bytes, and the device memory in use beyond them (the
    # CUDA context, NCCL's buffers, cuBLAS workspaces; ranks sharing a GPU also see each other's); () on CPU
    reserved_memory_bytes: tuple[int, ...] = ()
    outside_allocator_bytes: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "loss": self.loss, "iteration_s": self.iteration_s,
                "samples_per_s": self.samples_per_s, "simulated_iteration_s": self.simulated_iteration_s,
                "simulation_calibrated": self.simulation_calibrated, "grad_norm": self.grad_norm,
                "learning_rate": self.learning_rate, "eval_loss": self.eval_loss,
                "peak_memory_bytes": list(self.peak_memory_bytes), "steps_timed": self.steps_timed,
                "reserved_memory_bytes": list(self.reserved_memory_bytes),
                "outside_allocator_bytes": list(self.outside_allocator_bytes)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepMetrics:
        return cls(step=data["step"], loss=data["loss"], iteration_s=data["iteration_s"],
                   samples_per_s=data["samples_per_s"], simulated_iteration_s=data.get("simulated_iteration_s"),
                   peak_memory_bytes=tuple(data.get("peak_memory_bytes", ())),
                   simulation_calibrated=bool(data.get("simulation_calibrated", False)),
                   grad_norm=data.get("grad_norm"), learning_rate=data.get("learning_rate"),
                   eval_loss=data.get("eval_loss"), steps_timed=int(data.get("steps_timed", 1)),
                   reserved_memory_bytes=tuple(data.get("reserved_memory_bytes", ())),
                   outside_allocator_bytes=tuple(data.get("outside_allocator_bytes", ())))

    def short(self) -> str:
        sim = f" sim {self.simulated_iteration_s * 1e3:.1f} ms" \
            if self.simulated_iteration_s and self.simulation_calibrated else ""
        evaluated = f" | eval {self.eval_loss:.4g}" if self.eval_loss is not None else ""
        outside = max(self.outside_allocator_bytes, default=0)
        beside = f" (+{outside / 2**20:.0f} MiB outside torch)" if outside else ""
        return (f"loss {self.loss:.4g}{evaluated} | {self.samples_per_s:.1f} samples/s | "
                f"{self.iteration_s * 1e3:.1f} ms{sim} | peak {max(self.peak_memory_bytes, default=0) / 2**20:.0f} MiB"
                f"{beside}")


def peak_memory_bytes(device: torch.device) -> int:
    """Peak allocated memory on a CUDA device since the last call (each step's own: the statistics are reset);
    on CPU the process's peak resident set size."""
    if device.type == "cuda":
        peak = int(torch.cuda.max_memory_allocated(device))
        torch.cuda.reset_peak_memory_stats(device)
        return peak
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


def device_memory_bytes(device: torch.device) -> tuple[int, int]:
    """(reserved by this process's caching allocator, in use on the device beyond it) on CUDA; (0, 0) elsewhere.

    What torch's statistics leave out: the CUDA context, NCCL's communicator buffers, cuBLAS and cuDNN
    workspaces. `torch.cuda.mem_get_info` is device-wide, so ranks that share a GPU count each other's memory
    in the second figure too."""
    if device.type != "cuda":
        return 0, 0
    free, total = torch.cuda.mem_get_info(device)
    reserved = int(torch.cuda.memory_reserved(device))
    return reserved, max(0, int(total - free) - reserved)
