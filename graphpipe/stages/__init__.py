"""The plan types and the rules every layer shares: `Plan`, `Stage`, `StageEdge`, the tensors that
cross between stages, micro-batches in flight, memory per stage, the cost of a stage (`StageCost`, for
the planner and the simulator alike) and plan validation.

Below `planner/` (which makes plans), `schedule/`, `simulation/` and `runtime/` (which read them),
so none of those depends on the planner for the plan type.
"""
