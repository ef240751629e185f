"""What a replica node's turn loop is handed between turns: typed events, and the inbox.

Owns: ``Inbox``, the queue of events for the next turn and the event that wakes the loop.
Peers' admitted frames and whole snapshots (``consensus.runtime.peer_intake``) and the
in-process API's requests (``ReplicaNode.submit`` / ``read``) are posted as they come and wake
the loop at once; the client port's requests queue beside them (``queue_request``, the port
wakes the loop once per read of its socket) and are taken in arrival order after them, with
at most ``MAX_READS_PER_TURN`` reads a turn (``Inbox.take``).

Each event is a frozen slotted dataclass, dispatched by its type (``TurnLoop`` matches on
``Event``, the union of them all; a new event that the loop does not handle fails mypy).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from consensus.messages import Command, PeerMessage

__all__ = [
    "MAX_READS_PER_TURN",
    "Event",
    "Inbox",
    "PeerMessages",
    "PeerSnapshot",
    "Propose",
    "Read",
    "Request",
    "StaleRead",
]

#: linearizable reads taken into one loop turn at most (later requests wait for the next
#: turns): a turn's length is how long a peer's message waits behind this replica's clients
#: (above all, a read request at the sequencer, which closed-loop readers keep busy). Writes
#: are not counted: a turn's writes go out as one C-instance, and fewer, bigger instances are
#: what keeps the sequencer's ordering work small.
MAX_READS_PER_TURN = 128


@dataclass(frozen=True, slots=True)
class PeerMessages:
    """The messages of one admitted peer frame, in order (its snapshot chunks taken out)."""

    messages: Sequence[PeerMessage]


@dataclass(frozen=True, slots=True)
class PeerSnapshot:
    """A peer's snapshot, arrived whole: its encoded bytes (loaded off the loop)."""

    data: bytes


@dataclass(frozen=True, slots=True)
class Propose:
    """A command to propose (answered once executed; a blind write once ready)."""

    command: Command


@dataclass(frozen=True, slots=True)
class Read:
    """A linearizable read through the sequencer (or a backup's barrier: an empty op)."""

    command: Command


@dataclass(frozen=True, slots=True)
class StaleRead:
    """A read of the local state machine, possibly old (in-process callers only)."""

    command: Command


#: a request of a client (a turn counts its reads: ``MAX_READS_PER_TURN``)
Request = Propose | Read | StaleRead
#: everything a turn takes in
Event = PeerMessages | PeerSnapshot | Request


class Inbox:
    """The events for the next loop turn, in the order ``take`` hands them over."""

    __slots__ = ("_events", "_requests", "wakeup")

    def __init__(self) -> None:
        self._events: list[Event] = []
        self._requests: list[Request] = []  # from the client port
        #: set when there is something for a turn (the loop also sets it for its ticks)
        self.wakeup = asyncio.Event()

    def post(self, event: Event) -> None:
        """``event`` for the next turn, which runs as soon as the loop gets to it."""
        self._events.append(event)
        self.wakeup.set()

    def queue_request(self, request: Request) -> None:
        """A client port's request, after what is queued (the port wakes the loop: ``wake``)."""
        self._requests.append(request)

    def wake(self) -> None:
        self.wakeup.set()

    @property
    def idle(self) -> bool:
        """Nothing is queued for a turn."""
        return not self._events and not self._requests

    def take(self) -> list[Event]:
        """This turn's events: every posted one, then the client port's requests in arrival
        order up to ``MAX_READS_PER_TURN`` reads (the rest wait for the next turns)."""
        events, self._events = self._events, []
        requests = self._requests
        reads = 0
        for taken, request in enumerate(requests):
            if type(request) is not Propose:
                reads += 1
                if reads > MAX_READS_PER_TURN:
                    self._requests = requests[taken:]
                    events += requests[:taken]
                    return events
        self._requests = []
        events += requests
        return events
