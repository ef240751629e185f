"""Compaction and snapshot installation.

The driver snapshots the state machine and tells the core (``compact``): every part forgets
the slots below the snapshot (``SDPaxosReplica.drop_below`` announces it), and the records a
rewritten write-ahead log must hold are everything promised and accepted beyond the
execution frontier (``durable_records``). A replica behind a peer's compaction point
installs the peer's snapshot (``install``; ``SDPaxosReplica.snapshot_installed``) and
continues from it.

Rules: compaction never turns into "nothing accepted" — a vote, promise or catch-up request
reaching below the compaction point is answered with the snapshot (see view_change.py,
recovery.py, catchup.py). Our own proposals a peer's snapshot already executed are
reported as failed with "retry": the session table answers a retry with the first result.

Entry points: ``meta``, ``compact``, ``install``, ``durable_records``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from consensus.errors import LocalProtocolError
from consensus.messages import (
    CAcceptedRecord,
    CPromiseRecord,
    NewViewRecord,
    OAcceptedRecord,
    OEntry,
    Record,
    ReserveRecord,
    ViewRecord,
)
from consensus.protocol.sdpaxos.instances import NO_BALLOT
from consensus.protocol.types import SnapshotMeta

if TYPE_CHECKING:
    from consensus.protocol.sdpaxos.replica import SDPaxosReplica

__all__ = ["Snapshots"]


class Snapshots:
    """Where this replica's state machine snapshot stands, and what it lets us forget."""

    def __init__(self, r: SDPaxosReplica) -> None:
        self.r = r

    def meta(self) -> SnapshotMeta:
        """Where a snapshot of the state machine, taken now (after applying the last
        ``Ready``), stands in the log."""
        r = self.r
        return SnapshotMeta(r.o_log.exec_slot, tuple(r.o_log.exec_count[rid] for rid in range(r.n)))

    def compact(self, meta: SnapshotMeta) -> list[Record]:
        """The state machine's snapshot at ``meta`` is durable: forget every slot below it.
        Returns the records a rewritten write-ahead log must hold: with a durable snapshot at
        the execution frontier (the caller just took one; ``meta`` may be an older one, so
        that peers a little behind still catch up from memory), they rebuild this replica
        exactly as its full log would."""
        r = self.r
        if meta.slot > r.o_log.exec_slot:
            raise LocalProtocolError("compact() beyond the execution frontier")
        r.drop_below(meta)
        return self.durable_records()

    def install(self, meta: SnapshotMeta) -> list[Record]:
        """A peer's snapshot was applied to our state machine: continue from ``meta``.
        Returns the records for a rewritten write-ahead log, like ``compact``."""
        r = self.r
        if meta.slot > r.o_log.exec_slot:
            r.snapshot_installed(meta)
        return self.durable_records()

    def durable_records(self) -> list[Record]:
        """Everything this replica promised and accepted beyond its execution frontier: a
        restart begins at a snapshot of it and skips what it executed (``Restart.recover``), so
        rewriting executed instances that are kept in memory for peers would only cost."""
        r = self.r
        records: list[Record] = [
            ViewRecord(view=r.view),
            # "accepted this view's log, nothing of it beyond here": restores accepted_view
            NewViewRecord(view=r.o_log.accepted_view, start=r.o_log.exec_slot, owners=()),
        ]
        by_ballot: dict[int, list[OEntry]] = {}
        for slot in sorted(r.o_log.ballot):
            if slot >= r.o_log.exec_slot and r.o_log.ballot[slot] > NO_BALLOT:
                entry = OEntry(slot=slot, owner=r.o_log.value[slot])
                by_ballot.setdefault(r.o_log.ballot[slot], []).append(entry)
        for ballot in sorted(by_ballot):
            records.append(OAcceptedRecord(view=ballot, entries=tuple(by_ballot[ballot])))
        executed = r.o_log.exec_count
        for (owner, index), inst in sorted(r.c_store.items()):
            if inst.batch is not None and index >= executed[owner]:
                records.append(
                    CAcceptedRecord(owner=owner, index=index, ballot=inst.ballot, batch=inst.batch)
                )
        for owner, (ballot, from_index) in sorted(r.c_store.promised.items()):
            records.append(CPromiseRecord(owner=owner, from_index=from_index, ballot=ballot))
        if r.c_store.reserved:
            # our indexes below it may have been named before their records were durable
            records.append(ReserveRecord(below=r.c_store.reserved))
        return records
