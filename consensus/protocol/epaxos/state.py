"""EPaxos instance state: statuses, what a replica knows of an instance, and what its driver
(the owner, or a recoverer) tracks."""

from __future__ import annotations

from typing import Final

from consensus.messages import Command, EPrepareReply

__all__ = [
    "ACCEPTED",
    "ACCEPT_PHASE",
    "COMMITTED",
    "EPAXOS_UNSAFE_VARIANTS",
    "HEARTBEAT_WINDOW",
    "NONE",
    "NO_DEP",
    "PREACCEPTED",
    "PREACCEPTED_EQ",
    "PREACCEPT_PHASE",
    "PREPARE_PHASE",
    "RECOVERIES_PER_TICK",
    "TRY_PHASE",
    "Batch",
    "Drive",
    "Instance",
    "InstanceId",
    "merge",
]

#: instance status (``EPrepareReply.status``, ``EInstanceRecord.status``)
NONE: Final = 0  # a promise only
PREACCEPTED: Final = 1  # pre-accepted with attributes this replica changed
PREACCEPTED_EQ: Final = 2  # pre-accepted with the proposer's attributes unchanged
ACCEPTED: Final = 3
COMMITTED: Final = 4

#: the deliberately broken variants EPaxos has (teeth tests find each): ``epaxos_exec_uncommitted``
#: executes an instance without waiting for its dependencies to commit;
#: ``epaxos_try_ignores_conflicts`` answers every TryPreAccept with a pre-accept, never
#: checking its own instances for conflicts; ``epaxos_recovery_ignores_preaccepted`` treats a
#: recovery's pre-accepted replies as if nobody had seen the value (a no-op replaces it)
EPAXOS_UNSAFE_VARIANTS: Final = frozenset({
    "ack_before_persist", "epaxos_exec_uncommitted", "epaxos_try_ignores_conflicts",
    "epaxos_recovery_ignores_preaccepted",
})

#: a dependency on none of a replica's instances (an entry of ``deps``, on the wire too)
NO_DEP: Final = -1

#: most recoveries started in one tick (the rest wait for the next)
RECOVERIES_PER_TICK: Final = 64
#: a heartbeat announcing an owner's next index marks at most this many instances as known
HEARTBEAT_WINDOW: Final = 4096

InstanceId = tuple[int, int]
Batch = tuple[Command, ...]

PREACCEPT_PHASE: Final = "pre-accept"
ACCEPT_PHASE: Final = "accept"
PREPARE_PHASE: Final = "prepare"
#: recovery asking replicas to pre-accept the owner's attributes (the optimized fast quorum)
TRY_PHASE: Final = "try-pre-accept"


class Instance:
    """What this replica knows of one instance: the promised ``ballot``, and the value and
    attributes (pre-)accepted at ``vballot`` with their ``status``."""

    __slots__ = ("ballot", "batch", "deps", "executed", "seq", "status", "vballot")

    def __init__(
        self, ballot: int, vballot: int, status: int, batch: Batch, seq: int,
        deps: tuple[int, ...],
    ) -> None:
        self.ballot = ballot
        self.vballot = vballot
        self.status = status
        self.batch = batch
        self.seq = seq
        self.deps = deps
        self.executed = False


class Drive:
    """An instance this replica is driving (its own, or one it recovers) at ``ballot``."""

    __slots__ = (
        "ballot", "batch", "changed", "deps", "holders", "phase", "prepared", "refusals",
        "replies", "sent_at", "seq",
    )

    def __init__(
        self, phase: str, ballot: int, batch: Batch, seq: int, deps: tuple[int, ...], now: int
    ) -> None:
        self.phase = phase
        self.ballot = ballot
        self.batch = batch
        self.seq = seq
        self.deps = deps
        self.changed = False  # a pre-accept reply changed the attributes
        self.replies: dict[int, EPrepareReply | None] = {}
        self.sent_at = now
        #: TryPreAccept: replicas other than the owner holding the owner's attributes (at its
        #: default ballot, or pre-accepted by this try), those that refused for a conflict,
        #: and the prepare's replies that pre-accepted the value (a restarted phase 1 merges
        #: their attributes)
        self.holders: set[int] = set()
        self.refusals: set[int] = set()
        self.prepared: tuple[EPrepareReply, ...] = ()


def merge(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(x if x >= y else y for x, y in zip(a, b, strict=True))


