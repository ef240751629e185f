"""The O-log: the global slots' assignments as this replica knows them, what of them is
chosen, and how far it executed.

``OLog`` is the only writer of

* the assignments: per slot, the owner it places (``value``: accepted here, or learned from
  a commit) and the view it was accepted at (``ballot``; none for a learned one), the view
  of the newest NewView accepted and where it started (``accepted_view``,
  ``accepted_from``), and ``high``, one past the highest slot with a value;
* what is chosen: the unexecuted slots known chosen (``committed``) and the acknowledgements
  collected for the others (``acks``: the learner's side);
* the derived counts the ready rules read: ``prefix``, the gap-free prefix of slots
  accepted in the current view (N = 5), with ``prefix_mine`` own O-instances below it, and
  ``committed_mine``, the own O-instances known chosen;
* the execution frontier: ``exec_slot`` (every slot below it ran), ``exec_count`` (per
  owner, the C-instances placed below it), ``executed`` (slot -> (owner, index) of the
  executed slots still in memory), ``sealed_at`` (the executed SEAL, membership), and the
  compaction point (``compacted``, with the counts below it, ``base_counts``).

Invariants (verified as they change, and in full after each bulk change — a NewView, a view
change, compaction, a snapshot, a restart — when ``consensus.protocol.checks`` are on):

1. **Execution is in order, without gaps.** ``execute`` runs slot ``exec_slot`` and no
   other; ``executed`` holds exactly the slots ``[compacted, exec_slot)``.
2. **An executed slot is never accepted or counted again**: ``accept`` refuses a slot below
   ``exec_slot``, and every committed slot is unexecuted and holds a value.
3. **One value per slot and view**: ``accept`` never gives a slot a second owner at the
   view it already holds.
4. Every slot with a value is below ``high``; every slot with a ballot has a value.
5. ``exec_slot <= prefix``; the slots ``[exec_slot, prefix)`` were all accepted in the
   current view, and ``prefix_mine`` counts the own ones below ``prefix``.
6. ``committed_mine`` is ``exec_count[me]`` plus the own slots in ``committed``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from consensus.messages import SEAL, OAcceptedRecord
from consensus.protocol.checks import violated
from consensus.protocol.sdpaxos.instances import NO_BALLOT, NO_SLOT, PLACES_NOTHING
from consensus.protocol.types import SnapshotMeta

__all__ = ["OLog"]

_OWNER: Final = "OLog"


class OLog:
    """The assignment log, what of it is chosen, and the execution frontier."""

    __slots__ = (
        "_checking", "_me", "accepted_from", "accepted_view", "acks", "ballot", "base_counts",
        "committed", "committed_mine", "compacted", "exec_count", "exec_slot", "executed",
        "high", "prefix", "prefix_mine", "sealed_at", "value",
    )

    def __init__(self, replicas: int, me: int, *, start_view: int = 0,
                 checking: bool = False) -> None:
        """``start_view``: the view the log starts in, its (empty) assignment log accepted by
        everyone."""
        self._me = me
        self._checking = checking
        self.value: dict[int, int] = {}
        self.ballot: dict[int, int] = {}
        self.accepted_view = start_view
        self.accepted_from = 0  # the first slot of accepted_view's NewView (see Vote)
        self.high = 0
        self.committed: set[int] = set()
        self.acks: dict[int, set[int]] = {}  # slot -> acceptors (may precede our OAccept)
        self.prefix = 0
        self.prefix_mine = 0
        self.committed_mine = 0
        self.exec_slot = 0
        self.exec_count: dict[int, int] = dict.fromkeys(range(replicas), 0)
        self.executed: dict[int, tuple[int, int]] = {}
        #: the slot of the executed SEAL that ended this log (membership), once executed
        self.sealed_at = NO_SLOT
        self.compacted = 0  # slots below this were compacted into a snapshot
        self.base_counts: dict[int, int] = dict.fromkeys(range(replicas), 0)

    # ------------------------------------------------------------------ reading
    def count_of(self, owner: int) -> int:
        """O-instances for ``owner`` we know of (executed, then beyond the frontier)."""
        value = self.value
        count = self.exec_count[owner]
        for slot in range(self.exec_slot, self.high):
            if value.get(slot) == owner:
                count += 1
        return count

    # ------------------------------------------------------------------ accepting, choosing
    def accept(self, slot: int, owner: int, ballot: int) -> None:
        """We accepted ``owner`` for ``slot`` at ``ballot`` (a view): the caller persists it
        (``OAcceptedRecord``) and advances the prefix (``advance_prefix``) once the ready
        rule had its say."""
        if self._checking:
            if slot < self.exec_slot:
                raise violated(_OWNER, f"slot {slot} accepted after it executed")
            if self.ballot.get(slot) == ballot and self.value[slot] != owner:
                raise violated(_OWNER, f"slot {slot} given a second owner in view {ballot}")
        self.value[slot] = owner
        self.ballot[slot] = ballot
        if ballot > self.accepted_view:  # (only after its NewView: this bound is a safe one)
            self.accepted_view, self.accepted_from = ballot, slot
        if slot >= self.high:
            self.high = slot + 1

    def advance_prefix(self, view: int) -> None:
        """The gap-free prefix of O-instances we accepted (N=5's ready rule): executed slots,
        then those accepted in ``view`` (the current one). An entry from an older view may be
        stale, so it stops the prefix until it executes."""
        if self.prefix < self.exec_slot:
            self.prefix = self.exec_slot
            self.prefix_mine = self.exec_count[self._me]
        ballot, value, me = self.ballot, self.value, self._me
        prefix = self.prefix
        while ballot.get(prefix, NO_BALLOT) == view:
            if value[prefix] == me:
                self.prefix_mine += 1
            prefix += 1
        self.prefix = prefix

    def add_ack(self, slot: int, acceptor: int) -> None:
        """``acceptor`` accepted ``slot`` (unexecuted, not known chosen)."""
        self.acks.setdefault(slot, set()).add(acceptor)

    def commit(self, slot: int) -> bool:
        """``slot`` is chosen (we learned it): False if it was known already, or executed
        (executed slots leave ``committed``: never count one again)."""
        if slot in self.committed or slot < self.exec_slot:
            return False
        self.committed.add(slot)
        self.acks.pop(slot, None)
        if self.value[slot] == self._me:
            self.committed_mine += 1
        return True

    def learn_commit(self, slot: int, owner: int, view: int) -> None:
        """A commit says ``slot`` placed ``owner``: learned, not accepted (usable to execute,
        never reported in a vote). A value we accepted in an older view that a later view
        replaced yields to it; one accepted in ``view`` (the current one) cannot conflict
        (one proposer per view: that would be a bug) and stays."""
        if slot < self.exec_slot or slot in self.committed:
            return
        known = self.value.get(slot)
        if known is None:
            self.value[slot] = owner
            if slot >= self.high:
                self.high = slot + 1
        elif known != owner:
            if self.ballot.get(slot, NO_BALLOT) >= view:
                return
            self.value[slot] = owner
            self.ballot.pop(slot, None)
        self.committed.add(slot)
        if owner == self._me:
            self.committed_mine += 1

    # ------------------------------------------------------------------ views
    def install_new_view(self, view: int, start: int, owners: Sequence[int],
                         current_view: int) -> None:
        """A NewView of ``view`` (accepted now, or replayed at a restart in ``current_view``)
        replaces every unexecuted O-instance from ``start`` — a stale commit from an older
        view included: that is how a replica gives up a slot it committed alone."""
        end = start + len(owners)
        value, ballot, committed = self.value, self.ballot, self.committed
        for slot in range(max(start, self.exec_slot), end):
            value[slot] = owners[slot - start]
            ballot[slot] = view
            committed.discard(slot)
        for slot in range(max(end, self.exec_slot), self.high):
            if ballot.get(slot, NO_BALLOT) < view:
                value.pop(slot, None)
                ballot.pop(slot, None)
                committed.discard(slot)
        if view > self.accepted_view:
            self.accepted_view, self.accepted_from = view, start
        elif view == self.accepted_view:
            self.accepted_from = max(self.accepted_from, start)  # a replay: never lower it
        self.recount(current_view)

    def commit_new_view(self, start: int, end: int, view: int) -> None:
        """A majority accepted our NewView of ``view`` for ``[start, end)``: its slots are
        chosen."""
        for slot in range(max(start, self.exec_slot), end):
            self.committed.add(slot)
        self.recount(view)

    def forget_view(self) -> None:
        """A higher view began. A commit learned in an older view may be one the new view
        replaces (with N=5 a command leader commits on the sequencer's OAccept alone): forget
        them all; in the new view they come back from its NewView or, as executed facts, from
        Catchup. Likewise the N=5 prefix counts only acceptances in the current view: ours
        from an older view (a deposed sequencer's own proposals, say) prove nothing."""
        own = self.exec_count[self._me]
        self.committed.clear()
        self.acks.clear()
        self.committed_mine = own
        self.prefix = self.exec_slot
        self.prefix_mine = own
        self.check_all()

    def recount(self, view: int) -> None:
        """Recompute what derives from the O-instances known (after a log was replaced)."""
        own = self.exec_count[self._me]
        self.acks.clear()
        self.high = max(self.value, default=NO_SLOT) + 1
        self.prefix = self.exec_slot
        self.prefix_mine = own
        self.advance_prefix(view)
        exec_slot, value, me = self.exec_slot, self.value, self._me
        self.committed_mine = own + sum(
            1 for s in self.committed if s >= exec_slot and value.get(s) == me
        )
        self.check_all(view)

    # ------------------------------------------------------------------ executing
    def execute(self, slot: int, owner: int, index: int, view: int) -> None:
        """Slot ``slot`` (the next one) ran, placing ``C[owner][index]`` (``NO_INDEX`` for
        ``NO_CL`` and ``SEAL``, which place nothing; a SEAL ends the log)."""
        if self._checking and slot != self.exec_slot:
            raise violated(_OWNER, f"slot {slot} executed at frontier {self.exec_slot}")
        if owner not in PLACES_NOTHING:
            self.exec_count[owner] = index + 1
        self.executed[slot] = (owner, index)
        # the slot is done: forget what only the unexecuted part of the log needs
        self.committed.discard(slot)
        self.acks.pop(slot, None)
        self.exec_slot = slot + 1
        if self.prefix < self.exec_slot:
            self.advance_prefix(view)
        if owner == SEAL:
            self.sealed_at = slot

    def end_at(self, slot: int) -> None:
        """The log ends at ``slot`` although no SEAL executed there: the membership layer's
        broken variant ``epoch_at_change`` (a teeth test), nothing else."""
        self.sealed_at = slot

    # ------------------------------------------------------------------ restart, snapshots
    def restore_accepted(self, record: OAcceptedRecord) -> None:
        """A restart replays O-instances accepted at ``record.view`` (the highest view wins;
        ``recount`` follows)."""
        value, ballot, view = self.value, self.ballot, record.view
        for entry in record.entries:
            if entry.slot < self.exec_slot:
                continue
            if ballot.get(entry.slot, NO_BALLOT) <= view:
                value[entry.slot] = entry.owner
                ballot[entry.slot] = view
        self.accepted_view = max(self.accepted_view, view)

    def install_base(self, meta: SnapshotMeta) -> None:
        """A snapshot at ``meta`` was applied: the frontier is at least there."""
        self.exec_slot = max(self.exec_slot, meta.slot)
        counts = self.exec_count
        for rid in counts:
            counts[rid] = max(counts[rid], meta.exec_counts[rid])
        self.prefix = max(self.prefix, meta.slot)
        self.high = max(self.high, meta.slot)

    def compact(self, meta: SnapshotMeta) -> dict[int, tuple[int, int]]:
        """Forget every slot below ``meta.slot`` (a durable snapshot holds it). Returns the
        executed slots dropped (slot -> (owner, index))."""
        executed = self.executed
        dropped = {s: executed.pop(s) for s in [s for s in executed if s < meta.slot]}
        for table in (self.value, self.ballot, self.acks):
            for slot in [s for s in table if s < meta.slot]:
                del table[slot]
        self.committed = {s for s in self.committed if s >= meta.slot}
        self.compacted = max(self.compacted, meta.slot)
        self.base_counts = dict(enumerate(meta.exec_counts))
        return dropped

    # ------------------------------------------------------------------ checks
    def check_all(self, view: int | None = None) -> None:
        """With checks on, verify every invariant (``view``: the current view, for the
        prefix's; after a bulk change: O(log in memory))."""
        if not self._checking:
            return
        exec_slot, executed = self.exec_slot, self.executed
        if len(executed) != exec_slot - self.compacted or (executed and (
            self.compacted not in executed or exec_slot - 1 not in executed
        )):
            raise violated(_OWNER, f"executed slots are not [{self.compacted}, {exec_slot})")
        value = self.value
        for slot in self.committed:
            if slot < exec_slot or slot not in value:
                raise violated(_OWNER, f"committed slot {slot} executed or without a value")
        if any(slot >= self.high for slot in value):
            raise violated(_OWNER, f"a value at or past high ({self.high})")
        if any(slot not in value for slot in self.ballot):
            raise violated(_OWNER, "an accepted ballot without a value")
        if self.prefix < exec_slot:
            raise violated(_OWNER, f"prefix {self.prefix} below the frontier {exec_slot}")
        me = self._me
        mine = self.exec_count[me]
        if view is not None:
            for slot in range(exec_slot, self.prefix):
                if self.ballot.get(slot) != view:
                    raise violated(_OWNER, f"slot {slot} in the prefix not accepted in {view}")
                mine += value[slot] == me
            if mine != self.prefix_mine:
                raise violated(_OWNER, f"prefix_mine {self.prefix_mine}, counted {mine}")
        committed_mine = self.exec_count[me] + sum(1 for s in self.committed if value[s] == me)
        if committed_mine != self.committed_mine:
            raise violated(_OWNER, f"committed_mine {self.committed_mine}, counted "
                                   f"{committed_mine}")

