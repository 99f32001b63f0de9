"""How a rank's point-to-point operations are launched: torch pipelining's rule, in one place.

Every call (a send, or the receives of one schedule action) is launched at once, per peer in increasing
order so that every rank orders its launches the same way; each operation alone, never coalesced: a batch
completes as a whole, so a receive in it would wait for every other operation (head-of-line blocking). A
peer's operations are batched (`batch_isend_irecv`) only where one call mixes sends and receives with it, so
that neither direction waits for the other. The transport runs each channel (activations, gradients) on its
own communicator, so a pair's stream carries one direction (`graphpipe.runtime.comm`);
`graphpipe.runtime.p2p_check` replays the launches of every rank under NCCL's semantics and proves, per
schedule and plan, that none can wait forever.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Launch", "PeerOp", "launches"]


@dataclass(frozen=True, slots=True)
class PeerOp:
    """One send to or receive from `peer`; `payload` is the tensor (None where only the order matters)."""

    is_send: bool
    peer: int
    payload: Any = None


@dataclass(frozen=True, slots=True)
class Launch:
    """Operations launched together: one op, or a batch that mixes sends and receives with one peer."""

    peer: int
    ops: tuple[PeerOp, ...]

    @property
    def batched(self) -> bool:
        return len(self.ops) > 1


def launches(ops: Sequence[PeerOp]) -> list[Launch]:
    """The launches of one call's `ops`, per peer in increasing order; within a peer, the ops keep their order."""
    by_peer: dict[int, list[PeerOp]] = {}
    for op in ops:
        by_peer.setdefault(op.peer, []).append(op)
    out: list[Launch] = []
    for peer in sorted(by_peer):
        peer_ops = by_peer[peer]
        if len({op.is_send for op in peer_ops}) > 1:
            out.append(Launch(peer, tuple(peer_ops)))
        else:
            out += [Launch(peer, (op,)) for op in peer_ops]
    return out
