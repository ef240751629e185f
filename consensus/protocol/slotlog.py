"""What the baseline cores (Multi-Paxos, Mencius) share: a log of global slots, one Paxos
instance per slot, whose value is a batch of client commands (``()``: a no-op).

Theory of operation
-------------------
``SlotLogCore`` is the acceptor, learner and executor; a subclass is the proposer and decides
who proposes what in which slot (Multi-Paxos: the stable leader, in slot order; Mencius: the
slot's round-robin owner). In the normal case every slot runs at its proposer's pre-prepared
ballot ``ballot_of(0, proposer)``, with no Prepare phase; failover (a Multi-Paxos takeover, a
Mencius revocation) runs Prepare at a higher ballot and is the subclass's business, which
checks its promises before calling ``_accept``.

* **Accept.** ``_accept`` stores a value at a ballot and queues a ``SlotAcceptedRecord``; the
  acknowledgement the subclass then sends leaves through ``send_after_persist`` (``_send``),
  so the driver makes the record durable first. A duplicate is acknowledged again without a
  new record (its first acknowledgement may have been lost).
* **Learn.** A slot is chosen when a majority accepted it; its proposer counts the
  acknowledgements and broadcasts ``PaxosCommit`` (``batch`` None for peers that hold the
  value). ``_learn`` takes commits from anyone: a chosen value is a fact.
* **Execute.** Slot ``s`` runs once it is chosen and every slot below ran. Commands that
  arrived here from a client are ``led_here``; their *ready* report (``Ready.ready``) comes
  from the subclass's rule, or at the latest when they execute here. A linearizable read
  (``read``) is put through the log like any command and served (``Ready.reads``) once its slot
  executed here.
* **Catch up.** Every replica heartbeats its execution frontier to every other
  (``Heartbeat`` with ``view`` 0 and no lease). A replica that knows of a slot it cannot run,
  or hears of a peer that executed further, and has made no progress for ``catchup_us``, asks
  a peer for the commits (``CatchupMarkers``); the peer answers with ``PaxosCommit``s of the
  chosen slots from there on (at most ``CATCHUP_BATCH``), without values, as a replica stalled
  behind slow peers holds them. Once a commit names a slot whose value it lacks it asks
  ``Catchup``, answered with the values. A peer that needs slots below our compaction point
  gets our snapshot instead (``Ready.snapshot_requests``).

Everything that reports durable state or a chosen value goes out through ``_send``
(``send_after_persist``); only requests (``PaxosForward``, ``Catchup``, ``CatchupMarkers``,
``Heartbeat``) use ``_request``. Every container this module iterates to produce output is
ordered, so a seeded simulation replays exactly.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Final

from consensus import messages
from consensus.config import ProtocolConfig
from consensus.errors import ConfigError, LocalProtocolError
from consensus.messages import (
    NO_LEASE_REQUEST,
    Catchup,
    CatchupMarkers,
    Command,
    Heartbeat,
    PaxosCommit,
    PeerMessage,
    Record,
    SlotAcceptedRecord,
    check_command,
)
from consensus.protocol.batch import CATCHUP_BYTES, batch_size
from consensus.protocol.ready import Outgoing, Ready, SlotBatch
from consensus.protocol.status import CoreStatus
from consensus.protocol.types import NEVER, Role, SnapshotMeta

__all__ = [
    "BASELINE_UNSAFE_VARIANTS",
    "CATCHUP_BATCH",
    "CATCHUP_BYTES",
    "Batch",
    "Key",
    "Slot",
    "SlotLogCore",
    "key_of",
]

#: Most slots one Catchup answer carries.
CATCHUP_BATCH: Final = 256

#: The deliberately broken variants (``consensus.config.UNSAFE_VARIANTS``) the baselines have:
#: besides acknowledging early, a Multi-Paxos leader serving reads without a majority of leases
#: (``no_lease_check``), a takeover or revocation that ignores the values it was told were
#: accepted (``takeover_ignores_accepted``)
BASELINE_UNSAFE_VARIANTS: Final = frozenset(
    {"ack_before_persist", "no_lease_check", "takeover_ignores_accepted"}
)

Batch = messages.Batch  # the commands, or the bytes they came in (PackedBatch)
#: a client request's identity: (client id, sequence number)
Key = tuple[int, int]


def key_of(command: Command) -> Key:
    return (command.client_id, command.seq)


class Slot:
    """What one replica knows of one global slot: the value it accepted (or learned) and, on
    the slot's proposer, who acknowledged it and when the Accept last went out."""

    __slots__ = ("acks", "ballot", "batch", "committed", "sent_at")

    def __init__(self, ballot: int, batch: Batch, *, committed: bool = False) -> None:
        self.ballot = ballot
        self.batch = batch
        self.committed = committed
        self.acks: set[int] = set()
        self.sent_at = 0


class SlotLogCore(ABC):
    """Acceptor, learner, executor and catch-up of a slot-per-instance log (see module doc).

    Subclasses implement ``_submit`` (a client command arrived), ``_step`` (a peer message
    other than Heartbeat/Catchup), ``_flush`` (end of the loop turn: batches and merged
    messages) and ``_timers`` (retransmission), and may override the hooks ``_chosen``,
    ``_executed_slot``, ``_catchup_target``, ``_on_catchup``, ``_keeps``, ``_own_records``
    and ``_restored``. They call ``_restore`` at the end of their ``__init__``.
    """

    def __init__(self, config: ProtocolConfig, me: int, *, rng: random.Random) -> None:
        if not 0 <= me < config.replicas:
            raise LocalProtocolError(f"replica id {me} outside 0..{config.replicas - 1}")
        unsupported = config.unsafe - BASELINE_UNSAFE_VARIANTS
        if unsupported:
            raise ConfigError(
                f"the baselines implement only the unsafe variants "
                f"{sorted(BASELINE_UNSAFE_VARIANTS)}, not {sorted(unsupported)}"
            )
        self._ack_early = "ack_before_persist" in config.unsafe
        self.config = config
        self.me = me
        self.n = config.replicas
        self.q = config.quorum
        self.rng = rng
        #: no view changes here; drivers that report a view see 0
        self.view = 0
        self.now = 0
        self._peers = tuple(r for r in range(self.n) if r != me)

        self.slots: dict[int, Slot] = {}  # accepted or learned values, executed ones included
        self.known_high = 0  # one past the highest slot we know a value for
        self.exec_slot = 0  # every slot below ran
        self._compacted = 0  # slots below this live only in a snapshot

        # commands that arrived here from clients, until they execute here
        self._mine: dict[Key, Command] = {}
        self._unready: set[Key] = set()  # ... not reported ready yet
        self._reads: set[Key] = set()  # linearizable reads put through the log here

        self._started = False
        self._peer_executed: dict[int, int] = dict.fromkeys(range(self.n), 0)
        self._next_heartbeat = 0
        self._exec_progress_at = 0
        self._last_catchup_at = NEVER
        self._catchup_peer = 0
        # a commit named a slot whose value we lack: ask for values, not markers
        self._catchup_lacks_values = False
        self._catchup_asked_values = False

        self._out = Ready()
        self._handed_out: Ready | None = None

    # ------------------------------------------------------------------ inputs
    def propose(self, command: Command, now: int) -> None:
        """A client command arrived. Raises ``LocalProtocolError`` (and changes nothing) for a
        command no peer could decode: check client input before handing it over."""
        check_command(command)
        self._enter(now)
        key = key_of(command)
        self._mine[key] = command
        self._unready.add(key)
        self._submit(command)

    def read(self, command: Command, now: int) -> None:
        """A linearizable read: ordered through the log, served (``Ready.reads``) once its slot
        executed here. (The baselines have no lease read path.)"""
        check_command(command)
        self._enter(now)
        self._reads.add(key_of(command))
        self._submit(command)

    def read_stale(self, command: Command, now: int) -> None:
        """A read served from local state at once: fast, possibly stale, never linearizable."""
        self._enter(now)
        self._out.reads.append(command)

    def step(self, message: PeerMessage, now: int) -> None:
        self._enter(now)
        src = message.src
        if not 0 <= src < self.n or src == self.me:
            return
        if isinstance(message, Heartbeat):
            if message.executed > self._peer_executed[src]:
                self._peer_executed[src] = message.executed
            self._on_heartbeat(message)
        elif isinstance(message, Catchup | CatchupMarkers):
            self._answer_catchup(message)
        else:
            self._step(message)

    def tick(self, now: int) -> None:
        self._enter(now)
        if now >= self._next_heartbeat:
            self._next_heartbeat = now + self.config.heartbeat_us
            for peer in self._peers:
                self._request(peer, self._heartbeat_message())
        self._timers()
        self._maybe_catch_up()

    def ready(self) -> Ready:
        if self._handed_out is not None:
            raise LocalProtocolError("ready() called again before advance()")
        self._flush()
        self._try_execute()
        out, self._out = self._out, Ready()
        self._handed_out = out
        return out

    def advance(self, ready: Ready) -> None:
        if ready is not self._handed_out:
            raise LocalProtocolError("advance() with a Ready this core did not hand out")
        self._handed_out = None

    # ------------------------------------------------------------------ checker views
    def committed_log(self) -> Mapping[int, Batch]:
        return {slot: inst.batch for slot, inst in self.slots.items() if inst.committed}

    def executed_through(self) -> int:
        return self.exec_slot - 1

    def status(self) -> CoreStatus:
        """A peer among peers, with the frontiers the others heartbeat (Multi-Paxos adds its
        leader and leases)."""
        return CoreStatus(
            role=Role.PEER, view=self.view, executed=self.exec_slot,
            voters=tuple(range(self.n)),
            peer_executed={peer: self._peer_executed[peer] for peer in self._peers},
        )

    # ------------------------------------------------------------------ subclass interface
    @abstractmethod
    def _submit(self, command: Command) -> None:
        """A client command (or a read) arrived here."""

    @abstractmethod
    def _step(self, message: PeerMessage) -> None:
        """A peer message other than Heartbeat and Catchup arrived."""

    @abstractmethod
    def _flush(self) -> None:
        """The loop turn ends: propose what was batched, send this turn's merged messages."""

    @abstractmethod
    def _timers(self) -> None:
        """Time passed: retransmit what was not acknowledged."""

    def _heartbeat_message(self) -> Heartbeat:
        """What this replica heartbeats to every peer (its execution frontier)."""
        return Heartbeat(src=self.me, view=0, executed=self.exec_slot,
                         lease_request=NO_LEASE_REQUEST)

    def _on_heartbeat(self, message: Heartbeat) -> None:
        """A peer's heartbeat arrived (after its frontier was noted)."""
        return  # a hook: nothing by default

    def _chosen(self, slot: int, inst: Slot) -> None:
        """``slot`` was just learned chosen (before it executes)."""
        return  # a hook: nothing by default

    def _executed_slot(self, slot: int, inst: Slot) -> None:
        """``slot`` just executed here."""
        return  # a hook: nothing by default

    def _catchup_target(self) -> int:
        """Whom to ask when stuck and no peer is known to be ahead (``me``: nobody)."""
        peer = self._peers[self._catchup_peer % len(self._peers)] if self._peers else self.me
        self._catchup_peer += 1
        return peer

    def _on_catchup(self, msg: Catchup | CatchupMarkers) -> None:
        """A peer asks for the slots from ``msg.slot`` on (before we answer it)."""
        return  # a hook: nothing by default

    def _keeps(self, inst: Slot) -> bool:
        """Whether a rewritten log records this slot's value as accepted."""
        return True

    def _own_records(self) -> list[Record]:
        """Records beyond the accepted values that a rewritten log must keep."""
        return []

    def _restored(self, records: Sequence[Record]) -> None:
        """After ``_restore`` rebuilt the acceptor state from ``records``."""
        return  # a hook: nothing by default

    # ------------------------------------------------------------------ plumbing
    def _enter(self, now: int) -> None:
        self.now = now
        if not self._started:
            self._started = True
            self._exec_progress_at = now
            self._next_heartbeat = now

    def _send(self, to: int, message: PeerMessage) -> None:
        """Queue a message that may report state persisted in this batch."""
        if self._ack_early:
            self._out.send.append(Outgoing(to, message))
        else:
            self._out.send_after_persist.append(Outgoing(to, message))

    def _request(self, to: int, message: PeerMessage) -> None:
        """Queue a message that promises nothing (it may leave before the batch is durable)."""
        self._out.send.append(Outgoing(to, message))

    def _persist(self, record: Record) -> None:
        self._out.persist.append(record)

    # ------------------------------------------------------------------ acceptor and learner
    def _accept(self, slot: int, ballot: int, batch: Batch) -> bool:
        """Accept ``batch`` for ``slot`` at ``ballot``; False if that would be unsafe (the
        caller then sends no acknowledgement)."""
        inst = self.slots.get(slot)
        if slot < self._compacted or (inst is not None and inst.committed):
            # Chosen already: acknowledging is harmless (by Paxos, any accept at this ballot
            # or a later one carries the chosen value) and may be what the proposer waits for.
            return inst is None or inst.batch == batch
        if inst is not None:
            if ballot < inst.ballot or (ballot == inst.ballot and batch != inst.batch):
                return False  # one value per ballot: a conflict here would be a bug
            if ballot == inst.ballot:
                return True  # a duplicate: acknowledged again, persisted once
            inst.ballot, inst.batch = ballot, batch
        else:
            self.slots[slot] = Slot(ballot, batch)
        self.known_high = max(self.known_high, slot + 1)
        self._persist(SlotAcceptedRecord(slot=slot, ballot=ballot, batch=batch))
        return True

    def _learn(self, slot: int, ballot: int, batch: Batch | None) -> None:
        """``slot`` is chosen at ``ballot`` with ``batch`` (None: the value we accepted)."""
        if slot < self.exec_slot or slot < self._compacted:
            return
        inst = self.slots.get(slot)
        if inst is not None and inst.committed:
            return
        if batch is None:
            if inst is None or inst.ballot != ballot:
                self._catchup_lacks_values = True  # we lack the chosen value: Catchup brings it
                return
        elif inst is None:
            inst = self.slots[slot] = Slot(ballot, batch)
        else:
            inst.ballot, inst.batch = ballot, batch
        self.known_high = max(self.known_high, slot + 1)
        self._mark_chosen(slot, inst)

    def _mark_chosen(self, slot: int, inst: Slot) -> None:
        inst.committed = True
        self._chosen(slot, inst)

    def _commit_to_peers(self, slot: int, inst: Slot) -> None:
        """Tell every peer that ``slot`` is chosen. Without the value: each was sent our
        Accept first on the same FIFO connection (repeating the batch doubled the leader's
        bytes); one that lost it catches up when it stalls."""
        for peer in self._peers:
            self._send(
                peer, PaxosCommit(src=self.me, view=0, slot=slot, ballot=inst.ballot, batch=None)
            )

    def _report_ready(self, batch: Batch) -> None:
        """Commands of ``batch`` that arrived here are ready (reported once)."""
        if not self._unready:
            return
        for command in batch:
            key = key_of(command)
            if key in self._unready:
                self._unready.discard(key)
                self._out.ready.append(command)

    # ------------------------------------------------------------------ execution
    def _try_execute(self) -> None:
        while True:
            slot = self.exec_slot
            inst = self.slots.get(slot)
            if inst is None or not inst.committed:
                return
            # executed implies chosen and ordered for good: whatever the subclass's ready
            # rule still waits for, the command is ready now
            self._report_ready(inst.batch)
            self._execute(slot, inst.batch)
            self.exec_slot = slot + 1
            self._exec_progress_at = self.now
            self._executed_slot(slot, inst)

    def _execute(self, slot: int, batch: Batch) -> None:
        """Hand ``batch``, executed at ``slot``, to the driver: whole (``SlotBatch``) while
        nothing is led or read here at all (a replica without clients of its own), else in
        runs of commands led here and not, its reads served after it applies."""
        mine, reads, out = self._mine, self._reads, self._out
        if not mine and not reads:
            out.apply.append(SlotBatch(slot, 0, batch, False))
            return
        start, led = 0, False
        for offset, command in enumerate(batch):
            key = key_of(command)
            led_here = mine.pop(key, None) is not None
            if key in reads:
                reads.discard(key)
                out.reads.append(command)  # served after this batch applies
            if led_here != led and offset:
                out.apply.append(SlotBatch(slot, start, batch[start:offset], led))
                start = offset
            led = led_here
        if start:
            out.apply.append(SlotBatch(slot, start, batch[start:], led))
        elif batch:
            out.apply.append(SlotBatch(slot, 0, batch, led))

    # ------------------------------------------------------------------ catch-up
    def _maybe_catch_up(self) -> None:
        ahead = max(self._peer_executed.values())
        if ahead <= self.exec_slot and self.known_high <= self.exec_slot:
            self._catchup_lacks_values = False
            return  # nothing known that we could not run
        if self.now - self._exec_progress_at < self.config.catchup_us:
            return  # making progress (or just started waiting): the normal path may do
        values_now = self._catchup_lacks_values and not self._catchup_asked_values
        if self.now - self._last_catchup_at < self.config.catchup_us and not values_now:
            return
        self._last_catchup_at = self.now
        self._catchup_asked_values = self._catchup_lacks_values
        if ahead > self.exec_slot:
            peer = max(self._peers, key=lambda r: (self._peer_executed[r], -r))
        else:
            peer = self._catchup_target()
        if peer != self.me:
            ask = Catchup if self._catchup_asked_values else CatchupMarkers
            self._request(peer, ask(src=self.me, view=0, slot=self.exec_slot))

    def _answer_catchup(self, msg: Catchup | CatchupMarkers) -> None:
        """Tell a lagging peer the chosen slots from ``msg.slot`` on (bounded; their values
        only if it asked ``Catchup``)."""
        if msg.slot > self._peer_executed[msg.src]:
            self._peer_executed[msg.src] = msg.slot
        if msg.slot < self._compacted:
            # what it misses is only in our snapshot now: the driver sends it
            self._out.snapshot_requests.append(msg.src)
            return
        self._on_catchup(msg)
        values = isinstance(msg, Catchup)
        budget = CATCHUP_BYTES
        for slot in range(msg.slot, msg.slot + CATCHUP_BATCH):
            if budget <= 0:
                break
            inst = self.slots.get(slot)
            if inst is not None and inst.committed:
                if values:
                    budget -= batch_size(inst.batch)
                batch = inst.batch if values else None
                commit = PaxosCommit(
                    src=self.me, view=0, slot=slot, ballot=inst.ballot, batch=batch
                )
                self._send(msg.src, commit)

    # ------------------------------------------------------------------ snapshots
    def snapshot_meta(self) -> SnapshotMeta:
        """Where a snapshot of the state machine, taken now (after applying the last
        ``Ready``), stands in the log. (``exec_counts`` is SDPaxos's; zeros here.)"""
        return SnapshotMeta(self.exec_slot, (0,) * self.n)

    def compact(self, meta: SnapshotMeta) -> list[Record]:
        """The state machine's snapshot at ``meta`` is durable: forget every slot below it.
        Returns the records a rewritten write-ahead log must hold, with a durable snapshot at
        the execution frontier (``meta`` may be an older one)."""
        if meta.slot > self.exec_slot:
            raise LocalProtocolError("compact() beyond the execution frontier")
        self._drop_below(meta.slot)
        return self.durable_records()

    def install_snapshot(self, meta: SnapshotMeta) -> list[Record]:
        """A peer's snapshot was applied to our state machine: continue from ``meta``."""
        if meta.slot > self.exec_slot:
            self.exec_slot = meta.slot
            self.known_high = max(self.known_high, meta.slot)
            self._drop_below(meta.slot)
            self._exec_progress_at = self.now
        return self.durable_records()

    def _drop_below(self, slot: int) -> None:
        for s in [s for s in self.slots if s < slot]:
            del self.slots[s]
        self._compacted = max(self._compacted, slot)

    def durable_records(self) -> list[Record]:
        """Everything this replica accepted (and must remember) beyond its execution frontier:
        a restart begins at a snapshot of it (``compact``'s caller just took one) and skips
        the slots below, which are kept in memory only for peers a little behind."""
        records: list[Record] = [
            SlotAcceptedRecord(slot=slot, ballot=inst.ballot, batch=inst.batch)
            for slot, inst in sorted(self.slots.items())
            if slot >= self.exec_slot and self._keeps(inst)
        ]
        return records + self._own_records()

    # ------------------------------------------------------------------ recovery
    def _restore(self, records: Sequence[Record], snapshot: SnapshotMeta | None) -> None:
        """Rebuild the acceptor state from durable records (and a snapshot's position)."""
        if snapshot is not None:
            self.exec_slot = self._compacted = snapshot.slot
            self.known_high = snapshot.slot
        for record in records:
            if isinstance(record, SlotAcceptedRecord) and record.slot >= self._compacted:
                inst = self.slots.get(record.slot)
                if inst is None or record.ballot >= inst.ballot:
                    self.slots[record.slot] = Slot(record.ballot, record.batch)
                self.known_high = max(self.known_high, record.slot + 1)
        self._restored(records)
