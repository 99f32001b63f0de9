"""Errors a user can cause. Each message says what was wrong, the numbers, and what to change."""

from __future__ import annotations

__all__ = [
    "ClusterError",
    "CostError",
    "GraphCaptureError",
    "GraphPipeError",
    "GraphValidationError",
    "InputFileError",
    "ModelLoadError",
    "PlanValidationError",
    "PlanningError",
    "ScheduleError",
    "TrainingError",
    "UsageError",
    "WeightsError",
]


class GraphPipeError(Exception):
    """Base of every error graphpipe raises for bad input or an impossible request."""


class GraphCaptureError(GraphPipeError):
    """The model could not be traced into an operator graph."""


class GraphValidationError(GraphPipeError):
    """An operator graph breaks an invariant (cycle, duplicate name, parameter owned twice)."""


class CostError(GraphPipeError):
    """A cost table is missing an op or a micro-batch size, or a device preset is unknown."""


class ClusterError(GraphPipeError):
    """A cluster description is inconsistent or names an unknown preset."""


class PlanningError(GraphPipeError):
    """No plan satisfies the request (memory, divisibility, device count)."""


class PlanValidationError(GraphPipeError):
    """A plan breaks an invariant (stage not convex, op uncovered, device used twice)."""


class ScheduleError(GraphPipeError):
    """A schedule is malformed or deadlocks."""


class ModelLoadError(GraphPipeError):
    """A zoo name or a `file.py:factory` model spec could not be loaded."""


class UsageError(GraphPipeError):
    """The command line asks for something that cannot work (the CLI exits 2, like argparse's own errors)."""


class InputFileError(UsageError):
    """A file given as input (plan, cost table, op graph) is missing, cut short, not JSON or not that kind."""


class TrainingError(GraphPipeError):
    """Distributed training failed: a peer rank died, a plan does not fit the world size."""


class WeightsError(InputFileError, TrainingError):
    """A --weights file cannot be read or does not fit the model (bad input: exits 2 when `graphpipe train`
    finds it before starting the ranks; a rank that finds it fails the run like any TrainingError)."""
