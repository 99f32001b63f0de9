"""graphpipe: graph pipeline parallelism for PyTorch.

Capture a model into an op graph, cost it, plan a DAG of pipeline stages, schedule and
simulate it, and train it with torch.distributed. Names are imported lazily so that
`import graphpipe` stays cheap for the planner and the CLI.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    "capture": "graphpipe.graph.capture",
    "capture_module": "graphpipe.graph.capture",
    "CapturedModule": "graphpipe.graph.capture",
    "ModelInputs": "graphpipe.model_inputs",
    "OpGraph": "graphpipe.graph.op_graph",
    "OpNode": "graphpipe.graph.op_graph",
    "TensorMeta": "graphpipe.graph.tensor_meta",
    "profile": "graphpipe.cost.profile",
    "analytic_costs": "graphpipe.cost.analytic",
    "CostTable": "graphpipe.cost.cost_table",
    "OpCost": "graphpipe.cost.cost_table",
    "Cluster": "graphpipe.cost.cluster",
    "Device": "graphpipe.cost.cluster",
    "Link": "graphpipe.cost.cluster",
    "plan": "graphpipe.planning",
    "Plan": "graphpipe.stages.stage_graph",
    "Stage": "graphpipe.stages.stage_graph",
    "StageEdge": "graphpipe.stages.stage_graph",
    "Schedule": "graphpipe.schedule.schedule",
    "Action": "graphpipe.schedule.action",
    "make_schedule": "graphpipe.schedule.generate",
    "simulate": "graphpipe.simulation.simulator",
    "SimResult": "graphpipe.simulation.result",
    "PipelineTrainer": "graphpipe.runtime.trainer",
    "empty_weights": "graphpipe.empty_weights",
    "materialize": "graphpipe.runtime.materialize",
    "load_model": "graphpipe.models",
    "ZooModel": "graphpipe.models",
    "GraphPipeError": "graphpipe.errors",
    "GraphCaptureError": "graphpipe.errors",
    "PlanningError": "graphpipe.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'graphpipe' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return __all__
