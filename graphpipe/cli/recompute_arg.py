"""`--recompute STAGES`: which stages of a plan recompute their forward in their backward (`Stage.recompute`)."""

from __future__ import annotations

import argparse

from graphpipe.cost.cluster import Cluster
from graphpipe.cost.cost_table import CostTable
from graphpipe.errors import PlanValidationError, UsageError
from graphpipe.stages.stage_graph import Plan

RECOMPUTE_HELP = ("stages that recompute their forward in their backward, keeping only their inputs per micro-batch "
                  "in flight (one more forward, less memory): all, none, or stages such as s1,s3")


def add_recompute_arg(parser: argparse.ArgumentParser, help_text: str = RECOMPUTE_HELP) -> None:
    parser.add_argument("--recompute", default=None, metavar="STAGES", help=help_text)


def apply_recompute(plan: Plan, text: str | None, costs: CostTable, cluster: Cluster | None = None) -> Plan:
    """`plan` with the stages `text` names recomputing, priced again (`recompute_plan`); `plan` itself when
    `text` is None. UsageError naming the flag for a stage the plan does not have."""
    if text is None:
        return plan
    from graphpipe.simulation.reprice import recompute_plan

    try:
        return recompute_plan(plan, text, costs, cluster)
    except PlanValidationError as err:
        raise UsageError(f"--{err}") from err  # "--recompute 's4': the plan has stages s0..s3, not s4"
