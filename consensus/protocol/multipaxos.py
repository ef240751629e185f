"""Multi-Paxos with a leader that fails over (DESIGN §4), sans-I/O: a baseline for SDPaxos.

Theory of operation
-------------------
Replica ``config.leader`` (0 unless configured) starts as the leader, pre-prepared at ballot
``ballot_of(0, leader)`` for every slot, so in the normal case each slot costs Phase 2 only:

* **Forwarding.** A client command that arrives at another replica goes to the leader it
  believes in (``leader``) in a ``PaxosForward`` (one per loop turn, merged) and is forwarded
  again every ``retransmit_us`` (to whoever leads by then) until this replica sees it in an
  Accept or a Commit. The leader ignores a forwarded command it has in flight (proposed, not
  yet executed) — re-sending the Commit if it is chosen, since the forwarder evidently missed
  it — and proposes again one it already executed (a client retry: the state machine's
  session table answers it with the first result).
* **Phase 2.** Everything that reached the leader in one loop turn becomes one new slot (at most
  ``max_batch`` commands; slots pipeline). The leader persists its own acceptance and sends
  ``PaxosAccept`` to every peer (``thrifty``: to the nearest bare majority only); acceptors
  that promised no higher ballot persist and acknowledge (``PaxosAck``, merged per turn) after
  the record is durable, others refuse (``PaxosPromise`` with ``ok`` False). With a majority
  (itself included) the slot is chosen and the leader sends ``PaxosCommit`` to everyone.
* **Ready.** A command is ready when the replica it arrived at learns its slot chosen (paper
  WAN, leader at CA, three replicas: 20, 40 and 72 ms at CA, OR and OH).
* **Failover.** Every replica heartbeats with the highest ballot it knows as the heartbeat's
  ``view``. A replica that hears nothing from its leader for a randomized election timeout
  (1 to 1.5 times ``election_timeout_us``), and granted it no lease still running, becomes a
  candidate: it promises itself ``next_ballot`` (persisted) and sends ``PaxosPrepare`` from its
  execution frontier. Acceptors that promised no higher ballot (and granted no running lease
  to another leader) promise, persist, and report every value they accepted from that slot on
  (``PaxosPromise``, in pages of at most ``PROMISE_ENTRIES`` values; the candidate asks for
  the next page). With complete reports from a majority, the candidate re-proposes, at its
  ballot, the value of the highest ballot in every slot up to the highest reported, and a
  no-op in the holes, then leads: new commands go to the slots after. A leader that learns
  of a higher ballot steps down and forwards the commands its clients sent it (not executed
  yet) to the new leader.
* **Leases and reads.** The leader asks for a lease with every heartbeat (``lease_request``:
  its clock); a follower that promised its ballot grants it (``LeaseGrant``) and, for
  ``lease_us`` (stretched by the drift bound) on its own clock, promises no other candidate
  and starts no candidacy. With grants from a majority the leader holds the lease until its
  request time plus ``lease_us`` (shrunk by twice the drift bound). A ``read`` at a leader
  holding the lease is served locally once every slot it proposed so far has executed (and
  only if the lease still holds then); any other read is ordered through the log. A replica
  that restarts grants and votes nothing for a lease's length (it may have forgotten one).
* **Execution** is in slot order (``slotlog``); a command's result is answered by the replica
  it arrived at. A restarted initial leader still at ballot 0 re-drives the slots its records
  hold (its ballot needs no phase 1); any other restarted replica follows until it hears from
  a leader or takes over.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from typing import Final

from consensus.config import ProtocolConfig
from consensus.messages import (
    MAX_SLOTS,
    NO_LEASE_REQUEST,
    Command,
    CVote,
    Heartbeat,
    LeaseGrant,
    PaxosAccept,
    PaxosAck,
    PaxosCommit,
    PaxosForward,
    PaxosPrepare,
    PaxosPromise,
    PaxosPromiseRecord,
    PeerMessage,
    Record,
    SlotAcceptedRecord,
    check_command,
)
from consensus.protocol.ballot import BALLOT_STRIDE, ballot_of, next_ballot
from consensus.protocol.batch import CATCHUP_BYTES, CommandBatch, batch_size
from consensus.protocol.slotlog import Batch, Key, Slot, SlotLogCore, key_of
from consensus.protocol.status import CoreStatus
from consensus.protocol.types import NEVER, Role, SnapshotMeta

__all__ = ["PROMISE_ENTRIES", "MultiPaxosReplica"]

#: ``_inflight`` value of a command batched for the next slot
_BATCHED = -1
#: most accepted values one promise page carries (it stops earlier at ``CATCHUP_BYTES``)
PROMISE_ENTRIES: Final = 4096
#: parts per million
_PPM: Final = 1_000_000


class _Candidacy:
    """Phase 1 under way at ``ballot``: what each peer reported, and which are complete."""

    __slots__ = ("ballot", "complete", "from_slot", "next_from", "started", "values")

    def __init__(self, ballot: int, from_slot: int, started: int) -> None:
        self.ballot = ballot
        self.from_slot = from_slot
        self.started = started
        self.values: dict[int, tuple[int, Batch]] = {}  # slot -> (ballot, batch)
        self.complete: set[int] = set()
        self.next_from: dict[int, int] = {}  # peer -> the page start we asked for

    def add(self, slot: int, ballot: int, batch: Batch) -> None:
        known = self.values.get(slot)
        if known is None or ballot > known[0]:
            self.values[slot] = (ballot, batch)


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
        self._ignore_accepted = "takeover_ignores_accepted" in config.unsafe
        self._no_lease_check = "no_lease_check" in config.unsafe
        self.initial_ballot = ballot_of(0, config.leader)
        #: the highest ballot this replica promised (durable: records)
        self.promised = self.initial_ballot
        #: the highest ballot it knows of, and that ballot's owner: the leader it follows
        self.ballot = self.initial_ballot
        self.leader = config.leader
        #: leading at ``ballot`` (phase 1 done, or the initial leader's pre-prepared ballot)
        self.is_leader = me == config.leader
        self.view = self.ballot
        # thrifty: first Accepts to a bare majority (nearest first), the rest on retransmission
        pref = config.peers_by_preference(me)
        self._accept_to = pref[: self.q - 1] if config.thrifty else self._peers
        # leader
        self.next_slot = 0
        self._batch = CommandBatch(config)
        self._open: dict[int, Slot] = {}  # proposed, not chosen yet
        self._inflight: dict[Key, int] = {}  # proposed (or batched), not executed -> slot
        self._candidacy: _Candidacy | None = None
        self._lease_until = NEVER  # leader: holds a majority's lease until (own clock)
        self._lease_grants: dict[int, set[int]] = {}  # lease request -> granters
        self._lease_reads: list[tuple[Command, int]] = []  # (read, slot it waits for)
        # followers
        self._forward_out: list[Command] = []
        self._forwarded: dict[Key, tuple[Command, int]] = {}  # not seen proposed -> (cmd, sent)
        self._ack_out: dict[tuple[int, int], list[int]] = {}  # (proposer, ballot) -> slots
        self._leader_heard_at = 0
        self._election_after = 0
        self._granted_until = NEVER  # promised the leader: no other ballot until (own clock)
        self._restore(recovered, snapshot)

    # ------------------------------------------------------------------ clocks
    def _enter(self, now: int) -> None:
        first = not self._started
        super()._enter(now)
        if first:
            self._leader_heard_at = now
            self._election_after = self._election_timeout()
            # a lease granted before a restart is forgotten: honour one for its length
            self._granted_until = now + self._lease_span()

    def _election_timeout(self) -> int:
        timeout = self.config.election_timeout_us
        return timeout + self.rng.randrange(timeout // 2 + 1)

    def _lease_span(self) -> int:
        """How long a follower keeps a granted lease on its own clock (stretched by drift)."""
        return self.config.lease_us * (_PPM + self.config.max_drift_ppm) // _PPM

    # ------------------------------------------------------------------ inputs
    def read(self, command: Command, now: int) -> None:
        """A linearizable read: served locally by a leader holding a majority's lease, once
        every slot it proposed so far executed (each write acknowledged before the read
        arrived is in one); otherwise ordered through the log."""
        check_command(command)
        self._enter(now)
        if self.is_leader and (self._lease_valid() or self._no_lease_check):
            self._lease_reads.append((command, self.next_slot))
            return
        self._reads.add(key_of(command))
        self._submit(command)

    def _lease_valid(self) -> bool:
        return self.is_leader and self.now < self._lease_until

    def status(self) -> CoreStatus:
        """Leader, candidate (following nobody) or follower of ``leader``, and the leases."""
        role = Role.LEADER if self.is_leader else (
            Role.CANDIDATE if self._candidacy is not None else Role.FOLLOWER)
        bound = not self.is_leader and self.now < self._granted_until
        return dataclasses.replace(
            super().status(), role=role,
            leader=None if role is Role.CANDIDATE else self.leader,
            lease_held=self._lease_valid(), lease_granted_to=self.leader if bound else None,
        )

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
                # (no sign of a live leader: catch-up answers are commits too, from anyone)
                self._learn(message.slot, message.ballot, message.batch)
            case PaxosPrepare():
                self._on_prepare(message)
            case PaxosPromise():
                self._on_promise(message)
            case LeaseGrant():
                self._on_lease_grant(message)

    # ------------------------------------------------------------------ ballots
    def _heartbeat_message(self) -> Heartbeat:
        request = self.now if self.is_leader else NO_LEASE_REQUEST
        return Heartbeat(src=self.me, view=self.ballot, executed=self.exec_slot,
                         lease_request=request)

    def _on_heartbeat(self, message: Heartbeat) -> None:
        """Only a leading replica's heartbeat (it asks for a lease) names a leader to follow:
        a candidate's ballot is no leader yet."""
        if message.lease_request == NO_LEASE_REQUEST or message.view % BALLOT_STRIDE != message.src:
            return
        if message.view > self.ballot:
            self._note_ballot(message.view)
        elif message.view < self.ballot:
            if self.is_leader:
                return  # it will hear of us
            # a candidacy that failed (ours, or one we promised): follow who leads
            self._candidacy = None
            self.ballot = self.view = message.view
            self.leader = message.src
        if message.src != self.leader:
            return
        self._leader_heard_at = self.now
        if self.promised == message.view:
            self._granted_until = max(self._granted_until, self.now + self._lease_span())
            self._request(message.src, LeaseGrant(src=self.me, view=message.view,
                                                  request=message.lease_request))

    def _note_ballot(self, ballot: int) -> None:
        """Someone leads (or tries to) at ``ballot``: follow it if it is the highest known."""
        if ballot <= self.ballot:
            return
        self.ballot = self.view = ballot
        self.leader = ballot % BALLOT_STRIDE
        self._leader_heard_at = self.now
        if self.is_leader or self._candidacy is not None:
            self._step_down()

    def _promise(self, ballot: int) -> None:
        """Promise ``ballot`` (durably, before any answer that relies on it leaves)."""
        self._note_ballot(ballot)
        if ballot > self.promised:
            self.promised = ballot
            self._persist(PaxosPromiseRecord(ballot=ballot))

    def _step_down(self) -> None:
        """Another ballot leads: stop proposing; what our clients sent us and did not see
        executed goes to the new leader."""
        self.is_leader = False
        self._candidacy = None
        self._lease_until = NEVER
        self._lease_grants.clear()
        self._open.clear()
        self._inflight.clear()
        pending = list(self._batch.take())
        pending += [command for key, command in sorted(self._mine.items())]
        seen: set[Key] = set()
        for command in pending:
            key = key_of(command)
            if key not in seen and key not in self._forwarded:
                seen.add(key)
                self._forward_out.append(command)
                self._forwarded[key] = (command, self.now)
        for command, _ in self._lease_reads:
            self._reads.add(key_of(command))
            self._forward_out.append(command)
            self._forwarded[key_of(command)] = (command, self.now)
        self._lease_reads.clear()

    # ------------------------------------------------------------------ phase 1
    def _start_candidacy(self) -> None:
        ballot = next_ballot(max(self.promised, self.ballot), self.me)
        self._promise(ballot)
        self.leader = self.me
        candidacy = self._candidacy = _Candidacy(ballot, self.exec_slot, self.now)
        for slot, inst in self._accepted_from(self.exec_slot):
            candidacy.add(slot, inst.ballot, inst.batch)
        candidacy.complete.add(self.me)
        prepare = PaxosPrepare(src=self.me, view=0, ballot=ballot, from_slot=self.exec_slot)
        for peer in self._peers:
            candidacy.next_from[peer] = self.exec_slot
            self._send(peer, prepare)
        if len(candidacy.complete) >= self.q:
            self._take_over(candidacy)

    def _accepted_from(self, start: int) -> list[tuple[int, Slot]]:
        return sorted((slot, inst) for slot, inst in self.slots.items() if slot >= start)

    def _on_prepare(self, msg: PaxosPrepare) -> None:
        if msg.ballot % BALLOT_STRIDE != msg.src:
            return
        if msg.ballot < self.promised:
            self._refuse(msg.src)
            return
        if msg.ballot > self.promised:
            if self.now < self._granted_until and msg.src != self.leader:
                return  # a lease we granted is running: no other leader yet
            self._promise(msg.ballot)
        self._leader_heard_at = self.now
        if msg.from_slot < self._compacted:
            self._out.snapshot_requests.append(msg.src)  # it must catch up first
            return
        accepted: list[CVote] = []
        budget = CATCHUP_BYTES
        complete = True
        through = msg.from_slot
        for slot, inst in self._accepted_from(msg.from_slot):
            if len(accepted) >= PROMISE_ENTRIES or budget <= 0:
                complete = False
                break
            accepted.append(CVote(index=slot, ballot=inst.ballot, batch=inst.batch))
            budget -= batch_size(inst.batch)
            through = slot
        self._send(msg.src, PaxosPromise(src=self.me, view=0, ballot=msg.ballot, ok=True,
                                         from_slot=msg.from_slot, through=through,
                                         complete=complete, accepted=tuple(accepted)))

    def _preempted(self, ballot: int) -> None:
        """An acceptor refused us, having promised ``ballot``. A leader (it may be a failed
        candidate's ballot nobody follows) takes over again above it at the next tick unless
        a leader at a higher ballot shows up first; a candidate retries at its timeout."""
        if ballot <= self.ballot:
            return
        if self.is_leader:
            self._step_down()
            self._leader_heard_at = self.now - self._election_after
        self.ballot = self.view = max(self.ballot, ballot)

    def _refuse(self, to: int) -> None:
        self._send(to, PaxosPromise(src=self.me, view=0, ballot=self.promised, ok=False,
                                    from_slot=0, through=0, complete=True, accepted=()))

    def _on_promise(self, msg: PaxosPromise) -> None:
        if not msg.ok:
            self._preempted(msg.ballot)
            return
        candidacy = self._candidacy
        if candidacy is None or msg.ballot != candidacy.ballot:
            return
        if msg.src in candidacy.complete or candidacy.next_from.get(msg.src) != msg.from_slot:
            return  # a duplicate or a stale page
        for vote in msg.accepted:
            if vote.index >= candidacy.from_slot:
                candidacy.add(vote.index, vote.ballot, vote.batch)
        if msg.complete:
            candidacy.complete.add(msg.src)
        else:
            candidacy.next_from[msg.src] = msg.through + 1
            self._send(msg.src, PaxosPrepare(src=self.me, view=0, ballot=candidacy.ballot,
                                             from_slot=msg.through + 1))
        if len(candidacy.complete) >= self.q:
            self._take_over(candidacy)

    def _take_over(self, candidacy: _Candidacy) -> None:
        """Phase 1 done: re-propose what may have been chosen, fill the holes, then lead."""
        self._candidacy = None
        self.is_leader = True
        self.ballot = self.view = candidacy.ballot
        self.leader = self.me
        self._lease_until = NEVER
        high = max(candidacy.values, default=candidacy.from_slot - 1)
        start = max(candidacy.from_slot, self.exec_slot)
        for slot in range(start, high + 1):
            inst = self.slots.get(slot)
            if inst is not None and inst.committed:
                continue  # chosen already: peers that miss it catch up
            _, batch = candidacy.values.get(slot, (0, ()))
            if self._ignore_accepted:
                batch = ()  # unsafe: as if nobody had accepted anything
            self._persist(SlotAcceptedRecord(slot=slot, ballot=self.ballot, batch=batch))
            inst = self._drive(slot, batch)
            for command in batch:
                self._inflight[key_of(command)] = slot
            accept = PaxosAccept(src=self.me, view=0, slot=slot, ballot=self.ballot,
                                 batch=batch)
            for peer in self._peers:
                self._send(peer, accept)
            if len(inst.acks) >= self.q:
                self._commit(slot, inst)
        self.next_slot = max(self.next_slot, high + 1, self.exec_slot)
        # what our clients sent while nobody led: propose it now
        waiting = [command for command, _ in self._forwarded.values()]
        self._forwarded.clear()
        for command in waiting:
            self._enqueue(command)

    # ------------------------------------------------------------------ leases
    def _on_lease_grant(self, msg: LeaseGrant) -> None:
        if not self.is_leader or msg.view != self.ballot or msg.request > self.now:
            return
        granters = self._lease_grants.setdefault(msg.request, {self.me})
        granters.add(msg.src)
        if len(granters) >= self.q:
            drift = 2 * self.config.max_drift_ppm
            until = msg.request + self.config.lease_us * (_PPM - drift) // _PPM
            self._lease_until = max(self._lease_until, until)
        for request in [r for r in self._lease_grants if r < self.now - self.config.lease_us]:
            del self._lease_grants[request]

    def _serve_lease_reads(self) -> None:
        if not self._lease_reads:
            return
        waiting: list[tuple[Command, int]] = []
        for command, slot in self._lease_reads:
            if self.exec_slot < slot:
                waiting.append((command, slot))
            elif self._lease_valid() or self._no_lease_check:
                self._out.reads.append(command)
            else:  # the lease ran out meanwhile: through the log after all
                self._reads.add(key_of(command))
                self._enqueue(command)
        self._lease_reads = waiting

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

    def _drive(self, slot: int, batch: Batch) -> Slot:
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
        if msg.ballot % BALLOT_STRIDE != msg.src:
            return  # only a ballot's owner proposes at it
        if msg.ballot < self.promised:
            self._refuse(msg.src)
            return
        self._promise(msg.ballot)  # (the acceptance's record holds the ballot too)
        if msg.src == self.leader:
            self._leader_heard_at = self.now
        if self._accept(msg.slot, msg.ballot, msg.batch):
            self._ack_out.setdefault((msg.src, msg.ballot), []).append(msg.slot)
        self._seen_proposed(msg.batch)

    def _seen_proposed(self, batch: Batch) -> None:
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
        self._serve_lease_reads()
        if self._inflight:
            for command in inst.batch:
                key = key_of(command)
                if self._inflight.get(key) == slot:
                    del self._inflight[key]

    def _catchup_target(self) -> int:
        return self.leader if self.leader != self.me else super()._catchup_target()

    def _drop_below(self, slot: int) -> None:
        super()._drop_below(slot)
        for s in [s for s in self._open if s < slot]:
            del self._open[s]
        for key in [k for k, s in self._inflight.items() if 0 <= s < slot]:
            del self._inflight[key]
        if self.is_leader:
            self.next_slot = max(self.next_slot, slot)

    def _own_records(self) -> list[Record]:
        if self.promised > self.initial_ballot:
            return [PaxosPromiseRecord(ballot=self.promised)]
        return []

    def _restored(self, records: Sequence[Record]) -> None:
        for record in records:
            if isinstance(record, PaxosPromiseRecord | SlotAcceptedRecord):
                self.promised = max(self.promised, record.ballot)
        for accepted in self.slots.values():
            self.promised = max(self.promised, accepted.ballot)
        self.ballot = self.view = self.promised
        self.leader = self.promised % BALLOT_STRIDE
        self.is_leader = self.promised == ballot_of(0, self.me)
        if not self.is_leader:
            return
        # The initial leader at its pre-prepared ballot: drive again every slot our records
        # hold (we cannot tell which were chosen: the same value at the same ballot is safe to
        # re-propose); a slot below the highest one with no record was never sent (accepts
        # leave after their record is durable): a no-op.
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
        if self._batch and self.is_leader:
            self._propose()
        if self._forward_out:
            self._forward(self._forward_out)
            self._forward_out = []
        for (dest, ballot), slots in sorted(self._ack_out.items()):
            for i in range(0, len(slots), MAX_SLOTS):
                chunk = tuple(slots[i : i + MAX_SLOTS])
                self._send(dest, PaxosAck(src=self.me, view=0, ballot=ballot, slots=chunk))
        self._ack_out.clear()
        self._serve_lease_reads()

    def _forward(self, commands: list[Command]) -> None:
        """To the leader, in messages bounded like batches (kept here while we are the
        candidate: proposed once we lead)."""
        if self.is_leader:
            for command in commands:
                self._forwarded.pop(key_of(command), None)
                self._enqueue(command)
            return
        if self.leader == self.me:
            return  # our candidacy: they wait in _forwarded
        chunk = CommandBatch(self.config)
        for command in commands:
            if chunk.add(command):
                self._request(self.leader, PaxosForward(src=self.me, view=0, commands=chunk.take()))
        if chunk:
            self._request(self.leader, PaxosForward(src=self.me, view=0, commands=chunk.take()))

    def _timers(self) -> None:
        deadline = self.now - self.config.retransmit_us
        if self.is_leader:
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
        else:
            self._election_timer()
        late = [command for command, sent in self._forwarded.values() if sent <= deadline]
        if late:
            for command in late:
                self._forwarded[key_of(command)] = (command, self.now)
            self._forward(late)

    def _election_timer(self) -> None:
        candidacy = self._candidacy
        if candidacy is not None:
            if self.now - candidacy.started < self._election_after:
                return
        elif self.now - self._leader_heard_at < self._election_after:
            return
        if self.now < self._granted_until:
            return  # a lease we granted is running
        self._election_after = self._election_timeout()
        self._start_candidacy()
