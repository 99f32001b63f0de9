"""Fork/join blocks (`sp_dp.fork_join`): the blocks that differ only in their fork run share each plain layout's side
(`_Side`, kept per probe by the layout without F), and those whose fork runs give F's stage the same options share
the whole solution (`ForkJoinSolver._same_stages`), merge layouts included; sharing changes no block's vector or
choice. The floor of every
fork run into a block (`ForkJoinSolver.fork_floor`) is at or below each such block's vector."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import HealthCheck, given, settings

from graphpipe.cost.analytic import analytic_costs
from graphpipe.cost.presets import cluster_preset
from graphpipe.planner.api import make_request
from graphpipe.planner.request import PlanRequest
from graphpipe.planner.sp_dp import Probe, Search, build_tables
from tests.planner.clip import clip_towers_graph
from tests.planner.llama import llama_graph
from tests.planner.random_sp_graphs import Case, cases

FORK_RUNS = ("fork_join", "two_branch", "nested")  # the shapes with leaves before a block of at most 4 branches


class _Forgetful(dict[Any, Any]):
    """A memo that keeps nothing: every side or block is built afresh, as before it was shared."""

    def __setitem__(self, key: Any, value: Any) -> None:
        del key, value


class _Counted(dict[Any, Any]):
    """A memo that keeps the keys of the reads that find something."""

    def __init__(self) -> None:
        super().__init__()
        self.keys: list[Any] = []

    def get(self, key: Any, default: Any = None) -> Any:
        hit = super().get(key, default)
        if hit is not None:
            self.keys.append(key)
        return hit


Blocks = dict[Any, tuple[list[int], list[Any]]]


def _blocks(request: PlanRequest, micro_batch_size: int, forget: bool) -> tuple[list[Blocks], int]:
    """Every block's need vector and choices in probes from no target to below the optimum, with the sides and
    solutions shared or (`forget`) each built afresh; and how many blocks read another's solution."""
    found, reads = _blocks_and_reads(request, micro_batch_size, forget)
    return found, len(reads)


def _blocks_and_reads(request: PlanRequest, micro_batch_size: int, forget: bool) -> tuple[list[Blocks], list[Any]]:
    """`_blocks`, with the reads as (parallel block, with J): what each block that read another's solution is."""
    chains, pars = build_tables(request.model, request.sp_tree)
    search = Search(request.model, request.sp_tree, request.num_devices, micro_batch_size, request.memory_limit,
                    chains, pars)
    search.run()
    found, reads = [], []
    for target in (math.inf, search.hi, search.hi * 0.8):
        probe = Probe(search, target)
        stages = probe.blocks.stages_memo = _Counted()
        if forget:
            probe.blocks.side_memo = _Forgetful()
            probe.blocks.stages_memo = _Forgetful()
        probe.best_entry()
        reads += [(pars[key[0]], key[2]) for key in stages.keys]
        found.append({key: (sol.need, [sol.choice[v] for v in range(len(sol.need))])
                      for key, sol in probe.block_memo.items()})
    return found, reads


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=cases(shapes=FORK_RUNS))
def test_sharing_between_fork_runs_changes_no_block(case: Case) -> None:
    """With and without a binding memory limit, every block a probe solves has the same vector and choices whether
    the blocks that differ only in F read one side per layout and one solution per set of F's options, or each
    builds its own."""
    for limit in (1e18, case.cluster.device.memory_bytes * 0.05):
        request = make_request(case.graph, case.costs, case.cluster, case.global_batch_size,
                               micro_batch_sizes=[case.micro_batch_size], memory_limit=limit)
        shared, _ = _blocks(request, case.micro_batch_size, forget=False)
        assert shared == _blocks(request, case.micro_batch_size, forget=True)[0]


def test_fork_runs_into_clips_attention_share_their_solutions() -> None:
    """Hugging Face CLIP's towers (2 layers, tiny) at op level on 32 devices: the fork runs into each attention's
    q, k and v block start at items that cost nothing or change no option, so blocks read others' solutions, and
    every block is the same as solved afresh."""
    graph = clip_towers_graph()
    request = make_request(graph, analytic_costs(graph, "v100-16gb"), cluster_preset("summit", 32), 128)
    shared, reads = _blocks(request, 8, forget=False)
    assert reads > 0
    assert shared == _blocks(request, 8, forget=True)[0]


def test_fork_runs_into_llamas_merge_blocks_share_their_solutions() -> None:
    """Llama (2 layers, tiny) at op level on 32 devices: blocks of two branches with their join, which have merge
    layouts (the MLP's gate and up projections, the rotary embedding's), read others' solutions too, and every
    block is the same as solved afresh."""
    graph = llama_graph()
    request = make_request(graph, analytic_costs(graph, "v100-16gb"), cluster_preset("summit", 32), 128)
    shared, reads = _blocks_and_reads(request, 8, forget=False)
    assert any(pinfo.par is not None and len(pinfo.par.branches) == 2 and with_join for pinfo, with_join in reads)
    assert shared == _blocks_and_reads(request, 8, forget=True)[0]


def _floors_and_blocks(request: PlanRequest, micro_batch_size: int) -> list[tuple[list[int], list[int]]]:
    """Per fork-run block whose floor a probe reads (probes from no target to below the optimum), the floor
    (`fork_floor`) and the block's need vector, solved after the probe whether or not the probe skipped it."""
    chains, pars = build_tables(request.model, request.sp_tree)
    search = Search(request.model, request.sp_tree, request.num_devices, micro_batch_size, request.memory_limit,
                    chains, pars)
    search.run()
    pairs = []
    for target in (math.inf, search.hi, search.hi * 0.8):
        probe = Probe(search, target)
        read = probe.blocks.fork_floor
        met: list[tuple[Any, bool, int, list[int]]] = []

        def recorded(solver: Any, block: Any, shortest: Any, with_join: bool, k_after: int,
                     read: Any = read, met: list[Any] = met) -> tuple[list[int], list[int]] | None:
            found: tuple[list[int], list[int]] | None = read(solver, block, shortest, with_join, k_after)
            if found is not None:
                met.append((block, with_join, k_after, found[0]))
            return found

        probe.blocks.fork_floor = recorded  # type: ignore[method-assign]
        probe.best_entry()
        pairs += [(floor, probe.blocks.vector(probe, block, with_join, k_after))
                  for block, with_join, k_after, floor in met]
    return pairs


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=cases(shapes=FORK_RUNS))
def test_a_fork_floor_is_below_every_fork_run_into_its_block(case: Case) -> None:
    """With and without a binding memory limit: every block with a fork run is at or above its block's floor (the
    shortest fork run's stage judged by compute alone) at every cell."""
    for limit in (1e18, case.cluster.device.memory_bytes * 0.05):
        request = make_request(case.graph, case.costs, case.cluster, case.global_batch_size,
                               micro_batch_sizes=[case.micro_batch_size], memory_limit=limit)
        for floor, vector in _floors_and_blocks(request, case.micro_batch_size):
            assert all(low <= value for low, value in zip(floor, vector, strict=True))


def test_clips_fork_runs_are_above_their_floors() -> None:
    """CLIP's towers (2 layers, tiny) at op level on 32 devices: each attention's q, k and v block has fork runs from
    the items before it, and every one is at or above the block's floor."""
    graph = clip_towers_graph()
    request = make_request(graph, analytic_costs(graph, "v100-16gb"), cluster_preset("summit", 32), 128)
    pairs = _floors_and_blocks(request, 8)
    assert len(pairs) > 100
    assert all(all(low <= value for low, value in zip(floor, vector, strict=True)) for floor, vector in pairs)
