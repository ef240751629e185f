"""What a protocol core asks its driver to do: the ``Ready`` batch and its parts.

The driver's loop, for every batch (etcd-raft's contract):

1. make every record in ``persist`` durable (one fsync for the whole batch: group commit);
   append the records in ``log`` after them, which need no fsync of their own (losing them
   in a crash costs time, never safety): the next fsync makes them durable;
2. only then send ``send_after_persist`` (acknowledgements that promise what was persisted);
   ``send`` needs no durability and may leave at once;
3. apply ``apply`` to the state machine in order (global-log order, no gaps);
4. answer ``ready`` blind commands at once, and every other command led here after it applies;
   serve ``reads`` from the state machine *after* applying this batch's ``apply``; answer
   ``failed`` commands with their error;
5. call ``core.advance(ready)``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from consensus.messages import Command, PeerMessage, Record

__all__ = ["SLOT_STRIDE", "Execution", "Failure", "Outgoing", "Ready", "executions"]


@dataclass(frozen=True, slots=True)
class Outgoing:
    """``message`` for replica ``to``."""

    to: int
    message: PeerMessage


#: Commands per global slot are numbered below this bound (a batch never exceeds it).
SLOT_STRIDE = 1 << 16


class Execution(NamedTuple):
    """Apply ``command``, the ``offset``-th command of global slot ``slot``.

    ``led_here`` is true on the replica that proposed it: that replica answers the client
    (with the state machine's result) unless the command was blind and already acknowledged.

    A named tuple, not a frozen dataclass: one is built per command executed (a restart
    builds a million at once), and a frozen dataclass's ``__init__`` costs twice as much.
    """

    slot: int
    offset: int
    command: Command
    led_here: bool

    @property
    def position(self) -> int:
        """A number that grows along the global log and names this command's place in it
        (the same on every replica): what the state machine's ``apply`` receives."""
        return self.slot * SLOT_STRIDE + self.offset


_tuple_new = tuple.__new__


def executions(slot: int, batch: Iterable[Command], led_here: bool) -> list[Execution]:
    """An ``Execution`` for each command of the batch in ``slot``, in order: built as tuples
    (one C call each; the named tuple's own constructor is a Python function, and every
    replica builds one per command it executes)."""
    new = _tuple_new
    return [new(Execution, (slot, offset, command, led_here))
            for offset, command in enumerate(batch)]


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


@dataclass(slots=True)
class Ready:
    persist: list[Record] = field(default_factory=list)
    #: records written after ``persist`` without an fsync of their own (see the module doc)
    log: list[Record] = field(default_factory=list)
    send_after_persist: list[Outgoing] = field(default_factory=list)
    send: list[Outgoing] = field(default_factory=list)
    apply: list[Execution] = field(default_factory=list)
    #: commands led here that became ready (durably placed in the global order) this turn
    ready: list[Command] = field(default_factory=list)
    #: read requests (``core.read``) that may now be served from the state machine
    reads: list[Command] = field(default_factory=list)
    #: commands led here that failed
    failed: list[Failure] = field(default_factory=list)
    #: peers that need our latest snapshot (they are behind our compaction point)
    snapshot_requests: list[int] = field(default_factory=list)
    #: membership changes led here that executed, with the result their client gets (the
    #: core answers them itself: they never reach the state machine)
    results: list[tuple[Command, bytes]] = field(default_factory=list)
    #: snapshot the state machine once ``apply`` is applied, before anything else (a learner
    #: that becomes a voter: its core starts from that snapshot, ``core.durable_records``)
    snapshot_now: bool = False

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
