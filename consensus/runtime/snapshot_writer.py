"""Writing a replica's snapshots off its event loop.

A snapshot of a large state machine (a 100k-GPU allocation store: 2 MB) took 60-90 ms on the
replica's event loop to encode, write and fsync, a stall every peer and client waited behind.
It now goes in three steps:

1. **capture**, on the loop, at the execution frontier: the core's ``snapshot_meta``, what
   the state machine must read *now* (``CapturesSnapshots.capture_snapshot``: a few ms; a
   machine without it is snapshotted whole here) and the records the log is rewritten to
   (the core compacts to the *previous* snapshot and says what the log must hold beyond the
   frontier, exactly as a snapshot taken and installed at once did);
2. **write**, in a worker thread: the state machine's bytes finished from what was
   captured, the snapshot file written and fsynced (``write_snapshot``: temp file, rename,
   directory fsync), then the log's new segment with the captured records made and synced
   (``WriteAheadLog.prepare_rewrite``);
3. **install**, on the loop again, once all that is durable: the snapshot becomes the one
   peers are sent, and the log is rewritten to the captured records plus every record logged
   since the capture (``InFlight.logged``; ``install_rewrite``: they are added to the
   prepared segment, one fdatasync, and it is renamed into place, one directory fsync) —
   what the log would hold had the rewrite run at the capture.

At most one snapshot is in flight: one that falls due meanwhile waits for the next turn
after the install. A crash at any point leaves a usable pair: before the rename, the old
snapshot and the whole log (not rewritten yet); after it, the new snapshot and a log that
still holds everything after it (the old one until the rewrite, the rewritten one after).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from consensus.protocol.types import SnapshotMeta
from consensus.statemachine import StateMachine
from consensus.storage.snapshot import encode_snapshot, write_snapshot
from consensus.storage.wal import PreparedRewrite, WriteAheadLog

__all__ = ["CapturesSnapshots", "InFlight", "SnapshotWriter", "capture_state"]


@runtime_checkable
class CapturesSnapshots(Protocol):
    """A state machine whose snapshot can be finished away from the loop that applies to it."""

    def capture_snapshot(self) -> Callable[[], bytes]:
        """Read now what ``snapshot()`` needs of the current state; the function returned
        makes the same bytes ``snapshot()`` would have made now, later and in any thread
        (it must read nothing that applying later commands changes)."""
        ...


def capture_state(machine: StateMachine) -> Callable[[], bytes]:
    """``machine``'s snapshot as of now, to be finished later (see ``CapturesSnapshots``)."""
    if isinstance(machine, CapturesSnapshots):
        return machine.capture_snapshot()
    data = machine.snapshot()
    return lambda: data


@dataclass(slots=True)
class InFlight:
    """A snapshot being written: where it stands, its file's bytes and the log's prepared
    rewrite (``done``) once they are durable, and what was logged since its capture."""

    meta: SnapshotMeta
    #: the encoded snapshot, once written and fsynced, and the log's prepared rewrite
    done: Future[tuple[bytes, PreparedRewrite]]
    #: every record logged since the capture, in order (the driver adds them)
    logged: list[bytes] = field(default_factory=list)


class SnapshotWriter:
    """One worker thread that encodes, writes and fsyncs snapshot files and prepares the
    log's rewrites, one at a time."""

    def __init__(self, directory: Path, wal: WriteAheadLog, name: str) -> None:
        self.directory = directory
        self._wal = wal
        self._name = name
        self._pool: ThreadPoolExecutor | None = None  # started by the first snapshot

    def write(self, meta: SnapshotMeta, state: Callable[[], bytes], records: list[bytes],
              room: int) -> Future[tuple[bytes, PreparedRewrite]]:
        """In the worker: encode the snapshot at ``meta`` of ``state()`` and store it durably,
        then prepare the log's rewrite to ``records`` with ``room`` bytes for what the log
        takes in meanwhile; the future holds the encoded bytes and the prepared rewrite."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self._name)
        return self._pool.submit(self._write, meta, state, records, room)

    def _write(self, meta: SnapshotMeta, state: Callable[[], bytes], records: list[bytes],
               room: int) -> tuple[bytes, PreparedRewrite]:
        data = encode_snapshot(meta, state())
        write_snapshot(self.directory, data, meta.slot)  # durable before the log shrinks
        return data, self._wal.prepare_rewrite(records, room)

    def close(self) -> None:
        """Stop the worker (after what it is writing)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
