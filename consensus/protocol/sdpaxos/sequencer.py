"""TODO sequencer"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from consensus.messages import (
    MAX_ENTRIES,
    CRequest,
    OAccept,
    OAcceptedRecord,
    OEntry,
)
from consensus.protocol.sdpaxos.catchup import CATCHUP_BATCH
from consensus.protocol.sdpaxos.instances import Batch, OwnerSlots, keys_of, pages
from consensus.protocol.types import Role

if TYPE_CHECKING:
    from consensus.protocol.sdpaxos.replica import SDPaxosReplica



class Sequencer:
    """TODO"""

    def __init__(self, r: SDPaxosReplica) -> None:
        self.r = r
        self.deferred_orders: list[tuple[int, int, tuple[str, ...]]] = []
        # sequencer state (meaningful while r.role is SEQUENCER)
        self.seq_next_slot = 0
        self.seq_slots: dict[int, OwnerSlots] = {rid: OwnerSlots() for rid in range(r.n)}
        self.seq_acked: dict[int, set[int]] = {rid: set() for rid in range(r.n)}
        self.seq_acked_prefix: dict[int, int] = dict.fromkeys(range(r.n), 0)
        self.seq_own_chosen = 0  # N=5: how many of our own O-instances are chosen
        self.history: dict[str, int] = {}  # key -> last slot assigned to an update of it
        self.history_floor = -1
        self.unknown_keys: dict[tuple[int, int], int] = {}  # ordered before its keys known
        # N=3/N>=7 sequencer: when its own O-instances were last checked for re-sending
        self._own_checked_at = 0
        self._oaccept_out: list[OEntry] = []

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
        if r.role is not Role.SEQUENCER or not already:
            return
        # Re-send everything from the requester's gap-free prefix through its instance's slot.
        self._resend_oaccepts(msg.src, msg.o_prefix, slots[msg.index] + 1)

    def order(self, owner: int, index: int, keys: tuple[str, ...] | None = None) -> None:
        """Propose ``owner`` in new O-instances until it owns ``index + 1`` of them. ``keys``:
        what a ``CRequest`` names for ``C[owner][index]``; None when we hold its value (the
        history table then takes the keys from the batch itself)."""
        r = self.r
        if r.role is not Role.SEQUENCER:
            if r.is_sequencer:
                if keys is None:
                    inst = r.c.get((owner, index))
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
            inst = r.c.get((owner, k))
            if inst is not None and inst.batch is not None:
                self._note_update(slot, inst.batch)
            elif k == index and keys:
                for key in keys:
                    self.history[key] = slot
            else:
                self.unknown_keys[(owner, k)] = slot  # ordered before we saw it

    def _note_update(self, slot: int, batch: Batch) -> None:
        """History table: ``slot`` updates the keys of ``batch`` (a command naming no keys
        counts as updating every key). On the sequencer's path for every command: it walks the
        batch once, where building ``keys_of`` (a sorted union) twice per CAccept took a fifth
        of a loaded sequencer's CPU."""
        history = self.history
        for command in batch:
            if not command.keys:
                self.history_floor = max(self.history_floor, slot)
                return  # the keys noted so far were right too, and the floor covers the rest
            for key in command.keys:
                if history.get(key, -1) < slot:
                    history[key] = slot

    def learn_keys(self, owner: int, index: int, batch: Batch) -> None:
        slot = self.unknown_keys.pop((owner, index), None)
        if slot is not None:
            self._note_update(slot, batch)

    def _resend_oaccepts(self, to: int, start: int, stop: int) -> None:
        r = self.r
        stop = min(stop, self.seq_next_slot, start + CATCHUP_BATCH)
        entries = tuple(
            OEntry(slot=s, owner=r.o_value[s]) for s in range(start, stop) if s in r.o_value
        )
        if entries:
            r.send(to, OAccept(src=r.me, view=r.view, entries=entries))

    def flush_oaccepts(self) -> None:
        r = self.r
        if self._oaccept_out:
            for entries in pages(self._oaccept_out, MAX_ENTRIES):
                r.out.persist.append(OAcceptedRecord(view=r.view, entries=entries))
                r.broadcast(OAccept(src=r.me, view=r.view, entries=entries))
            self._oaccept_out.clear()
            self.after_seq_acks()

    def seq_record_ack(self, src: int, slot: int) -> None:
        prefix = self.seq_acked_prefix[src]
        if slot < prefix:
            return
        acked = self.seq_acked[src]
        acked.add(slot)
        while prefix in acked:
            acked.discard(prefix)
            prefix += 1
        self.seq_acked_prefix[src] = prefix

    def majority_prefix(self) -> int:
        r = self.r
        prefixes = sorted(
            (self.seq_next_slot if rid == r.me else self.seq_acked_prefix[rid])
            for rid in range(r.n)
        )
        return prefixes[r.n - r.q]

    def after_seq_acks(self) -> None:
        """N=5 sequencer: its own O-instances inside the majority-accepted prefix are chosen."""
        r = self.r
        if not (r.five and r.role is Role.SEQUENCER):
            return
        mine = self.seq_slots[r.me]
        chosen = mine.count_below(self.majority_prefix())
        for i in range(max(self.seq_own_chosen, mine.base), chosen):
            r.o_acceptor.commit_o(mine[i])
        self.seq_own_chosen = max(self.seq_own_chosen, chosen)
        r.readiness.check_ready()

    def retransmit_own_slots(self, late: list[int], deadline: int) -> None:
        """Serving: our own O-instances lack acknowledgements: re-send them to whoever has not
        acked."""
        r = self.r
        mine = self.seq_slots[r.me]
        for peer in r.peers:
            for index in late:
                if not mine.base <= index < len(mine):
                    continue
                slot = mine[index]
                if r.five:
                    if self.seq_acked_prefix[peer] <= slot:
                        self._resend_oaccepts(peer, self.seq_acked_prefix[peer], slot + 1)
                elif slot not in r.o_committed and peer not in r.o_acks.get(slot, ()):
                    self._resend_oaccepts(peer, slot, slot + 1)
        if not r.five and self._own_checked_at <= deadline:
            # With N=3 or N>=7 an own C-instance can be ready (by the count rule) while its own
            # O-instance is not chosen, so it is not late: re-send every own unchosen,
            # unexecuted slot at least one retransmission period old, each to the peers that
            # did not acknowledge it (checked once per period).
            self._own_checked_at = r.now
            for index in range(max(mine.base, r.exec_count[r.me]), len(mine)):
                slot = mine[index]
                if index in r.unready or slot < r.exec_slot or slot in r.o_committed:
                    continue  # late ones were handled above
                own = r.c.get((r.me, index))
                if own is None or own.sent_at > deadline:
                    continue
                for peer in r.peers:
                    if peer not in r.o_acks.get(slot, ()):
                        self._resend_oaccepts(peer, slot, slot + 1)
        named = r.c_phase.last_named_index()
        if len(mine) <= named:
            self.order(r.me, named, ())

    def read_slot(self, keys: Iterable[str]) -> int:
        keys = tuple(keys)
        if not keys:
            return self.seq_next_slot - 1
        slot = max((self.history.get(key, -1) for key in keys), default=-1)
        if self.unknown_keys:
            slot = max(slot, max(self.unknown_keys.values()))
        return max(slot, self.history_floor)
