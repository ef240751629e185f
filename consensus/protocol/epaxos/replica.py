"""The EPaxos core (see the package docstring): inputs, pre-accept, the fast and slow paths,
commit, snapshots and restart; execution and recovery are mixed in."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import ClassVar

from consensus.config import ProtocolConfig
from consensus.errors import ConfigError, LocalProtocolError
from consensus.messages import (
    NO_LEASE_REQUEST,
    Command,
    EAccept,
    EAcceptReply,
    ECommit,
    EInstanceRecord,
    EPreAccept,
    EPreAcceptReply,
    EPrepare,
    EPrepareReply,
    ETryPreAccept,
    ETryPreAcceptReply,
    Heartbeat,
    PeerMessage,
    Record,
    check_command,
)
from consensus.protocol.ballot import ballot_of, ballot_round
from consensus.protocol.batch import CommandBatch
from consensus.protocol.epaxos.execution import ExecutionMixin
from consensus.protocol.epaxos.recovery import RecoveryMixin
from consensus.protocol.epaxos.state import (
    ACCEPT_PHASE,
    ACCEPTED,
    COMMITTED,
    EPAXOS_UNSAFE_VARIANTS,
    NO_DEP,
    NONE,
    PREACCEPT_PHASE,
    PREACCEPTED,
    PREACCEPTED_EQ,
    TRY_PHASE,
    Batch,
    Drive,
    Instance,
    InstanceId,
    merge,
)
from consensus.protocol.ready import Failure, Outgoing, Ready
from consensus.protocol.slotlog import Key, key_of
from consensus.protocol.status import CoreStatus
from consensus.protocol.types import Role, SnapshotMeta

__all__ = ["EPaxosReplica"]

#: ``_inflight`` of a command in the open batch (no instance yet)
IN_BATCH = -1


class EPaxosReplica(RecoveryMixin, ExecutionMixin):
    """One EPaxos replica: feed it inputs, drain ``ready()``, call ``advance``."""

    #: only conflicting commands run in the same order everywhere (checkers compare orders
    #: per key, see ``consensus.sim.simulator``)
    partial_order: ClassVar[bool] = True

    def __init__(
        self,
        config: ProtocolConfig,
        me: int,
        *,
        recovered: Sequence[Record] = (),
        rng: random.Random,
        snapshot: SnapshotMeta | None = None,
    ) -> None:
        if not 0 <= me < config.replicas:
            raise LocalProtocolError(f"replica id {me} outside 0..{config.replicas - 1}")
        unsupported = config.unsafe - EPAXOS_UNSAFE_VARIANTS
        if unsupported:
            raise ConfigError(
                f"EPaxos implements only the unsafe variants {sorted(EPAXOS_UNSAFE_VARIANTS)}, "
                f"not {sorted(unsupported)}"
            )
        self._ack_early = "ack_before_persist" in config.unsafe
        self._exec_uncommitted = "epaxos_exec_uncommitted" in config.unsafe
        self._try_unchecked = "epaxos_try_ignores_conflicts" in config.unsafe
        self._ignore_preaccepted = "epaxos_recovery_ignores_preaccepted" in config.unsafe
        self.config = config
        self.me = me
        self.n = n = config.replicas
        self.f = n // 2
        self.q = self.f + 1
        #: the optimized fast quorum, the owner included (SOSP'13 §4.3): 2 of 3, 3 of 5
        self.fast_quorum = max(1, self.f + (self.f + 1) // 2)
        #: the fewest replicas besides the owner a majority keeps of a fast quorum: a
        #: recovery seeing that many unchanged pre-accepts must try to pre-accept the owner's
        #: attributes (``RecoveryMixin._try_preaccept``)
        self.try_quorum = (self.f + 1) // 2
        self.rng = rng
        self.view = 0  # no views: drivers that report one see 0
        self.now = 0
        self._peers = tuple(r for r in range(n) if r != me)
        self._none_deps = (NO_DEP,) * n

        self.instances: dict[InstanceId, Instance] = {}
        self.exec_counts = [0] * n  # per owner: its instances below this executed here
        #: commands executed here in all, the next one's ``Execution.slot`` (so the state
        #: machine's position grows with every command, and replicas that ran the same
        #: instances stand at the same one)
        self.exec_slot = 0
        self._compacted = [0] * n  # per owner: instances below this live only in a snapshot
        self.next_index = 0
        self._known_high = [0] * n  # per owner: one past the highest index known to exist

        # conflict indexes: per key, the highest index per owner and the highest seq
        self._key_high: dict[str, list[int]] = {}
        self._key_seq: dict[str, int] = {}
        self._keyless_high = [NO_DEP] * n  # instances holding a command that names no keys
        self._keyless_seq = 0
        self._any_high = [NO_DEP] * n
        self._max_seq = 0

        self._batch = CommandBatch(config)
        self._mine: dict[Key, Command] = {}  # commands led here, until they execute here
        self._unready: set[Key] = set()
        self._reads: set[Key] = set()
        #: own index a command was proposed in (``IN_BATCH`` while in the open batch)
        self._inflight: dict[Key, int] = {}
        self._drives: dict[InstanceId, Drive] = {}
        #: instances known but not committed here -> when recovery may start
        self._waiting: dict[InstanceId, int] = {}

        self._started = False
        self._next_heartbeat = 0
        self._out = Ready()
        self._handed_out: Ready | None = None
        self._restore(recovered, snapshot)

    # ------------------------------------------------------------------ inputs
    def propose(self, command: Command, now: int) -> None:
        """A client command arrived. Raises ``LocalProtocolError`` (and changes nothing) for a
        command no peer could decode."""
        check_command(command)
        self._enter(now)
        key = key_of(command)
        self._mine[key] = command
        self._unready.add(key)
        self._submit(command)

    def read(self, command: Command, now: int) -> None:
        """A linearizable read: a command like any other, served once it executed here."""
        check_command(command)
        self._enter(now)
        key = key_of(command)
        self._reads.add(key)
        self._submit(command)

    def read_stale(self, command: Command, now: int) -> None:
        """A read served from local state at once: fast, possibly stale."""
        self._enter(now)
        self._out.reads.append(command)

    def step(self, message: PeerMessage, now: int) -> None:
        self._enter(now)
        src = message.src
        if not 0 <= src < self.n or src == self.me:
            return
        match message:
            case EPreAccept():
                self._on_preaccept(message)
            case EPreAcceptReply():
                self._on_preaccept_reply(message)
            case EAccept():
                self._on_accept(message)
            case EAcceptReply():
                self._on_accept_reply(message)
            case ECommit():
                self._on_commit(message)
            case EPrepare():
                self._on_prepare(message)
            case EPrepareReply():
                self._on_prepare_reply(message)
            case ETryPreAccept():
                self._on_try_preaccept(message)
            case ETryPreAcceptReply():
                self._on_try_preaccept_reply(message)
            case Heartbeat():
                self._on_heartbeat(src, message.executed)
            case _:
                pass  # another protocol's message: ignored

    def tick(self, now: int) -> None:
        self._enter(now)
        if now >= self._next_heartbeat:
            self._next_heartbeat = now + self.config.heartbeat_us
            for peer in self._peers:
                beat = Heartbeat(src=self.me, view=0, executed=self.next_index,
                                 lease_request=NO_LEASE_REQUEST)
                self._out.send.append(Outgoing(peer, beat))
        self._retransmit()
        self._wait_for_frontiers()
        self._start_recoveries()

    def ready(self) -> Ready:
        if self._handed_out is not None:
            raise LocalProtocolError("ready() called again before advance()")
        if self._batch:
            self._start_instance(self._batch.take())
        self._execute()
        out, self._out = self._out, Ready()
        self._handed_out = out
        return out

    def advance(self, ready: Ready) -> None:
        if ready is not self._handed_out:
            raise LocalProtocolError("advance() with a Ready this core did not hand out")
        self._handed_out = None

    # ------------------------------------------------------------------ checker views
    def committed_log(self) -> Mapping[int, tuple[Command, ...]]:
        """Instance ``(owner, index)`` as ``index * N + owner`` -> its committed batch."""
        return {
            index * self.n + owner: inst.batch
            for (owner, index), inst in self.instances.items()
            if inst.status == COMMITTED
        }

    def executed_through(self) -> int:
        return self.exec_slot - 1

    def status(self) -> CoreStatus:
        """A peer among peers. No peer positions: ``executed`` counts the commands executed
        here, in an order of its own, and heartbeats carry the next own index."""
        return CoreStatus(role=Role.PEER, view=self.view, executed=self.exec_slot,
                          voters=tuple(range(self.n)))

    # ------------------------------------------------------------------ plumbing
    def _enter(self, now: int) -> None:
        self.now = now
        if not self._started:
            self._started = True
            self._next_heartbeat = now
            for iid in self._waiting:
                # restored: our own unfinished instances are recovered at once, others after
                # the usual timeout
                self._waiting[iid] = now if iid[0] == self.me else self._deadline()

    def _deadline(self) -> int:
        timeout = self.config.election_timeout_us
        return self.now + timeout + self.rng.randrange(timeout)

    def _send(self, to: int, message: PeerMessage) -> None:
        """A message that may report state persisted in this batch."""
        if self._ack_early:
            self._out.send.append(Outgoing(to, message))
        else:
            self._out.send_after_persist.append(Outgoing(to, message))

    def _broadcast(self, message: PeerMessage) -> None:
        for peer in self._peers:
            self._send(peer, message)

    def _persist(self, iid: InstanceId, inst: Instance) -> None:
        self._out.persist.append(
            EInstanceRecord(
                owner=iid[0], index=iid[1], ballot=inst.ballot, vballot=inst.vballot,
                status=inst.status, batch=inst.batch, seq=inst.seq, deps=inst.deps,
            )
        )

    # ------------------------------------------------------------------ attributes
    def _attributes(self, batch: Batch, iid: InstanceId) -> tuple[int, tuple[int, ...]]:
        """``seq`` and ``deps`` of ``batch`` against the instances known here."""
        if any(not command.keys for command in batch):
            deps = list(self._any_high)
            seq = self._max_seq + 1
        else:
            deps = list(self._keyless_high)
            seq = self._keyless_seq + 1
            for command in batch:
                for key in command.keys:
                    highs = self._key_high.get(key)
                    if highs is None:
                        continue
                    for r, high in enumerate(highs):
                        if high > deps[r]:
                            deps[r] = high
                    seq = max(seq, self._key_seq[key] + 1)
        owner, index = iid
        # the owner's own earlier instances run before this one anyway (index order), and a
        # dependency on itself or a later one would only delay it
        deps[owner] = min(deps[owner], index - 1)
        return seq, tuple(deps)

    def _note(self, iid: InstanceId, batch: Batch, seq: int) -> None:
        """Index ``batch`` as instance ``iid`` for later conflicts."""
        owner, index = iid
        if index >= self._known_high[owner]:
            self._known_high[owner] = index + 1
        if index > self._any_high[owner]:
            self._any_high[owner] = index
        if seq > self._max_seq:
            self._max_seq = seq
        for command in batch:
            if not command.keys:
                if index > self._keyless_high[owner]:
                    self._keyless_high[owner] = index
                if seq > self._keyless_seq:
                    self._keyless_seq = seq
                continue
            for key in command.keys:
                highs = self._key_high.get(key)
                if highs is None:
                    highs = self._key_high[key] = [NO_DEP] * self.n
                    self._key_seq[key] = 0
                if index > highs[owner]:
                    highs[owner] = index
                if seq > self._key_seq[key]:
                    self._key_seq[key] = seq

    def _wait_for(self, iid: InstanceId) -> None:
        """``iid`` exists (or is depended on) and is not committed here: recover it if it is
        not committed in time."""
        if iid not in self._waiting and iid[1] >= self._compacted[iid[0]]:
            inst = self.instances.get(iid)
            if inst is None or inst.status != COMMITTED:
                self._waiting[iid] = self._deadline()

    # ------------------------------------------------------------------ leader
    def _submit(self, command: Command) -> None:
        index = self._inflight.get(key_of(command))
        if index is not None:
            return  # a retry of a command under way here: its instance answers it
        self._inflight[key_of(command)] = IN_BATCH
        if self._batch.add(command):
            self._start_instance(self._batch.take())

    def _start_instance(self, batch: Batch) -> None:
        iid = (self.me, self.next_index)
        self.next_index += 1
        for command in batch:
            self._inflight[key_of(command)] = iid[1]
        seq, deps = self._attributes(batch, iid)
        ballot = ballot_of(0, self.me)
        inst = self.instances[iid] = Instance(ballot, ballot, PREACCEPTED_EQ, batch, seq, deps)
        self._note(iid, batch, seq)
        self._persist(iid, inst)
        self._drives[iid] = Drive(PREACCEPT_PHASE, ballot, batch, seq, deps, self.now)
        self._waiting[iid] = self._deadline()
        self._broadcast(
            EPreAccept(src=self.me, view=0, owner=iid[0], index=iid[1], ballot=ballot,
                       batch=batch, seq=seq, deps=deps)
        )
        if self.fast_quorum <= 1:
            self._commit(iid, ballot, batch, seq, deps)  # a cluster of one

    def _on_preaccept_reply(self, msg: EPreAcceptReply) -> None:
        iid = (msg.owner, msg.index)
        drive = self._drives.get(iid)
        if drive is None or drive.phase != PREACCEPT_PHASE:
            return
        if not msg.ok:
            self._refused(iid, msg.ballot)
            return
        if msg.ballot != drive.ballot or msg.src in drive.replies:
            return
        drive.replies[msg.src] = None
        if msg.changed or msg.seq != drive.seq or msg.deps != drive.deps:
            drive.changed = True
        drive.seq = max(drive.seq, msg.seq)
        drive.deps = merge(drive.deps, msg.deps)
        self._preaccept_progress(iid, drive, timed_out=False)

    def _preaccept_progress(self, iid: InstanceId, drive: Drive, *, timed_out: bool) -> None:
        votes = len(drive.replies) + 1
        default = ballot_round(drive.ballot) == 0
        if default and not drive.changed and votes >= self.fast_quorum:
            self._commit(iid, drive.ballot, drive.batch, drive.seq, drive.deps)  # fast path
        elif votes >= self.q and (
            drive.changed or not default or timed_out or votes >= self.n
        ):
            self._start_accept(iid, drive)  # slow path

    def _start_accept(self, iid: InstanceId, drive: Drive) -> None:
        drive.phase = ACCEPT_PHASE
        drive.replies = {}
        drive.sent_at = self.now
        inst = self.instances[iid]
        inst.vballot, inst.status = drive.ballot, ACCEPTED
        inst.batch, inst.seq, inst.deps = drive.batch, drive.seq, drive.deps
        self._note(iid, drive.batch, drive.seq)
        self._persist(iid, inst)
        self._broadcast(self._accept_message(iid, drive))
        if self.q <= 1:
            self._commit(iid, drive.ballot, drive.batch, drive.seq, drive.deps)

    def _accept_message(self, iid: InstanceId, drive: Drive) -> EAccept:
        return EAccept(src=self.me, view=0, owner=iid[0], index=iid[1], ballot=drive.ballot,
                       batch=drive.batch, seq=drive.seq, deps=drive.deps)

    def _on_accept_reply(self, msg: EAcceptReply) -> None:
        iid = (msg.owner, msg.index)
        drive = self._drives.get(iid)
        if drive is None or drive.phase != ACCEPT_PHASE:
            return
        if not msg.ok:
            self._refused(iid, msg.ballot)
            return
        if msg.ballot != drive.ballot:
            return
        drive.replies[msg.src] = None
        if len(drive.replies) + 1 >= self.q:
            self._commit(iid, drive.ballot, drive.batch, drive.seq, drive.deps)

    def _refused(self, iid: InstanceId, ballot: int) -> None:
        """A peer promised a higher ballot for ``iid``: someone else drives it now."""
        del self._drives[iid]
        inst = self.instances.get(iid)
        if inst is not None and ballot > inst.ballot:
            inst.ballot = ballot  # not a promise of ours: known only, so never persisted
        self._waiting[iid] = self._deadline()

    def _commit(
        self, iid: InstanceId, ballot: int, batch: Batch, seq: int, deps: tuple[int, ...]
    ) -> None:
        """``iid`` is decided: persist it, then tell every peer (with the value)."""
        self._learn(iid, ballot, batch, seq, deps)
        self._broadcast(
            ECommit(src=self.me, view=0, owner=iid[0], index=iid[1], ballot=ballot,
                    batch=batch, seq=seq, deps=deps)
        )

    # ------------------------------------------------------------------ acceptor
    def _reply_ballot_refused(self, msg: EPreAccept | EAccept, ballot: int) -> None:
        if isinstance(msg, EPreAccept):
            self._send(msg.src, EPreAcceptReply(
                src=self.me, view=0, owner=msg.owner, index=msg.index, ballot=ballot, ok=False,
                seq=0, deps=self._none_deps, changed=False))
        else:
            self._send(msg.src, EAcceptReply(
                src=self.me, view=0, owner=msg.owner, index=msg.index, ballot=ballot, ok=False))

    def _tell_committed(self, to: int, iid: InstanceId, inst: Instance) -> None:
        self._send(to, ECommit(src=self.me, view=0, owner=iid[0], index=iid[1],
                               ballot=inst.vballot, batch=inst.batch, seq=inst.seq,
                               deps=inst.deps))

    def _below_snapshot(self, iid: InstanceId, src: int) -> bool:
        """``iid`` was executed and forgotten here: the asker gets our snapshot."""
        if iid[1] < self._compacted[iid[0]]:
            self._out.snapshot_requests.append(src)
            return True
        return False

    def _on_preaccept(self, msg: EPreAccept) -> None:
        iid = (msg.owner, msg.index)
        if self._below_snapshot(iid, msg.src):
            return
        inst = self.instances.get(iid)
        if inst is not None:
            if inst.status == COMMITTED:
                self._tell_committed(msg.src, iid, inst)
                return
            if inst.ballot > msg.ballot:
                self._reply_ballot_refused(msg, inst.ballot)
                return
            if inst.status >= ACCEPTED and inst.vballot >= msg.ballot:
                return  # a stale pre-accept: this ballot moved on to phase 2
            if inst.status in (PREACCEPTED, PREACCEPTED_EQ) and inst.vballot == msg.ballot:
                self._reply_preaccepted(msg, inst)  # a duplicate: answered again, persisted once
                return
        seq, deps = self._attributes(msg.batch, iid)
        seq, deps = max(seq, msg.seq), merge(deps, msg.deps)
        changed = seq != msg.seq or deps != msg.deps
        status = PREACCEPTED if changed else PREACCEPTED_EQ
        if inst is None:
            inst = self.instances[iid] = Instance(msg.ballot, msg.ballot, status, msg.batch,
                                                  seq, deps)
        else:
            inst.ballot = inst.vballot = msg.ballot
            inst.status, inst.batch, inst.seq, inst.deps = status, msg.batch, seq, deps
        self._note(iid, msg.batch, seq)
        self._persist(iid, inst)
        self._wait_for(iid)
        self._reply_preaccepted(msg, inst)

    def _reply_preaccepted(self, msg: EPreAccept, inst: Instance) -> None:
        self._send(msg.src, EPreAcceptReply(
            src=self.me, view=0, owner=msg.owner, index=msg.index, ballot=msg.ballot, ok=True,
            seq=inst.seq, deps=inst.deps, changed=inst.status == PREACCEPTED))

    def _on_accept(self, msg: EAccept) -> None:
        iid = (msg.owner, msg.index)
        if self._below_snapshot(iid, msg.src):
            return
        inst = self.instances.get(iid)
        if inst is not None:
            if inst.status == COMMITTED:
                self._tell_committed(msg.src, iid, inst)
                return
            if inst.ballot > msg.ballot:
                self._reply_ballot_refused(msg, inst.ballot)
                return
        if inst is None:
            inst = self.instances[iid] = Instance(msg.ballot, msg.ballot, ACCEPTED, msg.batch,
                                                  msg.seq, msg.deps)
        elif not (inst.status == ACCEPTED and inst.vballot == msg.ballot):
            inst.ballot = inst.vballot = msg.ballot
            inst.status, inst.batch, inst.seq, inst.deps = ACCEPTED, msg.batch, msg.seq, msg.deps
        else:
            self._send(msg.src, EAcceptReply(src=self.me, view=0, owner=msg.owner,
                                             index=msg.index, ballot=msg.ballot, ok=True))
            return  # a duplicate: acknowledged again, persisted once
        self._note(iid, msg.batch, msg.seq)
        self._persist(iid, inst)
        self._wait_for(iid)
        self._send(msg.src, EAcceptReply(src=self.me, view=0, owner=msg.owner, index=msg.index,
                                         ballot=msg.ballot, ok=True))

    def _on_commit(self, msg: ECommit) -> None:
        iid = (msg.owner, msg.index)
        if iid[1] < self._compacted[iid[0]]:
            return
        self._learn(iid, msg.ballot, msg.batch, msg.seq, msg.deps)

    def _learn(
        self, iid: InstanceId, ballot: int, batch: Batch, seq: int, deps: tuple[int, ...]
    ) -> None:
        """``iid`` is committed with this value (a fact, whoever says it)."""
        inst = self.instances.get(iid)
        if inst is not None and inst.status == COMMITTED:
            return
        if inst is None:
            inst = self.instances[iid] = Instance(ballot, ballot, COMMITTED, batch, seq, deps)
        else:
            inst.ballot = max(inst.ballot, ballot)
            inst.vballot, inst.status = ballot, COMMITTED
            inst.batch, inst.seq, inst.deps = batch, seq, deps
        self._note(iid, batch, seq)
        self._persist(iid, inst)
        self._drives.pop(iid, None)
        self._waiting.pop(iid, None)
        owner, index = iid
        # what it depends on must be known here to run it
        if index > 0:
            self._wait_for((owner, index - 1))
        for r, high in enumerate(deps):
            if high >= self.exec_counts[r]:
                self._wait_for((r, high))
        if owner == self.me:
            self._own_decided(index, batch)

    def _own_decided(self, index: int, batch: Batch) -> None:
        """Our instance ``index`` is committed: its commands are ready; those we proposed in
        it that a recovery replaced (with a no-op) failed, not definitely: the client may
        have sent them to another replica too (``ready.Failure``'s rule)."""
        chosen = {key_of(command) for command in batch}
        for command in batch:
            key = key_of(command)
            if key in self._unready:
                self._unready.discard(key)
                self._out.ready.append(command)
        lost = [key for key, at in self._inflight.items() if at == index and key not in chosen]
        for key in sorted(lost):
            del self._inflight[key]
            self._reads.discard(key)
            self._unready.discard(key)
            lost_command = self._mine.pop(key, None)
            if lost_command is not None:
                self._out.failed.append(
                    Failure(lost_command, False, "instance recovered as a no-op; another "
                            "copy of the request may still run: retry it, or settle it")
                )

    # ------------------------------------------------------------------ timers
    def _retransmit(self) -> None:
        deadline = self.now - self.config.retransmit_us
        for iid in sorted(self._drives):
            drive = self._drives[iid]
            if drive.sent_at > deadline:
                continue
            drive.sent_at = self.now
            if drive.phase == PREACCEPT_PHASE and len(drive.replies) + 1 >= self.q:
                self._preaccept_progress(iid, drive, timed_out=True)
                continue
            if drive.phase == TRY_PHASE:
                self._try_progress(iid, drive, timed_out=True)
                if iid in self._drives:
                    for peer in self._try_targets(iid, drive):
                        self._send(peer, self._try_message(iid, drive))
                continue
            message: PeerMessage
            if drive.phase == PREACCEPT_PHASE:
                inst = self.instances[iid]  # holds what we proposed in this phase
                message = EPreAccept(src=self.me, view=0, owner=iid[0], index=iid[1],
                                     ballot=drive.ballot, batch=inst.batch, seq=inst.seq,
                                     deps=inst.deps)
            elif drive.phase == ACCEPT_PHASE:
                message = self._accept_message(iid, drive)
            else:
                message = EPrepare(src=self.me, view=0, owner=iid[0], index=iid[1],
                                   ballot=drive.ballot)
            for peer in self._peers:
                if peer not in drive.replies:
                    self._send(peer, message)

    # ------------------------------------------------------------------ snapshots
    def snapshot_meta(self) -> SnapshotMeta:
        """Commands executed here in all, and instances per replica (a prefix of each
        one's)."""
        return SnapshotMeta(self.exec_slot, tuple(self.exec_counts))

    def compact(self, meta: SnapshotMeta) -> list[Record]:
        """The state machine's snapshot at ``meta`` is durable: forget the instances it
        covers. Returns the records a rewritten write-ahead log must hold."""
        if any(c > mine for c, mine in zip(meta.exec_counts, self.exec_counts, strict=True)):
            raise LocalProtocolError("compact() beyond the execution frontier")
        self._drop_below(meta.exec_counts)
        return self.durable_records()

    def install_snapshot(self, meta: SnapshotMeta) -> list[Record]:
        """A peer's snapshot was applied: continue from ``meta`` if it covers everything we
        executed (another replica's executed set may hold other independent instances)."""
        if len(meta.exec_counts) == self.n and all(
            c >= mine for c, mine in zip(meta.exec_counts, self.exec_counts, strict=True)
        ) and meta.slot > self.exec_slot:
            self.exec_counts = list(meta.exec_counts)
            self.exec_slot = meta.slot
            self._drop_below(meta.exec_counts)
            self.next_index = max(self.next_index, self.exec_counts[self.me])
        return self.durable_records()

    def _drop_below(self, counts: Sequence[int]) -> None:
        for iid in [iid for iid in self.instances if iid[1] < counts[iid[0]]]:
            del self.instances[iid]
            self._waiting.pop(iid, None)
            self._drives.pop(iid, None)
        for owner, count in enumerate(counts):
            self._compacted[owner] = max(self._compacted[owner], count)
            self._known_high[owner] = max(self._known_high[owner], count)

    def durable_records(self) -> list[Record]:
        """Every instance not executed here (what a restart from a snapshot at the execution
        frontier needs)."""
        return [
            EInstanceRecord(owner=owner, index=index, ballot=inst.ballot, vballot=inst.vballot,
                            status=inst.status, batch=inst.batch, seq=inst.seq, deps=inst.deps)
            for (owner, index), inst in sorted(self.instances.items())
            if not inst.executed
        ]

    # ------------------------------------------------------------------ restart
    def _restore(self, records: Sequence[Record], snapshot: SnapshotMeta | None) -> None:
        if snapshot is not None and len(snapshot.exec_counts) == self.n:
            self.exec_counts = list(snapshot.exec_counts)
            self.exec_slot = snapshot.slot
            self._compacted = list(snapshot.exec_counts)
            self._known_high = list(snapshot.exec_counts)
        self.next_index = self.exec_counts[self.me]
        for record in records:
            if not isinstance(record, EInstanceRecord) or len(record.deps) != self.n:
                continue
            iid = (record.owner, record.index)
            if record.index < self._compacted[record.owner]:
                continue
            self.instances[iid] = Instance(record.ballot, record.vballot, record.status,
                                           record.batch, record.seq, record.deps)
        for iid, inst in sorted(self.instances.items()):
            if inst.status != NONE:
                self._note(iid, inst.batch, inst.seq)
            if iid[0] == self.me:
                self.next_index = max(self.next_index, iid[1] + 1)
            if inst.status != COMMITTED:
                self._waiting[iid] = 0  # set when the clock is first known (``_enter``)
