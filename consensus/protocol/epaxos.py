"""EPaxos (Moraru, Andersen, Kaminsky, SOSP'13), sans-I/O: the leaderless baseline.

Theory of operation
-------------------
Every replica leads its own instances ``(owner, index)``; an instance's value is a batch of
client commands with two attributes: ``seq`` (a sequence number) and ``deps`` (for every
replica r, the highest index of r's instances it depends on, -1 for none; a dependency on
``(r, d)`` stands for all of r's instances up to d). Two commands *conflict* when they name a
common key; a command naming no keys conflicts with everything.

* **Pre-accept (phase 1).** Everything proposed here in one loop turn becomes one instance
  (``CommandBatch`` bounds it). The owner computes ``seq`` (1 + the highest ``seq`` of a
  conflicting instance it knows) and ``deps`` (the highest conflicting index per replica),
  persists the instance and sends ``EPreAccept`` to every peer. An acceptor merges the
  attributes with its own conflicts, persists, and replies (``EPreAcceptReply``, ``changed``
  when it added something) after the record is durable.
* **Fast path.** At the owner's default ballot, when ``fast_quorum`` replicas (the owner
  included) hold the proposed attributes unchanged, the instance commits after one round trip.
  ``fast_quorum`` is 2F: at N=3 that is the paper's optimized fast quorum F + floor((F+1)/2)
  (both are 2); at N=5 the optimized quorum (3) needs the paper's TryPreAccept recovery phase,
  which this core does not implement, so it keeps the basic 2F (4), whose recovery below is
  complete (see ``_decide``).
* **Slow path.** Otherwise, with a majority of replies, the owner takes the union of the
  ``deps`` and the highest ``seq``, and runs ``EAccept`` (phase 2) at a majority.
* **Commit.** The decider persists the instance as committed, then reports its commands ready
  and sends ``ECommit`` (with the value) to every peer. Learners persist commits too.
* **Execution.** A committed instance runs once every instance it reaches through ``deps``
  (and the owner's previous instance: each replica's instances execute in index order, so the
  executed set is a prefix per replica, what ``SnapshotMeta.exec_counts`` records) is
  committed. Tarjan's algorithm (iterative, no recursion limit) finds the strongly connected
  components; each runs in ``(seq, owner, index)`` order, dependencies first. Conflicting
  commands therefore run in the same order everywhere; independent ones may run in different
  orders on different replicas (so ``Execution.slot`` is this replica's count of executed
  commands, not a position shared by the replicas; fencing tokens derived from it are not
  comparable across replicas).
* **Reads** are commands like any other (the paper's comparison), served (``Ready.reads``)
  when their instance executed here.
* **Explicit prepare (recovery).** An instance this replica knows of (from a message, a
  dependency, or a heartbeat announcing its owner's next index) that is not committed within
  a randomized election timeout is recovered: ``EPrepare`` at a higher ballot; with a majority
  of ``EPrepareReply`` the recoverer commits a committed value, re-accepts the accepted value
  of the highest ballot, accepts the proposed attributes if enough replicas pre-accepted them
  unchanged at the default ballot (they may have committed on the fast path), re-runs
  pre-accept when some replica pre-accepted the value, and otherwise commits a no-op.
* **Durability.** Every change to an instance's ballot, status or value is one
  ``EInstanceRecord`` in ``Ready.persist``; replies and commits leave through
  ``send_after_persist``. A restart rebuilds instances from the records (the latest record of
  an instance wins), never reuses an own index, and recovers its own unfinished instances.
* **Snapshots.** ``snapshot_meta`` is the executed count per replica; ``compact`` forgets
  executed instances below it; a peer asking about a forgotten instance is sent the snapshot.

Every container iterated to produce output is ordered, so a seeded simulation replays exactly.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import ClassVar, Final

from consensus.config import ProtocolConfig
from consensus.errors import ConfigError, LocalProtocolError
from consensus.messages import (
    Command,
    EAccept,
    EAcceptReply,
    ECommit,
    EInstanceRecord,
    EPreAccept,
    EPreAcceptReply,
    EPrepare,
    EPrepareReply,
    Heartbeat,
    PeerMessage,
    Record,
)
from consensus.protocol.ballot import ballot_of, ballot_round, next_ballot
from consensus.protocol.batch import CommandBatch
from consensus.protocol.ready import Execution, Failure, Outgoing, Ready
from consensus.protocol.slotlog import Key, check_command, key_of
from consensus.protocol.types import SnapshotMeta

__all__ = [
    "ACCEPTED",
    "COMMITTED",
    "EPAXOS_UNSAFE_VARIANTS",
    "NONE",
    "PREACCEPTED",
    "PREACCEPTED_EQ",
    "EPaxosReplica",
]

#: instance status (``EPrepareReply.status``, ``EInstanceRecord.status``)
NONE: Final = 0  # a promise only
PREACCEPTED: Final = 1  # pre-accepted with attributes this replica changed
PREACCEPTED_EQ: Final = 2  # pre-accepted with the proposer's attributes unchanged
ACCEPTED: Final = 3
COMMITTED: Final = 4

#: the deliberately broken variants EPaxos has: ``epaxos_exec_uncommitted`` executes an
#: instance without waiting for its dependencies to commit (a teeth test finds it)
EPAXOS_UNSAFE_VARIANTS: Final = frozenset({"ack_before_persist", "epaxos_exec_uncommitted"})

#: most recoveries started in one tick (the rest wait for the next)
RECOVERIES_PER_TICK: Final = 64
#: a heartbeat announcing an owner's next index marks at most this many instances as known
HEARTBEAT_WINDOW: Final = 4096

InstanceId = tuple[int, int]
Batch = tuple[Command, ...]

_PRE: Final = "pre-accept"
_ACCEPT: Final = "accept"
_PREPARE: Final = "prepare"


class Instance:
    """What this replica knows of one instance: the promised ``ballot``, and the value and
    attributes (pre-)accepted at ``vballot`` with their ``status``."""

    __slots__ = ("ballot", "batch", "deps", "executed", "seq", "status", "vballot")

    def __init__(
        self, ballot: int, vballot: int, status: int, batch: Batch, seq: int,
        deps: tuple[int, ...],
    ) -> None:
        self.ballot = ballot
        self.vballot = vballot
        self.status = status
        self.batch = batch
        self.seq = seq
        self.deps = deps
        self.executed = False


class _Drive:
    """An instance this replica is driving (its own, or one it recovers) at ``ballot``."""

    __slots__ = ("ballot", "batch", "changed", "deps", "phase", "replies", "sent_at", "seq")

    def __init__(
        self, phase: str, ballot: int, batch: Batch, seq: int, deps: tuple[int, ...], now: int
    ) -> None:
        self.phase = phase
        self.ballot = ballot
        self.batch = batch
        self.seq = seq
        self.deps = deps
        self.changed = False  # a pre-accept reply changed the attributes
        self.replies: dict[int, EPrepareReply | None] = {}
        self.sent_at = now


def _merge(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(x if x >= y else y for x, y in zip(a, b, strict=True))


class EPaxosReplica:
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
        self.config = config
        self.me = me
        self.n = n = config.replicas
        self.f = n // 2
        self.q = self.f + 1
        self.fast_quorum = max(1, 2 * self.f)
        self.rng = rng
        self.view = 0  # no views: drivers that report one see 0
        self.now = 0
        self._peers = tuple(r for r in range(n) if r != me)
        self._none_deps = (-1,) * n

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
        self._keyless_high = [-1] * n  # instances holding a command that names no keys
        self._keyless_seq = 0
        self._any_high = [-1] * n
        self._max_seq = 0

        self._batch = CommandBatch(config)
        self._mine: dict[Key, Command] = {}  # commands led here, until they execute here
        self._unready: set[Key] = set()
        self._reads: set[Key] = set()
        self._inflight: dict[Key, int] = {}  # own index a command was proposed in
        self._drives: dict[InstanceId, _Drive] = {}
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
            case Heartbeat():
                self._on_heartbeat(src, message.executed)
            case _:
                pass  # another protocol's message: ignored

    def tick(self, now: int) -> None:
        self._enter(now)
        if now >= self._next_heartbeat:
            self._next_heartbeat = now + self.config.heartbeat_us
            for peer in self._peers:
                beat = Heartbeat(src=self.me, view=0, executed=self.next_index, lease_request=-1)
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
                    highs = self._key_high[key] = [-1] * self.n
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
        self._inflight[key_of(command)] = -1
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
        self._drives[iid] = _Drive(_PRE, ballot, batch, seq, deps, self.now)
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
        if drive is None or drive.phase != _PRE:
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
        drive.deps = _merge(drive.deps, msg.deps)
        self._preaccept_progress(iid, drive, timed_out=False)

    def _preaccept_progress(self, iid: InstanceId, drive: _Drive, *, timed_out: bool) -> None:
        votes = len(drive.replies) + 1
        default = ballot_round(drive.ballot) == 0
        if default and not drive.changed and votes >= self.fast_quorum:
            self._commit(iid, drive.ballot, drive.batch, drive.seq, drive.deps)  # fast path
        elif votes >= self.q and (
            drive.changed or not default or timed_out or votes >= self.n
        ):
            self._start_accept(iid, drive)  # slow path

    def _start_accept(self, iid: InstanceId, drive: _Drive) -> None:
        drive.phase = _ACCEPT
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

    def _accept_message(self, iid: InstanceId, drive: _Drive) -> EAccept:
        return EAccept(src=self.me, view=0, owner=iid[0], index=iid[1], ballot=drive.ballot,
                       batch=drive.batch, seq=drive.seq, deps=drive.deps)

    def _on_accept_reply(self, msg: EAcceptReply) -> None:
        iid = (msg.owner, msg.index)
        drive = self._drives.get(iid)
        if drive is None or drive.phase != _ACCEPT:
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
        seq, deps = max(seq, msg.seq), _merge(deps, msg.deps)
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
        it that a recovery replaced (with a no-op) failed for good."""
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
                    Failure(lost_command, True, "instance recovered as a no-op")
                )

    # ------------------------------------------------------------------ recovery
    def _on_heartbeat(self, src: int, next_index: int) -> None:
        """``src`` created its instances below ``next_index``: we must learn them all."""
        start = max(self._known_high[src], self.exec_counts[src])
        stop = min(next_index, self.exec_counts[src] + HEARTBEAT_WINDOW)
        for index in range(start, stop):
            self._wait_for((src, index))
        if stop > self._known_high[src]:
            self._known_high[src] = stop

    def _wait_for_frontiers(self) -> None:
        """An owner's next instance to execute, if not committed here, blocks everything
        after it: wait for the ones known to exist (a lost message may be all we missed)."""
        for owner in range(self.n):
            start = self.exec_counts[owner]
            inst = self.instances.get((owner, start))
            if inst is not None and inst.status == COMMITTED:
                continue
            stop = min(self._known_high[owner], start + HEARTBEAT_WINDOW)
            for index in range(start, stop):
                self._wait_for((owner, index))

    def _start_recoveries(self) -> None:
        due = sorted(
            (deadline, iid) for iid, deadline in self._waiting.items()
            if deadline <= self.now and iid not in self._drives
        )
        for _, iid in due[:RECOVERIES_PER_TICK]:
            self._recover(iid)

    def _recover(self, iid: InstanceId) -> None:
        inst = self.instances.get(iid)
        if inst is not None and inst.status == COMMITTED:
            self._waiting.pop(iid, None)
            return
        if inst is None:
            inst = self.instances[iid] = Instance(0, 0, NONE, (), 0, self._none_deps)
        ballot = next_ballot(inst.ballot, self.me)
        inst.ballot = ballot
        self._persist(iid, inst)
        drive = _Drive(_PREPARE, ballot, (), 0, self._none_deps, self.now)
        drive.replies[self.me] = self._prepare_reply(iid, inst, ballot)
        self._drives[iid] = drive
        self._waiting[iid] = self._deadline()
        self._broadcast(EPrepare(src=self.me, view=0, owner=iid[0], index=iid[1], ballot=ballot))
        if len(drive.replies) >= self.q:
            self._decide(iid, drive)

    def _prepare_reply(self, iid: InstanceId, inst: Instance, ballot: int) -> EPrepareReply:
        return EPrepareReply(
            src=self.me, view=0, owner=iid[0], index=iid[1], ballot=ballot, ok=True,
            status=inst.status, vballot=inst.vballot, batch=inst.batch, seq=inst.seq,
            deps=inst.deps,
        )

    def _on_prepare(self, msg: EPrepare) -> None:
        iid = (msg.owner, msg.index)
        if self._below_snapshot(iid, msg.src):
            return
        inst = self.instances.get(iid)
        if inst is not None and inst.status == COMMITTED:
            self._send(msg.src, self._prepare_reply(iid, inst, msg.ballot))
            return
        if inst is not None and inst.ballot >= msg.ballot:
            if inst.ballot > msg.ballot:
                self._send(msg.src, EPrepareReply(
                    src=self.me, view=0, owner=msg.owner, index=msg.index, ballot=inst.ballot,
                    ok=False, status=NONE, vballot=0, batch=(), seq=0, deps=self._none_deps))
            else:
                self._send(msg.src, self._prepare_reply(iid, inst, msg.ballot))  # a duplicate
            return
        if inst is None:
            inst = self.instances[iid] = Instance(msg.ballot, 0, NONE, (), 0, self._none_deps)
        inst.ballot = msg.ballot
        # a higher ballot took over: ours (if we drove it) can no longer decide it
        self._drives.pop(iid, None)
        self._persist(iid, inst)
        self._wait_for(iid)
        self._send(msg.src, self._prepare_reply(iid, inst, msg.ballot))

    def _on_prepare_reply(self, msg: EPrepareReply) -> None:
        iid = (msg.owner, msg.index)
        drive = self._drives.get(iid)
        if drive is None or drive.phase != _PREPARE:
            return
        if not msg.ok:
            self._refused(iid, msg.ballot)
            return
        if msg.status == COMMITTED:
            self._commit(iid, msg.vballot, msg.batch, msg.seq, msg.deps)
            return
        if msg.ballot != drive.ballot or msg.src in drive.replies:
            return
        drive.replies[msg.src] = msg
        if len(drive.replies) >= self.q:
            self._decide(iid, drive)

    def _decide(self, iid: InstanceId, drive: _Drive) -> None:
        """A majority answered the prepare: choose what may have been chosen (see the module
        docstring; why each case is safe is in the comments)."""
        owner = iid[0]
        replies = [reply for _, reply in sorted(drive.replies.items()) if reply is not None]
        accepted = [r for r in replies if r.status == ACCEPTED]
        pre = [r for r in replies if r.status in (PREACCEPTED, PREACCEPTED_EQ)]
        default = ballot_of(0, owner)
        unchanged = [
            r for r in replies
            if r.src != owner and r.status == PREACCEPTED_EQ and r.vballot == default
        ]
        owner_answered = any(r.src == owner for r in replies)
        if accepted:
            # Paxos: a value accepted at the highest ballot may have been chosen
            best = max(accepted, key=lambda r: r.vballot)
            drive.batch, drive.seq, drive.deps = best.batch, best.seq, best.deps
            self._start_accept(iid, drive)
        elif unchanged and not owner_answered and len(unchanged) >= self.f:
            # A fast-path commit had 2F replicas holding the proposed attributes; without
            # the owner, at least F of any majority are among them. Choosing those
            # attributes is safe even if they were not chosen: with the owner, F + 1
            # replicas hold them, so any conflicting command's quorum met one of them.
            # (When the owner answers PREACCEPTED it never committed: it persists a commit
            # before anyone hears of it, and gave up driving when it promised our ballot.)
            best = unchanged[0]
            drive.batch, drive.seq, drive.deps = best.batch, best.seq, best.deps
            self._start_accept(iid, drive)
        elif pre:
            # Not chosen (no fast-path quorum and nothing accepted in a majority): run the
            # pre-accept phase again at our ballot, then the slow path
            batch = pre[0].batch
            seq, deps = self._attributes(batch, iid)
            for reply in pre:
                seq, deps = max(seq, reply.seq), _merge(deps, reply.deps)
            drive.phase, drive.batch, drive.seq, drive.deps = _PRE, batch, seq, deps
            drive.replies, drive.sent_at, drive.changed = {}, self.now, True
            inst = self.instances[iid]
            inst.vballot, inst.status = drive.ballot, PREACCEPTED
            inst.batch, inst.seq, inst.deps = batch, seq, deps
            self._note(iid, batch, seq)
            self._persist(iid, inst)
            self._broadcast(EPreAccept(src=self.me, view=0, owner=iid[0], index=iid[1],
                                       ballot=drive.ballot, batch=batch, seq=seq, deps=deps))
            self._preaccept_progress(iid, drive, timed_out=False)
        else:
            # nobody in a majority has seen a value: none was chosen; a no-op fills the index
            drive.batch, drive.seq, drive.deps = (), 0, self._none_deps
            self._start_accept(iid, drive)

    # ------------------------------------------------------------------ timers
    def _retransmit(self) -> None:
        deadline = self.now - self.config.retransmit_us
        for iid in sorted(self._drives):
            drive = self._drives[iid]
            if drive.sent_at > deadline:
                continue
            drive.sent_at = self.now
            if drive.phase == _PRE and len(drive.replies) + 1 >= self.q:
                self._preaccept_progress(iid, drive, timed_out=True)
                continue
            message: PeerMessage
            if drive.phase == _PRE:
                inst = self.instances[iid]  # holds what we proposed in this phase
                message = EPreAccept(src=self.me, view=0, owner=iid[0], index=iid[1],
                                     ballot=drive.ballot, batch=inst.batch, seq=inst.seq,
                                     deps=inst.deps)
            elif drive.phase == _ACCEPT:
                message = self._accept_message(iid, drive)
            else:
                message = EPrepare(src=self.me, view=0, owner=iid[0], index=iid[1],
                                   ballot=drive.ballot)
            for peer in self._peers:
                if peer not in drive.replies:
                    self._send(peer, message)

    # ------------------------------------------------------------------ execution
    def _successors(self, iid: InstanceId, inst: Instance) -> list[InstanceId]:
        owner, index = iid
        out: list[InstanceId] = []
        if index - 1 >= self.exec_counts[owner]:
            out.append((owner, index - 1))
        for r, high in enumerate(inst.deps):
            if high >= self.exec_counts[r] and (r, high) != iid:
                out.append((r, high))
        return out

    def _execute(self) -> None:
        progress = True
        while progress:
            progress = False
            for owner in range(self.n):
                iid = (owner, self.exec_counts[owner])
                inst = self.instances.get(iid)
                if inst is not None and inst.status == COMMITTED and self._run_from(iid):
                    progress = True

    def _runnable(self, iid: InstanceId) -> Instance | None:
        inst = self.instances.get(iid)
        if inst is None or inst.status != COMMITTED:
            return None
        return inst

    def _run_from(self, root: InstanceId) -> bool:
        """Tarjan's algorithm from ``root``, iteratively: run every strongly connected
        component as soon as it is complete (its dependencies ran before it). False if an
        instance it reaches is not committed here yet (the components found so far ran)."""
        index_of: dict[InstanceId, int] = {}
        low: dict[InstanceId, int] = {}
        on_stack: set[InstanceId] = set()
        stack: list[InstanceId] = []
        counter = 0
        ran = False
        root_inst = self._runnable(root)
        if root_inst is None:
            return False
        work: list[tuple[InstanceId, list[InstanceId]]] = []

        def visit(iid: InstanceId, inst: Instance) -> None:
            nonlocal counter
            index_of[iid] = low[iid] = counter
            counter += 1
            stack.append(iid)
            on_stack.add(iid)
            work.append((iid, self._successors(iid, inst)))

        visit(root, root_inst)
        while work:
            iid, successors = work[-1]
            if successors:
                nxt = successors.pop()
                if nxt in index_of:
                    if nxt in on_stack and index_of[nxt] < low[iid]:
                        low[iid] = index_of[nxt]
                    continue
                inst = self.instances.get(nxt)
                if inst is not None and inst.executed:
                    continue
                if inst is None or inst.status != COMMITTED:
                    if self._exec_uncommitted:
                        continue  # unsafe: as if the dependency did not exist
                    self._wait_for(nxt)
                    return ran
                visit(nxt, inst)
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                if low[iid] < low[parent]:
                    low[parent] = low[iid]
            if low[iid] == index_of[iid]:
                component: list[InstanceId] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == iid:
                        break
                self._run_component(component)
                ran = True
        return ran

    def _run_component(self, component: list[InstanceId]) -> None:
        order = sorted(component, key=lambda iid: (self.instances[iid].seq, iid[0], iid[1]))
        for iid in order:
            inst = self.instances[iid]
            inst.executed = True
            for command in inst.batch:
                key = key_of(command)
                led_here = self._mine.pop(key, None) is not None
                if iid[0] == self.me and self._inflight.get(key) == iid[1]:
                    del self._inflight[key]
                if key in self._reads:
                    self._reads.discard(key)
                    self._out.reads.append(command)
                if key in self._unready and led_here:
                    self._unready.discard(key)
                    self._out.ready.append(command)
                self._out.apply.append(Execution(self.exec_slot, 0, command, led_here))
                self.exec_slot += 1
        for owner in sorted({iid[0] for iid in component}):
            while True:
                nxt = self.instances.get((owner, self.exec_counts[owner]))
                if nxt is None or not nxt.executed:
                    break
                self.exec_counts[owner] += 1

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
