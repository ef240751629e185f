"""A replica node's turn loop: the thin driver around a sans-I/O core.

Every loop turn: hand the core everything that arrived (the inbox's events: peer messages, a
peer's whole snapshot, client requests with at most ``MAX_READS_PER_TURN`` reads among them),
tick it when due, take its ``Ready``, then — in this order — send what needs no durability,
append the records to the write-ahead log and fsync once (group commit, on the loop: the
next turn batches whatever came in meanwhile), answer the blind writes that became ready,
send the acknowledgements, apply committed commands to the state machine, answer the rest,
``advance``.

Owns: the core's driving (when it ticks next, whether the loop is stopping), the slot the
state machine has applied up to (``executed_slot``), the ``on_apply`` hooks, the log-time
commands this replica proposes (``consensus.sessions``), following the log's member set (the
transport's peers) and this replica's removal, and the counts of views and the log lines of
view changes. The waiters it answers are the client port's (``consensus.runtime.client_port``);
snapshots are the snapshot pipeline's (``consensus.runtime.snapshot_pipeline``), which it tells
of each turn's end.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import assert_never, cast

from consensus.auth import AuthorizingMachine, Denied, PermissionDenied
from consensus.errors import (
    DefiniteFailure,
    IndefiniteFailure,
    LocalProtocolError,
    MemberRefused,
    MemberRemoved,
    SessionExpired,
)
from consensus.messages import Command
from consensus.protocol.base import DrivenCore
from consensus.protocol.membership import MemberReplica, view_text
from consensus.protocol.ready import SLOT_STRIDE, Outgoing, Ready, SlotBatch
from consensus.protocol.sdpaxos import SDPaxosReplica
from consensus.runtime.client_port import ClientPort, Result, Waiter
from consensus.runtime.cluster_config import ClusterConfig
from consensus.runtime.framing import frames_by_peer
from consensus.runtime.members import address_text, known_members
from consensus.runtime.node_events import (
    Event,
    Inbox,
    PeerMessages,
    PeerSnapshot,
    Propose,
    Read,
    StaleRead,
)
from consensus.runtime.node_stats import BusyClock, NodeStats
from consensus.runtime.peer_intake import PeerIntake
from consensus.runtime.snapshot_pipeline import SnapshotPipeline, worker_result
from consensus.runtime.transport import PeerTransport
from consensus.sessions import LOG_TIME_STAGGERS, SESSION_EXPIRED, SessionTable, log_time_command
from consensus.statemachine import DefersQueries, StateMachine, batch_applier
from consensus.storage.identity import MemberIdentity, mark_removed
from consensus.storage.wal import WriteAheadLog

__all__ = [
    "APPLY_CHECK_EVERY",
    "APPLY_SLICE_S",
    "LAG_PROBE_S",
    "LOG_TIME_RETRY_S",
    "ApplyHook",
    "TurnLoop",
    "sdpaxos_of",
]

#: applying a turn's commands yields to the loop every this many seconds (checked every
#: APPLY_CHECK_EVERY commands)
APPLY_SLICE_S = 0.01
APPLY_CHECK_EVERY = 256
#: the event-loop lag probe's period (``NodeStats.longest_stall_s``)
LAG_PROBE_S = 0.02
#: a replica proposes a log-time command at most this often (seconds)
LOG_TIME_RETRY_S = 1
#: ``_loop``'s tick timer: none armed
_NO_TIMER = -1

log = logging.getLogger("sdpaxos.node")

#: an ``on_apply`` hook: ``hook(position, commands, results)`` after ``commands`` applied,
#: ``commands[i]`` at global-log position ``position + i`` with result ``results[i]``
ApplyHook = Callable[[int, Sequence[Command], Sequence[bytes]], None]


class TurnLoop:
    """Drives one replica's core turn by turn (see the module documentation)."""

    def __init__(
        self,
        config: ClusterConfig,
        me: int,
        core: DrivenCore,
        *,
        machine: StateMachine,
        authz: AuthorizingMachine | None,
        sessions: SessionTable | None,
        wal: WriteAheadLog,
        fsync: bool,
        tick_us: int,
        identity: MemberIdentity,
        inbox: Inbox,
        intake: PeerIntake,
        transport: PeerTransport,
        clients: ClientPort,
        snapshots: SnapshotPipeline,
        stats: NodeStats,
        busy: BusyClock,
    ) -> None:
        self.config = config
        self.me = me
        self.core = core
        self.machine = machine
        self._apply_batch = batch_applier(machine)  # runs of a slot at once (_apply)
        #: TLS: the state machine behind the principals' check
        self.authz = authz
        #: the state machine's session table, if it keeps one: this replica proposes the
        #: log-time commands it needs
        self.sessions = sessions
        self._log_time_proposed = 0  # the clock reading of our last log-time command
        self.wal = wal
        self.fsync = fsync
        self.tick_us = tick_us
        #: this replica's data-directory identity (marked once a change removes it)
        self.identity = identity
        self.inbox = inbox
        self.intake = intake
        self.transport = transport
        self.clients = clients
        self.snapshots = snapshots
        self.stats = stats
        self.busy = busy
        #: called after each run of applied commands (watchers): ``hook(position, commands,
        #: results)``, ``commands[i]`` applied at ``position + i`` with ``results[i]``
        self.on_apply: list[ApplyHook] = []
        #: one past the last slot applied to the state machine: the core's ``exec_slot`` once
        #: the turn that executed it is done (applying yields to the loop, so the core's runs
        #: ahead while a turn applies thousands of commands)
        self.executed_slot = 0
        self.stopping = False
        self._last_seen_view: tuple[int, object] = (-1, None)
        #: the membership configuration the transport was last told of
        self._known_config: object = None
        self._counted_view = core.view  # the view changes counted in NodeStats
        if isinstance(core, MemberReplica):  # the log's members, not only the file's
            self._members_changed(core)

    def stop(self) -> None:
        """End the loop after its turn under way (``run`` returns)."""
        self.stopping = True
        self.inbox.wake()

    async def replay(self) -> None:
        """Apply what a restarted core executes again from its records (its first ``Ready``)
        before anything is served: one long step at start, instead of a first loop turn that
        peers and clients would wait behind."""
        started = self.busy.since = time.perf_counter()
        latest = self.snapshots.latest
        first_slot = latest[1].slot if latest is not None else 0
        await self._carry_out(self.core.ready(), _now_us())
        self.busy.until_now()
        self.stats.replay_seconds = time.perf_counter() - started
        self.stats.replayed_slots = self.core.exec_slot - first_slot
        if self.stats.commands_applied:
            log.info("replica %d: executed %d commands again from its records in %.2f s",
                     self.me, self.stats.commands_applied, self.stats.replay_seconds)

    async def probe_lag(self) -> None:
        """Measure how late a short timer fires: the longest stretch anything held the loop."""
        while not self.stopping:
            due = time.perf_counter() + LAG_PROBE_S
            await asyncio.sleep(LAG_PROBE_S)
            stall = time.perf_counter() - due
            self.stats.stall_latency.observe(stall)
            if stall > self.stats.longest_stall_s:
                self.stats.longest_stall_s = stall

    async def run(self) -> None:
        """The loop, until stopped (or a peer refuses this replica, or a change removes it:
        ``MemberRefused``, ``MemberRemoved``)."""
        try:
            await self._loop()
        except (MemberRefused, MemberRemoved):
            raise  # not a bug: ``serve`` says why and exits
        except Exception:
            log.exception("replica %d: event loop failed", self.me)
            raise

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        inbox, wakeup, busy, snapshots = self.inbox, self.inbox.wakeup, self.busy, self.snapshots
        stats, core = self.stats, self.core
        turn_latency = stats.turn_latency
        members = core if isinstance(core, MemberReplica) else None
        next_tick = 0
        #: the tick the wake-up timer is armed for (NO_TIMER: none armed, or it fired): one
        #: timer per tick, not one per idle wait (each was a handle built, pushed on the
        #: loop's heap and cancelled, every turn of an idle replica)
        armed_for = _NO_TIMER
        timer: asyncio.TimerHandle | None = None

        def tick_due() -> None:
            nonlocal armed_for
            armed_for = _NO_TIMER
            wakeup.set()

        try:
            while not self.stopping:
                if self.intake.refusal is not None:
                    raise self.intake.refusal
                if inbox.idle:
                    if armed_for != next_tick:
                        if timer is not None:
                            timer.cancel()
                        # whole milliseconds, rounded up: the loop's timers are
                        # millisecond-grained and fire at once for less, which spun the loop
                        # until the tick was due
                        timeout = math.ceil(max(0, next_tick - _now_us()) / 1000) / 1000
                        timer = loop.call_later(timeout, tick_due)
                        armed_for = next_tick
                    await wakeup.wait()
                else:
                    await asyncio.sleep(0)  # a turn never yields: let the sockets be read first
                wakeup.clear()
                started = busy.since = time.perf_counter()
                if snapshots.install_ready and await snapshots.install():
                    self.executed_slot = core.exec_slot
                now = _now_us()
                self._feed(inbox.take(), now)
                if now >= next_tick:
                    core.tick(now)
                    self._propose_log_time(now)
                    next_tick = now + self.tick_us
                await self._carry_out(core.ready(), now)
                busy.until_now()
                turn = time.perf_counter() - started
                turn_latency.observe(turn)
                if turn > stats.longest_turn_s:
                    stats.longest_turn_s = turn
                self._after_turn(core, members)
        finally:
            if timer is not None:
                timer.cancel()

    def _after_turn(self, core: DrivenCore, members: MemberReplica | None) -> None:
        """What a turn changed of the view, the role and the members: counted, logged and
        followed."""
        view = core.view
        if view != self._counted_view:
            self._counted_view = view
            self.stats.view_changes += 1
        inner = members.core if members is not None else core
        if isinstance(inner, SDPaxosReplica) and (view, inner.role) != self._last_seen_view:
            self._last_seen_view = (view, inner.role)
            log.info(
                "replica %d: view %s, role %s, sequencer %d, executed through slot %d",
                self.me, view_text(view), inner.role.value,
                getattr(core, "sequencer", 0), core.executed_through(),
            )
        if members is not None:
            if members.config is not self._known_config:
                self._members_changed(members)
            if members.removed:  # (a restart finds it so if it stopped before it said so)
                raise self._removed(members)

    def _feed(self, events: list[Event], now: int) -> None:
        core, clients = self.core, self.clients
        for event in events:
            if type(event) is Propose:
                # most of a loaded turn's events, told apart before the match: its class
                # patterns cost a check per case tried (0.38 -> 0.05 us an event)
                command = event.command
                key = (command.client_id, command.seq)
                clients.proposed(key, now)
                try:
                    core.propose(command, now)
                except LocalProtocolError as exc:
                    clients.fail(key, DefiniteFailure(str(exc)), reads=False)
                continue
            match event:
                case PeerMessages(messages):
                    for message in messages:
                        core.step(message, now)
                case PeerSnapshot(data):
                    self.snapshots.receive(data)
                case Propose():
                    raise AssertionError("proposals are taken before the match")
                case Read(command) | StaleRead(command):
                    try:
                        if isinstance(event, Read):
                            core.read(command, now)
                        else:
                            core.read_stale(command, now)
                    except LocalProtocolError as exc:
                        clients.fail((command.client_id, command.seq),
                                     DefiniteFailure(str(exc)), reads=True)
                case _:
                    assert_never(event)

    async def _carry_out(self, ready: Ready, now: int) -> None:
        self.stats.turns += 1
        # Every message of a turn is handed to the peer connections as soon as it may leave
        # (``at_once``), not when the links' writers next run: what needs no durability (a
        # CAccept or OAccept reserved ahead) travels, and the peers' fsyncs run, in parallel
        # with ours; what waited for our fsync (an acknowledgement) does not also wait for
        # the commands this turn applies, nor for the loop to turn once more.
        if ready.send:
            self._send(ready.send)
        if ready.persist or ready.log:
            self.snapshots.append(itertools.chain(ready.persist, ready.log))
        if ready.persist:
            # fsync on the loop itself: handing it to a thread let the loop read sockets
            # meanwhile, but waking an idle worker thread and then the loop cost more (about
            # 0.5 ms a turn on an idle replica) than the fsync; the next turn waits anyway.
            self.wal.sync(fsync=self.fsync)
            self.stats.fsyncs += 1
            self.stats.fsync_seconds += self.wal.last_sync_seconds
            self.stats.fsync_latency.observe(self.wal.last_sync_seconds)
        elif ready.log:
            self.wal.sync(fsync=False)  # written; the next fsync makes it durable
        clients = self.clients
        if ready.ready:
            clients.acknowledge(ready.ready, now, self.stats.ready_latency)
            clients.answer()  # ready writes wait for neither the acks nor the state machine
        if ready.send_after_persist:
            self._send(ready.send_after_persist)
        if ready.apply:
            await self._apply(ready.apply, now)
        self.executed_slot = self.core.exec_slot  # applied, every command of it
        for command in ready.reads:
            waiters, backup = clients.take_read((command.client_id, command.seq))
            if backup:
                if waiters:
                    self._take_backup(waiters)
            elif waiters:
                self._answer_read(command.op, waiters)
        for failure in ready.failed:
            key = (failure.command.client_id, failure.command.seq)
            error = DefiniteFailure if failure.definite else IndefiniteFailure
            clients.fail(key, error(failure.reason), reads=False)
        for command, answer in ready.results:  # membership changes: the core answered
            clients.complete((command.client_id, command.seq), Result(answer, -1), now,
                             self.stats.executed_latency)
        for peer in sorted(set(ready.snapshot_requests)):
            for frame in self.snapshots.offer(peer):
                self.transport.send(peer, frame)
        self.core.advance(ready)
        self.snapshots.turn_end(ready.applied_count(), ready.snapshot_now)
        clients.answer()

    async def _apply(self, batches: Sequence[SlotBatch], now: int) -> None:
        """Apply a turn's slot batches in order, answering the clients of those led here.

        Each batch goes to the state machine whole (``batch_applier``: its ``apply_batch``,
        or ``apply`` in a loop; the authorization check's ``run_batch`` on a TLS cluster),
        in pieces of at most ``APPLY_CHECK_EVERY`` commands, a slice's check between them;
        the ``on_apply`` hooks see each piece once it applied. The results are those of
        ``apply`` command by command."""
        slices = _ApplySlices(self.busy, self.stats)
        unchecked = 0  # commands applied since the last slice check
        for slot, offset, commands, led_here in batches:
            position = slot * SLOT_STRIDE + offset  # SlotBatch.position
            count = len(commands)
            if count <= APPLY_CHECK_EVERY:
                if unchecked >= APPLY_CHECK_EVERY:
                    await slices.pause_if_due()
                    unchecked = 0
                unchecked += count
                self._apply_piece(position, commands, led_here, now)
                continue
            for start in range(0, count, APPLY_CHECK_EVERY):
                await slices.pause_if_due()
                self._apply_piece(position + start, commands[start:start + APPLY_CHECK_EVERY],
                                  led_here, now)
        slices.done()

    def _apply_piece(self, position: int, commands: Sequence[Command], led_here: bool,
                     now: int) -> None:
        """Consecutive commands of one slot, from ``position`` on, to the state machine at
        once; the hooks told; the clients of those led here answered."""
        authz = self.authz
        results: Sequence[bytes | Denied]
        if authz is None:
            results = applied = self._apply_batch(position, commands)
            if self.on_apply:
                self._tell_hooks(position, commands, applied)
        else:
            results = authz.run_batch(position, commands)
            if self.on_apply:
                self._tell_hooks_allowed(position, commands, results)
        self.stats.commands_applied += len(commands)
        if not led_here:
            return
        clients = self.clients
        complete, executed_latency = clients.complete, self.stats.executed_latency
        for offset, (command, result) in enumerate(zip(commands, results, strict=True)):
            if isinstance(result, Denied):  # refused as it applied: nothing changed
                clients.fail((command.client_id, command.seq), PermissionDenied(result.reason),
                             reads=False)
            elif command.blind:
                continue  # acknowledged once ready
            elif result is SESSION_EXPIRED:
                self._session_expired(command)
            else:
                complete((command.client_id, command.seq), Result(result, position + offset),
                         now, executed_latency)

    def _tell_hooks(self, position: int, commands: Sequence[Command],
                    results: Sequence[bytes]) -> None:
        for hook in self.on_apply:
            hook(position, commands, results)

    def _tell_hooks_allowed(self, position: int, commands: Sequence[Command],
                            results: Sequence[bytes | Denied]) -> None:
        """The hooks, told of the runs of commands the authorization check let apply (a
        refused one changed nothing: no hook hears of it)."""
        start = 0
        for index, result in enumerate(results):
            if type(result) is Denied:
                if index > start:
                    self._tell_hooks(position + start, commands[start:index],
                                     cast(Sequence[bytes], results[start:index]))
                start = index + 1
        if start < len(results):
            self._tell_hooks(position + start, commands[start:],
                             cast(Sequence[bytes], results[start:]))

    def _answer_read(self, op: bytes, waiters: list[Waiter]) -> None:
        """Answer a read now (every command of the turn applied), or, for one the state
        machine answers off the loop (``DefersQueries``), from what it reads now, once the
        worker made the answer."""
        machine, authz, clients = self.machine, self.authz, self.clients
        if authz is not None:
            later = authz.ask_later(op)
        else:
            later = machine.defer_query(op) if isinstance(machine, DefersQueries) else None
        if later is None:
            answered = machine.query(op) if authz is None else authz.ask(op)
            clients.answered(waiters, answered)
        elif isinstance(later, Denied):
            clients.answered(waiters, later)
        else:
            def made(work: Future[bytes]) -> None:
                answer = worker_result(work, "a read", self.me)
                if authz is not None and isinstance(answer, bytes):
                    answer = authz.filtered(op, answer)
                clients.answered(waiters, answer, now=False)

            self.snapshots.run_off_loop(later, made)

    def _take_backup(self, waiters: list[Waiter]) -> None:
        """A backup as of now for a barrier's waiters (``SnapshotPipeline.take_backup``)."""
        clients = self.clients
        self.snapshots.take_backup(lambda answer: clients.answered(waiters, answer, now=False))

    def _session_expired(self, command: Command) -> None:
        """``command``, led here, was not applied: its session is gone (``SessionExpired``,
        with the log time, from which its client opens the next one)."""
        self.stats.sessions_expired += 1
        log_time = self.sessions.now if self.sessions is not None else 0
        self.clients.fail((command.client_id, command.seq), SessionExpired(
            f"session expired: request ({command.client_id}, {command.seq}) was not applied "
            f"(its session was evicted, closed, or opened too late; log time {log_time})",
            log_time), reads=False)

    def _propose_log_time(self, now: int) -> None:
        """Propose a log-time command if the session table needs the log time to move
        (``SessionTable.time_due``; replicas take turns: ``LOG_TIME_STAGGERS``)."""
        table = self.sessions
        if table is None:
            return
        clock = int(time.time())
        if clock < self._log_time_proposed + LOG_TIME_RETRY_S:
            return  # ours is on its way (or was refused: a learner)
        if not table.time_due(clock - self.me % LOG_TIME_STAGGERS):
            return
        self._log_time_proposed = clock
        self.stats.log_times_proposed += 1
        with contextlib.suppress(LocalProtocolError):
            self.core.propose(log_time_command(clock), now)

    def _send(self, outgoing: list[Outgoing]) -> None:
        """A turn's messages, framed per peer and handed over at once (``_carry_out``)."""
        sent = self.stats.messages_sent
        for out in outgoing:
            kind = type(out.message)
            sent[kind] = sent.get(kind, 0) + 1
        for peer, frames in frames_by_peer(outgoing, self.transport.max_frame).items():
            for frame in frames:
                self.transport.send(peer, frame, at_once=True)

    # ------------------------------------------------------------------ members
    def _members_changed(self, core: MemberReplica) -> None:
        """Follow the log's member set (``consensus.runtime.members``): connect to members
        that joined or published another peer address, forget the ones that left (ids below
        ``next_id`` that are no member: a removed one never comes back)."""
        config = self._known_config = core.config
        transport, files = self.transport, {r.id: r for r in self.config.replicas}
        delays = self.config.delays_from(self.me)
        for member in known_members(config, files):
            info = member.info
            if member.id == self.me or info is None:
                continue
            if transport.addresses.get(member.id) != info.address:
                log.info("replica %d: member %d runs at %s", self.me, member.id,
                         address_text(info.address))
                transport.add_peer(member.id, info.address, delays.get(member.id, 0))
        for peer in sorted(transport.addresses):
            if peer != self.me and peer < config.next_id and config.member(peer) is None:
                log.info("replica %d: member %d left the cluster (epoch %d); no longer "
                         "connecting to it", self.me, peer, config.epoch)
                transport.remove_peer(peer)

    def _removed(self, core: MemberReplica) -> MemberRemoved:
        """A change removed this replica: say so, and mark its directory so that it never
        serves again (``consensus.storage.identity``); the loop stops with the error."""
        error = MemberRemoved(self.me, self.config.cluster_id, core.config.epoch)
        log.warning("replica %d: removed from the cluster at epoch %d (the members are now %s): "
                    "it stops serving and will not start again with this data directory",
                    self.me, core.config.epoch, [m.id for m in core.config.members])
        self.identity = mark_removed(self.config.replica_dir(self.me), self.identity,
                                     core.config.epoch)
        return error


def sdpaxos_of(core: DrivenCore) -> SDPaxosReplica | None:
    """The SDPaxos core of the current epoch (None for a baseline core, or while this
    member learns)."""
    if isinstance(core, MemberReplica):
        return core.core
    return core if isinstance(core, SDPaxosReplica) else None


class _ApplySlices:
    """A turn's applying, in slices of about ``APPLY_SLICE_S``: a catch-up (or a restart's
    replay) hands over thousands of commands at once, so the loop reads sockets and answers
    /metrics between slices and no callback holds it for long (what arrives waits for the
    next turn anyway). The time spent applying, yields excluded, goes to
    ``NodeStats.apply_latency``."""

    __slots__ = ("_applying", "_busy", "_end", "_start", "_stats")

    def __init__(self, busy: BusyClock, stats: NodeStats) -> None:
        self._busy = busy
        self._stats = stats
        self._start = time.perf_counter()
        self._end = self._start + APPLY_SLICE_S
        self._applying = 0.0

    async def pause_if_due(self) -> None:
        """Let the loop run if this slice is over."""
        if time.perf_counter() <= self._end:
            return
        busy = self._busy
        busy.until_now()
        self._applying += time.perf_counter() - self._start
        await asyncio.sleep(0)
        busy.since = self._start = time.perf_counter()
        self._end = self._start + APPLY_SLICE_S

    def done(self) -> None:
        self._stats.apply_latency.observe(self._applying + time.perf_counter() - self._start)


def _now_us() -> int:
    return time.monotonic_ns() // 1000
