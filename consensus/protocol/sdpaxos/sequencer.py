"""Ordering, the sequencer's side (§3.1-3.2, Figure 5): assign global slots to C-instances.

The sequencer of view ``v`` is replica ``v % N``; it serves once a majority accepted its
NewView (``Role.SEQUENCER``, see view_change.py). On seeing ``CAccept(n, i)`` or
``CRequest(n, i)`` it proposes ``n`` in the next O-instances until ``n`` owns ``i + 1`` of
them (``order``): the ``k``-th O-instance naming ``n`` places ``C[n][k]``, so a duplicated or
reordered request never places anything twice. It accepts its own proposals at once (with the
view as ballot) and broadcasts them, one ``OAccept`` per turn (``flush_oaccepts``): in
parallel with its own fsync where the readiness rule allows it, its own ``OAck`` after it.

Rules:

* Only a serving sequencer assigns slots. Elected but not yet serving, it defers what it is
  asked to order (``deferred_orders``) and orders it once serving (``start_serving``): its
  NewView decides the slots before them.
* A new view's sequencer rebuilds its assignment log from its executed slots and the NewView
  (``start_serving``) and knows no history: every earlier slot counts as a write to every key.
* A ``CRequest`` for an instance already ordered is a retransmission: the requester lost
  OAccepts, so they are re-sent from its gap-free prefix (``on_crequest``), at most a catch-up
  batch at a time. So is one a sealed sequencer can no longer order (the next epoch orders
  it): it names the requester's latest late instance only, and a lower one ordered here may
  be what it lost, so the OAccepts go again from its prefix through the SEAL.
* A serving sequencer that installs a snapshot past the slots it assigned (a peer's, taken
  while it was cut off) was succeeded: a later view's sequencer chose those slots. It stops
  serving (``on_compacted``: a follower of its view until it hears of the later one), since
  its next assignment would name a slot the log already executed.
* Reads: ``read_slot`` answers with the last slot assigned to an update of the keys
  (``HistoryTable``); reads.py checks the lease first.
* Closing the epoch (membership, ``consensus.protocol.membership``): once the replica executed
  a membership change (``SDPaxosReplica.close_epoch``), a serving sequencer proposes ``SEAL``
  in its next slot and assigns nothing after it (``seal``); so does every later sequencer
  whose rebuilt log holds a SEAL (``start_serving``), and one elected after the change
  executed seals as it starts serving. The SEAL is an O-instance like any other (accepted,
  acknowledged to the sequencer, chosen by a majority, committed by the sequencer's OCommit,
  rebuilt by view changes), so the epoch ends at one slot on every replica.

Entry points: ``on_crequest``, ``order``, ``learn_keys``, ``flush_oaccepts``,
``retransmit_own_slots``, ``start_serving``, ``seal``, ``read_slot``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from consensus.messages import (
    MAX_ENTRIES,
    NO_CL,
    SEAL,
    CRequest,
    OAccept,
    OAcceptedRecord,
    OAck,
    OEntry,
)
from consensus.protocol.sdpaxos.catchup import CATCHUP_BATCH
from consensus.protocol.sdpaxos.history import HistoryTable
from consensus.protocol.sdpaxos.instances import (
    NO_SLOT,
    PLACES_NOTHING,
    Batch,
    OwnerSlots,
    keys_of,
    pages,
)
from consensus.protocol.sdpaxos.tracker import AckPrefixes
from consensus.protocol.types import Role, SnapshotMeta

if TYPE_CHECKING:
    from consensus.protocol.sdpaxos.replica import SDPaxosReplica

__all__ = ["Sequencer"]


class Sequencer:
    """The assignment log of the view we serve (meaningful while ``r.role`` is SEQUENCER)."""

    def __init__(self, r: SDPaxosReplica) -> None:
        self.r = r
        #: asked to order while elected but not serving yet: (owner, index, keys)
        self.deferred_orders: list[tuple[int, int, tuple[str, ...]]] = []
        self.seq_next_slot = 0
        #: per owner, the slots of its O-instances
        self.seq_slots: dict[int, OwnerSlots] = {rid: OwnerSlots() for rid in range(r.n)}
        #: N=5: how far each replica acknowledged our OAccepts
        self.acks = AckPrefixes(dict.fromkeys(range(r.n), 0))
        self.seq_own_chosen = 0  # N=5: how many of our own O-instances are chosen
        self.history = HistoryTable()
        self._oaccept_out: list[OEntry] = []
        #: the slot of the SEAL in the log we serve (nothing is assigned after it)
        self.sealed_at = NO_SLOT
        # A core restarted from records starts as a follower and serves no view it served
        # before; one started from nothing starts as the sequencer of its start view. Until
        # a record of ours is durable a crash is such a start: our OAccepts wait for the fsync.
        self._restarts_as_follower = False

    def records_durable(self) -> None:
        """A record of ours is durable (or we restarted from records): a crash now restarts
        us as a follower (see ``flush_oaccepts``)."""
        self._restarts_as_follower = True

    def on_view_joined(self) -> None:
        """We joined a higher view: what we deferred as an elected sequencer of an older one
        is not ours to order (its owners ask the new sequencer again)."""
        self.deferred_orders.clear()

    def on_compacted(self, meta: SnapshotMeta) -> None:
        """A snapshot holds every slot below ``meta``: keep only counts below it. A snapshot
        past the slots we assigned stops us serving (see the rules above)."""
        r = self.r
        if (r.role is Role.SEQUENCER and meta.slot > self.seq_next_slot
                and "stale_sequencer_orders" not in r.unsafe):
            r.become(Role.FOLLOWER)
        for rid, slots in self.seq_slots.items():
            slots.trim_below(meta.slot)
            slots.base = max(slots.base, meta.exec_counts[rid])

    def on_crequest(self, msg: CRequest) -> None:
        r = self.r
        if not r.is_sequencer:
            return
        slots = self.seq_slots[msg.owner]
        # Checked before ordering: a CRequest for an instance already ordered is a
        # retransmission (the requester lost OAccepts); a fresh one is answered by the
        # OAccept broadcast that ordering it produces.
        already = slots.base <= msg.index < len(slots)
        self.order(msg.owner, msg.index, msg.keys)
        if r.role is not Role.SEQUENCER:
            return
        if already:
            # Re-send everything from the requester's gap-free prefix through its instance's
            # slot.
            self.resend_oaccepts(msg.src, msg.o_prefix, slots[msg.index] + 1)
        elif self.sealed_at != NO_SLOT and "sealed_ignores_crequest" not in r.unsafe:
            # Sealed (see the rules above): only we re-send an owner its O-instances, so an
            # OAccept it lost, with it the only other live voter, left its slot unchosen for
            # good, and the SEAL after it never executed (the epoch never ended).
            self.resend_oaccepts(msg.src, msg.o_prefix, self.sealed_at + 1)

    def order(self, owner: int, index: int, keys: tuple[str, ...] | None = None) -> None:
        """Propose ``owner`` in new O-instances until it owns ``index + 1`` of them. ``keys``:
        what a ``CRequest`` names for ``C[owner][index]``; None when we hold its value (the
        history table then takes the keys from the batch itself)."""
        r = self.r
        if self.sealed_at != NO_SLOT:
            return  # the epoch is closed: the next one orders what is left
        if r.role is not Role.SEQUENCER:
            if r.is_sequencer:
                if keys is None:
                    inst = r.c_store.instances.get((owner, index))
                    keys = keys_of(inst.batch if inst is not None else None)
                self.deferred_orders.append((owner, index, keys))
            return
        slots = self.seq_slots[owner]
        while len(slots) <= index:
            slot = self.seq_next_slot
            self.seq_next_slot += 1
            k = len(slots)
            slots.append(slot)
            entry = OEntry(slot=slot, owner=owner)
            self._oaccept_out.append(entry)
            r.o_acceptor.accept_o(entry, r.view)
            inst = r.c_store.instances.get((owner, k))
            if inst is not None and inst.batch is not None:
                self.history.note_update(slot, inst.batch)
            elif k == index and keys:
                self.history.note_keys(slot, keys)
            else:
                self.history.note_unknown((owner, k), slot)  # ordered before we saw it

    def seal(self) -> None:
        """Serving: propose SEAL in the next slot; nothing is assigned after it."""
        r = self.r
        if r.role is not Role.SEQUENCER or self.sealed_at != NO_SLOT:
            return
        slot = self.sealed_at = self.seq_next_slot
        self.seq_next_slot += 1
        entry = OEntry(slot=slot, owner=SEAL)
        self._oaccept_out.append(entry)
        r.o_acceptor.accept_o(entry, r.view)

    def learn_keys(self, owner: int, index: int, batch: Batch) -> None:
        """``C[owner][index]``'s value is known: if it was ordered before, note its keys."""
        self.history.learn_keys((owner, index), batch)

    def resend_oaccepts(self, to: int, start: int, stop: int) -> None:
        r = self.r
        stop = min(stop, self.seq_next_slot, start + CATCHUP_BATCH)
        entries = tuple(
            OEntry(slot=s, owner=r.o_log.value[s]) for s in range(start, stop) if s in r.o_log.value
        )
        if entries:
            r.send(to, OAccept(src=r.me, view=r.view, entries=entries))
            if r.readiness.oaccepts_early:
                # our acceptance, which the OAccept does not carry (see flush_oaccepts)
                r.send(to, OAck(src=r.me, view=r.view, slots=tuple(e.slot for e in entries)))

    def flush_oaccepts(self) -> None:
        """Persist and broadcast this turn's O-instances (one OAccept per page).

        Where the readiness rule allows it (``oaccepts_early``: no replica commits an
        O-instance on the OAccept alone), the OAccept leaves in parallel with our fsync, and
        our own ``OAck`` after it: nobody counts our acceptance before it is durable (a
        sequencer that crashes before then forgets it, and a view change without it may
        give the slot to another). Otherwise the OAccept waits for our fsync, and says we
        accepted. Nor does it leave early before a record of ours is durable
        (``records_durable``): restarted from nothing, we would serve the same view again
        and could propose another owner at the same slot and ballot (our own OAck goes
        anyway: the acceptors count us from nothing else)."""
        r = self.r
        if self._oaccept_out:
            own_acks = r.readiness.oaccepts_early
            early = own_acks and self._restarts_as_follower
            for entries in pages(self._oaccept_out, MAX_ENTRIES):
                r.out.persist.append(OAcceptedRecord(view=r.view, entries=entries))
                accept = OAccept(src=r.me, view=r.view, entries=entries)
                if not own_acks:
                    r.broadcast(accept)
                    continue
                own_ack = OAck(src=r.me, view=r.view, slots=tuple(e.slot for e in entries))
                for peer in r.peers:
                    if early:
                        r.request(peer, accept)
                    else:
                        r.send(peer, accept)
                    r.send(peer, own_ack)
            self._oaccept_out.clear()
            r.readiness.after_oaccepts()

    def record_acks(self, src: int, slots: tuple[int, ...]) -> None:
        """N=5, serving: ``src`` acknowledged our OAccepts of ``slots``."""
        for slot in slots:
            self.acks.record(src, slot)

    def majority_prefix(self) -> int:
        """The slots a majority accepted without a gap (we accepted all we proposed)."""
        r = self.r
        return self.acks.majority_prefix(r.me, self.seq_next_slot, r.q)

    def commit_own_in_majority_prefix(self) -> None:
        """N=5: our own O-instances inside the majority-accepted prefix are chosen."""
        mine = self.seq_slots[self.r.me]
        chosen = mine.count_below(self.majority_prefix())
        for i in range(max(self.seq_own_chosen, mine.base), chosen):
            self.r.o_acceptor.commit_o(mine[i])
        self.seq_own_chosen = max(self.seq_own_chosen, chosen)

    def retransmit_own_slots(self, late: list[int], deadline: int) -> None:
        """Serving: our own late O-instances lack acknowledgements: re-send them to whoever
        has not acked; then whatever else the readiness rule re-sends."""
        r = self.r
        mine = self.seq_slots[r.me]
        for peer in r.peers:
            for index in late:
                if mine.base <= index < len(mine):
                    r.readiness.resend_late_slot(peer, mine[index])
        r.readiness.resend_unchosen(deadline)
        seal = self.sealed_at
        if seal != NO_SLOT and seal >= r.o_log.exec_slot and seal not in r.o_log.committed:
            # nobody else re-sends a SEAL (it has no owner to ask for it again)
            for peer in r.peers:
                if peer not in r.o_log.acks.get(seal, ()):
                    self.resend_oaccepts(peer, seal, seal + 1)
        named = r.c_phase.last_named_index()
        if len(mine) <= named:
            self.order(r.me, named, ())

    def start_serving(self, start: int, end: int, acked: set[int]) -> None:
        """A majority (``acked``) accepted our NewView for slots ``[start, end)``: rebuild the
        assignment log — the compacted prefix (counts only), the executed slots we still
        hold, then the new view's range — and serve."""
        r = self.r
        self.seq_slots = {rid: OwnerSlots(r.o_log.base_counts[rid]) for rid in range(r.n)}
        self.sealed_at = NO_SLOT
        for slot in sorted(r.o_log.executed):
            owner = r.o_log.executed[slot][0]
            if owner not in PLACES_NOTHING:
                self.seq_slots[owner].append(slot)
            elif owner == SEAL:
                self.sealed_at = slot
        for slot in range(r.o_log.exec_slot, end):
            owner = r.o_log.value.get(slot, NO_CL)
            if owner not in PLACES_NOTHING:
                self.seq_slots[owner].append(slot)
            elif owner == SEAL:
                self.sealed_at = slot
        self.seq_next_slot = max(end, r.o_log.exec_slot)
        self.acks = AckPrefixes({rid: (end if rid in acked else start) for rid in range(r.n)})
        self.seq_own_chosen = self.seq_slots[r.me].count_below(end)
        self.history.reset(floor=self.seq_next_slot - 1)

    def order_deferred(self) -> None:
        """Order what we were asked to while elected but not serving."""
        deferred, self.deferred_orders = self.deferred_orders, []
        for owner, index, keys in deferred:
            self.order(owner, index, keys)

    def read_slot(self, keys: Iterable[str]) -> int:
        """The slot a read of ``keys`` must wait for (see ``HistoryTable.read_slot``)."""
        return self.history.read_slot(keys, self.seq_next_slot - 1)
