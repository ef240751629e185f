"""Our own proposals, from proposed to told: the one place that reports them.

A batch of client commands proposed here lives in one own C-instance, and ``pending`` maps
its index to the batch until its clients can be told something. Every outcome is reported
here, once:

=====================  =========================================  ==========================
outcome                when                                       reported by
=====================  =========================================  ==========================
ready                  chosen with our batch and durably ordered  ``ready_below`` (asked by
                       (what "ordered" means is the readiness     the readiness rule)
                       rule's)
ready                  executed with our batch (executed implies  ``executed``
                       chosen and ordered for good)
failed, indefinitely   decided with another value (a recoverer's  ``decided``
                       no-op): another copy of the request may
                       still run (``ready.Failure``'s rule)
failed, indefinitely   a peer's snapshot covered it before we     ``covered_by_snapshot``
                       saw it decided: retry (the session table
                       answers with the first result)
carried over           the epoch ended before it was ordered      ``carry_over`` (membership)
=====================  =========================================  ==========================

A proposal is *driven* while its instance is ours to get chosen (c_phase.py); it is
*undriven* while held for our own recovery or after a recoverer overtook it, and stays
pending: our recovery proposes it again, or it is decided without us (``decided``).

After a restart, our instances found in the records (``found_at_restart``) are driven again
once caught up with the peers (``resume_after_restart``: most are decided by then). Until
then, the batches the records hold (``found``) are reported like the old incarnation would
have: executed as proposed, ready; decided with another value, failed.

Entry points: ``propose``, ``ready_below``, ``executed``, ``decided``,
``covered_by_snapshot``, ``found_at_restart``, ``resume_after_restart``, ``carry_over``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from consensus.messages import Command
from consensus.protocol.ready import Failure
from consensus.protocol.sdpaxos.instances import Batch, CInstance
from consensus.protocol.types import NEVER

if TYPE_CHECKING:
    from consensus.protocol.sdpaxos.replica import SDPaxosReplica

__all__ = ["COVERED_BY_SNAPSHOT", "RECOVERED_WITHOUT", "OwnProposals"]

#: why a command we proposed failed when our instance was decided without it
RECOVERED_WITHOUT = ("its instance was recovered without it; another copy of the request "
                     "may still run: retry it, or settle it")
#: why a command we proposed failed when a peer's snapshot covered its instance
COVERED_BY_SNAPSHOT = "decided while this replica caught up from a snapshot: retry it"


class OwnProposals:
    """Our proposals not yet reported, and those our records held at a restart."""

    def __init__(self, r: SDPaxosReplica) -> None:
        self.r = r
        self._pending: dict[int, Batch] = {}
        #: own index -> the batch we proposed there, for every proposal not reported yet
        #: (read it here; it changes only through the methods below)
        self.pending: Mapping[int, Batch] = self._pending
        #: own indexes found in our records at a restart, driven again once caught up
        self._found: list[int] = []
        # ... with the batches the records hold: executed as they are, they are ready, even
        # if something decided them before this incarnation drove them (then they are not
        # pending): the new incarnation reports them like the old one would have
        self._found_batches: dict[int, Batch] = {}
        #: when our recovery of a restart's gap last started (``NEVER``: not yet)
        self._gap_recovered_at = NEVER

    def propose(self, index: int, batch: Batch) -> None:
        """We proposed ``batch`` at our ``index`` (or hold it there for our recovery)."""
        self._pending[index] = batch

    # ------------------------------------------------------------------ outcomes
    def ready_below(self, ordered: int) -> None:
        """Our instances below ``ordered`` are durably ordered: those chosen are ready."""
        r = self.r
        pending, store, me = self._pending, r.c_store, r.me
        for index in sorted(pending):
            if index >= ordered:
                break
            inst = store.instances[(me, index)]
            if inst.committed:
                batch = pending.pop(index)
                if inst.batch == batch:
                    r.out.ready.extend(batch)

    def executed(self, index: int, batch: Batch) -> None:
        """Our instance ``index`` executed with ``batch``: ours (now or before a restart), it
        is ready, whatever the ready rule still waits for (a lost OAck, say)."""
        proposed = self._pending.pop(index, None)
        if self._found_batches:
            found = self._found_batches.pop(index, None)
            proposed = proposed if proposed is not None else found
        if proposed is not None and proposed == batch:
            self.r.out.ready.extend(batch)

    def decided(self, index: int, inst: CInstance) -> None:
        """Our instance ``index`` was chosen (``inst``): if not with what we proposed, its
        commands failed.

        Not definitely (``ready.Failure``): the copy we proposed here never executes, but
        the client may have sent the same request elsewhere — after a timeout, or because we
        crashed — and the instance of the replica it asked then may carry it and be chosen,
        ordered and executed whatever became of ours. Nothing here can tell: which instances
        hold a request is known to its client only. So the outcome is left open; the client
        retries (the session table applies the request once) or settles it through the log.
        (``definite_recovered`` is the broken variant a teeth test catches.)"""
        r = self.r
        # ours from this incarnation, or found in our records at a restart
        table = self._pending if index in self._pending else self._found_batches
        proposed = table.get(index)
        if proposed is None or inst.batch == proposed:
            return
        del table[index]
        chosen = set(inst.batch or ())
        definite = "definite_recovered" in r.unsafe
        for command in proposed:
            if command not in chosen:
                r.out.failed.append(Failure(command, definite, RECOVERED_WITHOUT))

    def covered_by_snapshot(self, covered: int) -> None:
        """A snapshot covers our instances below ``covered`` (compaction, or a peer's
        snapshot we installed). Those still pending were decided while we fell behind: their
        outcome is in the snapshot, not here, and the client learns it by retrying (the
        session table answers a retry with the first result)."""
        r = self.r
        self._found = [i for i in self._found if i >= covered]
        self._found_batches = {i: b for i, b in self._found_batches.items() if i >= covered}
        pending = self._pending
        for index in sorted(i for i in pending if i < covered):
            for command in pending.pop(index):
                r.out.failed.append(Failure(command, False, COVERED_BY_SNAPSHOT))

    def carry_over(self) -> list[Command]:
        """The epoch ended: the commands proposed here it never ordered, in order (for the
        next epoch to take; they are not acknowledged)."""
        return [command for index in sorted(self._pending) for command in self._pending[index]]

    # ------------------------------------------------------------------ restart
    def found_at_restart(self, own: set[int]) -> None:
        """A restart found our instances ``own`` in the records (and executed again what they
        say ran)."""
        r = self.r
        store, executed = r.c_store, r.o_log.exec_count[r.me]
        self._found = sorted(own)
        self._found_batches = {
            index: batch
            for index in self._found
            if index >= executed and (batch := store.instances[(r.me, index)].batch) is not None
        }

    def resume_after_restart(self) -> None:
        """Once caught up after a restart, drive our instances found in the records that
        nothing decided yet (most of them are decided by then)."""
        r = self.r
        if not (self._found or r.c_store.gap) or not r.view_ready:
            return
        if max(r.catchup.peer_executed.values()) > r.o_log.exec_slot:
            return  # still catching up: most of them are probably decided
        store, executed = r.c_store, r.o_log.exec_count[r.me]
        for index in self._found:
            inst = store.instances[(r.me, index)]
            if index >= executed and not inst.committed and inst.batch:
                r.c_phase.drive_again(inst)
                self._pending[index] = inst.batch
                self._found_batches.pop(index, None)  # reported from pending now
        self._found = []
        self._decide_gap()

    def _decide_gap(self) -> None:
        """Our indexes an earlier incarnation may have named without a durable record of its
        own (``CStore.gap``) are ordered as soon as we propose past them: our recovery
        decides them now (their values where a majority reports one, a no-op elsewhere),
        rather than execution waiting for it to notice."""
        r = self.r
        gap = r.c_store.gap
        if gap is None:
            return
        start = max(gap[0], r.o_log.exec_count[r.me])
        if start >= gap[1]:
            r.c_store.end_gap()
        elif (r.me not in r.recovery.recoveries
              and r.now - self._gap_recovered_at > r.election.election_timeout):
            # (again only after an election timeout: a recovery that a higher one ended,
            # each tick, would duel with it)
            self._gap_recovered_at = r.now
            r.recovery.start_recovery(r.me, start)
