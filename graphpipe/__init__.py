"""graphpipe: graph pipeline parallelism for PyTorch.

Capture a model into an op graph, cost it, plan a DAG of pipeline stages, schedule and
simulate it, and train it with torch.distributed. Names are imported lazily so that
`import graphpipe` stays cheap for the planner and the CLI.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the real types for type checkers; at run time the names load lazily (__getattr__)
    from graphpipe.cost.analytic import analytic_costs as analytic_costs
    from graphpipe.cost.cluster import Cluster as Cluster
    from graphpipe.cost.cluster import Device as Device
    from graphpipe.cost.cluster import Link as Link
    from graphpipe.cost.cost_table import CostTable as CostTable
    from graphpipe.cost.cost_table import OpCost as OpCost
    from graphpipe.cost.profile import profile as profile
    from graphpipe.cost.sources import CostSource as CostSource
    from graphpipe.cost.sources import choose_costs as choose_costs
    from graphpipe.errors import GraphCaptureError as GraphCaptureError
    from graphpipe.errors import GraphPipeError as GraphPipeError
    from graphpipe.errors import PlanningError as PlanningError
    from graphpipe.graph.capture import CapturedModule as CapturedModule
    from graphpipe.graph.capture import capture as capture
    from graphpipe.graph.capture import capture_module as capture_module
    from graphpipe.graph.op_graph import OpGraph as OpGraph
    from graphpipe.graph.op_graph import OpNode as OpNode
    from graphpipe.graph.tensor_meta import TensorMeta as TensorMeta
    from graphpipe.meta_weights import empty_weights as empty_weights
    from graphpipe.model_inputs import ModelInputs as ModelInputs
    from graphpipe.models import ZooModel as ZooModel
    from graphpipe.models import load_model as load_model
    from graphpipe.planner.options import PlanOptions as PlanOptions
    from graphpipe.planning import plan as plan
    from graphpipe.runtime.materialize import materialize as materialize
    from graphpipe.runtime.trainer import PipelineTrainer as PipelineTrainer
    from graphpipe.schedule.action import Action as Action
    from graphpipe.schedule.generate import make_schedule as make_schedule
    from graphpipe.schedule.schedule import Schedule as Schedule
    from graphpipe.simulation.result import SimResult as SimResult
    from graphpipe.simulation.simulator import simulate as simulate
    from graphpipe.stages.stage_graph import Plan as Plan
    from graphpipe.stages.stage_graph import Stage as Stage
    from graphpipe.stages.stage_graph import StageEdge as StageEdge

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
    "PlanOptions": "graphpipe.planner.options",
    "CostSource": "graphpipe.cost.sources",
    "choose_costs": "graphpipe.cost.sources",
    "Plan": "graphpipe.stages.stage_graph",
    "Stage": "graphpipe.stages.stage_graph",
    "StageEdge": "graphpipe.stages.stage_graph",
    "Schedule": "graphpipe.schedule.schedule",
    "Action": "graphpipe.schedule.action",
    "make_schedule": "graphpipe.schedule.generate",
    "simulate": "graphpipe.simulation.simulator",
    "SimResult": "graphpipe.simulation.result",
    "PipelineTrainer": "graphpipe.runtime.trainer",
    "empty_weights": "graphpipe.meta_weights",
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
