"""SDPaxos replica core (SoCC'18, §3.1-3.2, Figure 5): the failure-free protocol, sans-I/O.

Theory of operation
-------------------
Every replica ``n`` replicates its own commands in *C-instances* ``C[n][0], C[n][1], ...``: it
is pre-prepared at ballot ``(0, n)`` and goes straight to the Accept phase (``CAccept``); an
instance is chosen when a majority (``n`` included) accepted it, and ``n`` broadcasts
``CCommit``. One replica, the *sequencer* (replica ``view % N``), orders them: on seeing
``CAccept(n, i)`` or ``CRequest(n, i)`` it proposes ``n`` in the next *O-instances* (global
slots) until ``n`` owns ``i + 1`` of them. The ``k``-th O-instance naming ``n`` places
``C[n][k]`` in that slot; so duplicated and reordered requests cannot place anything twice.
``OAccept`` goes to every replica (the command leader ``n`` included); acceptors answer the
*learner* ``n`` with ``OAck`` — and, with five replicas, the sequencer too.

When is a command *ready* (may the leader acknowledge a blind write)? ``C[n][i]`` chosen, and:

* N = 3 or N >= 7 — at least ``i + 1`` O-instances for ``n`` are chosen (accepted by a
  majority). With three replicas the sequencer's OAccept plus ``n``'s own acceptance already
  form that majority, so the order costs half a round trip: one round trip in all.
* N = 5 — a non-sequencer ``n`` treats its O-instance as chosen as soon as it accepts the
  sequencer's OAccept, and is ready once it accepted *every* O-instance up to the one placing
  ``C[n][i]`` (no gap: the view change's hole-filling rule relies on it); the sequencer's own
  commands need every O-instance up to theirs accepted by a majority.

Slot ``j`` executes when ``O[j]`` and the C-instance it places are chosen and every slot
before ``j`` has executed. Execution is what every replica does; readiness is only the
leader's early answer to blind writes.

Rules that keep it safe
-----------------------
* Anything that reports an acceptance (``CAck``, ``OAck``, a ``CAccept``/``OAccept`` that
  counts the sender as an acceptor, commits derived from them) leaves through
  ``send_after_persist``: the driver makes the batch's records durable first.
* A replica never reuses a C-instance index: its counter is rebuilt from its durable records.
* Every map this core iterates to produce output is ordered (ints or sorted), so a seeded
  simulation replays exactly.

Messages may be lost, duplicated and reordered: unacknowledged CAccepts are resent after
``retransmit_us``; a leader whose committed instance still lacks its O-instance re-sends a
``CRequest`` (which also repairs lost OAccepts); a replica that cannot execute its next slot
for ``catchup_us`` asks a peer (``Catchup``), which answers with the commits it knows.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Mapping, Sequence

from consensus.config import ProtocolConfig
from consensus.errors import LocalProtocolError
from consensus.messages import (
    NO_CL,
    CAccept,
    CAcceptedRecord,
    CAck,
    Catchup,
    CCommit,
    Command,
    CRequest,
    OAccept,
    OAcceptedRecord,
    OAck,
    OCommit,
    OEntry,
    PeerMessage,
    Record,
)
from consensus.protocol.ready import Execution, Outgoing, Ready

__all__ = ["SDPaxosReplica"]

#: Most slots (and C-instances) one Catchup answer carries.
CATCHUP_BATCH = 256


class CInstance:
    """What one replica knows of one C-instance."""

    __slots__ = ("acks", "ballot", "batch", "committed", "ready", "sent_at")

    def __init__(self, ballot: int, batch: tuple[Command, ...] | None) -> None:
        self.ballot = ballot
        self.batch = batch
        self.committed = False
        # leader-only bookkeeping
        self.acks: set[int] = set()
        self.ready = False
        self.sent_at = 0


class SDPaxosReplica:
    """One SDPaxos replica: feed it inputs, drain ``ready()``, call ``advance``."""

    def __init__(
        self,
        config: ProtocolConfig,
        me: int,
        *,
        recovered: Sequence[Record] = (),
        rng: random.Random,
    ) -> None:
        if not 0 <= me < config.replicas:
            raise LocalProtocolError(f"replica id {me} outside 0..{config.replicas - 1}")
        self.config = config
        self.me = me
        self.n = config.replicas
        self.q = config.quorum
        self.rng = rng
        self.view = 0
        self.now = 0
        self._five = self.n == 5
        self._peers = tuple(r for r in range(self.n) if r != me)
        pref = config.peers_by_preference(me)
        self._thrifty_targets = pref[: self.q - 1] if config.thrifty else self._peers

        # C-instances, by (owner, index)
        self.c: dict[tuple[int, int], CInstance] = {}
        self.next_index = 0
        self._batch: list[Command] = []
        self._unready: dict[int, CInstance] = {}  # own instances not yet ready, by index

        # O-instances as accepted here: slot -> owner; committed slots
        self.o_value: dict[int, int] = {}
        self.o_committed: set[int] = set()
        self.o_acks: dict[int, set[int]] = {}  # learner side: slot -> acceptors
        self.o_prefix = 0  # slots [0, o_prefix) all accepted here
        self._prefix_mine = 0  # O-instances for me within that prefix
        self._my_committed_o = 0  # O-instances for me known chosen

        # sequencer state (meaningful while self.is_sequencer)
        self.seq_next_slot = 0
        self.seq_slots: dict[int, list[int]] = {r: [] for r in range(self.n)}
        self.seq_acked: dict[int, set[int]] = {r: set() for r in range(self.n)}
        self.seq_acked_prefix: dict[int, int] = dict.fromkeys(range(self.n), 0)
        self._seq_own_chosen = 0  # N=5: how many of our own O-instances are chosen

        # execution
        self.exec_slot = 0
        self._exec_count: dict[int, int] = dict.fromkeys(range(self.n), 0)
        self.log: dict[int, tuple[int, int]] = {}  # executed slot -> (owner, index)
        self._exec_progress_at = 0
        self._catchup_peer = 0
        self.o_high = 0  # one past the highest slot we know a value for

        # the turn's output
        self._out = Ready()
        self._oaccept_out: list[OEntry] = []
        self._oack_out: dict[int, list[int]] = {}
        self._ocommit_out: list[OEntry] = []
        self._handed_out: Ready | None = None

        self._recover(recovered)

    # ------------------------------------------------------------------ properties
    @property
    def sequencer(self) -> int:
        return self.view % self.n

    @property
    def is_sequencer(self) -> bool:
        return self.view % self.n == self.me

    # ------------------------------------------------------------------ inputs
    def propose(self, command: Command, now: int) -> None:
        self.now = now
        self._batch.append(command)
        if len(self._batch) >= self.config.max_batch:
            self._flush_batch()

    def step(self, message: PeerMessage, now: int) -> None:
        self.now = now
        if message.view < self.view or not 0 <= message.src < self.n:
            return
        match message:
            case CAccept():
                self._on_caccept(message)
            case CAck():
                self._on_cack(message)
            case CCommit():
                self._on_ccommit(message)
            case CRequest():
                self._on_crequest(message)
            case OAccept():
                self._on_oaccept(message)
            case OAck():
                self._on_oack(message)
            case OCommit():
                self._on_ocommit(message)
            case Catchup():
                self._on_catchup(message)

    def tick(self, now: int) -> None:
        self.now = now
        self._retransmit()
        self._maybe_catch_up()

    def ready(self) -> Ready:
        if self._handed_out is not None:
            raise LocalProtocolError("ready() called again before advance()")
        self._flush_batch()
        self._flush_order_messages()
        self._try_execute()
        out, self._out = self._out, Ready()
        self._handed_out = out
        return out

    def advance(self, ready: Ready) -> None:
        if ready is not self._handed_out:
            raise LocalProtocolError("advance() with a Ready this core did not hand out")
        self._handed_out = None

    # ------------------------------------------------------------------ checker views
    def committed_log(self) -> Mapping[int, tuple[Command, ...]]:
        result: dict[int, tuple[Command, ...]] = {}
        for slot, (owner, index) in self.log.items():
            batch = self.c[(owner, index)].batch if owner != NO_CL else ()
            result[slot] = batch or ()
        return result

    def executed_through(self) -> int:
        return self.exec_slot - 1

    def _send(self, to: int, message: PeerMessage) -> None:
        """Queue a message that may report state persisted in this batch."""
        self._out.send_after_persist.append(Outgoing(to, message))

    # ------------------------------------------------------------------ C-phase (leader)
    def _flush_batch(self) -> None:
        if not self._batch:
            return
        batch = tuple(self._batch)
        self._batch.clear()
        index = self.next_index
        self.next_index += 1
        inst = CInstance(self.me, batch)
        inst.acks.add(self.me)
        inst.sent_at = self.now
        self.c[(self.me, index)] = inst
        self._unready[index] = inst
        self._out.persist.append(
            CAcceptedRecord(owner=self.me, index=index, ballot=self.me, batch=batch)
        )
        accept = CAccept(
            src=self.me, view=self.view, owner=self.me, index=index, ballot=self.me, batch=batch
        )
        for peer in self._thrifty_targets:
            self._send(peer, accept)
        if self.is_sequencer:
            self._order(self.me, index)
        elif self.sequencer not in self._thrifty_targets:
            self._send_crequest(index)
        if self.n == 1:
            self._commit_own(index, inst)

    def _send_crequest(self, index: int) -> None:
        keys = _keys_of(self.c[(self.me, index)].batch)
        request = CRequest(
            src=self.me,
            view=self.view,
            owner=self.me,
            index=index,
            keys=keys,
            o_prefix=self.o_prefix,
        )
        self._out.send.append(Outgoing(self.sequencer, request))  # asks, promises nothing

    def _on_cack(self, msg: CAck) -> None:
        if msg.owner != self.me:
            return
        inst = self.c.get((self.me, msg.index))
        if inst is None or inst.ballot != msg.ballot or inst.committed:
            return
        inst.acks.add(msg.src)
        if len(inst.acks) >= self.q:
            self._commit_own(msg.index, inst)

    def _commit_own(self, index: int, inst: CInstance) -> None:
        inst.committed = True
        for peer in self._peers:
            batch = None if peer in inst.acks else inst.batch
            commit = CCommit(
                src=self.me,
                view=self.view,
                owner=self.me,
                index=index,
                ballot=inst.ballot,
                batch=batch,
            )
            self._send(peer, commit)
        self._check_ready()

    # ------------------------------------------------------------------ C-phase (acceptor)
    def _on_caccept(self, msg: CAccept) -> None:
        key = (msg.owner, msg.index)
        inst = self.c.get(key)
        if inst is None:
            inst = self.c[key] = CInstance(msg.ballot, msg.batch)
            self._out.persist.append(
                CAcceptedRecord(
                    owner=msg.owner, index=msg.index, ballot=msg.ballot, batch=msg.batch
                )
            )
        elif msg.ballot > inst.ballot or (msg.ballot == inst.ballot and inst.batch is None):
            if inst.committed:
                return  # a chosen value never changes; a stale leader learns it on catch-up
            inst.ballot, inst.batch = msg.ballot, msg.batch
            self._out.persist.append(
                CAcceptedRecord(
                    owner=msg.owner, index=msg.index, ballot=msg.ballot, batch=msg.batch
                )
            )
        elif msg.ballot < inst.ballot:
            return
        ack = CAck(src=self.me, view=self.view, owner=msg.owner, index=msg.index, ballot=msg.ballot)
        self._send(msg.src, ack)
        if self.is_sequencer:
            self._order(msg.owner, msg.index)

    def _on_ccommit(self, msg: CCommit) -> None:
        key = (msg.owner, msg.index)
        inst = self.c.get(key)
        if inst is not None and inst.committed:
            return
        if msg.batch is None:
            if inst is None or inst.ballot != msg.ballot or inst.batch is None:
                return  # we lack the chosen value; Catchup will bring it
        elif inst is None:
            inst = self.c[key] = CInstance(msg.ballot, msg.batch)
        else:
            inst.ballot, inst.batch = msg.ballot, msg.batch
        inst.committed = True

    # ------------------------------------------------------------------ O-phase (sequencer)
    def _on_crequest(self, msg: CRequest) -> None:
        if not self.is_sequencer:
            return
        self._order(msg.owner, msg.index)
        # A CRequest for an instance already ordered is a retransmission: the requester lost
        # OAccepts. Re-send everything from its gap-free prefix through its instance's slot.
        slots = self.seq_slots[msg.owner]
        if msg.index < len(slots):
            self._resend_oaccepts(msg.src, msg.o_prefix, slots[msg.index] + 1)

    def _order(self, owner: int, index: int) -> None:
        """Propose ``owner`` in new O-instances until it owns ``index + 1`` of them."""
        slots = self.seq_slots[owner]
        while len(slots) <= index:
            slot = self.seq_next_slot
            self.seq_next_slot += 1
            slots.append(slot)
            entry = OEntry(slot=slot, owner=owner)
            self._oaccept_out.append(entry)
            self._accept_o(entry)

    def _resend_oaccepts(self, to: int, start: int, stop: int) -> None:
        stop = min(stop, self.seq_next_slot, start + CATCHUP_BATCH)
        entries = tuple(
            OEntry(slot=s, owner=self.o_value[s]) for s in range(start, stop) if s in self.o_value
        )
        if entries:
            self._send(to, OAccept(src=self.me, view=self.view, entries=entries))

    def _flush_order_messages(self) -> None:
        """Send this turn's OAccepts, OAcks and OCommits: one message of each per peer."""
        if self._oaccept_out:
            entries = tuple(self._oaccept_out)
            self._oaccept_out.clear()
            self._out.persist.append(OAcceptedRecord(view=self.view, entries=entries))
            accept = OAccept(src=self.me, view=self.view, entries=entries)
            for peer in self._peers:
                self._send(peer, accept)
            self._after_seq_acks()
        for dest in sorted(self._oack_out):
            self._send(dest, OAck(src=self.me, view=self.view, slots=tuple(self._oack_out[dest])))
        self._oack_out.clear()
        if self._ocommit_out:
            commit = OCommit(src=self.me, view=self.view, entries=tuple(self._ocommit_out))
            self._ocommit_out.clear()
            for peer in self._peers:
                self._send(peer, commit)

    # ------------------------------------------------------------------ O-phase (acceptor)
    def _on_oaccept(self, msg: OAccept) -> None:
        if msg.src != self.sequencer:
            return
        fresh: list[OEntry] = []
        for entry in msg.entries:
            known = self.o_value.get(entry.slot)
            if known is None:
                fresh.append(entry)
                self._accept_o(entry)
            elif known != entry.owner:
                continue  # two values for one slot in one view: impossible without a bug
            # a duplicate is acknowledged again below: its first OAck may have been lost
            self._queue_oack(entry)
        if fresh:
            self._out.persist.append(OAcceptedRecord(view=msg.view, entries=tuple(fresh)))

    def _accept_o(self, entry: OEntry) -> None:
        """Record an O-instance accepted here (by the sequencer itself, or from an OAccept)."""
        slot, owner = entry.slot, entry.owner
        self.o_value[slot] = owner
        if owner == self.me:
            acks = self.o_acks.setdefault(slot, set())
            acks.add(self.me)
            acks.add(self.sequencer)
            if self._five and not self.is_sequencer:
                self._commit_o(slot)  # Figure 5, line 29
            elif not self._five and len(acks) >= self.q:
                self._commit_o(slot)
        if slot >= self.o_high:
            self.o_high = slot + 1
        while self.o_prefix in self.o_value:
            if self.o_value[self.o_prefix] == self.me:
                self._prefix_mine += 1
            self.o_prefix += 1
        if self._five and not self.is_sequencer:
            self._check_ready()

    def _queue_oack(self, entry: OEntry) -> None:
        # N=5: the learner commits on the sequencer's OAccept alone, and the sequencer needs
        # every acknowledgement (its ready rule looks at the majority-accepted prefix).
        # Otherwise the learner (the command leader) counts acknowledgements itself.
        dest = self.sequencer if self._five else entry.owner
        if entry.owner != NO_CL and dest != self.me:
            self._oack_out.setdefault(dest, []).append(entry.slot)

    def _on_oack(self, msg: OAck) -> None:
        if self._five:
            if self.is_sequencer:
                for slot in msg.slots:
                    self._seq_record_ack(msg.src, slot)
                self._after_seq_acks()
            return
        for slot in msg.slots:
            if slot in self.o_committed:
                continue
            acks = self.o_acks.setdefault(slot, set())  # may precede our own OAccept
            acks.add(msg.src)
            if self.o_value.get(slot) == self.me and len(acks) >= self.q:
                self._commit_o(slot)

    def _seq_record_ack(self, src: int, slot: int) -> None:
        prefix = self.seq_acked_prefix[src]
        if slot < prefix:
            return
        acked = self.seq_acked[src]
        acked.add(slot)
        while prefix in acked:
            acked.discard(prefix)
            prefix += 1
        self.seq_acked_prefix[src] = prefix

    def _after_seq_acks(self) -> None:
        """N=5 sequencer: its own O-instances inside the majority-accepted prefix are chosen."""
        if not (self._five and self.is_sequencer):
            return
        prefixes = sorted(
            (self.seq_next_slot if r == self.me else self.seq_acked_prefix[r])
            for r in range(self.n)
        )
        majority_prefix = prefixes[self.n - self.q]
        mine = self.seq_slots[self.me]
        chosen = bisect.bisect_left(mine, majority_prefix)
        for i in range(self._seq_own_chosen, chosen):
            self._commit_o(mine[i])
        self._seq_own_chosen = max(self._seq_own_chosen, chosen)
        self._check_ready()

    def _commit_o(self, slot: int) -> None:
        if slot in self.o_committed:
            return
        self.o_committed.add(slot)
        self.o_acks.pop(slot, None)
        owner = self.o_value[slot]
        if owner == self.me:
            self._my_committed_o += 1
            self._ocommit_out.append(OEntry(slot=slot, owner=owner))
            self._check_ready()

    def _on_ocommit(self, msg: OCommit) -> None:
        fresh: list[OEntry] = []
        for entry in msg.entries:
            known = self.o_value.get(entry.slot)
            if known is None:
                # The value is the sequencer's proposal for this view, relayed: accepting it
                # is what its OAccept would have made us do (and is persisted like it).
                fresh.append(entry)
                self._accept_o(entry)
            elif known != entry.owner:
                continue  # only a view change may replace a value
            self.o_committed.add(entry.slot)
        if fresh:
            self._out.persist.append(OAcceptedRecord(view=msg.view, entries=tuple(fresh)))

    # ------------------------------------------------------------------ readiness
    def _ordered_own(self) -> int:
        """How many of my C-instances the ready rule considers durably ordered."""
        if not self._five:
            return self._my_committed_o
        if self.is_sequencer:
            prefixes = sorted(
                (self.seq_next_slot if r == self.me else self.seq_acked_prefix[r])
                for r in range(self.n)
            )
            return bisect.bisect_left(self.seq_slots[self.me], prefixes[self.n - self.q])
        return self._prefix_mine

    def _check_ready(self) -> None:
        if not self._unready:
            return
        ordered = self._ordered_own()
        for index in sorted(self._unready):
            if index >= ordered:
                break
            inst = self._unready[index]
            if inst.committed:
                inst.ready = True
                del self._unready[index]
                assert inst.batch is not None
                self._out.ready.extend(inst.batch)

    # ------------------------------------------------------------------ execution
    def _try_execute(self) -> None:
        while True:
            slot = self.exec_slot
            if slot not in self.o_committed:
                return
            owner = self.o_value[slot]
            if owner == NO_CL:
                self.log[slot] = (NO_CL, -1)
            else:
                index = self._exec_count[owner]
                inst = self.c.get((owner, index))
                if inst is None or not inst.committed or inst.batch is None:
                    return
                led_here = owner == self.me
                for offset, command in enumerate(inst.batch):
                    self._out.apply.append(Execution(slot, offset, command, led_here))
                self._exec_count[owner] = index + 1
                self.log[slot] = (owner, index)
            self.exec_slot = slot + 1
            self._exec_progress_at = self.now

    # ------------------------------------------------------------------ timers
    def _retransmit(self) -> None:
        deadline = self.now - self.config.retransmit_us
        late: list[int] = []
        for index in sorted(self._unready):
            inst = self._unready[index]
            if inst.sent_at > deadline:
                continue
            inst.sent_at = self.now
            late.append(index)
            if not inst.committed:
                assert inst.batch is not None
                accept = CAccept(
                    src=self.me,
                    view=self.view,
                    owner=self.me,
                    index=index,
                    ballot=inst.ballot,
                    batch=inst.batch,
                )
                for peer in self._peers:
                    if peer not in inst.acks:
                        self._send(peer, accept)
        if not late:
            return
        if not self.is_sequencer:
            self._send_crequest(late[-1])  # one request covers every lower index
            return
        # Our own O-instances lack acknowledgements: re-send them to whoever has not acked.
        mine = self.seq_slots[self.me]
        for peer in self._peers:
            if self._five:
                stop = mine[late[-1]] + 1
                if self.seq_acked_prefix[peer] < stop:
                    self._resend_oaccepts(peer, self.seq_acked_prefix[peer], stop)
                continue
            for index in late:
                slot = mine[index]
                if slot not in self.o_committed and peer not in self.o_acks.get(slot, ()):
                    self._resend_oaccepts(peer, slot, slot + 1)

    def _maybe_catch_up(self) -> None:
        idle_for = self.now - self._exec_progress_at
        behind = bool(self._unready) or self.o_high > self.exec_slot
        # Behind: ask soon. Seemingly idle: still probe now and then, since the commits we
        # lost may be the last ones anybody sent (failure detection will carry this later).
        if idle_for < (self.config.catchup_us if behind else 4 * self.config.catchup_us):
            return
        self._exec_progress_at = self.now
        peer = self._peers[self._catchup_peer % len(self._peers)] if self._peers else self.me
        self._catchup_peer += 1
        if peer != self.me:
            self._out.send.append(
                Outgoing(peer, Catchup(src=self.me, view=self.view, slot=self.exec_slot))
            )

    def _on_catchup(self, msg: Catchup) -> None:
        """Tell a lagging peer every commit we know from ``msg.slot`` on (bounded)."""
        start = msg.slot
        stop = start + CATCHUP_BATCH
        entries = tuple(
            OEntry(slot=s, owner=self.o_value[s])
            for s in range(start, stop)
            if s in self.o_committed
        )
        if entries:
            self._send(msg.src, OCommit(src=self.me, view=self.view, entries=entries))
        # C-instances placed in slots we executed, then chosen ones we have not executed yet
        wanted: list[tuple[int, int]] = [
            self.log[s] for s in range(start, min(stop, self.exec_slot)) if s in self.log
        ]
        for owner in range(self.n):
            index = self._exec_count[owner]
            while len(wanted) < 2 * CATCHUP_BATCH:
                inst = self.c.get((owner, index))
                if inst is None or not inst.committed:
                    break
                wanted.append((owner, index))
                index += 1
        for owner, index in wanted:
            if owner == NO_CL:
                continue
            inst = self.c[(owner, index)]
            commit_c = CCommit(
                src=self.me,
                view=self.view,
                owner=owner,
                index=index,
                ballot=inst.ballot,
                batch=inst.batch,
            )
            self._send(msg.src, commit_c)

    # ------------------------------------------------------------------ recovery
    def _recover(self, records: Sequence[Record]) -> None:
        """Rebuild what this replica accepted from its durable records."""
        for record in records:
            match record:
                case CAcceptedRecord():
                    key = (record.owner, record.index)
                    inst = self.c.get(key)
                    if inst is None or record.ballot >= inst.ballot:
                        self.c[key] = CInstance(record.ballot, record.batch)
                    if record.owner == self.me:
                        self.next_index = max(self.next_index, record.index + 1)
                case OAcceptedRecord():
                    for entry in record.entries:
                        self.o_value[entry.slot] = entry.owner


def _keys_of(batch: tuple[Command, ...] | None) -> tuple[str, ...]:
    if not batch:
        return ()
    if len(batch) == 1:
        return batch[0].keys
    return tuple(sorted({key for command in batch for key in command.keys}))
