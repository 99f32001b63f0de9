"""Fork/join blocks (`sp_dp.fork_join`): the blocks that differ only in their fork run share each plain layout's side
(`_Side`, kept per probe by the layout without F), and sharing it changes no block's vector or choice."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import HealthCheck, given, settings

from graphpipe.planner.api import make_request
from graphpipe.planner.sp_dp import Probe, Search, build_tables
from tests.planner.random_sp_graphs import Case, cases

FORK_RUNS = ("fork_join", "two_branch", "nested")  # the shapes with leaves before a block of at most 4 branches


class _Forgetful(dict[Any, Any]):
    """A memo that keeps nothing: every side is built afresh, as before it was shared."""

    def __setitem__(self, key: Any, value: Any) -> None:
        del key, value


def _blocks(case: Case, limit: float, forget: bool) -> list[dict[Any, tuple[list[int], list[Any]]]]:
    """Every block's need vector and choices in probes from no target to below the optimum, with the sides shared
    or (`forget`) each built afresh."""
    request = make_request(case.graph, case.costs, case.cluster, case.global_batch_size,
                           micro_batch_sizes=[case.micro_batch_size], memory_limit=limit)
    chains, pars = build_tables(request.model, request.sp_tree)
    search = Search(request.model, request.sp_tree, request.num_devices, case.micro_batch_size, limit, chains, pars)
    search.run()
    found = []
    for target in (math.inf, search.hi, search.hi * 0.8):
        probe = Probe(search, target)
        if forget:
            probe.blocks.side_memo = _Forgetful()
        probe.best_entry()
        found.append({key: (sol.need, [sol.choice[v] for v in range(len(sol.need))])
                      for key, sol in probe.block_memo.items()})
    return found


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=cases(shapes=FORK_RUNS))
def test_sharing_the_sides_of_fork_runs_changes_no_block(case: Case) -> None:
    """With and without a binding memory limit, every block a probe solves has the same vector and choices whether
    the blocks that differ only in F read one side per layout or each builds its own."""
    for limit in (1e18, case.cluster.device.memory_bytes * 0.05):
        assert _blocks(case, limit, forget=False) == _blocks(case, limit, forget=True)

