"""Ordering, the acceptors' and learners' side (§3.2, Figure 5, lines 21-40).

Every replica accepts the sequencer's O-instances (``on_oaccept``: only from the sequencer
of its current view, and only once it accepted that view's NewView) and acknowledges each
to whoever learns from it (``OAck``, addressed by ``ReadinessRule.oack_targets``). An
O-instance is chosen once a majority accepted it at the view's ballot: the sequencer (it
proposed it), us, and the acknowledgements collected (``learn_chosen``). The learner of its
own O-instance sends ``OCommit`` to every peer (``commit_o``; with three replicas not to
one that acknowledged a sequencer's own slot: it learns from the sequencer's own OAck);
others may learn from commits (``on_ocommit``: learned, not accepted, so never reported in
a vote). A sequencer whose OAccept leaves before its own acceptance is durable
(``ReadinessRule.oaccepts_early``) acknowledges its own proposals too, after its fsync, and
only that acknowledgement counts it.

Rules (what this replica accepted and learned lives in the O-log, ``OLog``, which keeps
them):

* One proposer per view: two values for one slot in one view are impossible without a bug
  and are ignored; a value accepted in an older view yields to a later view's commit
  (``OLog.learn_commit``).
* An executed slot is never accepted, acknowledged as new, or counted again.
* ``OLog.prefix`` is the gap-free prefix of O-instances accepted in this view (N = 5's
  ready rule, ``OLog.advance_prefix``, advanced here after the ready rule saw the
  acceptance): an entry from an older view may be stale, so it stops the prefix until it
  executes.
* A NewView replaces every unexecuted O-instance from its start (a stale commit from the old
  view included: that is how a replica gives up a slot it committed alone;
  ``OLog.install_new_view``).

Entry points: ``on_oaccept``, ``accept_o``, ``on_oack``, ``learn_chosen``, ``commit_o``,
``on_ocommit``, ``flush_acks``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from consensus.messages import (
    MAX_ENTRIES,
    MAX_SLOTS,
    NO_CL,
    SEAL,
    OAccept,
    OAcceptedRecord,
    OAck,
    OCommit,
    OEntry,
)
from consensus.protocol.sdpaxos.instances import NO_BALLOT, pages
from consensus.protocol.types import Role

if TYPE_CHECKING:
    from consensus.protocol.sdpaxos.replica import SDPaxosReplica

__all__ = ["OAcceptor"]


class OAcceptor:
    """What this replica accepted and learned of the O-instances, and its acknowledgements."""

    def __init__(self, r: SDPaxosReplica) -> None:
        self.r = r
        self._oack_out: dict[int, list[int]] = {}
        #: this turn's commits, each with the peers that learn it without one (see commit_o)
        self._ocommit_out: dict[int, tuple[OEntry, set[int]]] = {}

    def flush_acks(self) -> None:
        r = self.r
        for dest in sorted(self._oack_out):
            for slots in pages(self._oack_out[dest], MAX_SLOTS):
                r.send(dest, OAck(src=r.me, view=r.view, slots=slots))
        self._oack_out.clear()
        if self._ocommit_out:  # each peer what it does not learn without (see commit_o)
            for peer in r.peers:
                wanted = [e for e, learned in self._ocommit_out.values() if peer not in learned]
                for entries in pages(wanted, MAX_ENTRIES):
                    r.send(peer, OCommit(src=r.me, view=r.view, entries=entries))
            self._ocommit_out.clear()

    def on_oaccept(self, msg: OAccept) -> None:
        r = self.r
        if msg.src != r.sequencer or not r.view_ready:
            return
        o_log = r.o_log
        fresh: list[OEntry] = []
        for entry in msg.entries:
            if o_log.ballot.get(entry.slot, NO_BALLOT) < msg.view or entry.slot not in o_log.value:
                if entry.slot < o_log.exec_slot:
                    continue  # executed: nothing to accept (the value is chosen)
                fresh.append(entry)
                self.accept_o(entry, msg.view)
            elif o_log.value[entry.slot] != entry.owner:
                continue  # two values for one slot in one view: impossible without a bug
            elif entry.owner == r.me and entry.slot not in o_log.committed:
                r.readiness.learn_own(entry.slot)  # e.g. we restarted and forgot the commit
            # a duplicate is acknowledged again below: its first OAck may have been lost
            self._queue_oack(entry)
        if fresh:
            r.out.persist.append(OAcceptedRecord(view=msg.view, entries=tuple(fresh)))

    def accept_o(self, entry: OEntry, ballot: int) -> None:
        """Record an O-instance accepted here (by the sequencer itself, or from an OAccept)."""
        r = self.r
        slot, owner = entry.slot, entry.owner
        r.o_log.accept(slot, owner, ballot)
        if owner == r.me:
            r.straggler.note_ordered()
            r.readiness.learn_own(slot)
        else:
            # with the sequencer's acceptance (its OAck, or its OAccept where that says it)
            # and ours it is chosen with three replicas, and its learner's OCommit would take
            # a one-way delay longer to tell us; with five, the acknowledgements that came
            # before the OAccept may complete a majority
            self.learn_chosen(slot)
        r.o_log.advance_prefix(r.view)
        r.readiness.after_accept()

    def _queue_oack(self, entry: OEntry) -> None:
        """Acknowledge an accepted O-instance to whoever learns from it. The learner (the
        command leader) counts acknowledgements itself, and with three replicas the sequencer
        too: ours tells it the slot is chosen a round trip to the learner sooner than the
        learner's OCommit would. With five, the learner commits on the sequencer's OAccept
        alone and the sequencer needs every acknowledgement (its ready rule looks at the
        majority-accepted prefix); the others learn others' slots from a majority of them, a
        round trip sooner than through the owner's OCommit. Every later slot a replica
        executes waits for each of them. (A learner's own OCommit goes out now anyway.)"""
        r = self.r
        owner = entry.owner
        if owner == NO_CL:
            return
        if owner == SEAL:  # the sequencer learns it and commits it to everyone
            if r.sequencer != r.me:
                self._oack_out.setdefault(r.sequencer, []).append(entry.slot)
            return
        for dest in r.readiness.oack_targets(owner):
            if dest != r.me:
                self._oack_out.setdefault(dest, []).append(entry.slot)

    def learn_chosen(self, slot: int) -> None:
        """O[slot] is chosen once a majority accepted it at this view's ballot: us, and the
        acknowledgements we collected — the sequencer's own among them when its OAccept
        leaves before its acceptance is durable (``ReadinessRule.oaccepts_early``); else its
        OAccept says it accepted. (``learn_from_accept``: the broken variant that counts the
        sequencer from an early OAccept.)"""
        r = self.r
        o_log = r.o_log
        if o_log.ballot.get(slot) != r.view or slot in o_log.committed:
            return
        acks = o_log.acks.get(slot, set()) | {r.me}
        if not r.readiness.oaccepts_early or "learn_from_accept" in r.unsafe:
            acks = acks | {r.sequencer}
        if len(acks) >= r.q:
            self.commit_o(slot)

    def on_oack(self, msg: OAck) -> None:
        r = self.r
        if not r.view_ready:
            return
        r.readiness.on_sequencer_acks(msg.src, msg.slots)
        # Any replica may learn a slot from acknowledgements: the learner in the normal case,
        # anyone stuck on a slot whose learner forgot it (they come with a Catchup answer).
        o_log = r.o_log
        for slot in msg.slots:
            if slot in o_log.committed or slot < o_log.exec_slot:
                self._acked_before_commit(slot, msg.src)
                continue
            o_log.add_ack(slot, msg.src)  # may precede our OAccept
            self.learn_chosen(slot)

    def commit_o(self, slot: int) -> None:
        """O[slot] is chosen. Its learner (its owner; the sequencer for a SEAL) commits it to
        the peers, but with three replicas a serving sequencer skips the peers that
        acknowledged it (``ReadinessRule.acceptors_learn_alone``): our own ``OAck`` went to
        each with our ``OAccept``, in an earlier turn on the same FIFO connection, and with
        their acceptance it makes a majority (``learn_chosen``). One that lost our OAck, or
        restarted before it came, stops executing at the slot and gets the commit from a
        peer by ``Catchup``, as when the commit itself is lost."""
        r = self.r
        acked = r.o_log.acks.get(slot, ())  # (forgotten once committed)
        if not r.o_log.commit(slot):
            return  # known chosen already, or executed
        owner = r.o_log.value[slot]
        if owner != r.me and not (owner == SEAL and r.is_sequencer):
            return
        learned: set[int] = set()
        if self._acceptors_learn_alone():
            learned.update(acked)
        self._ocommit_out[slot] = (OEntry(slot=slot, owner=owner), learned)
        if owner == r.me:
            r.readiness.check_ready()

    def _acceptors_learn_alone(self) -> bool:
        """Our commits may skip the peers that acknowledged (see ``commit_o``): three
        replicas, and we serve as sequencer, whose own OAck goes with every OAccept
        (``oaccepts_early``)."""
        r = self.r
        rule = r.readiness
        return rule.acceptors_learn_alone and rule.oaccepts_early and r.role is Role.SEQUENCER

    def _acked_before_commit(self, slot: int, src: int) -> None:
        """``src`` acknowledged ``slot`` after we learned it chosen: if our commit of it
        has not left (learned this turn), it need not go to ``src``."""
        pending = self._ocommit_out.get(slot)
        if pending is not None and self._acceptors_learn_alone():
            pending[1].add(src)

    def on_ocommit(self, msg: OCommit) -> None:
        r = self.r
        if not r.view_ready:
            return
        for entry in msg.entries:
            r.o_log.learn_commit(entry.slot, entry.owner, r.view)
        r.readiness.check_ready()
