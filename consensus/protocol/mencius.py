"""Mencius (Mao, Junqueira, Marzullo, OSDI'08), sans-I/O: a baseline for SDPaxos (DESIGN §4).

Theory of operation
-------------------
The global slots are owned round-robin: replica ``r`` owns ``r, r + N, r + 2N, ...`` and is
pre-prepared at ballot ``ballot_of(0, r)`` for all of them (Coordinated Paxos: only the owner
proposes a command in its slot; anyone else could only ever propose a no-op there).

* **Proposing.** Every command that reached a replica from its clients in one loop turn
  becomes one batch in the replica's next unused own slot (``next_own``; at most
  ``max_batch`` commands; slots pipeline). The owner persists its acceptance and sends
  ``MenciusAccept`` to *every* peer (never a bare majority, whatever ``thrifty`` says: the
  skips below need everyone's answer); acceptors persist and acknowledge (``MenciusAck``,
  merged per turn) once durable. With a majority (the owner included) the slot is chosen and
  the owner sends ``PaxosCommit`` to everyone.
* **Skipping.** A replica that learns of a command proposed in slot ``s`` (an Accept or a
  Commit) *skips* every own slot below ``s`` it has not used: they become no-ops, chosen at
  once (nobody else can propose anything but a no-op there), persisted as a ``SkipRecord``
  before anybody hears of them. A skip is learned by a run of the skipper's own slots
  ``[skip_start, skip_stop)``, piggybacked as the paper's optimizations suggest:
  every Accept carries the run of skipped own slots just below its slot, every Ack the run just
  below the sender's ``next_own`` (which holds what the Accept it answers made it skip), and a
  peer that gets neither in a turn that skipped gets a ``MenciusSkip``. Skips are only ever
  triggered by slots holding commands, never by other skips, so they cannot chase each other.
* **Ready and execution.** Slot ``s`` executes once it is chosen and every slot below executed,
  that is once every other replica's slots below ``s`` are known used or skipped. A command is
  ready when it executes at the replica it arrived at — the SDPaxos paper's Mencius *commit*:
  before that a later command could still land in a lower slot of a replica that has not heard
  of ``s``. This is why a lightly loaded or distant replica slows everybody down (it must be
  heard from), the weakness SDPaxos is compared on.
* **Retransmission.** An own proposal not yet executed here is re-sent every
  ``retransmit_us`` to the peers that did not acknowledge it (with its skip run). Lost skips and
  Commits are repaired by catch-up (``slotlog``): a stuck replica asks the owner of the slot it
  waits for, which first skips that slot if it is still unused, then answers with every chosen
  value (no-ops included) from there.

Normal case only: there is no revocation (the paper's Prepare by another replica to no-op a
crashed owner's slots), so every replica must stay up for the log to advance; a restarted
replica recovers its next own slot from its records and re-drives its unfinished proposals.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Final

from consensus.config import ProtocolConfig
from consensus.messages import (
    MAX_SLOTS,
    Catchup,
    CatchupMarkers,
    Command,
    MenciusAccept,
    MenciusAck,
    MenciusSkip,
    PaxosCommit,
    PeerMessage,
    Record,
    SkipRecord,
    SlotAcceptedRecord,
)
from consensus.protocol.ballot import ballot_of
from consensus.protocol.batch import CommandBatch
from consensus.protocol.slotlog import Slot, SlotLogCore
from consensus.protocol.types import NEVER, SnapshotMeta

__all__ = ["MAX_AHEAD", "SKIP_RUN", "MenciusReplica"]

#: Most own slots one skip run (in a message) names; longer skips travel by catch-up.
SKIP_RUN: Final = 4096

#: A slot this far beyond everything we know of is dropped, not acted on: skipping up to it
#: would allocate a no-op per own slot (correct peers are never more than the commands in
#: flight ahead).
MAX_AHEAD: Final = 1 << 20


class MenciusReplica(SlotLogCore):
    """One Mencius replica: feed it inputs, drain ``ready()``, call ``advance``."""

    def __init__(
        self,
        config: ProtocolConfig,
        me: int,
        *,
        recovered: Sequence[Record] = (),
        rng: random.Random,
        snapshot: SnapshotMeta | None = None,
    ) -> None:
        super().__init__(config, me, rng=rng)
        self.ballot = ballot_of(0, me)
        self.next_own = me  # our lowest slot neither proposed in nor skipped
        self._batch = CommandBatch(config)
        self._open: dict[int, Slot] = {}  # own proposals not executed here yet
        self._ack_out: dict[tuple[int, int], list[int]] = {}  # (owner, ballot) -> slots
        self._skipped = False  # skipped something this turn
        self._restore(recovered, snapshot)

    # ------------------------------------------------------------------ inputs
    def _submit(self, command: Command) -> None:
        if self._batch.add(command):
            self._propose()

    def _step(self, message: PeerMessage) -> None:
        if isinstance(message, MenciusAccept | PaxosCommit) and not self._plausible(message.slot):
            return
        match message:
            case MenciusAccept():
                self._on_accept(message)
            case MenciusAck():
                self._learn_skip(message.src, message.skip_start, message.skip_stop)
                self._on_ack(message)
            case MenciusSkip():
                self._learn_skip(message.src, message.skip_start, message.skip_stop)
            case PaxosCommit():
                self._learn(message.slot, message.ballot, message.batch)

    # ------------------------------------------------------------------ owner
    def _propose(self) -> None:
        batch = self._batch.take()
        slot = self.next_own
        self.next_own += self.n
        inst = self.slots[slot] = Slot(self.ballot, batch)
        inst.acks.add(self.me)
        inst.sent_at = self.now
        self._open[slot] = inst
        self.known_high = max(self.known_high, slot + 1)
        self._persist(SlotAcceptedRecord(slot=slot, ballot=self.ballot, batch=batch))
        accept = self._accept_message(slot, inst)
        for peer in self._peers:
            self._send(peer, accept)
        if len(inst.acks) >= self.q:
            self._commit(slot, inst)

    def _accept_message(self, slot: int, inst: Slot) -> MenciusAccept:
        start, stop = self._skip_run_below(slot)
        return MenciusAccept(
            src=self.me,
            view=0,
            slot=slot,
            ballot=inst.ballot,
            batch=inst.batch,
            skip_start=start,
            skip_stop=stop,
        )

    def _on_ack(self, msg: MenciusAck) -> None:
        for slot in msg.slots:
            inst = self._open.get(slot)
            if inst is None or inst.ballot != msg.ballot:
                continue
            inst.acks.add(msg.src)  # also after the commit: retransmission stops at it
            if not inst.committed and len(inst.acks) >= self.q:
                self._commit(slot, inst)

    def _commit(self, slot: int, inst: Slot) -> None:
        self._commit_to_peers(slot, inst)
        self._mark_chosen(slot, inst)

    # ------------------------------------------------------------------ acceptor
    def _on_accept(self, msg: MenciusAccept) -> None:
        if msg.slot % self.n != msg.src or not msg.batch:
            return  # only the owner proposes in its slot, and never a no-op
        self._learn_skip(msg.src, msg.skip_start, msg.skip_stop)
        if self._accept(msg.slot, msg.ballot, msg.batch):
            self._ack_out.setdefault((msg.src, msg.ballot), []).append(msg.slot)
        self._skip_below(msg.slot)

    # ------------------------------------------------------------------ skips
    def _plausible(self, slot: int) -> bool:
        return slot < max(self.known_high, self.next_own, self.exec_slot) + MAX_AHEAD

    def _skip_below(self, limit: int) -> None:
        """Skip every own slot below ``limit`` not used yet (no-ops, chosen at once)."""
        if self.next_own >= limit:
            return
        start = self.next_own
        while self.next_own < limit:
            self.slots[self.next_own] = Slot(self.ballot, (), committed=True)
            self.next_own += self.n
        self._persist(SkipRecord(start=start, stop=self.next_own))
        self._skipped = True

    def _skip_run_below(self, slot: int) -> tuple[int, int]:
        """The run of own slots just below own slot ``slot`` that we skipped, as a
        ``[start, stop)`` range (``(0, 0)``: none)."""
        start = slot
        while start - self.n >= 0 and slot - start < SKIP_RUN * self.n:
            inst = self.slots.get(start - self.n)
            if inst is None or inst.batch or not inst.committed:
                break
            start -= self.n
        return (start, slot) if start < slot else (0, 0)

    def _learn_skip(self, owner: int, start: int, stop: int) -> None:
        """``owner`` skipped its slots in ``[start, stop)``: they are chosen no-ops."""
        n = self.n
        if start >= stop or start % n != owner or stop % n != owner:
            return
        if stop - start > SKIP_RUN * n:
            return  # larger than any run a correct peer sends
        ballot = ballot_of(0, owner)
        for slot in range(start, stop, n):
            if slot < self.exec_slot:
                continue
            inst = self.slots.get(slot)
            if inst is not None and (inst.committed or inst.batch):
                continue  # a value there would mean a bug: keep what we have
            self.slots[slot] = Slot(ballot, (), committed=True)

    # ------------------------------------------------------------------ hooks
    def _chosen(self, slot: int, inst: Slot) -> None:
        if inst.batch:
            self._skip_below(slot)
            if slot % self.n == self.me and slot >= self.next_own:
                self.next_own = slot + self.n  # ours, chosen: never reuse it

    def _executed_slot(self, slot: int, inst: Slot) -> None:
        self._open.pop(slot, None)

    def _catchup_target(self) -> int:
        owner = self.exec_slot % self.n
        return owner if owner != self.me else super()._catchup_target()

    def _on_catchup(self, msg: Catchup | CatchupMarkers) -> None:
        # The asker is stuck at msg.slot: if it is ours and unused, give it up now.
        self._skip_below(msg.slot + 1)

    def _drop_below(self, slot: int) -> None:
        super()._drop_below(slot)
        for s in [s for s in self._open if s < slot]:
            del self._open[s]
        self.next_own = max(self.next_own, self._own_at_or_above(slot))

    def _own_at_or_above(self, slot: int) -> int:
        return slot + (self.me - slot) % self.n

    def _keeps(self, inst: Slot) -> bool:
        return bool(inst.batch)  # no-ops are skips: ours are in SkipRecords, others' are facts

    def _own_records(self) -> list[Record]:
        """Our skips beyond the compaction point, as runs."""
        records: list[Record] = []
        start = -1
        slot = self._own_at_or_above(self._compacted)
        while slot <= self.next_own:
            inst = self.slots.get(slot)
            skipped = slot < self.next_own and inst is not None and not inst.batch
            if skipped and start < 0:
                start = slot
            elif not skipped and start >= 0:
                records.append(SkipRecord(start=start, stop=slot))
                start = -1
            slot += self.n
        return records

    def _restored(self, records: Sequence[Record]) -> None:
        self.next_own = max(self.next_own, self._own_at_or_above(self._compacted))
        for record in records:
            if isinstance(record, SkipRecord):
                for slot in range(record.start, record.stop, self.n):
                    if slot >= self._compacted:
                        self.slots[slot] = Slot(self.ballot, (), committed=True)
                self.next_own = max(self.next_own, record.stop)
        for slot, inst in sorted(self.slots.items()):
            if slot % self.n == self.me and inst.batch:
                self.next_own = max(self.next_own, slot + self.n)
                if not inst.committed:
                    # ours, outcome unknown: drive it again (same value, same ballot)
                    inst.acks = {self.me}
                    inst.sent_at = NEVER
                    self._open[slot] = inst

    # ------------------------------------------------------------------ the loop turn
    def _flush(self) -> None:
        if self._batch:
            self._propose()
        start, stop = self._skip_run_below(self.next_own)
        acked: set[int] = set()
        for (owner, ballot), slots in sorted(self._ack_out.items()):
            acked.add(owner)
            for i in range(0, len(slots), MAX_SLOTS):
                ack = MenciusAck(
                    src=self.me,
                    view=0,
                    ballot=ballot,
                    slots=tuple(slots[i : i + MAX_SLOTS]),
                    skip_start=start,
                    skip_stop=stop,
                )
                self._send(owner, ack)
        self._ack_out.clear()
        if self._skipped and start < stop:
            skip = MenciusSkip(src=self.me, view=0, skip_start=start, skip_stop=stop)
            for peer in self._peers:
                if peer not in acked:
                    self._send(peer, skip)
        self._skipped = False

    def _timers(self) -> None:
        deadline = self.now - self.config.retransmit_us
        for slot in sorted(self._open):
            inst = self._open[slot]
            missing = [peer for peer in self._peers if peer not in inst.acks]
            if inst.sent_at > deadline or not missing:
                continue
            inst.sent_at = self.now
            accept = self._accept_message(slot, inst)
            for peer in missing:
                self._send(peer, accept)
