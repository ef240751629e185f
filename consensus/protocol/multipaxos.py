"""Multi-Paxos with a stable leader (DESIGN §4), sans-I/O: a baseline for SDPaxos.

Theory of operation
-------------------
Replica ``config.leader`` (0 unless configured) leads for good. It is pre-prepared at ballot
``ballot_of(0, leader)`` for every slot, so each slot costs Phase 2 only:

* **Forwarding.** A client command that arrives at another replica goes to the leader in a
  ``PaxosForward`` (one per loop turn, merged) and is forwarded again every ``retransmit_us``
  until this replica sees it in an Accept or a Commit. The leader ignores a forwarded command
  it has in flight (proposed, not yet executed) — re-sending the Commit if it is chosen, since
  the forwarder evidently missed it — and proposes again one it already executed (a client
  retry: the state machine's session table answers it with the first result).
* **Phase 2.** Everything that reached the leader in one loop turn becomes one new slot (at most
  ``max_batch`` commands; slots pipeline). The leader persists its own acceptance and sends
  ``PaxosAccept`` to every peer (``thrifty``: to the nearest bare majority only, the others
  get it on retransmission or the value with the Commit); acceptors persist and acknowledge
  (``PaxosAck``, merged per turn) after the record is durable. With a majority (itself
  included) the slot is chosen and the leader sends ``PaxosCommit`` to everyone, with the value
  for peers that did not acknowledge it.
* **Retransmission.** An Accept a peer has not acknowledged after ``retransmit_us`` is sent to
  it again, until the slot is chosen; after that, catch-up (``slotlog``) repairs lost Commits.
* **Ready.** A command is ready when the replica it arrived at learns its slot chosen: the
  leader on the majority, another replica on the Commit. A command arriving at the leader is
  ready after one round trip to the leader's nearest majority; elsewhere it takes the forward,
  that round trip and the Commit's way back (paper WAN, leader at CA, three replicas: 20, 40
  and 72 ms at CA, OR and OH).
* **Execution** is in slot order (``slotlog``); a command's result is answered by the replica
  it arrived at.

Normal case only: there is no leader election, so the cluster makes no progress while the
leader is down or cut off (forwarders keep re-sending, and a restarted leader re-drives the
slots its records hold, then goes on).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from consensus.config import ProtocolConfig
from consensus.messages import (
    MAX_SLOTS,
    Command,
    PaxosAccept,
    PaxosAck,
    PaxosCommit,
    PaxosForward,
    PeerMessage,
    Record,
    SlotAcceptedRecord,
)
from consensus.protocol.ballot import ballot_of
from consensus.protocol.batch import CommandBatch
from consensus.protocol.slotlog import Key, Slot, SlotLogCore, key_of
from consensus.protocol.types import NEVER, SnapshotMeta

__all__ = ["MultiPaxosReplica"]

#: ``_inflight`` value of a command batched for the next slot
_BATCHED = -1


class MultiPaxosReplica(SlotLogCore):
    """One Multi-Paxos replica (the leader or a follower): feed it inputs, drain ``ready()``,
    call ``advance``."""

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
        self.leader = config.leader
        self.ballot = ballot_of(0, self.leader)
        self.is_leader = me == self.leader
        # thrifty: first Accepts to a bare majority (nearest first), the rest on retransmission
        pref = config.peers_by_preference(me)
        self._accept_to = pref[: self.q - 1] if config.thrifty else self._peers
        # leader
        self.next_slot = 0
        self._batch = CommandBatch(config)
        self._open: dict[int, Slot] = {}  # proposed, not chosen yet
        self._inflight: dict[Key, int] = {}  # proposed (or batched), not executed -> slot
        # followers
        self._forward_out: list[Command] = []
        self._forwarded: dict[Key, tuple[Command, int]] = {}  # not seen proposed -> (cmd, sent)
        self._ack_out: dict[tuple[int, int], list[int]] = {}  # (proposer, ballot) -> slots
        self._restore(recovered, snapshot)

    # ------------------------------------------------------------------ inputs
    def _submit(self, command: Command) -> None:
        if self.is_leader:
            self._enqueue(command)
        else:
            self._forward_out.append(command)
            self._forwarded[key_of(command)] = (command, self.now)

    def _step(self, message: PeerMessage) -> None:
        match message:
            case PaxosForward():
                if self.is_leader:
                    self._on_forward(message)
            case PaxosAccept():
                self._on_accept(message)
            case PaxosAck():
                if self.is_leader:
                    self._on_ack(message)
            case PaxosCommit():
                self._learn(message.slot, message.ballot, message.batch)

    # ------------------------------------------------------------------ leader
    def _enqueue(self, command: Command) -> None:
        key = key_of(command)
        if key in self._inflight:
            return  # a client retry or a duplicate forward of a command under way
        self._inflight[key] = _BATCHED
        if self._batch.add(command):
            self._propose()

    def _on_forward(self, msg: PaxosForward) -> None:
        for command in msg.commands:
            slot = self._inflight.get(key_of(command))
            if slot is None:
                self._enqueue(command)
                continue
            inst = self.slots.get(slot) if slot != _BATCHED else None
            if inst is not None and inst.committed:
                # the forwarder re-sent a command whose slot is chosen: it missed the Commit
                commit = PaxosCommit(
                    src=self.me, view=0, slot=slot, ballot=inst.ballot, batch=inst.batch
                )
                self._send(msg.src, commit)

    def _propose(self) -> None:
        batch = self._batch.take()
        slot = self.next_slot
        self.next_slot += 1
        for command in batch:
            self._inflight[key_of(command)] = slot
        inst = self._drive(slot, batch)
        self._persist(SlotAcceptedRecord(slot=slot, ballot=self.ballot, batch=batch))
        accept = PaxosAccept(src=self.me, view=0, slot=slot, ballot=self.ballot, batch=batch)
        for peer in self._accept_to:
            self._send(peer, accept)
        if len(inst.acks) >= self.q:
            self._commit(slot, inst)

    def _drive(self, slot: int, batch: tuple[Command, ...]) -> Slot:
        """Lead ``slot`` with ``batch`` (our own acceptance counted)."""
        inst = self.slots[slot] = Slot(self.ballot, batch)
        inst.acks.add(self.me)
        inst.sent_at = self.now
        self._open[slot] = inst
        self.known_high = max(self.known_high, slot + 1)
        return inst

    def _on_ack(self, msg: PaxosAck) -> None:
        for slot in msg.slots:
            inst = self._open.get(slot)
            if inst is None or inst.ballot != msg.ballot:
                continue
            inst.acks.add(msg.src)
            if len(inst.acks) >= self.q:
                self._commit(slot, inst)

    def _commit(self, slot: int, inst: Slot) -> None:
        self._commit_to_peers(slot, inst)
        self._mark_chosen(slot, inst)

    # ------------------------------------------------------------------ acceptor
    def _on_accept(self, msg: PaxosAccept) -> None:
        if msg.src != self.leader:
            return  # a stable leader: nobody else proposes
        if self._accept(msg.slot, msg.ballot, msg.batch):
            self._ack_out.setdefault((msg.src, msg.ballot), []).append(msg.slot)
        self._seen_proposed(msg.batch)

    def _seen_proposed(self, batch: tuple[Command, ...]) -> None:
        """The leader has these commands: stop forwarding them."""
        if self._forwarded:
            for command in batch:
                self._forwarded.pop(key_of(command), None)

    # ------------------------------------------------------------------ hooks
    def _chosen(self, slot: int, inst: Slot) -> None:
        self._open.pop(slot, None)  # also when a restarted leader learns it from a peer
        self._report_ready(inst.batch)
        self._seen_proposed(inst.batch)

    def _executed_slot(self, slot: int, inst: Slot) -> None:
        if self._inflight:
            for command in inst.batch:
                key = key_of(command)
                if self._inflight.get(key) == slot:
                    del self._inflight[key]

    def _catchup_target(self) -> int:
        return self.leader if not self.is_leader else super()._catchup_target()

    def _drop_below(self, slot: int) -> None:
        super()._drop_below(slot)
        for s in [s for s in self._open if s < slot]:
            del self._open[s]
        for key in [k for k, s in self._inflight.items() if 0 <= s < slot]:
            del self._inflight[key]
        if self.is_leader:
            self.next_slot = max(self.next_slot, slot)

    def _restored(self, records: Sequence[Record]) -> None:
        if not self.is_leader:
            return
        # Drive again every slot our records hold (we cannot tell which were chosen: the same
        # value at the same ballot is safe to re-propose); a slot below the highest one with no
        # record was never sent (accepts leave after their record is durable): a no-op.
        self.next_slot = max(self.known_high, self.exec_slot)
        for slot in range(self.exec_slot, self.next_slot):
            inst = self.slots.get(slot)
            if inst is None:
                self._persist(SlotAcceptedRecord(slot=slot, ballot=self.ballot, batch=()))
                inst = self._drive(slot, ())
            elif inst.ballot == self.ballot:
                inst = self._drive(slot, inst.batch)
            else:
                continue
            inst.sent_at = NEVER  # send at the first tick
            for command in inst.batch:
                self._inflight[key_of(command)] = slot
            if len(inst.acks) >= self.q:
                self._commit(slot, inst)  # a cluster of one

    # ------------------------------------------------------------------ the loop turn
    def _flush(self) -> None:
        if self._batch:
            self._propose()
        if self._forward_out:
            self._forward(self._forward_out)
            self._forward_out = []
        for (dest, ballot), slots in sorted(self._ack_out.items()):
            for i in range(0, len(slots), MAX_SLOTS):
                chunk = tuple(slots[i : i + MAX_SLOTS])
                self._send(dest, PaxosAck(src=self.me, view=0, ballot=ballot, slots=chunk))
        self._ack_out.clear()

    def _forward(self, commands: list[Command]) -> None:
        """To the leader, in messages bounded like batches."""
        chunk = CommandBatch(self.config)
        for command in commands:
            if chunk.add(command):
                self._request(self.leader, PaxosForward(src=self.me, view=0, commands=chunk.take()))
        if chunk:
            self._request(self.leader, PaxosForward(src=self.me, view=0, commands=chunk.take()))

    def _timers(self) -> None:
        deadline = self.now - self.config.retransmit_us
        for slot in sorted(self._open):
            inst = self._open[slot]
            if inst.sent_at > deadline:
                continue
            inst.sent_at = self.now
            accept = PaxosAccept(
                src=self.me, view=0, slot=slot, ballot=inst.ballot, batch=inst.batch
            )
            for peer in self._peers:
                if peer not in inst.acks:
                    self._send(peer, accept)
        late = [command for command, sent in self._forwarded.values() if sent <= deadline]
        if late:
            for command in late:
                self._forwarded[key_of(command)] = (command, self.now)
            self._forward(late)
