"""Linearizable reads through the sequencer (§3.5).

A replica asks the sequencer once per turn for all of that turn's reads (``RRequest`` with the
union of their keys, ``flush_read_requests``): the answer, the last slot assigned to an
update of those keys (``Sequencer.read_slot``), serves every one of them once this replica
executed through it (``serve_reads``). Only a sequencer holding read leases from a majority
answers (``Election.lease_valid``, leases.py); the sequencer serves its own reads the same
way without a message. An unanswered request is asked again after ``retransmit_us``
(``retry_reads``), and of the new sequencer right after a view change.

Rules: a read is served only at or after the slot the leased sequencer named (never from a
state older than a write acknowledged before the read began); ``no_lease_check`` is the
broken variant a teeth test catches.

Entry points: ``flush_read_requests``, ``on_rrequest``, ``on_rreply``, ``retry_reads``,
``serve_reads``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from consensus.messages import (
    Command,
    RReply,
    RRequest,
)
from consensus.protocol.sdpaxos.instances import union_keys
from consensus.protocol.types import Role

if TYPE_CHECKING:
    from consensus.protocol.sdpaxos.replica import SDPaxosReplica

__all__ = ["Reads"]


class Reads:
    """This replica's linearizable reads, from asking to serving."""

    def __init__(self, r: SDPaxosReplica) -> None:
        self.r = r
        # reads
        self._read_ids = 0
        # reads asked of the sequencer, one RRequest per turn: id -> (reads, sent at)
        self.pending_reads: dict[int, tuple[tuple[Command, ...], int]] = {}
        self.unasked_reads: list[Command] = []  # this turn's, asked in ready()
        # (slot, id, read); the sequencer's own reads have no id (answered without an
        # RRequest)
        self._waiting_reads: list[tuple[int, int | None, Command]] = []

    def ask(self, command: Command) -> None:
        """A linearizable read: asked of the sequencer with the turn's others."""
        self.unasked_reads.append(command)

    def on_view_accepted(self) -> None:
        """Our view's NewView is accepted: ask its sequencer the reads not answered yet."""
        r = self.r
        for read_id, (reads, _) in sorted(self.pending_reads.items()):
            self.pending_reads[read_id] = (reads, r.now)
            self.send_rrequest(read_id, reads)

    def flush_read_requests(self) -> None:
        """Ask the sequencer once for all of this turn's reads: its answer for the union of
        their keys (the latest slot any of them needs) serves every one of them, so a read
        costs the sequencer a share of one message instead of two messages."""
        r = self.r
        if not self.unasked_reads:
            return
        reads = tuple(self.unasked_reads)
        self.unasked_reads.clear()
        if r.role is Role.SEQUENCER and r.election.lease_valid():
            # the sequencer answers its own reads the same way, once per turn: one lease check
            # and one history lookup for the turn instead of one per read
            slot = r.ordering.read_slot(union_keys(reads))
            self._waiting_reads.extend((slot, None, read) for read in reads)
            return
        self._read_ids += 1
        self.pending_reads[self._read_ids] = (reads, r.now)
        self.send_rrequest(self._read_ids, reads)

    def send_rrequest(self, read_id: int, reads: tuple[Command, ...]) -> None:
        r = self.r
        if r.is_sequencer:
            return  # we answer ourselves once serving with a lease (see retry_reads)
        request = RRequest(src=r.me, view=r.view, read_id=read_id, keys=union_keys(reads))
        r.request(r.sequencer, request)

    def on_rrequest(self, msg: RRequest) -> None:
        r = self.r
        if r.role is Role.SEQUENCER and r.election.lease_valid():
            slot = r.ordering.read_slot(msg.keys)
            r.request(
                msg.src, RReply(src=r.me, view=r.view, read_id=msg.read_id, slot=slot)
            )

    def on_rreply(self, msg: RReply) -> None:
        r = self.r
        if msg.src != r.sequencer:
            return
        pending = self.pending_reads.pop(msg.read_id, None)
        if pending is not None:
            self._waiting_reads.extend((msg.slot, msg.read_id, read) for read in pending[0])

    def retry_reads(self) -> None:
        r = self.r
        deadline = r.now - r.config.retransmit_us
        for read_id, (reads, sent_at) in sorted(self.pending_reads.items()):
            if r.role is Role.SEQUENCER and r.election.lease_valid():
                del self.pending_reads[read_id]
                slot = r.ordering.read_slot(union_keys(reads))
                self._waiting_reads.extend((slot, read_id, read) for read in reads)
            elif sent_at <= deadline:
                self.pending_reads[read_id] = (reads, r.now)
                self.send_rrequest(read_id, reads)

    def serve_reads(self) -> None:
        r = self.r
        if not self._waiting_reads:
            return
        still: list[tuple[int, int | None, Command]] = []
        for slot, read_id, command in self._waiting_reads:
            if slot < r.o_log.exec_slot:
                r.out.reads.append(command)
            else:
                still.append((slot, read_id, command))
        self._waiting_reads = still
