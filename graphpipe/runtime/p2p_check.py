"""Replay every rank's point-to-point launches under NCCL's semantics: no launch may wait forever, and no
receive the computation waits for may be held up by an operation with another peer.

A rank's program (`graphpipe.runtime.p2p_record` records it from a real run) is a sequence of
- `Post`: operations launched together on one stream: one peer's on one channel (NCCL gives every pair of
  ranks a stream per communicator, and the transport a communicator per channel), several peers' (a batch on
  the group's stream), or a collective's (its group's stream); and
- `Wait`: the computation waits for those posts (on a GPU the compute stream, and so every later launch,
  which NCCL orders after the compute stream: a fence).
The semantics, worst case (NCCL may buffer a small send; nothing here counts on it): a post starts when the
posts before it on its stream are done and every post fenced before it was posted is done; an operation
completes when its own post and its counterpart's have started (the k-th send from r to p meets the k-th
receive on p from r; the k-th collective of a group meets every member's k-th), a post when all its
operations have. `check` runs this to its fixed point. What is left undone has a cycle of waits, which it
names; it also names every received value the computation waits for that shares its launch with another
peer (head-of-line blocking), and every operation without a counterpart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Op", "Post", "Wait", "check"]

StreamKey = tuple[object, ...]


@dataclass(frozen=True, slots=True)
class Op:
    """A send to or receive from `peer`, or (kind "all_reduce") a collective over `group`."""

    kind: str  # "send", "recv" or "all_reduce"
    peer: int = -1
    group: tuple[int, ...] = ()
    channel: int = 0  # point-to-point: the communicator (`graphpipe.runtime.comm.CHANNELS`)

    def describe(self) -> str:
        if self.kind == "all_reduce":
            return f"all-reduce over {list(self.group)}"
        return f"{self.kind} {'to' if self.kind == 'send' else 'from'} {self.peer}"


@dataclass(frozen=True, slots=True)
class Post:
    ops: tuple[Op, ...]

    @property
    def stream(self) -> StreamKey:
        ends = {(op.peer, op.channel) for op in self.ops if op.kind != "all_reduce"}
        if not ends:
            return ("collective", self.ops[0].group)
        return ("pair", *next(iter(ends))) if len(ends) == 1 else ("group",)


@dataclass(frozen=True, slots=True)
class Wait:
    posts: tuple[int, ...]  # indices, in the rank's program, of the posts waited for


Step = Post | Wait
PostId = tuple[int, int]  # (rank, index of the post in its program)


def check(programs: Mapping[int, Sequence[Step]]) -> list[str]:
    """Problems of the ranks' programs (empty: every launch completes, no receive waits behind another peer)."""
    replay = _Replay(programs)
    return [*replay.unmatched, *replay.head_of_line(), *replay.deadlock()]


class _Replay:
    def __init__(self, programs: Mapping[int, Sequence[Step]]) -> None:
        self.programs = programs
        self.posts: dict[PostId, Post] = {(rank, i): step for rank, steps in programs.items()
                                          for i, step in enumerate(steps) if isinstance(step, Post)}
        self.fences: dict[PostId, set[PostId]] = {}
        self.before: dict[PostId, PostId | None] = {}  # the previous post on the same stream
        for rank, steps in programs.items():
            fenced: set[PostId] = set()
            last: dict[StreamKey, PostId] = {}
            for i, step in enumerate(steps):
                if isinstance(step, Wait):
                    fenced |= {(rank, j) for j in step.posts}
                    continue
                self.fences[(rank, i)] = set(fenced)
                self.before[(rank, i)] = last.get(step.stream)
                last[step.stream] = (rank, i)
        self.partners, self.unmatched = _match(programs)
        self.done: set[PostId] = set()
        self._run()

    def _started(self, post: PostId) -> bool:
        previous = self.before[post]
        return (previous is None or previous in self.done) and self.fences[post] <= self.done

    def _run(self) -> None:
        changed = True
        while changed:
            changed = False
            for post in self.posts:
                if post not in self.done and self._started(post) and all(
                        self._started(other) for other in self.partners.get(post, ())):
                    self.done.add(post)
                    changed = True

    def head_of_line(self) -> list[str]:
        found = []
        for rank, steps in self.programs.items():
            for step in steps:
                if not isinstance(step, Wait):
                    continue
                for index in step.posts:
                    ops = self.posts[(rank, index)].ops
                    for op in ops:
                        others = sorted({o.peer for o in ops if o.peer != op.peer})
                        if op.kind == "recv" and others:
                            found.append(f"head-of-line: rank {rank}'s receive from {op.peer} is launched with "
                                         f"operations on ranks {others}, so it completes only after them")
        return found

    def deadlock(self) -> list[str]:
        stuck = [post for post in self.posts if post not in self.done]
        if not stuck:
            return []
        cycle = self._cycle(stuck[0])
        path = " -> ".join(f"rank {rank} {self._describe((rank, index))}" for rank, index in cycle)
        return [f"deadlock: {len(stuck)} launches never complete; waits go round: {path}"]

    def _blockers(self, post: PostId) -> list[PostId]:
        previous = self.before[post]
        found = [previous] if previous is not None and previous not in self.done else []
        found += sorted(self.fences[post] - self.done)
        return found + [other for other in self.partners.get(post, ()) if not self._started(other)]

    def _cycle(self, start: PostId) -> list[PostId]:
        """Follow the first unfinished blocker from `start` until a post repeats: the waits that go round."""
        seen: list[PostId] = []
        post = start
        while post not in seen:
            seen.append(post)
            blockers = self._blockers(post)
            if not blockers:
                return seen
            post = blockers[0]
        return [*seen[seen.index(post):], post]

    def _describe(self, post: PostId) -> str:
        return "[" + ", ".join(op.describe() for op in self.posts[post].ops) + "]"


def _match(programs: Mapping[int, Sequence[Step]]) -> tuple[dict[PostId, set[PostId]], list[str]]:
    """Each post's counterpart posts: the k-th send r -> p with the k-th receive on p from r, the k-th
    collective of a group with every member's k-th; and the operations that have none."""
    queues: dict[tuple[object, ...], list[PostId]] = {}
    for rank, steps in programs.items():
        for i, step in enumerate(steps):
            if isinstance(step, Post):
                for op in step.ops:
                    queues.setdefault(_channel(rank, op), []).append((rank, i))
    partners: dict[PostId, set[PostId]] = {}
    unmatched: list[str] = []
    for channel, posts in queues.items():
        if channel[0] == "all_reduce":
            group = channel[1]
            assert isinstance(group, tuple)
            _pair_collective(group, queues, partners, unmatched)
            continue
        if channel[0] != "p2p":
            continue
        _, src, dst, lane = channel
        receives = queues.get(("p2p_recv", src, dst, lane), [])
        for send, recv in zip(posts, receives):
            partners.setdefault(send, set()).add(recv)
            partners.setdefault(recv, set()).add(send)
        if len(posts) != len(receives):
            unmatched.append(f"unmatched: rank {src} sends {len(posts)} to rank {dst}, which receives {len(receives)}")
    for channel, posts in queues.items():
        if channel[0] == "p2p_recv" and ("p2p", *channel[1:]) not in queues:
            unmatched.append(f"unmatched: rank {channel[2]} receives {len(posts)} from rank {channel[1]}, "
                             "which sends none")
    return partners, unmatched


def _pair_collective(group: tuple[int, ...], queues: Mapping[tuple[object, ...], list[PostId]],
                     partners: dict[PostId, set[PostId]], unmatched: list[str]) -> None:
    if group[0] != min(group):
        return
    per_rank = [queues.get(("all_reduce", group, rank), []) for rank in group]
    if len({len(posts) for posts in per_rank}) > 1:
        counts = ", ".join(f"rank {rank}: {len(posts)}" for rank, posts in zip(group, per_rank))
        unmatched.append(f"unmatched: the ranks of group {list(group)} run different numbers of collectives ({counts})")
    for together in zip(*per_rank):
        for post in together:
            partners.setdefault(post, set()).update(other for other in together if other != post)


def _channel(rank: int, op: Op) -> tuple[object, ...]:
    if op.kind == "all_reduce":
        return ("all_reduce", op.group, rank)
    return ("p2p", rank, op.peer, op.channel) if op.kind == "send" else ("p2p_recv", op.peer, rank, op.channel)
