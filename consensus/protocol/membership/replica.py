"""``MemberReplica``: a member of an SDPaxos cluster whose members change (see the package's
theory of operation). It runs one ``SDPaxosReplica`` core per epoch it votes in, and learns
the log from voters while it does not vote.

Inputs and outputs are the core's (``propose / read / read_stale / step / tick / ready /
advance``, snapshots, records); what this layer adds, and where:

* **Membership changes** are commands (``config.encode_change``). Every member applies the
  ones it executes, in log order (``_applied``): they never reach the state machine, and the
  member that led one answers its client with the result (``Ready.results``). A voter change
  closes the epoch: the core is told (``SDPaxosReplica.close_epoch``), its sequencer proposes a
  SEAL, and once the SEAL executes (``_maybe_switch``) the next epoch's core starts, at the
  global slot after the SEAL, with the next configuration's voters. What the old epoch never
  ordered of our clients' commands and reads is proposed again in the new one (not
  acknowledged before, so nothing is lost or done twice: sessions deduplicate).
* **Epochs on the wire**: a message's view says its epoch (``EPOCH_SHIFT``); ``step`` routes
  it to that epoch's core (earlier epochs' cores, retired, answer catch-up only, until a
  snapshot covers them) and
  ``check_frame`` admits it against that core with the sender's index in that epoch. In epoch
  0 of a cluster that never changed, member id = core index and nothing is translated: the
  wire, the records and the simulator's output are what they always were.
* **Records**: a ``ConfigRecord`` starts each epoch's records (written, with everything
  before it made durable, when the epoch starts); a restart replays epoch after epoch
  (``_recover``).
* **Learners** ask a voter for executed slots (``LearnRequest``/``LearnReply``,
  ``_ask_to_learn``, ``_on_learn_request``, ``_on_learn_reply``) or get its snapshot; the
  voter a learner learns from proposes its promotion once it is within ``PROMOTE_LAG`` slots.
  What a learner applies it logs (``LearnedRecord``, before the configuration of an epoch it
  starts): a restarted learner applies it again from its records (``_replay_learned``) and
  asks for what follows, instead of learning again everything since its last snapshot.
* **An epoch is left only on proof** (``_probe``, ``_on_probe_reply``): a message of a later
  epoch says only that its sender claims one; a member leaves its epoch when its core
  executes the SEAL (``_maybe_switch``) or when it holds the SEAL itself in the log a peer
  sends it. On such a message a voter keeps its core and asks every member it knows for the
  executed slots from its own frontier (``LearnRequest``); it retires its core to learn the
  rest of the epoch like a learner (``_behind``) only once an answer carries the SEAL, which
  it scans for batch after batch while answers show the log going on. A peer claiming a
  far-future epoch therefore costs a round of requests, no longer a voter (it made one drop
  its core and learn, as a learner, until the next epoch: one authenticated peer could take
  the quorum away). A snapshot of a later epoch is the other proof (the log up to it).
  Moving into another epoch, by either proof, ends a probe under way: its answer, the log
  from a slot of the epoch before, holds the SEAL that began ours, not the one ending it.
* **Where a member runs** (``info``: opaque here, the runtime's addresses) is published
  through the log: a voter whose configuration entry says otherwise than its own ``info``
  proposes a ``publish`` change (``_maybe_publish``, at most once a catch-up period), so the
  members a cluster started with (whose entries carry nothing) and a member started elsewhere
  than its ``add`` said are known to every replica, in log order.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from collections.abc import Iterable, Mapping, Sequence
from operator import attrgetter

from consensus.config import ProtocolConfig
from consensus.errors import LocalProtocolError
from consensus.messages import (
    SEAL,
    Batch,
    Catchup,
    CatchupMarkers,
    Command,
    ConfigRecord,
    LearnedRecord,
    LearnedSlot,
    LearnReply,
    LearnRequest,
    MemberEntry,
    PeerMessage,
    Record,
    SnapshotChunk,
)
from consensus.packed_batch import PackedBatch
from consensus.protocol.admission import Rejection, check_frame
from consensus.protocol.batch import CATCHUP_BYTES, batch_size
from consensus.protocol.membership.config import (
    EPOCH_SHIFT,
    MEMBER_OP,
    PROMOTE,
    PUBLISH,
    Change,
    Configuration,
    Member,
    apply_change,
    bootstrap,
    decode_change,
    encode_change,
    next_epoch,
)
from consensus.protocol.ready import Failure, Outgoing, Ready, SlotBatch
from consensus.protocol.sdpaxos.instances import NEVER, NO_SLOT
from consensus.protocol.sdpaxos.replica import SDPaxosReplica
from consensus.protocol.status import CoreStatus
from consensus.protocol.types import Role, SnapshotMeta

__all__ = ["LEARN_BATCH", "PROMOTE_LAG", "MemberReplica", "config_of", "record_of"]

#: most slots one LearnReply carries (and ``CATCHUP_BYTES`` of commands)
LEARN_BATCH = 256
#: a learner this close to the sequencer's execution (in slots) is promoted
PROMOTE_LAG = 2 * LEARN_BATCH
#: the client id of the membership changes a replica proposes itself (a promotion)
SELF_CLIENT = 0
#: the protocol name admission checks messages against (``consensus.protocol.admission``)
PROTOCOL = "sdpaxos"


def record_of(config: Configuration) -> ConfigRecord:
    return ConfigRecord(
        epoch=config.epoch, base=config.base, next_id=config.next_id, voters=config.voters,
        members=tuple(MemberEntry(id=m.id, incarnation=m.incarnation, voter=m.voter,
                                  info=m.info, replaces=m.replaces) for m in config.members),
        closing=config.closing, closing_member=config.closing_member,
    )


def config_of(record: ConfigRecord) -> Configuration:
    return Configuration(
        epoch=record.epoch, base=record.base, voters=record.voters,
        members=tuple(Member(m.id, m.incarnation, m.voter, m.info, m.replaces)
                      for m in record.members),
        next_id=record.next_id, closing=record.closing, closing_member=record.closing_member,
    )


#: messages between members by id, whatever their epochs (see ``check_frame``)
_BY_MEMBER_ID = (LearnRequest, LearnReply, SnapshotChunk)

#: a command's op (what ``_applied`` looks for membership changes in)
_OP_OF = attrgetter("op")


def _may_change_members(batch: SlotBatch) -> bool:
    """Whether a command of ``batch`` may be a membership change (``MEMBER_OP``): one C pass
    over its bytes as they came in (a packed batch's ops are in them verbatim), or over its
    ops (this runs for every slot executed). False for certain; true may be a false alarm."""
    commands = batch.commands
    if type(commands) is PackedBatch:
        return MEMBER_OP in commands.packed
    return MEMBER_OP in b"".join(map(_OP_OF, commands))


@functools.lru_cache(maxsize=64)
def _ids_are_indexes(voters: tuple[int, ...]) -> bool:
    """Whether the voters' member ids are their indexes (nothing to translate: every turn
    asks, and a configuration's voters rarely change)."""
    return voters == tuple(range(len(voters)))


def epoch_of(view: int) -> int:
    return view >> EPOCH_SHIFT


class MemberReplica:
    """One member: its current epoch's core (None while it learns, or once removed)."""

    def __init__(
        self,
        config: ProtocolConfig,
        me: int,
        *,
        recovered: Sequence[Record] = (),
        rng: random.Random,
        snapshot: SnapshotMeta | None = None,
        contacts: Sequence[int] = (),
        info: str = "",
    ) -> None:
        """``config``: the protocol settings, ``config.replicas`` the bootstrap voters (ids
        0..N-1); a member with a higher id joins as a learner. ``contacts``: members a
        learner asks first (the bootstrap voters may be long gone). ``info``: where this
        member runs, published through the log while a voter (``_maybe_publish``; "" never
        publishes)."""
        self.contacts = tuple(contacts)
        self.info = info
        self.protocol = config
        self.me = me
        self.rng = rng
        self.now = 0
        self.config = bootstrap(config.replicas)
        self.core: SDPaxosReplica | None = None
        #: earlier epochs' configurations and cores, oldest first, until a snapshot covers
        #: them: they answer catch-up of members behind and learners
        self.retired: list[tuple[Configuration, SDPaxosReplica]] = []
        #: learning: the next global slot to execute, the voter asked, when, and its answer
        self.learned = 0
        self._learn_peer = 0
        self._learn_asked_at = NEVER
        self.learn_lag = 0
        #: (sequencer) when we last proposed a learner's promotion
        self._promoted_at = NEVER
        #: when we last proposed our own ``info`` (``_maybe_publish``)
        self._published_at = NEVER
        #: the sequence number of the last change this member proposed itself
        self._own_seq = -1
        self.out = Ready()
        self._handed: tuple[SDPaxosReplica | None, Ready] | None = None
        #: a learner that became a voter waits for its snapshot (``Ready.snapshot_now``) to
        #: be durable before its core starts: what it learned is in no record of its own
        self._awaiting_snapshot = False
        #: after a restart, later epochs we have records of, waiting for the one before to
        #: be learned to its end (``_resume_pending``)
        self._pending_epochs: list[tuple[Configuration, list[Record]]] = []
        #: the broken variant ``epoch_at_change``: the slot its epoch was cut at
        self._cut_at = NO_SLOT
        #: looking for the proof that our epoch ended (``_probe``): when we last asked, and
        #: the global slot whose answers we take (NO_SLOT: not looking)
        self._probed_at = NEVER
        self._probe_slot = NO_SLOT
        self._recover(recovered, snapshot)

    # ------------------------------------------------------------------ who we are
    @property
    def view(self) -> int:
        return self.core.view if self.core is not None else self.config.start_view

    @property
    def exec_slot(self) -> int:
        """Every global slot below this one was applied."""
        if self.core is not None:
            return self.config.base + self.core.exec_slot
        return self.learned

    @property
    def role(self) -> Role:
        return self.core.role if self.core is not None else Role.FOLLOWER

    @property
    def voting(self) -> bool:
        return self.core is not None

    @property
    def member(self) -> bool:
        """The configuration we know names us (a joining member: not yet)."""
        return self.config.member(self.me) is not None

    @property
    def removed(self) -> bool:
        """We were a member and a change removed us (ids are never reused: for good)."""
        return self.me < self.config.next_id and not self.member

    @property
    def sequencer(self) -> int:
        """The member id of the sequencer of our view."""
        if self.core is None:
            return self.config.voters[0]
        return self.config.voters[self.core.sequencer]

    def executed_through(self) -> int:
        return self.exec_slot - 1

    def status(self) -> CoreStatus:
        """The epoch core's status in member ids and global slots; a member that does not
        vote is a learner (or removed) that knows no view, sequencer or peers' positions."""
        config = self.config
        if self.core is None:
            return CoreStatus(
                role=Role.REMOVED if self.removed else Role.LEARNER, view=self.view,
                executed=self.exec_slot, voters=config.voters, epoch=config.epoch, voting=False,
            )
        inner = self.core.status()
        voters, base = config.voters, config.base
        return dataclasses.replace(
            inner, executed=base + inner.executed, voters=voters, epoch=config.epoch,
            leader=None if inner.leader is None else voters[inner.leader],
            peer_executed={voters[peer]: base + at for peer, at in inner.peer_executed.items()},
            lease_granted_to=(None if inner.lease_granted_to is None
                              else voters[inner.lease_granted_to]),
        )

    def committed_log(self) -> Mapping[int, Batch]:
        if self.core is None:
            return {}
        base = self.config.base
        return {base + slot: batch for slot, batch in self.core.committed_log().items()}

    # ------------------------------------------------------------------ inputs
    def propose(self, command: Command, now: int) -> None:
        self.now = now
        change = decode_change(command.op)
        if change is not None:
            _, result = apply_change(self.config, change)
            if result.startswith("refused"):  # refused now rather than after ordering it
                self.out.failed.append(Failure(command, True, result))
                return
        if self.core is None:
            self.out.failed.append(Failure(command, False, self._not_voting()))
            return
        self.core.propose(command, now)

    def read(self, command: Command, now: int) -> None:
        self.now = now
        if self.core is None:
            self.out.failed.append(Failure(command, False, self._not_voting()))
            return
        self.core.read(command, now)

    def read_stale(self, command: Command, now: int) -> None:
        self.now = now
        if self.core is None:
            self.out.reads.append(command)
        else:
            self.core.read_stale(command, now)

    def step(self, message: PeerMessage, now: int) -> None:
        self.now = now
        if isinstance(message, LearnRequest):
            self._on_learn_request(message)
            return
        if isinstance(message, LearnReply):
            self._on_learn_reply(message)
            return
        epoch = epoch_of(message.view)
        if self.core is not None and epoch == self.config.epoch:
            self.core.step(message, now)
        elif epoch > self.config.epoch:
            if "trust_epoch_claims" in self.protocol.unsafe:
                self._behind()  # broken on purpose: one peer's word moves us on
            else:
                self._probe()
        elif isinstance(message, Catchup | CatchupMarkers):
            found = self._retired_epoch(epoch)
            if found is not None:
                found[1].step(message, now)

    def tick(self, now: int) -> None:
        self.now = now
        if self.core is not None:
            self._maybe_publish()
            self.core.tick(now)
        elif not self.removed and not self._awaiting_snapshot:
            self._ask_to_learn(again=False)

    def check_frame(self, messages: Iterable[PeerMessage], sender: int) -> Rejection | None:
        """Admission (``consensus.protocol.admission``) of a frame from member ``sender``:
        each message against the core of its epoch, with the sender's index there."""
        if type(messages) is not list and not isinstance(messages, Sequence):
            messages = tuple(messages)
        core, config = self.core, self.config
        index = config.index_of(sender)
        if core is None or index is None:
            return self._check_each(messages, sender)
        epoch = config.epoch
        for message in messages:
            if isinstance(message, _BY_MEMBER_ID) or message.view >> EPOCH_SHIFT != epoch:
                return self._check_each(messages, sender)
        # the common case, every message of our epoch: the whole frame at once, which is
        # what ``_check_each`` does message by message (the receiver's bounds taken once per
        # frame instead of once per message)
        return check_frame(messages, core, len(config.voters), sender=index, protocol=PROTOCOL)

    def _check_each(self, messages: Iterable[PeerMessage], sender: int) -> Rejection | None:
        """``check_frame`` message by message, each against the core of its epoch."""
        for message in messages:
            if isinstance(message, _BY_MEMBER_ID):
                # between members by id (a snapshot goes to learners too): ids are below
                # next_id, whatever the epoch; and their view is the sender's epoch's, which
                # says nothing here (a learner has none)
                ids = max(self.config.next_id, self.protocol.replicas, sender + 1, self.me + 1)
                checked = dataclasses.replace(message, view=min(message.view, self.view))
                rejection = check_frame((checked,), self, ids, sender=sender,
                                        protocol=PROTOCOL)
            else:
                epoch = epoch_of(message.view)
                config, core = self.config, self.core
                found = self._retired_epoch(epoch)
                if found is not None:
                    config, core = found
                if epoch > self.config.epoch:
                    continue  # a later epoch's: ``step`` only notes we are behind
                if core is None or epoch != config.epoch:
                    return Rejection("view", f"{type(message).__name__} of epoch {epoch}, "
                                     f"this member is in epoch {self.config.epoch}")
                index = config.index_of(sender)
                if index is None:
                    return Rejection("sender", f"member {sender} does not vote in epoch "
                                     f"{epoch}")
                rejection = check_frame((message,), core, len(config.voters), sender=index,
                                        protocol=PROTOCOL)
            if rejection is not None:
                return rejection
        return None

    # ------------------------------------------------------------------ output
    def ready(self) -> Ready:
        if self._handed is not None:
            raise LocalProtocolError("ready() called again before advance()")
        core = self.core
        if core is None:
            ready, self.out = self.out, Ready()
        else:
            ready = core.ready()
            self._translate(ready, self.config)
            ready.apply = self._applied(ready.apply, ready)
            self._merge_own(ready)
            self._maybe_switch(ready)
        self._drain_retired(ready, core)
        self._handed = (core, ready)
        return ready

    def _drain_retired(self, ready: Ready, handing: SDPaxosReplica | None) -> None:
        """What retired cores answered (catch-up) leaves with this turn (``handing``: the
        core whose own output this turn is, retired by it or not)."""
        for config, old in self.retired:
            if old is handing:
                continue
            out = old.ready()
            if out.send or out.send_after_persist or out.snapshot_requests:
                self._translate(out, config)
                ready.send += out.send + out.send_after_persist
                ready.snapshot_requests += out.snapshot_requests
            old.advance(out)

    def advance(self, ready: Ready) -> None:
        if self._handed is None or ready is not self._handed[1]:
            raise LocalProtocolError("advance() with a Ready this core did not hand out")
        core, inner = self._handed
        self._handed = None
        if core is not None:
            core.advance(inner)

    def _translate(self, ready: Ready, config: Configuration) -> None:
        """Core indexes to member ids, epoch slots to global slots (nothing in an unchanged
        epoch 0: ids are indexes and slots are global there)."""
        voters, base = config.voters, config.base
        if not _ids_are_indexes(voters):
            ready.send = [Outgoing(voters[o.to], o.message) for o in ready.send]
            ready.send_after_persist = [
                Outgoing(voters[o.to], o.message) for o in ready.send_after_persist
            ]
            ready.snapshot_requests = [voters[i] for i in ready.snapshot_requests]
        if base:
            ready.apply = [SlotBatch(slot + base, offset, commands, led_here)
                           for slot, offset, commands, led_here in ready.apply]

    def _merge_own(self, ready: Ready) -> None:
        """What this layer produced since the last turn goes out with the core's, first."""
        if not self.out.is_empty():  # (mostly empty: no new one each turn then)
            own, self.out = self.out, Ready()
            _extend(ready, own, first=True)

    def _absorb(self, core: SDPaxosReplica) -> None:
        """Take ``core``'s turn into our own output (a restart's replay, or the last turn
        of a core we leave), applying its membership changes."""
        ready = core.ready()
        self._translate(ready, self.config)
        ready.apply = self._applied(ready.apply, ready)
        ready.persist += ready.log  # durable with our next turn's records, like them
        ready.log = []
        _extend(self.out, ready)
        core.advance(ready)

    # ------------------------------------------------------------------ membership changes
    def _applied(self, batches: list[SlotBatch], ready: Ready) -> list[SlotBatch]:
        """Take the membership changes out of what executes, applying each in order (a
        batch that holds one goes on as the runs of commands around it)."""
        if not any(map(_may_change_members, batches)):
            return batches  # none (the common case: nothing built)
        kept: list[SlotBatch] = []
        for batch in batches:
            slot, offset, commands, led_here = batch
            if not _may_change_members(batch):
                kept.append(batch)
                continue
            start = 0  # the first command of the run not yet kept
            for index, command in enumerate(commands):
                change = decode_change(command.op)
                if change is None:
                    continue
                if index > start:
                    kept.append(SlotBatch(slot, offset + start, commands[start:index], led_here))
                start = index + 1
                self.config, result = apply_change(self.config, change)
                if led_here:
                    ready.results.append((command, result.encode()))
                if self.config.closing and self.core is not None:
                    self.core.close_epoch()
                    if "epoch_at_change" in self.protocol.unsafe:
                        # broken on purpose: the epoch ends here, whatever was ordered after it
                        self._cut_at = slot - self.config.base
                        return kept
            if start < len(commands):
                kept.append(batch if not start else
                            SlotBatch(slot, offset + start, commands[start:], led_here))
        return kept

    def _maybe_switch(self, ready: Ready) -> None:
        """The SEAL executed: start the next epoch (see the module header)."""
        core = self.core
        if core is not None and self._cut_at != NO_SLOT:
            core.sealed_at, self._cut_at = self._cut_at, NO_SLOT  # (epoch_at_change)
        if core is None or core.sealed_at == NO_SLOT:
            return
        seal = self.config.base + core.sealed_at
        commands, reads = core.carry_over()
        # everything the old epoch executed is durable before the new one's first record
        ready.persist += ready.log
        ready.log = []
        self.retired.append((self.config, core))
        self._start_epoch(next_epoch(self.config, seal), ready.persist)
        if self.core is not None:
            for command in commands:
                self.core.propose(command, self.now)
            for command in reads:
                self.core.read(command, self.now)
        else:
            why = self._not_voting()
            ready.failed += [Failure(c, False, why) for c in (*commands, *reads)]

    def _start_epoch(self, config: Configuration, persist: list[Record]) -> None:
        voted = self.core is not None
        self._probe_slot = NO_SLOT
        self.config = config
        self.learned = config.base
        if not voted and config.index_of(self.me) is not None:
            self._awaiting_snapshot = True  # the core starts once it is durable
            self.out.snapshot_now = True
            return
        persist.append(record_of(config))
        self.core = self._core_for(config, recovered=(), snapshot=None)

    def _core_for(
        self, config: Configuration, *, recovered: Sequence[Record],
        snapshot: SnapshotMeta | None,
    ) -> SDPaxosReplica | None:
        index = config.index_of(self.me)
        if index is None:
            return None
        protocol = self.protocol
        if len(config.voters) != protocol.replicas or config.epoch:
            protocol = dataclasses.replace(protocol, replicas=len(config.voters), leader=0,
                                           preference=())
        return SDPaxosReplica(protocol, index, recovered=recovered, rng=self.rng,
                              snapshot=snapshot, start_view=config.start_view)

    def _behind(self) -> None:
        """A later epoch's message: our epoch ended without us (its SEAL is chosen: the next
        epoch's cores start only after it executed). It will never choose anything again,
        so our core of it is done with — we may even be stuck in one of its views that
        nobody serves any more. Learn the rest of it from those who executed it, like a
        learner; what the core still had to say (records first) goes out now, and the
        commands it never ordered fail (not acknowledged: the clients retry)."""
        core = self.core
        if core is None:
            return
        self._absorb(core)
        if core.sealed_at != NO_SLOT:  # that turn executed the SEAL after all
            self._maybe_switch(self.out)
            return
        commands, reads = core.carry_over()
        why = "the epoch ended before this replica ordered it: retry"
        self.out.failed += [Failure(c, False, why) for c in (*commands, *reads)]
        self.retired.append((self.config, core))
        self.core = None
        self.learned = self.config.base + core.exec_slot
        self._ask_to_learn(again=True)

    def _retired_epoch(self, epoch: int) -> tuple[Configuration, SDPaxosReplica] | None:
        for found in self.retired:
            if found[0].epoch == epoch:
                return found
        return None

    def _drop_retired(self, slot: int) -> None:
        """A durable snapshot covers everything below global ``slot``: the epochs that ended
        there need no core any more (a peer that far behind gets the snapshot)."""
        ends = [config.base for config, _ in self.retired[1:]] + [self.config.base]
        self.retired = [kept for kept, end in zip(self.retired, ends, strict=False) if end > slot]

    def _not_voting(self) -> str:
        if self.removed:
            return f"member {self.me} was removed from the cluster"
        return f"member {self.me} is a learner (it does not vote yet): ask a voter"

    # ------------------------------------------------------------------ learners
    def _ask_to_learn(self, *, again: bool) -> None:
        if not again and self.now - self._learn_asked_at < self.protocol.catchup_us:
            return
        # voters first, then anyone we know of (a learner of our epoch may be a voter of the
        # next, whose snapshot covers what we miss)
        known = (*self.contacts, *self.config.voters, *(m.id for m in self.config.members))
        peers = [p for p in dict.fromkeys(known) if p != self.me]
        if not again:  # no answer in time: ask another one
            self._learn_peer += 1
        self._learn_asked_at = self.now
        peer = peers[self._learn_peer % len(peers)]
        self.out.send.append(Outgoing(peer, LearnRequest(
            src=self.me, view=self.config.start_view, slot=self.learned)))

    def _on_learn_request(self, msg: LearnRequest) -> None:
        # (anyone the transport admitted may learn: a member being added, or one that was
        # removed and lags; what they get is the log every member has)
        config, core = self.config, self.core
        for old, old_core in reversed(self.retired):
            if msg.slot >= old.base and msg.slot < config.base:
                config, core = old, old_core
                break
        if core is None or msg.slot < config.base:
            self.out.snapshot_requests.append(msg.src)
            return
        start = msg.slot - config.base
        if start < core.compacted:
            self.out.snapshot_requests.append(msg.src)
            return
        slots: list[LearnedSlot] = []
        budget = CATCHUP_BYTES
        for slot in range(start, min(core.exec_slot, start + LEARN_BATCH)):
            found = core.executed_slot(slot)
            if found is None or budget <= 0:
                break
            owner, batch = found
            budget -= batch_size(batch)
            slots.append(LearnedSlot(seal=owner == SEAL, batch=batch))
        if not slots and msg.slot < self.exec_slot:
            # we are past it but our core of that epoch is not (we learned its end from a
            # peer, and snapshotted when we started the next): our snapshot covers it
            self.out.snapshot_requests.append(msg.src)
            return
        self.out.send.append(Outgoing(msg.src, LearnReply(
            src=self.me, view=self.view, start=msg.slot, executed=self.exec_slot,
            slots=tuple(slots))))
        self._maybe_promote(msg.src, msg.slot)

    def _maybe_promote(self, learner: int, slot: int) -> None:
        """The voter a learner learns from proposes its promotion once it caught up (one
        proposal per catch-up period; a second one executed is refused, harmlessly)."""
        member = self.config.member(learner)
        core = self.core
        if (member is None or member.voter or self.config.closing or core is None
                or self.exec_slot - slot > PROMOTE_LAG
                or self.now - self._promoted_at < self.protocol.catchup_us):
            return
        self._promoted_at = self.now
        self._propose_own(core, Change(PROMOTE, learner))

    def _maybe_publish(self) -> None:
        """A voter whose configuration entry holds another ``info`` than its own proposes
        its own (once a catch-up period: a proposal lost with an epoch is made again)."""
        me = self.config.member(self.me)
        core = self.core
        if (not self.info or me is None or me.info == self.info or core is None
                or self.now - self._published_at < self.protocol.catchup_us):
            return
        self._published_at = self.now
        change = Change(PUBLISH, self.me, info=self.info)
        if "publish_local" in self.protocol.unsafe:
            # broken on purpose: the member sets its own entry, outside the log's order
            self.config, _ = apply_change(self.config, change)
            return
        self._propose_own(core, change)

    def _propose_own(self, core: SDPaxosReplica, change: Change) -> None:
        """Propose a change this member makes itself (its own client: ``SELF_CLIENT``,
        sequence numbers from its clock, never repeated)."""
        self._own_seq = max(self.now, self._own_seq + 1)
        core.propose(Command(client_id=SELF_CLIENT, seq=self._own_seq,
                             op=encode_change(change), keys=()), self.now)

    def _on_learn_reply(self, msg: LearnReply) -> None:
        if self.core is not None:
            self._on_probe_reply(msg)
            return
        if self._awaiting_snapshot or msg.start != self.learned:
            return  # a stale answer
        self.learn_lag = max(0, msg.executed - self.learned)
        # what it applies is logged (before the configurations of the epochs it starts): a
        # restart applies it again from there, it does not learn it again
        mark = len(self.out.persist)
        learned, stopped = self._learn(msg.slots, self.out.persist)
        if learned:
            self.out.persist.insert(mark, LearnedRecord(start=msg.start,
                                                        slots=msg.slots[:learned]))
        if not stopped and msg.slots and msg.executed > self.learned:
            self._ask_to_learn(again=True)

    def _learn(self, slots: Sequence[LearnedSlot], persist: list[Record]) -> tuple[int, bool]:
        """Apply learned ``slots`` from ``self.learned`` on, starting the epochs their SEALs
        begin (their configurations go to ``persist``); how many it took, and whether it
        stopped at a SEAL after which this member votes (its core takes it from there)."""
        for taken, learned in enumerate(slots, 1):
            slot = self.learned
            self.learned += 1
            if learned.seal:
                seal_config = next_epoch(self.config, slot)
                if self._pending_epochs and self._pending_epochs[0][0].epoch == (
                    seal_config.epoch
                ):
                    # we voted in that epoch before a restart: its core resumes from our
                    # records (``_resume_pending``)
                    self._resume_epoch(*self._pending_epochs.pop(0))
                    self._resume_pending()
                    return taken, True
                self._start_epoch(seal_config, persist)
                if self.core is not None or self._awaiting_snapshot:
                    return taken, True  # a voter now: its core takes it from here
                continue
            self.out.apply += self._applied([SlotBatch(slot, 0, learned.batch, False)],
                                            self.out)
        return len(slots), False

    def _replay_learned(self, records: Sequence[Record]) -> None:
        """A restarted learner: apply again what its records say it learned (after its
        snapshot), so it goes on learning after it. Their epochs' configurations are
        among the records already (nothing is logged again)."""
        for record in records:
            if not isinstance(record, LearnedRecord):
                continue
            end = record.start + len(record.slots)
            if self.core is not None or self._awaiting_snapshot or end <= self.learned:
                continue
            if record.start > self.learned:
                return  # a gap (not written by this build): learn the rest from peers
            self._learn(record.slots[self.learned - record.start:], [])

    # ------------------------------------------------------------------ epoch proofs
    def _probe(self) -> None:
        """A message of a later epoch: ask every member we know for the executed slots from
        our frontier, looking for the SEAL of our epoch (at most once per catch-up period)."""
        if self.core is None or self.now - self._probed_at < self.protocol.catchup_us:
            return
        self._probed_at = self.now
        self._probe_slot = self.exec_slot
        known = (*self.contacts, *self.config.voters, *(m.id for m in self.config.members))
        request = LearnRequest(src=self.me, view=self.config.start_view, slot=self._probe_slot)
        self.out.send += [Outgoing(peer, request) for peer in dict.fromkeys(known)
                          if peer != self.me]

    def _on_probe_reply(self, msg: LearnReply) -> None:
        """An answer to ``_probe``: if its slots hold our epoch's SEAL, the epoch ended (the
        log says so, not a claim): learn the rest of it; if it shows the log going on past
        them, look on from there (asking its sender)."""
        if self._probe_slot == NO_SLOT or msg.start != self._probe_slot:
            return  # not what we asked for (or we moved on since: a new epoch ends a probe)
        if any(learned.seal for learned in msg.slots):
            self._probe_slot = NO_SLOT
            self._behind()
            if self.core is None and msg.start == self.learned:
                self._on_learn_reply(msg)  # (what it carries is the log from our frontier)
            return
        end = msg.start + len(msg.slots)
        if msg.slots and msg.executed > end and epoch_of(msg.view) > self.config.epoch:
            self._probe_slot = end
            self.out.send.append(Outgoing(msg.src, LearnRequest(
                src=self.me, view=self.config.start_view, slot=end)))

    # ------------------------------------------------------------------ snapshots
    def snapshot_meta(self) -> SnapshotMeta:
        config = None if self.config == bootstrap(self.protocol.replicas) else (
            record_of(self.config))
        if self.core is None:
            # a learner knows the slots it applied, not their owners: its counts are exact
            # only at its epoch's base (none of the epoch applied); past it they are unknown
            # (no counts), and no voter of the epoch may start its core from them
            # (``accepts_snapshot``): zeros made one execute an owner's older instances again
            counts = ((0,) * len(self.config.voters)
                      if self.learned == self.config.base or "learner_counts_zero" in (
                          self.protocol.unsafe) else ())
            return SnapshotMeta(self.learned, counts, config)
        inner = self.core.snapshot_meta()
        return SnapshotMeta(self.config.base + inner.slot, inner.exec_counts, config)

    def accepts_snapshot(self, meta: SnapshotMeta) -> bool:
        """Whether a peer's snapshot at ``meta`` is of use here (ahead of us, and of our
        epoch or a later one, with one count per voter of its epoch: a learner's past its
        epoch's base has none, and only learners take it)."""
        config = config_of(meta.config) if meta.config is not None else (
            bootstrap(self.protocol.replicas))
        if meta.slot <= self.exec_slot or config.epoch < self.config.epoch:
            return False
        return len(meta.exec_counts) == len(config.voters) or config.index_of(self.me) is None

    def install_snapshot(self, meta: SnapshotMeta) -> list[Record]:
        config = config_of(meta.config) if meta.config is not None else (
            bootstrap(self.protocol.replicas))
        inner = SnapshotMeta(meta.slot - config.base, meta.exec_counts)
        if "apply_covered" not in self.protocol.unsafe:
            self._covered(meta.slot)
        if self.core is not None and config.epoch == self.config.epoch:
            self.config = config
            installed = self.core.install_snapshot(inner)
            self._closing_known()
            if "snapshot_log_unmarked" in self.protocol.unsafe:
                return installed  # broken on purpose: read back as epoch 0's records
            # the records rewrite the log: like every rewritten log (``durable_records``)
            # they start with the epoch's configuration, or a restart takes them for epoch
            # 0's, skips them, and our core of this epoch comes back from nothing (its
            # promises and the NewView it accepted lost: a sequencer that counted that
            # acceptance never sends it again, and we wait for it in its view for good)
            return [*self._epoch_marker(), *installed]
        if self.core is not None:
            self.retired.append((self.config, self.core))
        if "probe_survives_snapshot" not in self.protocol.unsafe:
            # a probe looks for the end of the epoch it was asked in (``_probe``): in a later
            # one its answer, the log from a slot before our new base, holds the SEAL that
            # began it, and taken for the end of ours it retired the core we vote with
            self._probe_slot = NO_SLOT
        self.config = config
        self.learned = meta.slot
        self.core = self._core_for(config, recovered=(), snapshot=inner)
        if "stale_awaiting_core" not in self.protocol.unsafe:
            # the snapshot is what a promoted voter's core was waiting for: started now, it
            # must not be started again (``durable_records``) from nothing, its votes lost;
            # so no core exists while one is awaited
            self._awaiting_snapshot = False
        records: list[Record] = [record_of(config)]
        if self.core is not None:
            records += self.core.durable_records()
        self._closing_known()
        return records

    def _covered(self, slot: int) -> None:
        """A snapshot at global ``slot`` replaces the state machine: what this turn was to
        apply below it (an epoch's last slots taken from its core as we left it, ``_behind``,
        or slots a learner learned) is in it, and applied on top of it would run twice. Our
        own clients' commands among it fail (not known here: a retry gets the first result
        from the session table), like the core's own (``Snapshots._drop_below``)."""
        why = "decided while this replica caught up from a snapshot: retry it"
        covered = [batch for batch in self.out.apply if batch.slot < slot]
        if covered:
            self.out.apply = [batch for batch in self.out.apply if batch.slot >= slot]
            self.out.failed += [Failure(command, False, why) for batch in covered
                                if batch.led_here for command in batch.commands
                                if not command.blind]

    def _closing_known(self) -> None:
        """A configuration taken from a snapshot may hold a voter change we never executed
        ourselves: our core must still close the epoch (as sequencer, propose the SEAL)."""
        if self.config.closing and self.core is not None and not self.core.closing:
            self.core.close_epoch()

    def compact(self, meta: SnapshotMeta) -> list[Record]:
        """Forget what the snapshot at ``meta`` (the previous one) covers; one of an earlier
        epoch covers nothing of the current core (it starts after it)."""
        self._drop_retired(meta.slot)
        epoch = meta.config.epoch if meta.config is not None else 0
        if self.core is None or epoch != self.config.epoch:
            return self.durable_records()
        inner = SnapshotMeta(meta.slot - self.config.base, meta.exec_counts)
        return [*self._epoch_marker(), *self.core.compact(inner)]

    def durable_records(self) -> list[Record]:
        """What a rewritten log holds: after a snapshot (the node rewrites its log then), a
        promoted learner's core starts from it."""
        if self._awaiting_snapshot:  # (never with a core: installing a snapshot ends it)
            self._awaiting_snapshot = False
            inner = SnapshotMeta(self.learned - self.config.base, (0,) * len(self.config.voters))
            self.core = self._core_for(self.config, recovered=(), snapshot=inner)
        if self.core is None:
            return self._epoch_marker()
        return [*self._epoch_marker(), *self.core.durable_records()]

    def _epoch_marker(self) -> list[Record]:
        """A rewritten log starts with its epoch's configuration (none in epoch 0)."""
        return [record_of(self.config)] if self.config.epoch else []

    # ------------------------------------------------------------------ restart
    def _recover(self, recovered: Sequence[Record], snapshot: SnapshotMeta | None) -> None:
        """Rebuild from the snapshot and the records: epoch after epoch (a ``ConfigRecord``
        starts each; records before the first are epoch 0's), each core replaying what it
        executed (the applies come out in the first ``ready``). A member whose id is not a
        voter of its configuration learns (a new member has no records at all)."""
        if snapshot is not None:
            if snapshot.config is not None:
                self.config = config_of(snapshot.config)
            self.learned = snapshot.slot
        segments: list[tuple[ConfigRecord | None, list[Record]]] = [(None, [])]
        for record in recovered:
            if isinstance(record, ConfigRecord):
                segments.append((record, []))
            else:
                segments[-1][1].append(record)
        for position, (marker, records) in enumerate(segments):
            epoch = 0 if marker is None else marker.epoch
            if epoch < self.config.epoch:
                continue  # an epoch the snapshot is past
            if marker is not None and epoch > self.config.epoch:
                # (markers are in epoch order: the loop stops at the first gap)
                self._pending_epochs = [
                    (config_of(m), r) for m, r in segments[position:] if m is not None
                ]
                self._resume_pending()
                return
            inner = None
            if snapshot is not None:
                inner = SnapshotMeta(snapshot.slot - self.config.base, snapshot.exec_counts)
            voted = [r for r in records if not isinstance(r, LearnedRecord)]
            self.core = self._core_for(self.config, recovered=voted, snapshot=inner)
            if self.core is not None:
                self._replay_core()
            else:  # a learner of this epoch: what it learned is in its records
                self._replay_learned(records)
        self._closing_known()

    def _resume_pending(self) -> None:
        """Start the epochs we have records of, in turn, while the one before ended here. If
        it did not (its last executed slots were lost with an unsynced tail, or we learned
        it without records of our own), learn the rest of it first: ``_on_learn_reply``
        comes back here at its SEAL."""
        while self._pending_epochs:
            core = self.core
            if core is None or core.sealed_at == NO_SLOT:
                if core is not None:
                    self.retired.append((self.config, core))
                    self.learned = self.config.base + core.exec_slot
                    self.core = None
                return  # learn from peers (``tick``) up to the next epoch
            self.retired.append((self.config, core))
            self._resume_epoch(*self._pending_epochs.pop(0))

    def _resume_epoch(self, config: Configuration, records: list[Record]) -> None:
        """Start ``config``'s core from our records of it (a restart), replaying them (what
        we learned of it, if we do not vote in it)."""
        self.config, self.learned = config, config.base
        voted = [r for r in records if not isinstance(r, LearnedRecord)]
        self.core = self._core_for(config, recovered=voted, snapshot=None)
        if self.core is not None:
            self._replay_core()
        else:
            self._replay_learned(records)

    def _replay_core(self) -> None:
        """Drain a restarted core's replay into our own output, applying its changes."""
        core = self.core
        assert core is not None
        self._absorb(core)
        if core.sealed_at != NO_SLOT:  # (the next epoch's records, if any, follow)
            self.learned = self.config.base + core.exec_slot


def _extend(into: Ready, extra: Ready, *, first: bool = False) -> None:
    """Add ``extra``'s output to ``into``'s, after it (``first``: before it)."""
    for name in ("persist", "log", "send", "send_after_persist", "apply", "ready", "reads",
                 "failed", "results", "snapshot_requests"):
        mine, theirs = getattr(into, name), getattr(extra, name)
        setattr(into, name, theirs + mine if first else mine + theirs)
    into.snapshot_now = into.snapshot_now or extra.snapshot_now
