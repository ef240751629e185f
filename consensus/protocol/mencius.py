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

* **Revocation.** The log stops at a crashed or cut-off owner's next slot. A replica stuck
  there that has heard nothing from that owner for a randomized election timeout, and is the
  first replica after it (in id order, wrapping) it has heard from recently — or anyone once
  twice that long passed — revokes the owner's slots from the stuck one up to ``REVOKE_SPAN``
  of them beyond the highest slot a live replica proposed in; and while the owner stays
  silent it revokes the next range before the proposals reach the end of the last one
  (``REVOKE_AHEAD``), so that a dead owner stalls the log once, not once per range:
  ``MenciusPrepare`` at a higher ballot; acceptors that
  promised no higher ballot there persist a ``MenciusPromiseRecord``, refuse the owner's
  lower-ballot Accepts in the range from then on, and report what they accepted in it
  (``MenciusPromise``). With a majority, the revoker re-proposes (``PaxosAccept`` at its
  ballot) the value of the highest ballot in every slot and a no-op in the others, and
  commits each once a majority acknowledged it (``PaxosAck``, ``PaxosCommit``). The owner,
  when back (or if it was only slow), learns its revoked slots from those commits and the
  promises, never proposes in them again, and proposes again, in its next free slot, the
  commands of a proposal that a revocation replaced with a no-op.

A restarted replica recovers its next own slot from its records (skips, promises, accepted
values) and re-drives its unfinished proposals.
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
    CVote,
    MenciusAccept,
    MenciusAck,
    MenciusPrepare,
    MenciusPromise,
    MenciusPromiseRecord,
    MenciusSkip,
    PaxosAccept,
    PaxosAck,
    PaxosCommit,
    PeerMessage,
    Record,
    SkipRecord,
    SlotAcceptedRecord,
)
from consensus.protocol.admission import REVOKE_SLOTS
from consensus.protocol.ballot import BALLOT_STRIDE, ballot_of, next_ballot
from consensus.protocol.batch import CommandBatch
from consensus.protocol.slotlog import Batch, Slot, SlotLogCore
from consensus.protocol.types import NEVER, SnapshotMeta

__all__ = ["MAX_AHEAD", "REVOKE_AHEAD", "REVOKE_SPAN", "SKIP_RUN", "MenciusReplica"]

#: Most own slots one skip run (in a message) names; longer skips travel by catch-up.
SKIP_RUN: Final = 4096

#: A slot this far beyond everything we know of is dropped, not acted on: skipping up to it
#: would allocate a no-op per own slot (correct peers are never more than the commands in
#: flight ahead).
MAX_AHEAD: Final = 1 << 20

#: A revocation covers the owner's slots up to this many of them beyond everything known
#: (``consensus.protocol.admission.REVOKE_SLOTS`` bounds a range at N times this, N <= 255).
REVOKE_SPAN: Final = 256

#: While a revoked owner stays silent, its next range is revoked once the live replicas'
#: proposals come within this many of its slots of the end of the last one (half a span: a
#: revocation's round trip is far shorter than proposing that many slots takes).
REVOKE_AHEAD: Final = REVOKE_SPAN // 2


class _Revocation:
    """A revocation under way: ``owner``'s slots in ``[start, stop)`` at ``ballot``."""

    __slots__ = ("ballot", "owner", "promised", "start", "started", "stop", "values")

    def __init__(self, owner: int, start: int, stop: int, ballot: int, now: int) -> None:
        self.owner = owner
        self.start = start
        self.stop = stop
        self.ballot = ballot
        self.started = now
        self.promised: set[int] = set()
        self.values: dict[int, tuple[int, Batch]] = {}

    def add(self, slot: int, ballot: int, batch: Batch) -> None:
        known = self.values.get(slot)
        if known is None or ballot > known[0]:
            self.values[slot] = (ballot, batch)


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
        self._ignore_accepted = "takeover_ignores_accepted" in config.unsafe
        #: revocation promises: (owner, start, stop, ballot), the owner's slots in [start, stop)
        self._promises: list[tuple[int, int, int, int]] = []
        self._revocation: _Revocation | None = None
        self._revoking: dict[int, Slot] = {}  # slots re-proposed by our revocation, not chosen
        self._heard: list[int] = [0] * self.n  # when each peer was last heard from
        self._revocation_seen_at = 0  # when we last promised somebody's revocation
        #: own proposals not chosen yet (the slot's value may change under a revocation)
        self._proposals: dict[int, Batch] = {}
        self._suspect_after = 0
        #: one past the highest slot a live owner proposed in (its Accepts), what execution
        #: will have to pass: revocations reach beyond it
        self._proposed_high = 0
        self._restore(recovered, snapshot)

    # ------------------------------------------------------------------ inputs
    def _submit(self, command: Command) -> None:
        if self._batch.add(command):
            self._propose()

    def _step(self, message: PeerMessage) -> None:
        if isinstance(message, MenciusAccept | PaxosCommit | PaxosAccept) and not self._plausible(
            message.slot
        ):
            return
        match message:
            case MenciusAccept():
                self._on_accept(message)
            case MenciusAck():
                self._learn_skip(message.src, message.skip_start, message.skip_stop)
                self._on_ack(message)
                if self._revoking:
                    self._on_revoked_ack(message)  # (acknowledgements are merged per peer)
            case MenciusSkip():
                self._learn_skip(message.src, message.skip_start, message.skip_stop)
            case PaxosCommit():
                self._learn(message.slot, message.ballot, message.batch)
            case MenciusPrepare():
                self._on_prepare(message)
            case MenciusPromise():
                self._on_promise(message)
            case PaxosAccept():
                self._on_revoked_accept(message)
            case PaxosAck():
                self._on_revoked_ack(message)

    def step(self, message: PeerMessage, now: int) -> None:
        if 0 <= message.src < self.n:
            self._heard[message.src] = now
        super().step(message, now)

    def _enter(self, now: int) -> None:
        if not self._started:
            # everyone counts as heard at boot: a peer is suspected after a silence, not
            # before its first heartbeat had time to arrive
            self._heard = [now] * self.n
        super()._enter(now)

    # ------------------------------------------------------------------ owner
    def _propose(self) -> None:
        batch = self._batch.take()
        slot = self.next_own
        self.next_own += self.n
        inst = self.slots[slot] = Slot(self.ballot, batch)
        inst.acks.add(self.me)
        inst.sent_at = self.now
        self._open[slot] = inst
        self._proposals[slot] = batch
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
        self._proposed_high = max(self._proposed_high, msg.slot + 1)
        self._learn_skip(msg.src, msg.skip_start, msg.skip_stop)
        if self._promised(msg.slot) > msg.ballot:
            return  # revoked: the revoker decides this slot
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
            # (a no-op a revoker chose is no skip of ours: announced as one, it would stand at
            # our ballot 0, where we may have proposed a command that the revocation replaced)
            if inst is None or inst.batch or not inst.committed or inst.ballot != self.ballot:
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
        self._revoking.pop(slot, None)
        if inst.batch:
            self._skip_below(slot)
        if slot % self.n == self.me:
            if slot >= self.next_own:
                self.next_own = slot + self.n  # ours, chosen (perhaps revoked): never reuse it
            mine = self._proposals.pop(slot, None)
            if mine is not None and mine != inst.batch:
                # a revocation chose something else here: propose ours again
                for command in mine:
                    if command not in inst.batch:
                        self._submit(command)

    def _executed_slot(self, slot: int, inst: Slot) -> None:
        self._open.pop(slot, None)
        self._proposals.pop(slot, None)

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
        # no-ops are skips (ours are in SkipRecords, others' are facts), unless a revoker
        # accepted them at its ballot: that is an acceptance to remember
        return bool(inst.batch) or inst.ballot >= BALLOT_STRIDE

    def _own_records(self) -> list[Record]:
        """Our skips beyond the compaction point, as runs; our revocation promises."""
        records: list[Record] = [
            MenciusPromiseRecord(owner=owner, start=start, stop=stop, ballot=ballot)
            for owner, start, stop, ballot in self._promises
            if stop > self._compacted
        ]
        start: int | None = None  # of the run of skips under way
        slot = self._own_at_or_above(self._compacted)
        while slot <= self.next_own:
            inst = self.slots.get(slot)
            skipped = slot < self.next_own and inst is not None and not inst.batch
            if skipped and start is None:
                start = slot
            elif not skipped and start is not None:
                records.append(SkipRecord(start=start, stop=slot))
                start = None
            slot += self.n
        return records

    def _restored(self, records: Sequence[Record]) -> None:
        self.next_own = max(self.next_own, self._own_at_or_above(self._compacted))
        for record in records:
            if isinstance(record, MenciusPromiseRecord):
                self._promises.append((record.owner, record.start, record.stop, record.ballot))
                if record.owner == self.me:
                    self.next_own = max(self.next_own, self._own_at_or_above(record.stop))
            if isinstance(record, SkipRecord):
                for slot in range(record.start, record.stop, self.n):
                    if slot >= self._compacted:
                        self.slots[slot] = Slot(self.ballot, (), committed=True)
                self.next_own = max(self.next_own, record.stop)
        for slot, inst in sorted(self.slots.items()):
            if slot % self.n == self.me and (inst.batch or inst.ballot >= BALLOT_STRIDE):
                self.next_own = max(self.next_own, slot + self.n)
                if not inst.committed and inst.ballot == self.ballot:
                    # ours, outcome unknown: drive it again (same value, same ballot)
                    inst.acks = {self.me}
                    inst.sent_at = NEVER
                    self._open[slot] = inst
                    self._proposals[slot] = inst.batch

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

    # ------------------------------------------------------------------ revocation
    def _promised(self, slot: int) -> int:
        """The highest ballot promised for ``slot`` (its owner's 0 unless revoked)."""
        owner = slot % self.n
        best = ballot_of(0, owner)
        for who, start, stop, ballot in self._promises:
            if who == owner and start <= slot < stop and ballot > best:
                best = ballot
        return best

    def _range_promised(self, owner: int, start: int, stop: int) -> int:
        best = ballot_of(0, owner)
        for who, low, high, ballot in self._promises:
            if who == owner and low < stop and start < high and ballot > best:
                best = ballot
        return best

    def _maybe_revoke(self) -> None:
        """Stuck at a slot whose owner has been silent too long: revoke its slots."""
        if self._revocation is not None:
            if self.now - self._revocation.started < 2 * self.config.election_timeout_us:
                return
            self._revocation = None  # no majority in time: try again (a higher ballot)
        stuck = self.exec_slot
        owner = stuck % self.n
        inst = self.slots.get(stuck)
        if inst is not None and inst.committed:
            return
        timeout = self.config.election_timeout_us
        if not self._suspect_after:
            self._suspect_after = timeout + self.rng.randrange(timeout // 2 + 1)
        stalled = self.now - max(self._exec_progress_at, self._revocation_seen_at)
        if stalled < self._suspect_after:
            return
        revoked = self._promised(stuck) > ballot_of(0, owner) or (
            inst is not None and inst.ballot >= BALLOT_STRIDE
        )
        if not revoked:
            # the owner still holds it: revoke only if it has been silent, and let the first
            # live replica after it do it (anyone once twice that long passed)
            silent = self.now - self._heard[owner]
            if owner == self.me or silent < self._suspect_after:
                return
            order = [(owner + k) % self.n for k in range(1, self.n)]
            first = next(r for r in order if r == self.me or self.now - self._heard[r] < timeout)
            if first != self.me and silent < 2 * self._suspect_after:
                return
        # (a revoked slot nobody finished, its revoker gone: anyone, the owner too, finishes it)
        self._suspect_after = 0
        start = stuck
        frontier = max(stuck, self.next_own, self._proposed_high)
        stop = self._own_of(frontier, owner)
        self._start_revocation(owner, start, min(stop + REVOKE_SPAN * self.n,
                                                 start + REVOKE_SLOTS))

    def _maybe_revoke_ahead(self) -> None:
        """Keep a revoked owner's slots revoked ahead of the live replicas' proposals.

        A revocation covers ``REVOKE_SPAN`` of the owner's slots beyond everything known; under
        sustained load the live replicas propose past its end, and execution stopped there
        again until a timeout suspected the owner anew (a stall of about an election timeout
        every ``REVOKE_SPAN`` slots). So while the owner stays silent, the first live replica
        after it revokes the next range before the proposals reach the end of the last one:
        a dead owner costs one stall, not one per range."""
        if self._revocation is not None:
            return
        timeout = self.config.election_timeout_us
        frontier = max(self.next_own, self._proposed_high)
        for owner in range(self.n):
            if owner == self.me or self.now - self._heard[owner] < timeout:
                continue
            revoked_to = max(
                (stop for who, _, stop, _ in self._promises if who == owner), default=None
            )
            if revoked_to is None or revoked_to >= frontier + REVOKE_AHEAD * self.n:
                continue  # never revoked (the stuck path decides that), or far enough ahead
            order = [(owner + k) % self.n for k in range(1, self.n)]
            first = next(r for r in order if r == self.me or self.now - self._heard[r] < timeout)
            if first != self.me:
                continue
            start = max(revoked_to, self.exec_slot)
            stop = min(self._own_of(frontier, owner) + REVOKE_SPAN * self.n,
                       start + REVOKE_SLOTS)
            self._start_revocation(owner, start, stop)
            return

    def _start_revocation(self, owner: int, start: int, stop: int) -> None:
        ballot = next_ballot(self._range_promised(owner, start, stop), self.me)
        self._promise(owner, start, stop, ballot)
        revocation = self._revocation = _Revocation(owner, start, stop, ballot, self.now)
        self._report_accepted(revocation, self.me)
        prepare = MenciusPrepare(src=self.me, view=0, owner=owner, start=start, stop=stop,
                                 ballot=ballot)
        for peer in self._peers:
            self._send(peer, prepare)
        self._maybe_revoked(revocation)

    def _own_of(self, slot: int, owner: int) -> int:
        """``owner``'s first slot at or above ``slot``."""
        return slot + (owner - slot) % self.n

    def _promise(self, owner: int, start: int, stop: int, ballot: int) -> None:
        self._promises.append((owner, start, stop, ballot))
        self._persist(MenciusPromiseRecord(owner=owner, start=start, stop=stop, ballot=ballot))
        if owner == self.me:
            # revoked: our unused slots there are the revoker's to fill (with no-ops)
            self.next_own = max(self.next_own, self._own_of(stop, self.me))

    def _accepted_in(self, owner: int, start: int, stop: int) -> list[CVote]:
        votes = []
        for slot in range(self._own_of(start, owner), stop, self.n):
            inst = self.slots.get(slot)
            if inst is not None:
                votes.append(CVote(index=slot, ballot=inst.ballot, batch=inst.batch))
        return votes

    def _report_accepted(self, revocation: _Revocation, src: int) -> None:
        for vote in self._accepted_in(revocation.owner, revocation.start, revocation.stop):
            revocation.add(vote.index, vote.ballot, vote.batch)
        revocation.promised.add(src)

    def _on_prepare(self, msg: MenciusPrepare) -> None:
        if msg.ballot % BALLOT_STRIDE != msg.src or not 0 <= msg.stop - msg.start <= REVOKE_SLOTS:
            return
        promised = self._range_promised(msg.owner, msg.start, msg.stop)
        if msg.ballot < promised:
            self._send(msg.src, MenciusPromise(src=self.me, view=0, owner=msg.owner,
                                               start=msg.start, stop=msg.stop, ballot=promised,
                                               ok=False, accepted=()))
            return
        if msg.start < self._compacted:
            self._out.snapshot_requests.append(msg.src)  # it must catch up first
            return
        if msg.ballot > promised:
            self._promise(msg.owner, msg.start, msg.stop, msg.ballot)
            self._revocation_seen_at = self.now  # give it time before revoking ourselves
            if self._revocation is not None and self._revocation.ballot < msg.ballot:
                self._revocation = None
        self._send(msg.src, MenciusPromise(
            src=self.me, view=0, owner=msg.owner, start=msg.start, stop=msg.stop,
            ballot=msg.ballot, ok=True,
            accepted=tuple(self._accepted_in(msg.owner, msg.start, msg.stop)),
        ))

    def _on_promise(self, msg: MenciusPromise) -> None:
        revocation = self._revocation
        if revocation is None or (msg.owner, msg.start, msg.stop) != (
            revocation.owner, revocation.start, revocation.stop
        ):
            return
        if not msg.ok:
            if msg.ballot > revocation.ballot:
                self._revocation = None  # somebody revokes at a higher ballot
            return
        if msg.ballot != revocation.ballot or msg.src in revocation.promised:
            return
        for vote in msg.accepted:
            if revocation.start <= vote.index < revocation.stop and vote.index % self.n == (
                revocation.owner
            ):
                revocation.add(vote.index, vote.ballot, vote.batch)
        revocation.promised.add(msg.src)
        self._maybe_revoked(revocation)

    def _maybe_revoked(self, revocation: _Revocation) -> None:
        """With a majority's promises: re-propose what may have been chosen, no-op the rest."""
        if len(revocation.promised) < self.q:
            return
        self._revocation = None
        for slot in range(self._own_of(revocation.start, revocation.owner), revocation.stop,
                          self.n):
            inst = self.slots.get(slot)
            if slot < self.exec_slot or (inst is not None and inst.committed):
                continue
            _, batch = revocation.values.get(slot, (0, ()))
            if self._ignore_accepted:
                batch = ()  # unsafe: as if nobody had accepted anything
            if not self._accept(slot, revocation.ballot, batch):
                continue
            inst = self.slots[slot]
            inst.acks = {self.me}
            inst.sent_at = self.now
            self._revoking[slot] = inst
            accept = PaxosAccept(src=self.me, view=0, slot=slot, ballot=revocation.ballot,
                                 batch=batch)
            for peer in self._peers:
                self._send(peer, accept)
            if len(inst.acks) >= self.q:
                self._commit(slot, inst)

    def _on_revoked_accept(self, msg: PaxosAccept) -> None:
        if msg.ballot % BALLOT_STRIDE != msg.src or msg.ballot < self._promised(msg.slot):
            return
        if self._accept(msg.slot, msg.ballot, msg.batch):
            self._ack_out.setdefault((msg.src, msg.ballot), []).append(msg.slot)

    def _on_revoked_ack(self, msg: PaxosAck | MenciusAck) -> None:
        for slot in msg.slots:
            inst = self._revoking.get(slot)
            if inst is None or inst.ballot != msg.ballot:
                continue
            inst.acks.add(msg.src)
            if not inst.committed and len(inst.acks) >= self.q:
                self._commit(slot, inst)

    def _timers(self) -> None:
        self._maybe_revoke()
        self._maybe_revoke_ahead()
        for slot in sorted(self._revoking):
            inst = self._revoking[slot]
            if inst.sent_at > self.now - self.config.retransmit_us:
                continue
            inst.sent_at = self.now
            again = PaxosAccept(src=self.me, view=0, slot=slot, ballot=inst.ballot,
                                batch=inst.batch)
            for peer in self._peers:
                if peer not in inst.acks:
                    self._send(peer, again)
        deadline = self.now - self.config.retransmit_us
        for slot in sorted(self._open):
            inst = self._open[slot]
            missing = [peer for peer in self._peers if peer not in inst.acks]
            if inst.sent_at > deadline or not missing or inst.ballot != self.ballot:
                continue  # (a revoker's value now: the revoker drives it)
            inst.sent_at = self.now
            accept = self._accept_message(slot, inst)
            for peer in missing:
                self._send(peer, accept)
