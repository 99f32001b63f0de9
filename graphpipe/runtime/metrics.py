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

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "loss": self.loss, "iteration_s": self.iteration_s,
                "samples_per_s": self.samples_per_s, "simulated_iteration_s": self.simulated_iteration_s,
                "simulation_calibrated": self.simulation_calibrated, "grad_norm": self.grad_norm,
                "learning_rate": self.learning_rate, "eval_loss": self.eval_loss,
                "peak_memory_bytes": list(self.peak_memory_bytes)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepMetrics:
        return cls(step=data["step"], loss=data["loss"], iteration_s=data["iteration_s"],
                   samples_per_s=data["samples_per_s"], simulated_iteration_s=data.get("simulated_iteration_s"),
                   peak_memory_bytes=tuple(data.get("peak_memory_bytes", ())),
                   simulation_calibrated=bool(data.get("simulation_calibrated", False)),
                   grad_norm=data.get("grad_norm"), learning_rate=data.get("learning_rate"),
                   eval_loss=data.get("eval_loss"))

    def short(self) -> str:
        sim = f" sim {self.simulated_iteration_s * 1e3:.1f} ms" \
            if self.simulated_iteration_s and self.simulation_calibrated else ""
        evaluated = f" | eval {self.eval_loss:.4g}" if self.eval_loss is not None else ""
        return (f"loss {self.loss:.4g}{evaluated} | {self.samples_per_s:.1f} samples/s | "
                f"{self.iteration_s * 1e3:.1f} ms{sim} | peak {max(self.peak_memory_bytes, default=0) / 2**20:.0f} MiB")


def peak_memory_bytes(device: torch.device) -> int:
    """Peak allocated memory on a CUDA device since the last call (each step's own: the statistics are reset);
    on CPU the process's peak resident set size."""
    if device.type == "cuda":
        peak = int(torch.cuda.max_memory_allocated(device))
        torch.cuda.reset_peak_memory_stats(device)
        return peak
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)
