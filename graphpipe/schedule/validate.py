"""Check a schedule against its plan under the communication contract, by a dry run.

Checked, in order: every stage has one list ending in `AR`, `STEP`; forwards and
backwards run each micro-batch once, in increasing order, `F m` before `B m`; a stage runs every backward
whole (`B`) or every one split (`I m` then `W m`), and a recomputing stage only whole ones; sends and
receives only on stage edges in the right direction, once per message (see
`graphpipe.schedule.action` for the numbering); `F m` after the receives of all its
messages from every predecessor, `B m` after those from every successor, each send after
the compute that produces it; per stage pair and direction the sends and receives list
the same messages in the same order; and a dry run (sends never block, a receive waits
for its send) finishes without deadlock. A failure raises `ScheduleError` whose message
shows the stage × step grid with the offending action marked `*...*`.
"""

from __future__ import annotations

from collections import defaultdict

from graphpipe.errors import ScheduleError
from graphpipe.schedule.action import Action, ActionKind, producer_kinds, recv_kind
from graphpipe.schedule.grid import format_grid
from graphpipe.schedule.messages import messages_of, micro_batch_of, num_messages
from graphpipe.schedule.schedule import Schedule
from graphpipe.stages.stage_graph import Plan


def validate_schedule(schedule: Schedule, plan: Plan) -> None:
    """Raise `ScheduleError` (with the grid) unless `schedule` is correct and deadlock-free for `plan`."""
    expected = {stage.idx for stage in plan.stages}
    if set(schedule.actions) != expected:
        raise ScheduleError(f"schedule has stages {sorted(schedule.actions)}, the plan has {sorted(expected)}")
    for stage in plan.stages:
        _check_stage(schedule, plan, stage.idx)
    _check_pair_order(schedule, plan)
    _dry_run(schedule)


def _fail(schedule: Schedule, stage: int, step: int, why: str) -> ScheduleError:
    grid = format_grid(schedule, marks={stage: step}, window=8)
    return ScheduleError(f"stage {stage}, step {step}: {why}\n{grid}")


def _check_stage(schedule: Schedule, plan: Plan, idx: int) -> None:
    actions = schedule.actions[idx]
    num_mb = plan.num_micro_batches(idx)
    if schedule.num_micro_batches.get(idx) != num_mb:
        raise ScheduleError(f"stage {idx}: schedule says {schedule.num_micro_batches.get(idx)} micro-batches, "
                            f"the plan {num_mb} (mini-batch {plan.global_batch_size} / "
                            f"micro-batch {plan.stages[idx].micro_batch_size})")
    tail = tuple(a.kind for a in actions[-2:])
    if tail != (ActionKind.ALL_REDUCE, ActionKind.STEP):
        raise _fail(schedule, idx, max(0, len(actions) - 1), "a stage must end with AR then STEP")
    done = {kind: 0 for kind in ActionKind if kind.is_compute}  # next expected micro-batch
    seen: set[tuple[ActionKind, int, int]] = set()
    for step, action in enumerate(actions[:-2]):
        why = _check_action(plan, idx, action, done, seen)
        if why:
            raise _fail(schedule, idx, step, why)
    for kind in _expected_computes(done):
        if done[kind] != num_mb:
            raise _fail(schedule, idx, len(actions) - 2, f"only {done[kind]} of {num_mb} {kind.name.lower()}s")
    for peer, src, dst, kinds in _edges_of(plan, idx):
        for kind in kinds:
            have = sum(1 for k, p, _ in seen if k is kind and p == peer)
            if have != num_messages(plan, src, dst):
                raise _fail(schedule, idx, len(actions) - 2,
                            f"{have} {kind.code} actions with s{peer}, expected {num_messages(plan, src, dst)}")


def _expected_computes(done: dict[ActionKind, int]) -> list[ActionKind]:
    """The compute kinds a stage must run once per micro-batch: every whole kind, except that a stage running
    split backwards runs their halves instead."""
    split = {kind.half_of for kind in done if kind.half_of is not None and done[kind] > 0}
    halves = [kind for kind in done if kind.half_of in split]
    return [kind for kind in done if kind.half_of is None and kind.compute not in split] + halves


def _edges_of(plan: Plan, idx: int) -> list[tuple[int, int, int, tuple[ActionKind, ...]]]:
    """(peer, src, dst, the message kinds stage `idx` must list with that peer) for every edge."""
    ups = tuple(kind for kind in ActionKind if kind.is_message and kind.peer_is_upstream)
    downs = tuple(kind for kind in ActionKind if kind.is_message and not kind.peer_is_upstream)
    return [(p, p, idx, ups) for p in plan.predecessors[idx]] + [(s, idx, s, downs) for s in plan.successors[idx]]


def _check_action(plan: Plan, idx: int, action: Action, done: dict[ActionKind, int],
                  seen: set[tuple[ActionKind, int, int]]) -> str:
    """Why `action` is wrong at this point of stage `idx`'s list, or '' when it is fine."""
    kind, mb = action.kind, action.micro_batch
    if not kind.has_micro_batch:
        return "AR and STEP come once, at the end"
    if kind.is_compute:
        why = _check_compute(plan, idx, action, done, seen)
        if not why:
            done[kind] += 1
        return why
    upstream = kind.peer_is_upstream
    peers = plan.predecessors[idx] if upstream else plan.successors[idx]
    if action.peer not in peers:
        side = "predecessor" if upstream else "successor"
        return f"{kind.code} needs a {side} stage; s{action.peer} is not one (it has {list(peers)})"
    src, dst = (action.peer, idx) if upstream else (idx, action.peer)
    if not 0 <= mb < num_messages(plan, src, dst):
        return f"message {mb} out of range 0..{num_messages(plan, src, dst) - 1} on edge s{src}->s{dst}"
    if (kind, action.peer, mb) in seen:
        return "duplicate message"
    if kind.sends is not None:
        producers = producer_kinds(kind.sends)
        owner = micro_batch_of(plan, idx, mb, src, dst)
        if owner >= max(done[compute] for compute in producers):
            return f"{kind.code}{mb} before the {'/'.join(k.code for k in producers)}{owner} that produces it"
    seen.add((kind, action.peer, mb))
    return ""


def _check_compute(plan: Plan, idx: int, action: Action, done: dict[ActionKind, int],
                   seen: set[tuple[ActionKind, int, int]]) -> str:
    """Why compute `action` cannot run here: out of order, before its forward, or before its inputs arrived."""
    kind, mb = action.kind, action.micro_batch
    why = _check_split(plan, idx, kind, mb, done)
    if why:
        return why
    if mb != done[kind]:
        return f"expected {kind.code}{done[kind]} next (micro-batches run in order)"
    if kind is not ActionKind.FORWARD and mb >= done[ActionKind.FORWARD]:
        return f"{kind.code}{mb} before F{mb}"
    if kind.consumes is None:
        return ""
    needed = recv_kind(kind.consumes)
    upstream = needed.peer_is_upstream
    for peer in plan.predecessors[idx] if upstream else plan.successors[idx]:
        src, dst = (peer, idx) if upstream else (idx, peer)
        missing = [n for n in messages_of(plan, idx, mb, src, dst) if (needed, peer, n) not in seen]
        if missing:
            return f"{kind.code}{mb} runs before receiving message(s) {missing} from s{peer}"
    return ""


def _check_split(plan: Plan, idx: int, kind: ActionKind, mb: int, done: dict[ActionKind, int]) -> str:
    """Why a whole or a half compute cannot run here: the stage mixes both, a half comes before the halves
    that precede it, or a recomputing stage splits (each half would run its forward again:
    `graphpipe.schedule.zero_bubble`)."""
    whole = kind.half_of or kind.compute
    family = [k for k in done if k.compute is whole or k.half_of is whole]
    halves = [k for k in family if k.half_of is not None]
    if not halves:
        return ""
    mixed = any(done[k] for k in halves) if kind.half_of is None else any(
        done[k] for k in family if k.half_of is None)
    if mixed:
        return f"{kind.code}{mb}: a stage runs its backwards all whole (B) or all split (I, W), not both"
    if kind.half_of is not None and plan.stages[idx].recompute:
        return (f"{kind.code}{mb}: stage {idx} recomputes its forward, so it cannot split its backward (the W "
                "would recompute the forward again); give it whole backwards (B) or plan it without recomputation")
    for earlier in halves[:halves.index(kind)] if kind in halves else []:
        if mb >= done[earlier]:
            return f"{kind.code}{mb} before {earlier.code}{mb}"
    return ""


def _check_pair_order(schedule: Schedule, plan: Plan) -> None:
    """Per (sender, receiver, direction), the message sequences of sends and receives must be equal."""
    streams: dict[tuple[int, int, str, str], list[tuple[int, int]]] = defaultdict(list)
    for stage, actions in schedule.actions.items():
        for step, a in enumerate(actions):
            if a.kind.is_send:
                streams[(stage, a.peer, a.kind.direction, "send")].append((a.micro_batch, step))
            elif a.kind.is_recv:
                streams[(a.peer, stage, a.kind.direction, "recv")].append((a.micro_batch, step))
    for (src, dst, direction, side), sends in list(streams.items()):
        if side != "send":
            continue
        recvs = streams.get((src, dst, direction, "recv"), [])
        for (sent, _), (got, step) in zip(sends, recvs):
            if sent != got:
                raise _fail(schedule, dst, step,
                            f"message order differs: s{src} sends {direction}{sent} to s{dst} but s{dst} "
                            f"receives {direction}{got} at this point (sends and receives must be in one order)")


def _dry_run(schedule: Schedule) -> None:
    """Run the lists with sends never blocking and receives waiting for their send; find deadlocks."""
    pos = dict.fromkeys(schedule.actions, 0)
    posted: set[tuple[int, int, str, int]] = set()  # (sender, receiver, direction, message)
    progress = True
    while progress:
        progress = False
        for stage, actions in schedule.actions.items():
            while pos[stage] < len(actions):
                a = actions[pos[stage]]
                if a.kind.is_recv and (a.peer, stage, a.kind.direction, a.micro_batch) not in posted:
                    break
                if a.kind.is_send:
                    posted.add((stage, a.peer, a.kind.direction, a.micro_batch))
                pos[stage] += 1
                progress = True
    stuck = {s: p for s, p in pos.items() if p < len(schedule.actions[s])}
    if stuck:
        waits = ", ".join(f"s{s} waits at {schedule.actions[s][p]}" for s, p in sorted(stuck.items()))
        grid = format_grid(schedule, marks=stuck, window=8)
        raise ScheduleError(f"deadlock: {waits}\n{grid}")
