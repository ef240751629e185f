"""A replica node's snapshots and backups: when one is due, taking it (on the loop or off it),
compacting the core and rewriting the write-ahead log, sending it to peers behind, installing
a peer's, and the backups clients read in chunks.

Owns: the latest snapshot (what a peer behind this replica's compaction point is sent) and
when it was last sent to whom, the snapshot being written off the loop and a peer's being
made ready off it (at most one of each), what was applied, logged and how long ago since the
last snapshot (the policy's ``every``, ``log_bytes``, ``interval_s``: the first reached makes
one due), the backups kept for chunked reading, and the node's worker thread
(``consensus.runtime.snapshot_writer``, whose header says how the worker never reads a state
machine while the loop changes it). The turn loop appends each turn's records through here
(``append``: a snapshot in flight gets them for its log's rewrite) and calls ``turn_end``.

Work too long for a turn runs in the worker: writing snapshots, building a peer's snapshot's
state (installed at a turn's start once built: ``install``), encoding a backup, answering a
query the state machine defers (``run_off_loop``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import itertools
import logging
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import msgpack

from consensus.codec import encode_frame, encode_record
from consensus.errors import IndefiniteFailure
from consensus.messages import Record, SnapshotChunk
from consensus.protocol.base import DrivenCore
from consensus.protocol.membership import MemberReplica
from consensus.protocol.sdpaxos import VIEW_SPAN
from consensus.protocol.types import SnapshotMeta
from consensus.runtime.client_protocol import ClientRequest, ClientResponse
from consensus.runtime.node_events import Inbox
from consensus.runtime.node_stats import BusyClock, NodeStats
from consensus.runtime.snapshot_writer import (
    InFlight,
    SnapshotWriter,
    capture_state,
    prepared_restore,
    release_gradually,
)
from consensus.statemachine import StateMachine
from consensus.storage.snapshot import decode_snapshot, encode_snapshot, write_snapshot
from consensus.storage.wal import WriteAheadLog

__all__ = [
    "BACKUPS_KEPT",
    "BACKUP_CHUNK",
    "SNAPSHOT_CHUNK",
    "SNAPSHOT_MAX_SLOTS",
    "SNAPSHOT_RESEND_S",
    "SnapshotPipeline",
    "worker_result",
]

#: a snapshot is sent to the same peer again only after this long (unless a newer one exists)
SNAPSHOT_RESEND_S = 1.0
#: bytes of snapshot per SnapshotChunk (the codec caps a bin field at 1 MiB)
SNAPSHOT_CHUNK = 512 << 10
#: a snapshot at least every this many slots, whatever the commands per slot: a restart that
#: lost what it executed (a new disk, a power loss before the lazy records' fsync) learns
#: again only what lies beyond its snapshot, and a view change reports at most
#: ``sdpaxos.VIEW_SPAN`` slots a vote (lightly loaded, every command is a slot of its own)
SNAPSHOT_MAX_SLOTS = VIEW_SPAN

#: bytes of a backup per ``"backup-chunk"`` answer (a client frame holds it easily)
BACKUP_CHUNK = 512 << 10
#: backups a replica keeps for chunked reading (a newer one drops the oldest)
BACKUPS_KEPT = 2

_T = TypeVar("_T")

log = logging.getLogger("sdpaxos.node")


class _Prepared:
    """A peer's snapshot made ready by the worker: its meta, and what makes its state the
    state machine's (``take``n once: the one reference to it, so that it is let go of
    where the node decides)."""

    __slots__ = ("_adopt", "meta")

    def __init__(self, meta: SnapshotMeta, adopt: Callable[[], object]) -> None:
        self.meta = meta
        self._adopt: Callable[[], object] | None = adopt

    def take(self) -> Callable[[], object]:
        adopt, self._adopt = self._adopt, None
        assert adopt is not None
        return adopt


class SnapshotPipeline:
    """One replica's snapshots and backups (see the module documentation). ``latest``: the
    snapshot the replica started from, if any (its state already restored)."""

    def __init__(
        self,
        me: int,
        directory: Path,
        *,
        wal: WriteAheadLog,
        core: DrivenCore,
        machine: StateMachine,
        replicas: int,
        inbox: Inbox,
        stats: NodeStats,
        busy: BusyClock,
        latest: tuple[bytes, SnapshotMeta] | None,
        every: int,
        log_bytes: int,
        interval_s: float,
        off_loop: bool,
    ) -> None:
        self.me = me
        self.directory = directory
        self.wal = wal
        self.core = core
        self.machine = machine
        self.replicas = replicas
        self.inbox = inbox
        self.stats = stats
        self.busy = busy
        #: a snapshot is taken once any of these is reached since the last one: commands
        #: applied, bytes appended to the write-ahead log, seconds (with something applied).
        #: Bytes and time bound what a restart reads and executes again whatever the
        #: commands' sizes and the load.
        self.every = every
        self.log_bytes = log_bytes
        self.interval_s = interval_s
        #: periodic snapshots are written by the worker (False: taken whole on the loop)
        self.off_loop = off_loop
        self._applied_since = 0
        self._logged_since = 0
        self._last_at = time.monotonic()
        #: the latest snapshot (what a peer behind our compaction point is sent) and its meta
        self.latest = latest
        #: peer -> (slot, monotonic time) of the snapshot last sent to it
        self._sent: dict[int, tuple[int, float]] = {}
        #: the snapshot being written off the loop (at most one)
        self.in_flight: InFlight | None = None
        #: a peer's snapshot being made ready off the loop (at most one): its bytes, and
        #: what the worker made of them
        self._install: tuple[bytes, Future[_Prepared]] | None = None
        #: token -> a backup's snapshot bytes, kept for chunked reading (BACKUPS_KEPT)
        self._backups: dict[int, bytes] = {}
        self._backup_tokens = itertools.count(1)
        #: writes snapshot files and prepares the log's rewrites off the loop
        self.writer = SnapshotWriter(directory, wal, f"snapshot-{me}")

    # ------------------------------------------------------------------ a turn's part
    def append(self, records: Iterable[Record]) -> None:
        """Append a turn's records to the write-ahead log (unsynced): counted toward the next
        snapshot, and kept for the log's rewrite of the one in flight."""
        wal, in_flight = self.wal, self.in_flight  # what is logged meanwhile: its rewrite's
        for record in records:
            payload = encode_record(record)
            self._logged_since += len(payload)
            wal.append(payload)
            if in_flight is not None:
                in_flight.logged.append(payload)

    def due(self) -> bool:
        applied = self._applied_since
        if applied == 0:
            return False  # nothing new to cover (the log may still grow: votes, promises)
        base = self.latest[1].slot if self.latest is not None else 0
        return (
            applied >= self.every
            or self.core.exec_slot - base >= SNAPSHOT_MAX_SLOTS
            or self._logged_since >= self.log_bytes
            or time.monotonic() - self._last_at >= self.interval_s
        )

    def turn_end(self, applied: int, now: bool) -> None:
        """A turn's end, ``applied`` commands applied in it: install the snapshot written
        meanwhile once it is durable, then take one if the core wants one now (whole, on the
        loop: a promoted learner's core starts only once it is durable) or one is due (off the
        loop, unless one is in flight)."""
        self._applied_since += applied
        if self.in_flight is not None and self.in_flight.done.done():
            self._finish()
        if now:
            self.take()
        elif self.in_flight is None and self.due():
            if self.off_loop:
                self._start()
            else:
                self.take()

    def close(self, *, snapshot: bool) -> None:
        """The replica stops: install the snapshot in flight, stop the worker and, if
        ``snapshot``, take one whole if anything was applied since the last (a clean stop
        leaves nothing to execute again: the restart reads the snapshot; after a kill -9 the
        restart executes the log since the last snapshot again)."""
        if not self.wal.closed:
            self.join()
        self.writer.close()
        if snapshot and self._applied_since and not self.wal.closed:
            self.take()

    # ------------------------------------------------------------------ our own snapshots
    def take(self) -> None:
        """Snapshot the state machine at the execution frontier, compact the core to the
        *previous* snapshot and rewrite the write-ahead log to what the new one does not cover,
        all on the loop (a snapshot in flight is installed first).
        The core's memory keeps the last interval, so a peer a little behind catches up from
        it: compacting to the new one made every peer that lagged by a few slots ask for the
        whole state (a third of a loaded replica's CPU went into sending, receiving and
        installing snapshots)."""
        self.join()
        started = _clocks()
        meta = self.core.snapshot_meta()
        data = encode_snapshot(meta, self.machine.snapshot())
        write_snapshot(self.directory, data, meta.slot)
        previous = self.latest
        self.latest = (data, meta)
        self._taken()
        self._rewrite_log([encode_record(record) for record in self._log_after(previous)])
        log.info("replica %d: snapshot at slot %d, log compacted to slot %d", self.me, meta.slot,
                 previous[1].slot if previous else 0)
        self._held(started)

    def _start(self) -> None:
        """``take`` with the file written by the worker thread: only the capture runs here
        (``consensus.runtime.snapshot_writer``)."""
        started = _clocks()
        meta = self.core.snapshot_meta()
        state = capture_state(self.machine)
        # what the log must hold beyond the snapshot, as of now (the core compacts here;
        # the records are encoded by the worker)
        records = self._log_after(self.latest)
        # room in the log's new segment for what it takes in while this is written: as much
        # as the whole interval took (the writing takes a fraction of one)
        room = self._logged_since
        in_flight = InFlight(meta, self.writer.write(meta, state, records, room))
        self.in_flight = in_flight
        self._taken()
        self._wake_when_done(in_flight.done)  # a turn installs it
        self._held(started)

    def _finish(self) -> None:
        """Install the snapshot in flight once it is durable (waiting for it if need be): peers
        are sent it from now on, and the log is rewritten to what it does not cover."""
        in_flight = self.in_flight
        assert in_flight is not None
        self.in_flight = None
        data, prepared = in_flight.done.result()  # what the writing raised, if it failed
        started = _clocks()
        previous = self.latest
        self.latest = (data, in_flight.meta)
        started_rewrite = time.perf_counter()
        self.wal.install_rewrite(prepared, in_flight.logged)
        self._rewrite_took(started_rewrite)
        log.info("replica %d: snapshot at slot %d, log compacted to slot %d", self.me,
                 in_flight.meta.slot, previous[1].slot if previous else 0)
        self._held(started)

    def join(self) -> None:
        """Install the snapshot in flight, if any, waiting for its file (before anything else
        replaces the snapshot or rewrites the log)."""
        if self.in_flight is not None:
            self._finish()

    def _log_after(self, previous: tuple[bytes, SnapshotMeta] | None) -> list[Record]:
        """Compact the core to the ``previous`` snapshot; the records the log must hold with a
        durable snapshot at the execution frontier. The first snapshot compacts nothing (no
        older one for peers a little behind), but the log still shrinks to what it does not
        cover: a restart then reads none of it."""
        if previous is None:
            return self.core.durable_records()
        return self.core.compact(previous[1])

    def _taken(self) -> None:
        """A snapshot at the execution frontier was taken (captured, if off the loop): the
        next one counts from here."""
        self.stats.snapshots_taken += 1
        self._applied_since = 0
        self._logged_since = 0
        self._last_at = time.monotonic()

    def _rewrite_log(self, payloads: list[bytes]) -> None:
        """The write-ahead log after a snapshot of ours: ``payloads`` alone (timed)."""
        started = time.perf_counter()
        self.wal.rewrite(payloads)
        self._rewrite_took(started)

    def _rewrite_took(self, started: float) -> None:
        """A rewrite of the log that began at ``started`` ended now (``longest_log_rewrite_s``)."""
        took = time.perf_counter() - started
        if took > self.stats.longest_log_rewrite_s:
            self.stats.longest_log_rewrite_s = took

    def _held(self, started: tuple[float, float]) -> None:
        """A piece of a snapshot that began at ``started`` (``_clocks``) held the loop until
        now."""
        wall, cpu = _clocks()
        stats = self.stats
        stats.longest_snapshot_hold_s = max(stats.longest_snapshot_hold_s, wall - started[0])
        stats.longest_snapshot_cpu_s = max(stats.longest_snapshot_cpu_s, cpu - started[1])

    # ------------------------------------------------------------------ peers' snapshots
    def offer(self, peer: int) -> list[bytes]:
        """The frames that send ``peer`` the latest snapshot, in order (none if there is
        none, or if it was sent that one within ``SNAPSHOT_RESEND_S``)."""
        if self.latest is None:
            return []
        data, meta = self.latest
        sent = self._sent.get(peer)
        now = time.monotonic()
        if sent is not None and sent[0] == meta.slot and now - sent[1] < SNAPSHOT_RESEND_S:
            return []  # on its way: the peer's requests meanwhile would each repeat it
        self._sent[peer] = (meta.slot, now)
        return [
            encode_frame([SnapshotChunk(
                src=self.me,
                view=self.core.view,
                slot=meta.slot,
                offset=offset,
                total=len(data),
                data=data[offset : offset + SNAPSHOT_CHUNK],
            )])
            for offset in range(0, len(data), SNAPSHOT_CHUNK)
        ]

    def receive(self, data: bytes) -> None:
        """A peer's snapshot arrived whole: the worker decodes it and builds its state beside
        the state machine's (``snapshot_writer.prepared_restore``) while this replica goes on
        as before; the first turn after that installs it (``install``). One at a time: a peer
        sends its snapshot again while it is still asked for."""
        if self._install is not None:
            return
        machine = self.machine

        def prepare() -> _Prepared:
            meta, state = decode_snapshot(data)
            return _Prepared(meta, prepared_restore(machine, state))

        future = self.writer.submit(prepare)
        self._install = (data, future)
        self._wake_when_done(future)

    @property
    def install_ready(self) -> bool:
        """A peer's snapshot is made ready for ``install`` (or failed to load)."""
        return self._install is not None and self._install[1].done()

    async def install(self) -> bool:
        """Install the peer's snapshot made ready off the loop, if it is still of use (True if
        it was): the core installs it and the state machine takes the state built for it
        (both at once, here); then the snapshot file and the log's rewrite to the core's new
        records are written by the worker while this replica's turns wait (nothing the
        installed core logs may reach the log before the snapshot it starts from is durable;
        the loop itself goes on reading sockets meanwhile)."""
        assert self._install is not None
        (data, ready), self._install = self._install, None
        try:
            prepared = ready.result()
        except Exception as exc:  # bytes from the network: a peer never crashes us
            log.warning("replica %d: ignoring a snapshot that does not load: %s", self.me, exc)
            return False
        meta = prepared.meta
        if self.in_flight is not None:
            # ours first: it is compacted to, and the log rewritten, in order
            await self._wait_for(self.in_flight.done)
            self._finish()
        core = self.core
        if isinstance(core, MemberReplica):
            if not core.accepts_snapshot(meta):
                self._let_go([prepared.take()])  # (the state built goes off the loop too)
                return False
        elif meta.slot <= core.exec_slot or len(meta.exec_counts) != self.replicas:
            self._let_go([prepared.take()])
            return False
        started = _clocks()
        # the core first: it may refuse a snapshot that lacks something it executed (EPaxos:
        # a peer's executed set may hold other independent instances), and then the state
        # machine must keep its own state
        records = core.install_snapshot(meta)
        if core.exec_slot < meta.slot:
            log.info("replica %d: the core refused a snapshot at slot %d", self.me, meta.slot)
            self._let_go([prepared.take()])
            return False
        self._let_go([prepared.take()()])  # what the state machine's new state replaced
        payloads = [encode_record(record) for record in records]
        self._held(started)

        def store() -> None:
            write_snapshot(self.directory, data, meta.slot)  # durable before the log shrinks
            self.wal.rewrite(payloads)

        await self._wait_for(self.writer.submit(store))
        self.latest = (data, meta)
        self._applied_since = self._logged_since = 0
        self._last_at = time.monotonic()
        self.stats.snapshots_installed += 1
        log.info("replica %d: installed a snapshot at slot %d", self.me, meta.slot)
        return True

    # ------------------------------------------------------------------ backups
    def take_backup(self, answer: Callable[[bytes | IndefiniteFailure], None]) -> None:
        """A backup of the state machine as of now (every command of the turn applied):
        captured here, encoded and hashed off the loop; ``answer`` is called then, on the
        loop, with msgpack ``[token, size, sha256, slot]``, the token naming it for
        ``backup_chunk`` (or with the failure, if the worker failed)."""
        meta = self.core.snapshot_meta()
        state = capture_state(self.machine)

        def encode() -> tuple[bytes, str]:  # in the worker
            data = encode_snapshot(meta, state())
            return data, hashlib.sha256(data).hexdigest()

        def taken(work: Future[tuple[bytes, str]]) -> None:
            made = worker_result(work, "a backup", self.me)
            if isinstance(made, IndefiniteFailure):
                answer(made)
                return
            data, digest = made
            token = next(self._backup_tokens)
            self._backups[token] = data
            while len(self._backups) > BACKUPS_KEPT:
                del self._backups[min(self._backups)]
            log.info("replica %d: backup %d taken at slot %d (%d bytes)", self.me, token,
                     meta.slot, len(data))
            answer(msgpack.packb([token, len(data), digest, meta.slot]))

        self.run_off_loop(encode, taken)

    def backup_chunk(self, request: ClientRequest) -> ClientResponse:
        """The answer to a ``"backup-chunk"`` request: ``BACKUP_CHUNK`` bytes of a backup kept
        here, from an offset."""
        try:
            token, offset = msgpack.unpackb(request.command.op, max_array_len=2, max_map_len=0)
        except Exception:
            token = offset = None
        if type(token) is not int or type(offset) is not int or offset < 0:
            return ClientResponse(request.req_id, "error", "a backup-chunk op is msgpack "
                                  "[token, offset] (non-negative ints)")
        data = self._backups.get(token)
        if data is None:
            return ClientResponse(request.req_id, "definite", f"backup {token} is no longer "
                                  "kept here (a newer one replaced it): take a new one")
        return ClientResponse(request.req_id, "ok", data[offset : offset + BACKUP_CHUNK])

    # ------------------------------------------------------------------ the worker
    def run_off_loop(self, work: Callable[[], _T],
                     then: Callable[[Future[_T]], None]) -> None:
        """``work()`` in the worker (after what it was given before), then ``then(future)``
        on the loop."""
        self._when_done(self.writer.submit(work), then)

    def _let_go(self, garbage: list[object]) -> None:
        """Free what ``garbage`` alone refers to in the worker, a part at a time
        (``snapshot_writer.release_gradually``: freed at once, a 98k-GPU store's replaced
        state held the loop 50-100 ms). The caller keeps no reference to it."""
        self.writer.submit(functools.partial(release_gradually, garbage))

    async def _wait_for(self, work: Future[_T]) -> _T:
        """Wait for the worker's ``work`` in the middle of a turn: this replica's turns wait
        and the loop serves everything else."""
        self.busy.until_now()
        try:
            return await asyncio.wrap_future(work)
        finally:
            self.busy.since = time.perf_counter()

    def _wake_when_done(self, work: Future[Any]) -> None:
        """A turn runs once the worker finished ``work``."""
        self._when_done(work, lambda _: self.inbox.wake())

    def _when_done(self, work: Future[_T], then: Callable[[Future[_T]], None]) -> None:
        """``then(work)`` on the loop once the worker finished ``work``."""
        loop = asyncio.get_running_loop()

        def done(_: object) -> None:  # in the worker
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile (stop joins)
                loop.call_soon_threadsafe(then, work)

        work.add_done_callback(done)


def worker_result(work: Future[_T], what: str, me: int) -> _T | IndefiniteFailure:
    """What the worker made, or the failure its waiters get (a bug: logged)."""
    try:
        return work.result()
    except Exception as exc:
        log.error("replica %d: %s failed off the loop: %r", me, what, exc)
        return IndefiniteFailure(f"{what} failed at replica {me}: {exc!r}")


def _clocks() -> tuple[float, float]:
    """Now, by the wall clock and by this thread's CPU time (seconds)."""
    return time.perf_counter(), time.thread_time()
