"""The simulator's events: what its heap holds, one small frozen class per kind.

``Simulation`` keeps ``(time, seq, event)`` on its heap (``seq`` breaks ties, so events are
never compared) and dispatches on the event's class. Events addressed to a replica name it by
``rid``; those that travel a connection (``Frame``, ``SnapshotArrival``) or wait on a loop
(``Turn``, ``Durable``) carry the incarnation they were meant for: a replica that crashed
since ignores them, as a broken connection or a dead process would. ``Tick``, ``Frame``,
``SnapshotArrival``, ``Propose`` and ``Read`` are also what a replica's inbox holds until its
next loop turn feeds them to the core.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from consensus.messages import Command, PeerMessage
from consensus.protocol.ready import Ready
from consensus.protocol.types import SnapshotMeta

__all__ = [
    "Chaos",
    "Check",
    "ClientTimeout",
    "Durable",
    "Event",
    "FaultCrash",
    "FaultRestart",
    "Frame",
    "Heal",
    "InboxEvent",
    "Issue",
    "LongLogRecover",
    "LongLogStep",
    "MemberRetry",
    "Propose",
    "Read",
    "RestartAll",
    "Resume",
    "SnapshotArrival",
    "Tick",
    "Turn",
]

# ---------------------------------------------------------------- a replica's inputs


@dataclass(frozen=True, slots=True)
class Tick:
    """The replica's timer fires (and is set again)."""

    rid: int


@dataclass(frozen=True, slots=True)
class Frame:
    """A peer's frame arrives: the messages the receiver decoded."""

    rid: int
    incarnation: int
    messages: Sequence[PeerMessage]


@dataclass(frozen=True, slots=True)
class SnapshotArrival:
    """A peer's snapshot arrives (sent to a replica behind its compaction point)."""

    rid: int
    incarnation: int
    snapshot: tuple[SnapshotMeta, bytes]


@dataclass(frozen=True, slots=True)
class Propose:
    """A client's write (or read through the log) reaches the replica."""

    rid: int
    command: Command


@dataclass(frozen=True, slots=True)
class Read:
    """A client's lease read reaches the replica."""

    rid: int
    command: Command


# ---------------------------------------------------------------- a replica's loop


@dataclass(frozen=True, slots=True)
class Turn:
    """The replica runs a loop turn over its inbox."""

    rid: int
    incarnation: int


@dataclass(frozen=True, slots=True)
class Durable:
    """The replica's "fsync" of ``ready.persist`` completes."""

    rid: int
    incarnation: int
    ready: Ready


@dataclass(frozen=True, slots=True)
class Resume:
    """A paused replica runs again."""

    rid: int


# ---------------------------------------------------------------- clients


@dataclass(frozen=True, slots=True)
class Issue:
    """Client ``cid`` issues its next operation (or its owed probe read)."""

    cid: int


@dataclass(frozen=True, slots=True)
class ClientTimeout:
    """Client ``cid`` gives up on attempt ``attempt`` of request ``seq`` and retries."""

    cid: int
    seq: int
    attempt: int


# ---------------------------------------------------------------- faults and phases


@dataclass(frozen=True, slots=True)
class Chaos:
    """The chaos phase picks its next fault."""


@dataclass(frozen=True, slots=True)
class Heal:
    """Every fault ends; the heal phase begins."""


@dataclass(frozen=True, slots=True)
class Check:
    """Look whether the run is finished (heal phase)."""


@dataclass(frozen=True, slots=True)
class FaultCrash:
    """Crash the replica (during the chaos phase, while fewer than F are down)."""

    rid: int


@dataclass(frozen=True, slots=True)
class FaultRestart:
    """Restart the crashed replica (during the chaos phase)."""

    rid: int


@dataclass(frozen=True, slots=True)
class LongLogStep:
    """Long-log mode: look at the phase."""


@dataclass(frozen=True, slots=True)
class LongLogRecover:
    """Long-log mode: the restarted replicas must serve again."""


@dataclass(frozen=True, slots=True)
class RestartAll:
    """Restart every crashed replica."""


@dataclass(frozen=True, slots=True)
class MemberRetry:
    """Membership faults: propose the change under way again unless it took effect (as an
    operator would: its first proposal may have been refused or lost)."""


#: what a replica's inbox holds until its next loop turn
InboxEvent = Tick | Frame | SnapshotArrival | Propose | Read

#: anything the simulator's heap holds
Event = (
    InboxEvent | Turn | Durable | Resume | Issue | ClientTimeout | Chaos | Heal | Check
    | FaultCrash | FaultRestart | LongLogStep | LongLogRecover | RestartAll | MemberRetry
)
