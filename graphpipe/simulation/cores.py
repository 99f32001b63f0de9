"""Shared host cores: ranks of one node that compute at the same time compete for its cores.

Model: core tokens, first come first served. A node has `cores_per_node` cores; a compute
action (forward, backward, optimizer step) of a stage holds one core per rank of the stage
on that node for its whole duration. When fewer are free it waits for the earliest ones to
free up. Requests are served in the order of the time they are made (the engine runs the
stages in time order when cores are shared). Communication (sends, receives, all-reduce)
holds no core: a rank blocked on a message sleeps. On a 1-core node two stages that want
to compute at once therefore take twice as long as one; with a core per rank nothing waits.
A stage with more ranks on a node than it has cores takes all of them, for longer: its ranks
time-share them (duration x ranks / cores).
This is what the OS does over a whole action (total throughput is the same as processor
sharing; only who finishes first differs).
"""

from __future__ import annotations

from collections import Counter

from graphpipe.cost.cluster import Cluster
from graphpipe.stages.stage_graph import Plan

Slot = tuple[int, int]  # (stage, position in its list)


def cores_are_shared(plan: Plan, cluster: Cluster) -> bool:
    """True when some node hosts more of the plan's ranks than it has cores."""
    if cluster.cores_per_node is None:
        return False
    per_node = Counter(cluster.node_of(rank) for stage in plan.stages for rank in stage.ranks)
    return max(per_node.values(), default=0) > cluster.cores_per_node


class CorePool:
    """Free times of every core of every node, and which action freed each."""

    def __init__(self, plan: Plan, cluster: Cluster) -> None:
        cores = cluster.cores_per_node or 1
        nodes = {cluster.node_of(rank) for stage in plan.stages for rank in stage.ranks}
        self.free: dict[int, list[tuple[float, Slot | None]]] = {node: [(0.0, None)] * cores for node in nodes}
        self.needs: dict[int, dict[int, int]] = {}
        self.stretch: dict[int, float] = {}
        for stage in plan.stages:
            need = Counter(cluster.node_of(rank) for rank in stage.ranks)
            self.stretch[stage.idx] = max(1.0, max(need.values(), default=0) / cores)
            self.needs[stage.idx] = {node: min(count, cores) for node, count in need.items()}

    def duration_ms(self, stage: int, duration_ms: float) -> float:
        """How long a compute action of `stage` holds its cores (longer when its ranks outnumber them)."""
        return duration_ms * self.stretch[stage]

    def acquire(self, stage: int, ready_ms: float, duration_ms: float, slot: Slot) -> tuple[float, Slot | None]:
        """Start time of a compute action of `stage` (of `duration_ms` on its cores) ready at `ready_ms`,
        and the action it waited for."""
        start, cause = ready_ms, None
        picks: dict[int, list[int]] = {}
        for node, count in self.needs[stage].items():
            order = sorted(range(len(self.free[node])), key=lambda i: self.free[node][i][0])[:count]
            picks[node] = order
            last_free, last_slot = self.free[node][order[-1]]
            if last_free > start:
                start, cause = last_free, last_slot
        for node, order in picks.items():
            for i in order:
                self.free[node][i] = (start + duration_ms, slot)
        return start, cause
