"""Restart: rebuild a replica from its durable records (after a snapshot, if any).

``recover`` replays the records — accepted C-instances (highest ballot wins), accepted
O-instances, NewViews, the view, promises, and which slots ran — then executes again what
they say ran (``Executor.replay_executed``) and starts as a follower
(``SDPaxosReplica.restarted``). A restarted replica votes for nobody for one lease period
(``Leases.start``) and never reuses an index it named: it starts past its reservation
(``ReserveRecord``, ``CStore``), and its own recovery decides the indexes below it that its
records do not hold (``CStore.gap``). Its own proposals found in the
records are handed to ``OwnProposals.found_at_restart``, which drives them again once caught
up with the peers (most of them are decided by then; those decided without their commands
are reported failed, those executed as proposed are reported ready).

Entry points: ``recover``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from consensus.messages import (
    CAcceptedRecord,
    CPromiseRecord,
    ExecutedRecord,
    NewViewRecord,
    OAcceptedRecord,
    Record,
    ReserveRecord,
    ViewRecord,
)

if TYPE_CHECKING:
    from consensus.protocol.sdpaxos.replica import SDPaxosReplica

__all__ = ["Restart"]


class Restart:
    """Rebuilds the replica from its records and resumes its own proposals."""

    def __init__(self, r: SDPaxosReplica) -> None:
        self.r = r

    def recover(self, records: Sequence[Record]) -> None:
        """Rebuild what this replica promised and accepted from its durable records, then
        execute again what they say it executed."""
        r = self.r
        own: set[int] = set()
        executed: dict[int, tuple[int, int]] = {}
        for record in records:
            match record:
                case CAcceptedRecord():
                    if record.index < r.o_log.exec_count[record.owner]:
                        continue  # executed: in the snapshot
                    r.c_store.restore(record)
                    if record.owner == r.me:
                        own.add(record.index)
                case OAcceptedRecord():
                    r.o_log.restore_accepted(record)
                case NewViewRecord():
                    r.o_log.install_new_view(record.view, record.start, record.owners, r.view)
                case ViewRecord():
                    r.restore_view(record.view)
                case CPromiseRecord():
                    r.c_store.restore_promise(record.owner, record.ballot, record.from_index)
                case ExecutedRecord():
                    for k, owner in enumerate(record.owners):
                        executed[record.start + k] = (owner, record.ballots[k])
                case ReserveRecord():
                    if "reuse_index" not in r.unsafe:
                        r.c_store.restore_reservation(record.below)
        r.executor.replay_executed(executed)
        self._note_gap(own)
        r.restarted(own)

    def _note_gap(self, own: set[int]) -> None:
        """Our indexes below the reservation that our records do not hold may have been
        named by a ``CAccept`` that left before its record was durable: our own recovery
        decides them once we are caught up (``CStore.gap``)."""
        r = self.r
        store = r.c_store
        start = r.o_log.exec_count[r.me]
        while start < store.reserved and start in own:
            start += 1
        store.note_gap(start)
