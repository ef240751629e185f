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
   directory fsync), then the log's new segment with the captured records (immutable
   objects, encoded here) made and synced
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

**The worker's other jobs** (``SnapshotWriter.submit``; one thread, so they queue behind one
another and never compete with each other for the machine's CPUs):

* **a peer's snapshot** (``SnapshotPipeline.receive``): decoded, and the state machine's
  new state built beside its live one (``RestoresOffLoop.prepare_restore``: 0.35-0.45 s at 98k
  GPUs); the node keeps turning its core and applying meanwhile. Then, on the loop, the core
  installs it and the state machine adopts the built state (a swap); the snapshot file and
  the log's rewrite to the core's records are written by the worker *with the replica's
  turns paused* (the loop still reads sockets and answers /metrics): no record of the
  installed core may reach the log before the snapshot it starts from is durable.
* **a backup**: captured on the loop (``capture_state``), encoded and hashed by the worker;
* **a deferred query** (``consensus.statemachine.DefersQueries``: the store's digest):
  captured on the loop, answered by the worker.

How the worker does not slow the loop down: it gives way (``consensus.loop_share``). Long work
calls ``give_way()`` often (a store's restore between the groups and cells it builds,
``release_gradually`` between chunks), and in this worker each call after a millisecond of work
hands the interpreter lock to the loop's thread; without it, both threads took the lock in
5 ms turns and every loop turn ran twice as long while the worker worked.

How the worker never reads a state machine while the loop changes it: it reads only a
*capture* (the captured pieces are immutable or copies) or builds a state beside the live one
(reading only immutable objects), which the loop adopts in one step.
"""

from __future__ import annotations

import collections
import itertools
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar, runtime_checkable

from consensus.codec import encode_record
from consensus.loop_share import give_way, shares_with_loop
from consensus.messages import Record
from consensus.protocol.types import SnapshotMeta
from consensus.statemachine import StateMachine
from consensus.storage.snapshot import encode_snapshot, write_snapshot
from consensus.storage.wal import PreparedRewrite, WriteAheadLog

__all__ = [
    "CapturesSnapshots",
    "InFlight",
    "RestoresOffLoop",
    "SnapshotWriter",
    "capture_state",
    "prepared_restore",
    "release_gradually",
]

_T = TypeVar("_T")


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


@runtime_checkable
class RestoresOffLoop(Protocol):
    """A state machine whose restore can be built away from the loop that applies to it."""

    def prepare_restore(self, data: bytes) -> Callable[[], object]:
        """Build, in any thread, the state ``restore(data)`` would load, beside the current
        one (reading nothing that applying commands changes, changing nothing); the
        function returned makes it the current state at once, and returns what it replaced
        (the caller lets go of it away from the loop: ``release_gradually``). Raises (from
        this call) for a snapshot that does not load, the machine untouched."""
        ...


def prepared_restore(machine: StateMachine, state: bytes) -> Callable[[], object]:
    """In a worker thread: what makes ``state`` ``machine``'s, on the loop, at once
    (``RestoresOffLoop``); a machine without it restores there whole."""
    if isinstance(machine, RestoresOffLoop):
        return machine.prepare_restore(state)
    return lambda: machine.restore(state)


#: ``release_gradually`` frees at most about this many items of a container in one C call,
#: and opens each item of a container of at most ``FEW``
RELEASE_CHUNK = 1024
FEW = 64
#: containers ``release_gradually`` empties a chunk at a time, and what it never opens
_CONTAINERS = (list, dict, set, frozenset, tuple, collections.deque)
_ATOMS = frozenset({int, float, bool, str, bytes, type(None)})


def release_gradually(garbage: list[object]) -> None:
    """Let go of what ``garbage`` holds (the only references to it) a part at a time: call
    it in a worker thread. Freeing a large structure is one C call that holds the
    interpreter lock, and so the replica's event loop, until all of it is freed: 50-100 ms
    for the allocator a 98k-GPU store replaced by a snapshot. Here each object handed over
    is opened (its attributes, a closure's contents, ... are taken out and opened in turn,
    as are the items of a container of at most ``FEW``), and a bigger container is emptied
    ``RELEASE_CHUNK`` items at a time: the items of a chunk are freed at once, but for the
    containers of more than ``FEW`` among them, which are emptied in turn. Anything still
    referred to elsewhere (shared with the state that replaced it) is only let go of, never
    touched."""
    stack = garbage
    while stack:
        give_way()
        item = stack.pop()
        # ``item`` and the call's argument: anything more is someone else's reference
        if sys.getrefcount(item) > 2:
            continue
        if isinstance(item, _CONTAINERS):
            if len(item) <= FEW:
                stack += item.values() if isinstance(item, dict) else item
                stack += item if isinstance(item, dict) else ()
                continue  # (each opened in turn)
            parts: Iterator[list[object]] = (
                _emptied(item) if isinstance(item, list | dict | set | collections.deque)
                else iter([list(item)]))
            for part in parts:
                give_way()
                if not _ATOMS.issuperset(map(type, part)):  # (most often: all atoms, in C)
                    stack += [x for x in part if isinstance(x, _CONTAINERS) and len(x) > FEW]
                del part  # the rest is freed here (the bigger ones once popped)
        elif isinstance(item, types.FunctionType):
            stack += (cell.cell_contents for cell in item.__closure__ or ())
        elif isinstance(item, types.MethodType):
            stack.append(item.__self__)
        elif type(item) not in _ATOMS:
            if hasattr(item, "__dict__"):
                stack += vars(item).values()
            stack += (getattr(item, name) for cls in type(item).__mro__
                      for name in getattr(cls, "__slots__", ()) if hasattr(item, name))
        # ``item`` goes at the loop's next assignment: what it held is on the stack now


def _emptied(
    container: list[object] | dict[object, object] | set[object] | collections.deque[object],
) -> Iterator[list[object]]:
    """``container``'s items (a dict's keys and values), ``RELEASE_CHUNK`` at a time, taken
    out of it."""
    while container:
        if isinstance(container, list):
            part = container[-RELEASE_CHUNK:]
            del container[-RELEASE_CHUNK:]
        elif isinstance(container, dict):
            part = list(itertools.islice(container, RELEASE_CHUNK))
            part += map(container.pop, part[:])
        else:
            part = [container.pop() for _ in range(min(RELEASE_CHUNK, len(container)))]
        yield part


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
    log's rewrites, one at a time, and runs the node's other work off the loop (``submit``)."""

    def __init__(self, directory: Path, wal: WriteAheadLog, name: str) -> None:
        self.directory = directory
        self._wal = wal
        self._name = name
        self._pool: ThreadPoolExecutor | None = None  # started by the first snapshot

    def write(self, meta: SnapshotMeta, state: Callable[[], bytes], records: Sequence[Record],
              room: int) -> Future[tuple[bytes, PreparedRewrite]]:
        """In the worker: encode the snapshot at ``meta`` of ``state()`` and store it durably,
        then prepare the log's rewrite to ``records`` (immutable: encoded there too, a
        loaded interval's thousands took ~10 ms of the loop) with ``room`` bytes for what the
        log takes in meanwhile; the future holds the encoded bytes and the prepared
        rewrite."""
        return self.submit(lambda: self._write(meta, state, records, room))

    def submit(self, work: Callable[[], _T]) -> Future[_T]:
        """Run ``work()`` in the worker, after what it was given before."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self._name,
                                            initializer=shares_with_loop)
        return self._pool.submit(work)

    def _write(self, meta: SnapshotMeta, state: Callable[[], bytes], records: Sequence[Record],
               room: int) -> tuple[bytes, PreparedRewrite]:
        data = encode_snapshot(meta, state())
        write_snapshot(self.directory, data, meta.slot)  # durable before the log shrinks
        payloads = []
        for record in records:
            give_way()
            payloads.append(encode_record(record))
        return data, self._wal.prepare_rewrite(payloads, room)

    def close(self) -> None:
        """Stop the worker (after what it is writing)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
