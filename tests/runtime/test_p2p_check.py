"""The point-to-point program cannot stall on NCCL: every schedule on every plan shape of the runtime scenarios
(fork/join, shared weights, data-parallel stages of unequal degree, library models), recorded from a real run
and replayed under NCCL's blocking semantics, completes with no receive waiting on another peer; the checker
catches what it must: the former coalesced rule (head-of-line), one communicator for both directions (a pair's
launch order deadlocks), a cycle across three peers and unmatched operations."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from graphpipe.runtime.comm import InMemoryHub
from graphpipe.runtime.p2p_check import Op, Post, Step, Wait, check
from graphpipe.runtime.p2p_program import PeerOp, launches
from graphpipe.runtime.p2p_record import LaunchRule, RecordingTransport, coalesced
from graphpipe.runtime.trainer import PipelineTrainer
from graphpipe.schedule.generate import make_schedule
from tests.runtime.helpers import run_threads
from tests.runtime.scenarios import LR, SCENARIOS

CASES = [(name, schedule) for name, scenario in SCENARIOS.items() for schedule in scenario.schedules]


def _recorded(name: str, schedule: str, *, launch: LaunchRule = launches, hold_sends: bool = False,
              one_channel: bool = False, steps: int = 2) -> dict[int, list[Step]]:
    """Each rank's launches over `steps` training steps of the scenario (the first sends headers, the second
    not), recorded as NCCL would run them, with the data moved in memory."""
    torch.set_num_threads(1)
    scenario = SCENARIOS[name]
    plan = scenario.plan()
    hub = InMemoryHub(plan.world_size, timeout_s=15)
    batches = scenario.make_batches(steps)
    transports = [RecordingTransport(hub.transport(rank), launch=launch, hold_sends=hold_sends, one_channel=one_channel)
                  for rank in range(plan.world_size)]
    trainers = [PipelineTrainer(scenario.model(), plan, optimizer=lambda ps: torch.optim.Adam(ps, lr=LR),
                                loss_fn=scenario.loss_fn, schedule=make_schedule(plan, schedule),
                                transport=transports[rank], rank=rank, example_inputs=batches[0][0])
                for rank in range(plan.world_size)]
    run_threads(plan.world_size, lambda rank: [trainers[rank].step(*batch) for batch in batches])
    return {rank: transport.steps for rank, transport in enumerate(transports)}


@pytest.mark.parametrize(("name", "schedule"), CASES)
def test_every_schedule_on_every_plan_shape_completes_under_nccl_semantics(name: str, schedule: str) -> None:
    problems = check(_recorded(name, schedule))
    assert not problems, "\n".join(problems)


def test_launches_are_per_peer_in_order_and_batch_only_mixed_directions() -> None:
    ops = [PeerOp(True, 3), PeerOp(True, 1), PeerOp(False, 3), PeerOp(False, 2), PeerOp(False, 2)]
    found = [(launch.peer, [op.is_send for op in launch.ops]) for launch in launches(ops)]
    assert found == [(1, [True]), (2, [False]), (2, [False]), (3, [True, False])]


def test_the_former_coalesced_rule_is_refused_for_its_head_of_line_waits() -> None:
    """Sends held until the next receive and launched with it in one batch, every peer together, on one
    communicator (the transport's former rule): a fork's gradient receive waits on a send to the other branch."""
    problems = check(_recorded("diamond3", "1f1b", launch=coalesced, hold_sends=True, one_channel=True, steps=1))
    assert any(problem.startswith("head-of-line: rank 0's receive from 1 is launched with operations on ranks [2]")
               for problem in problems), problems


def test_one_communicator_for_both_directions_deadlocks_a_graph_schedule() -> None:
    """Activations and gradients on one communicator, every send launched at once: a pair's stream runs its
    launches in order, so on split3's 1F1B a send waits for a receive queued behind the peer's send the other
    way. With a communicator per direction (the transport's rule) the same run completes (above)."""
    problems = check(_recorded("split3", "1f1b", one_channel=True, steps=1))
    assert len(problems) == 1 and problems[0].startswith("deadlock:"), problems
    assert check(_recorded("split3", "1f1b", steps=1)) == []


def _ring(order: Sequence[str]) -> dict[int, list[Step]]:
    """Three ranks in a ring: each receives from its predecessor, waits, then sends to its successor
    (`order` "recv-first"), or sends first."""
    programs: dict[int, list[Step]] = {}
    for rank in range(3):
        recv = Post((Op("recv", (rank - 1) % 3),))
        send = Post((Op("send", (rank + 1) % 3),))
        programs[rank] = [recv, Wait((0,)), send] if order[rank] == "recv-first" else [send, recv, Wait((1,))]
    return programs


def test_a_cycle_across_three_peers_is_named_and_breaking_it_passes() -> None:
    problems = check(_ring(["recv-first"] * 3))
    assert len(problems) == 1 and problems[0].startswith("deadlock: 6 launches never complete")
    assert all(f"rank {rank}" in problems[0] for rank in range(3))
    assert check(_ring(["send-first", "recv-first", "recv-first"])) == []


def test_unmatched_operations_and_collectives_are_named() -> None:
    programs: dict[int, list[Step]] = {0: [Post((Op("send", 1),)), Post((Op("send", 1),))],
                                       1: [Post((Op("recv", 0),)), Wait((0,))]}
    assert "unmatched: rank 0 sends 2 to rank 1, which receives 1" in check(programs)
    group = (0, 1)
    programs = {0: [Post((Op("all_reduce", group=group),)), Wait((0,))], 1: []}
    assert any("run different numbers of collectives" in problem for problem in check(programs))
