"""What a protocol core asks its driver to do: the ``Ready`` batch and its parts.

The driver's loop, for every batch (etcd-raft's contract):

1. make every record in ``persist`` durable (one fsync for the whole batch: group commit);
   append the records in ``log`` after them, which need no fsync of their own (losing them
   in a crash costs time, never safety): the next fsync makes them durable;
2. only then send ``send_after_persist`` (acknowledgements that promise what was persisted);
   ``send`` needs no durability and may leave at once — the sooner the better: a proposer's
   Accept there travels, and its acceptors' fsyncs run, in parallel with its own fsync;
3. apply ``apply`` to the state machine in order (global-log order, no gaps): each entry is
   one executed slot's batch (or a run of it), handed over as the core holds it (a
   ``PackedBatch`` too), never one object per command;
4. answer ``ready`` blind commands at once, and every other command led here after it applies;
   serve ``reads`` from the state machine *after* applying this batch's ``apply``; answer
   ``failed`` commands with their error;
5. call ``core.advance(ready)``: the records are durable. No input reaches the core
   between ``ready()`` and ``advance`` (a core may count its own acceptance at once because
   nothing that completes a majority with it is stepped before it is durable).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from consensus.messages import Command, PeerMessage, Record

__all__ = ["SLOT_STRIDE", "Execution", "Failure", "Outgoing", "Ready", "SlotBatch", "executions"]


@dataclass(frozen=True, slots=True)
class Outgoing:
    """``message`` for replica ``to``."""

    to: int
    message: PeerMessage


#: Commands per global slot are numbered below this bound (a batch never exceeds it).
SLOT_STRIDE = 1 << 16


class SlotBatch(NamedTuple):
    """What to apply of global slot ``slot``: ``commands``, the ``offset``-th command of the
    slot first, then the next ones in order (the whole batch of the slot, ``offset`` 0, but
    for a run a core or the membership layer cut out of it).

    ``led_here`` is true on the replica that proposed them: that replica answers their
    clients (with the state machine's results) unless a command was blind and already
    acknowledged. A core whose batches mix commands led here and elsewhere hands over a
    run for each stretch of one kind.

    One per slot, not one per command (EPaxos, which numbers each command a slot of its own,
    hands one per command): the driver hands ``commands`` to the state machine as they are
    (``consensus.statemachine.batch_applier``), so neither the core nor the driver builds
    anything per command it executes (a restart executes a million at once).
    """

    slot: int
    offset: int
    commands: Sequence[Command]
    led_here: bool

    @property
    def position(self) -> int:
        """The global-log position of the first command (``Execution.position``)."""
        return self.slot * SLOT_STRIDE + self.offset


class Execution(NamedTuple):
    """One command of a ``SlotBatch``: ``command``, the ``offset``-th of global slot
    ``slot``, for whoever looks at commands one at a time (the simulator, tests)."""

    slot: int
    offset: int
    command: Command
    led_here: bool

    @property
    def position(self) -> int:
        """A number that grows along the global log and names this command's place in it
        (the same on every replica): what the state machine's ``apply`` receives."""
        return self.slot * SLOT_STRIDE + self.offset


def executions(batches: Iterable[SlotBatch]) -> list[Execution]:
    """The commands of ``batches``, one ``Execution`` each, in order."""
    return [Execution(slot, offset + index, command, led_here)
            for slot, offset, commands, led_here in batches
            for index, command in enumerate(commands)]


@dataclass(frozen=True, slots=True)
class Failure:
    """A command led here that did not complete.

    ``definite``: the *request* never took effect and never will — not this copy of it only,
    but every copy of its ``(client id, seq)`` anywhere. Otherwise the outcome is unknown; a
    retry with the same (client id, seq) is safe (the session table applies it once).

    The rule for ``definite`` (every core keeps it): a client may have sent the request to
    several replicas (a retry after a timeout or a lost connection, a restarted replica asked
    again), and each may hold it in an instance of its own; a core knows only its own. So a
    core reports a failure as definite only for a refusal that follows from the request
    itself and the rules every replica shares, never from a fate of one of its instances:
    an instance decided without the command (a recoverer's no-op) is reported indefinite,
    since another replica's instance may still carry it (SDPaxos's ``OwnProposals.decided``). What
    settles such a request for good is the log itself: a cancel under the same
    (client id, seq) (``consensus.statemachine.CANCEL_OP``) that the session table orders
    against every copy (``consensus.attempts``: the client's side).
    """

    command: Command
    definite: bool
    reason: str


@dataclass(slots=True, init=False)
class Ready:
    """What one turn of a core asks its driver to do (the module doc). Built empty, by an
    ``__init__`` of its own: a core builds one a turn, and the dataclass's, calling a
    factory per list, cost three times as much."""

    persist: list[Record]
    #: records written after ``persist`` without an fsync of their own (see the module doc)
    log: list[Record]
    send_after_persist: list[Outgoing]
    send: list[Outgoing]
    #: what executed, in global-log order: each slot's batch (see ``SlotBatch``)
    apply: list[SlotBatch]
    #: commands led here that became ready (durably placed in the global order) this turn
    ready: list[Command]
    #: read requests (``core.read``) that may now be served from the state machine
    reads: list[Command]
    #: commands led here that failed
    failed: list[Failure]
    #: peers that need our latest snapshot (they are behind our compaction point)
    snapshot_requests: list[int]
    #: membership changes led here that executed, with the result their client gets (the
    #: core answers them itself: they never reach the state machine)
    results: list[tuple[Command, bytes]]
    #: snapshot the state machine once ``apply`` is applied, before anything else (a learner
    #: that becomes a voter: its core starts from that snapshot, ``core.durable_records``)
    snapshot_now: bool

    def __init__(self) -> None:
        self.persist = []
        self.log = []
        self.send_after_persist = []
        self.send = []
        self.apply = []
        self.ready = []
        self.reads = []
        self.failed = []
        self.snapshot_requests = []
        self.results = []
        self.snapshot_now = False

    def executions(self) -> list[Execution]:
        """``apply`` command by command (``executions``)."""
        return executions(self.apply)

    def applied_count(self) -> int:
        """How many commands ``apply`` holds."""
        return sum(len(batch.commands) for batch in self.apply)

    def is_empty(self) -> bool:
        return not (
            self.persist
            or self.log
            or self.send_after_persist
            or self.send
            or self.apply
            or self.ready
            or self.reads
            or self.failed
            or self.snapshot_requests
            or self.results
            or self.snapshot_now
        )
