"""Ordering, the acceptors' and learners' side (§3.2, Figure 5, lines 21-40).

Every replica accepts the sequencer's O-instances (``on_oaccept``: only from the sequencer
of its current view, and only once it accepted that view's NewView) and acknowledges each
to whoever learns from it (``OAck``, addressed by ``ReadinessRule.oack_targets``). An
O-instance is chosen once a majority accepted it at the view's ballot: the sequencer (it
proposed it), us, and the acknowledgements collected (``learn_chosen``). The learner of its
own O-instance broadcasts ``OCommit`` (``commit_o``); others may learn from commits
(``on_ocommit``: learned, not accepted, so never reported in a vote).

Rules:

* One proposer per view: two values for one slot in one view are impossible without a bug
  and are ignored; a value accepted in an older view yields to a later view's commit.
* An executed slot is never accepted, acknowledged as new, or counted again.
* ``o_prefix`` is the gap-free prefix of O-instances accepted in this view (N = 5's ready
  rule, ``advance_prefix``): an entry from an older view may be stale, so it stops the
  prefix until it executes.
* ``install_new_view`` replaces every unexecuted O-instance from a NewView's start (a stale
  commit from the old view included: that is how a replica gives up a slot it committed
  alone); ``recount_o_state`` recomputes what derives from the O-instances known.

Entry points: ``on_oaccept``, ``accept_o``, ``on_oack``, ``learn_chosen``, ``commit_o``,
``on_ocommit``, ``flush_acks``, ``install_new_view``, ``known_o_count``.
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
from consensus.protocol.sdpaxos.instances import NO_BALLOT, NO_SLOT, pages

if TYPE_CHECKING:
    from consensus.protocol.sdpaxos.replica import SDPaxosReplica

__all__ = ["OAcceptor"]


class OAcceptor:
    """What this replica accepted and learned of the O-instances, and its acknowledgements."""

    def __init__(self, r: SDPaxosReplica) -> None:
        self.r = r
        self._oack_out: dict[int, list[int]] = {}
        self._ocommit_out: list[OEntry] = []

    def known_o_count(self, owner: int) -> int:
        """O-instances for ``owner`` we know of (executed, then beyond the frontier)."""
        r = self.r
        count = r.exec_count[owner]
        for slot in range(r.exec_slot, r.o_high):
            if r.o_value.get(slot) == owner:
                count += 1
        return count

    def flush_acks(self) -> None:
        r = self.r
        for dest in sorted(self._oack_out):
            for slots in pages(self._oack_out[dest], MAX_SLOTS):
                r.send(dest, OAck(src=r.me, view=r.view, slots=slots))
        self._oack_out.clear()
        for entries in pages(self._ocommit_out, MAX_ENTRIES):
            r.broadcast(OCommit(src=r.me, view=r.view, entries=entries))
        self._ocommit_out.clear()

    def on_oaccept(self, msg: OAccept) -> None:
        r = self.r
        if msg.src != r.sequencer or not r.view_ready:
            return
        fresh: list[OEntry] = []
        for entry in msg.entries:
            if r.o_ballot.get(entry.slot, NO_BALLOT) < msg.view or entry.slot not in r.o_value:
                if entry.slot < r.exec_slot:
                    continue  # executed: nothing to accept (the value is chosen)
                fresh.append(entry)
                self.accept_o(entry, msg.view)
            elif r.o_value[entry.slot] != entry.owner:
                continue  # two values for one slot in one view: impossible without a bug
            elif entry.owner == r.me and entry.slot not in r.o_committed:
                r.readiness.learn_own(entry.slot)  # e.g. we restarted and forgot the commit
            # a duplicate is acknowledged again below: its first OAck may have been lost
            self._queue_oack(entry)
        if fresh:
            r.out.persist.append(OAcceptedRecord(view=msg.view, entries=tuple(fresh)))

    def accept_o(self, entry: OEntry, ballot: int) -> None:
        """Record an O-instance accepted here (by the sequencer itself, or from an OAccept)."""
        r = self.r
        slot, owner = entry.slot, entry.owner
        r.o_value[slot] = owner
        r.o_ballot[slot] = ballot
        if ballot > r.accepted_view:  # (only after its NewView: this bound is a safe one)
            r.accepted_view, r.accepted_from = ballot, slot
        if slot >= r.o_high:
            r.o_high = slot + 1
        if owner == r.me:
            r.straggler.window.got += 1
            r.readiness.learn_own(slot)
        else:
            # the sequencer and we accepted it: with three replicas it is chosen, and its
            # learner's OCommit would take a one-way delay longer to tell us; with five, the
            # acknowledgements that came before the OAccept may complete a majority
            self.learn_chosen(slot)
        self.advance_prefix()
        r.readiness.after_accept()

    def advance_prefix(self) -> None:
        """The gap-free prefix of O-instances we accepted (N=5's ready rule): executed slots,
        then those accepted in this view. An entry from an older view may be stale, so it
        stops the prefix until it executes."""
        r = self.r
        if r.o_prefix < r.exec_slot:
            r.o_prefix = r.exec_slot
            r.prefix_mine = r.exec_count[r.me]
        while r.o_ballot.get(r.o_prefix, NO_BALLOT) == r.view:
            if r.o_value[r.o_prefix] == r.me:
                r.prefix_mine += 1
            r.o_prefix += 1

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
        """O[slot] is chosen once a majority accepted it at this view's ballot: the
        sequencer (it proposed it), us, and the acknowledgements we collected."""
        r = self.r
        if r.o_ballot.get(slot) != r.view or slot in r.o_committed:
            return
        acks = r.o_acks.get(slot, set()) | {r.me, r.sequencer}
        if len(acks) >= r.q:
            self.commit_o(slot)

    def on_oack(self, msg: OAck) -> None:
        r = self.r
        if not r.view_ready:
            return
        r.readiness.on_sequencer_acks(msg.src, msg.slots)
        # Any replica may learn a slot from acknowledgements: the learner in the normal case,
        # anyone stuck on a slot whose learner forgot it (they come with a Catchup answer).
        for slot in msg.slots:
            if slot in r.o_committed or slot < r.exec_slot:
                continue
            r.o_acks.setdefault(slot, set()).add(msg.src)  # may precede our OAccept
            self.learn_chosen(slot)

    def commit_o(self, slot: int) -> None:
        r = self.r
        # executed slots leave o_committed: never count one of them again
        if slot in r.o_committed or slot < r.exec_slot:
            return
        r.o_committed.add(slot)
        r.o_acks.pop(slot, None)
        owner = r.o_value[slot]
        if owner == r.me:
            r.my_committed_o += 1
            self._ocommit_out.append(OEntry(slot=slot, owner=owner))
            r.readiness.check_ready()
        elif owner == SEAL and r.is_sequencer:
            self._ocommit_out.append(OEntry(slot=slot, owner=owner))

    def on_ocommit(self, msg: OCommit) -> None:
        r = self.r
        if not r.view_ready:
            return
        for entry in msg.entries:
            if entry.slot < r.exec_slot or entry.slot in r.o_committed:
                continue
            known = r.o_value.get(entry.slot)
            if known is None:
                # learned, not accepted: usable to execute, never reported in a vote
                r.o_value[entry.slot] = entry.owner
                if entry.slot >= r.o_high:
                    r.o_high = entry.slot + 1
            elif known != entry.owner:
                if r.o_ballot.get(entry.slot, NO_BALLOT) >= r.view:
                    continue  # one proposer per view: a conflict here would be a bug
                # we hold a value accepted in an older view that a later view replaced; the
                # chosen one wins (learned, not accepted: it is not ours to report in a vote)
                r.o_value[entry.slot] = entry.owner
                r.o_ballot.pop(entry.slot, None)
            r.o_committed.add(entry.slot)
            if entry.owner == r.me:
                r.my_committed_o += 1
        r.readiness.check_ready()

    def install_new_view(self, view: int, start: int, owners: tuple[int, ...]) -> None:
        r = self.r
        end = start + len(owners)
        for slot in range(max(start, r.exec_slot), end):
            r.o_value[slot] = owners[slot - start]
            r.o_ballot[slot] = view
            r.o_committed.discard(slot)
        for slot in range(max(end, r.exec_slot), r.o_high):
            if r.o_ballot.get(slot, NO_BALLOT) < view:
                r.o_value.pop(slot, None)
                r.o_ballot.pop(slot, None)
                r.o_committed.discard(slot)
        if view > r.accepted_view:
            r.accepted_view, r.accepted_from = view, start
        elif view == r.accepted_view:
            r.accepted_from = max(r.accepted_from, start)  # a replay: never lower it
        self.recount_o_state()

    def recount_o_state(self) -> None:
        """Recompute what is derived from the O-instances known (after a log was replaced)."""
        r = self.r
        r.o_acks.clear()
        r.o_high = max(r.o_value, default=NO_SLOT) + 1
        r.o_prefix = r.exec_slot
        r.prefix_mine = r.exec_count[r.me]
        self.advance_prefix()
        r.my_committed_o = r.exec_count[r.me] + sum(
            1 for s in r.o_committed if s >= r.exec_slot and r.o_value.get(s) == r.me
        )
