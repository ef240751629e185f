"""A crash-safe write-ahead log of opaque records, with group commit.

File format, SDPXWAL2 (segment files ``wal-<generation, 20 digits>.log``, read in generation
order; every number big-endian)::

    segment := header record* end
    header  := b"SDPXWAL2"
    record  := length:u32  crc:u32  header_crc:u32  payload:length bytes
    end     := (nothing: the file ends right after the last record)
             | zero bytes up to the end of the file (at least one)

``crc`` is CRC-32 of ``payload``; ``header_crc`` is CRC-32 of the 8 bytes ``length crc``, so a
record's length can be trusted before its payload is read: a damaged length is seen as damage,
never taken as the extent of a torn write (which would let it swallow the records after it). An
all-zero header cannot check out (CRC-32 of eight zero bytes is not zero), so a zero length
field followed by zeros to the end of the segment marks the end of the log, while an empty
payload (``length`` 0, a non-zero ``header_crc``) is still a valid record. ``length`` is at
most ``MAX_RECORD``, and a record never extends past the end of its segment file.

Writing. A segment file is created whole before it holds anything -- ``header`` then zeros
(really written, not ``fallocate``'d, so that overwriting them changes no file metadata) up to
its *capacity*, synced -- under a temporary name (``segment-*.tmp``), and renamed to its
``wal-*.log`` name, with a directory fsync, when the log moves into it. Records are written at
the log's own offset over the zeros (``pwrite``); segment files never grow or shrink. ``append``
buffers; ``sync`` writes everything buffered with one ``pwrite`` and calls ``fdatasync`` once
(group commit: the driver calls it once per loop turn, before sending what depends on the
records); as no metadata changed, that writes only the data pages. ``sync(fsync=False)`` writes
without syncing at all (benchmarks of the no-fsync case; not crash-safe).

Segments and rollover. Once the current segment is half full, a background thread prepares the
next one as ``segment-next.tmp`` (like etcd's file pipeline), with twice the current capacity,
at most ``segment_bytes``; it fdatasyncs every MiB of zeros it writes, as one 64 MiB burst
stalled the log's own ``fdatasync`` for ~30 ms. Rolling over then costs ``sync`` only a rename
and a directory fsync (waiting for the preparation if it is still running). A segment created
synchronously -- the first one of a new log, the one ``rewrite`` starts unless a prepared one is
ready, one needed before any was prepared -- gets ``min(segment_bytes, 256 KiB)``, so a small
log stays small on disk and a fresh log opens about as fast as an SDPXWAL1 one did (measured:
0.6 ms against 0.45 ms; 1.2 ms with 1 MiB, 2.9 ms with 4 MiB); capacities then double up to
``segment_bytes``. A batch that does not fit in what is left of the current segment goes to the
next segment (a batch is never split), and a batch larger than a segment gets a segment sized
to fit it. The old segment is not truncated: its zero tail marks its end.

A crash anywhere in this leaves a readable directory: a ``segment-*.tmp`` holds no records (it
is removed at open), and a renamed segment is complete (header and zeros synced before the
rename) and empty until a record is written into it, which only happens after the directory
fsync.

Recovery (``open``) removes any ``segment-*.tmp`` (a segment prepared or being created and
never used: it holds no records) and reads every segment in order. Where a record does not
check out (header CRC, ``length``, payload CRC):

* if every byte from there to the end of the file is zero, that is the end of the log (in any
  segment);
* in the *last* segment, a record whose header checks out but whose payload does not (its
  payload was cut short -- unwritten parts of it are still zeros -- or garbled), followed only
  by zeros to the end of the file, is a torn write from a crash: ``sync`` had not returned, so
  it was never acknowledged. So is, in the last segment, a header that does not check out
  (cut short or garbled) followed only by zeros. The torn bytes are rewritten with zeros and
  synced before the log is written again, so no later recovery can mistake them for records.
  (Damage to the last acknowledged record looks the same and is dropped too, as in SDPXWAL1.)
* anything else is damage to acknowledged data, and ``WALCorruption`` names the file and byte
  offset (nothing is silently dropped): damage followed by a valid record or by any non-zero
  byte (non-zero bytes after a zero header, "garbage after the end of the log", included),
  damage in a segment that is not the last, a record running past the end of its file, a bad
  segment header.

Some torn writes are therefore reported as corruption rather than guessed at, since they look
exactly like lost or garbled acknowledged data: a crash writing several records that leaves a
hole (zeros) in one while a later one landed, or one that loses or garbles a record's header
while its payload landed (its extent is then unknown). The replica refuses to start instead of
risking the loss of acknowledged records. A process crash cannot cause these -- the kernel
still writes out everything ``pwrite`` took -- only a power failure that persists the sectors
of one write out of order (or garbled) can.

SDPXWAL1, the previous format (header ``b"SDPXWAL1"``; ``record := length:u32 crc:u32
payload`` with ``crc`` the CRC-32 of ``length`` then ``payload``; segments end at the end of
the file; written by appending), is still read, segment by segment, by its own rules: a record
cut short, or whose CRC fails, that reaches the end of the *last* segment is a torn write and
is truncated; anything else that does not check out is ``WALCorruption``. A last segment
shorter than its 8-byte header is an SDPXWAL1 segment whose creation was interrupted; it is
removed. If the last segment is SDPXWAL1, ``open`` starts a new SDPXWAL2 segment after it, so
SDPXWAL1 segments are never written again and are dropped by the next ``rewrite``.

Compaction: ``rewrite(payloads)`` writes the records still needed (after a snapshot) to a new
segment (renamed into place, directory fsynced, records fdatasynced), then deletes the older
segments and fsyncs the directory. A crash in between leaves old and new segments; reading both
replays a superset, which the records' meaning (later ones win) makes harmless.
``prepare_rewrite`` + ``install_rewrite`` do the same in two halves: the segment with the
records, made and synced in another thread; then, in the log's, the records logged meanwhile
added to it, its rename and the old segments' deletion.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import time
import zlib
from collections.abc import Callable
from io import FileIO
from pathlib import Path

from consensus.errors import SDPaxosError

__all__ = ["MAX_RECORD", "PreparedRewrite", "WALCorruption", "WriteAheadLog", "emulate_slow_disk"]

log = logging.getLogger("sdpaxos.wal")

MAGIC = b"SDPXWAL2"
MAGIC_V1 = b"SDPXWAL1"
_HEADER = struct.Struct(">III")  # length, crc of the payload, crc of the first 8 bytes
_V1_HEADER = struct.Struct(">II")  # length, crc of length + payload
#: largest record payload accepted (larger is a bug upstream, or a corrupt length on reading)
MAX_RECORD = 64 << 20
#: capacity of a full-grown segment (the first ones of a log are smaller, see the docstring)
SEGMENT_BYTES = 64 << 20
#: capacity of the first segment of a new log, and of any segment created synchronously
FIRST_SEGMENT_BYTES = 256 << 10
_PREPARED = "segment-next.tmp"  # prepared in the background
_CREATING = "segment-new.tmp"  # created synchronously
_REWRITING = "segment-rewrite.tmp"  # a rewrite's, made by ``prepare_rewrite``
_ZEROS = bytes(1 << 20)

_REAL_DATASYNC: Callable[[int], None] = getattr(os, "fdatasync", os.fsync)
_datasync = _REAL_DATASYNC


def emulate_slow_disk(extra_s: float) -> None:
    """Benchmarks only: every fdatasync of this process takes ``extra_s`` seconds longer (it
    sleeps after the real one, holding its thread as a slower disk would), as the transport's
    WAN emulation delays frames: ``sdpaxos serve --emulate-fsync-ms``, ``bench runtime``'s.
    This machine's disk syncs in about 0.15 ms; a cloud volume takes milliseconds."""
    global _datasync

    def slow(fd: int) -> None:
        _REAL_DATASYNC(fd)
        time.sleep(extra_s)

    _datasync = slow if extra_s > 0 else _REAL_DATASYNC


class WALCorruption(SDPaxosError):
    """Durable log data is damaged: the replica must stop rather than lose acknowledged data."""

    def __init__(self, path: Path, offset: int, reason: str) -> None:
        super().__init__(f"{path}: offset {offset}: {reason}")
        self.path = path
        self.offset = offset


def _segment_name(generation: int) -> str:
    return f"wal-{generation:020d}.log"


def _encode(payload: bytes) -> bytes:
    head = struct.pack(">II", len(payload), zlib.crc32(payload))
    return head + struct.pack(">I", zlib.crc32(head)) + payload


def _all_zero(data: bytes, start: int, end: int) -> bool:
    return start >= end or data.count(0, start, end) == end - start


def _pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


def _write_zeros(fd: int, start: int, end: int) -> None:
    zeros = memoryview(_ZEROS)
    while start < end:
        count = min(len(zeros), end - start)
        _pwrite_all(fd, zeros[:count], start)
        start += count


def _create_segment_file(
    path: Path, capacity: int, cancel: threading.Event | None = None
) -> FileIO | None:
    """Write ``path`` as an empty segment of ``capacity`` bytes (header, zeros), durably; the
    open file, or None if ``cancel`` was set first (the file is then removed).

    It fdatasyncs after each MiB: writing a whole 64 MiB segment and syncing once at the end
    stalled a concurrent ``sync`` of the log for ~30 ms (its device flush waits behind the
    burst); paced, the worst stall measured was ~3 ms, p99 ~1 ms. The last fdatasync also
    makes the size durable (timestamps are not needed)."""
    file = FileIO(path, "w+")
    try:
        fd = file.fileno()
        _pwrite_all(fd, MAGIC, 0)
        position = len(MAGIC)
        while cancel is None or not cancel.is_set():
            stop = min(position + len(_ZEROS), capacity)
            _write_zeros(fd, position, stop)
            position = stop
            _datasync(fd)
            if position >= capacity:
                return file
    except BaseException:
        file.close()
        path.unlink(missing_ok=True)
        raise
    file.close()
    path.unlink(missing_ok=True)
    return None


class _Preparation:
    """The next segment, being written in a background thread (like etcd's filePipeline)."""

    def __init__(self, path: Path, capacity: int) -> None:
        self.path = path
        self.capacity = capacity
        self._file: FileIO | None = None
        self._error: BaseException | None = None
        self._cancel = threading.Event()
        self._thread = threading.Thread(target=self._run, name="wal-prepare", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._file = _create_segment_file(self.path, self.capacity, self._cancel)
        except BaseException as exc:  # handed to the log's thread by ``take``
            self._error = exc

    def done(self) -> bool:
        return not self._thread.is_alive()

    def take(self) -> FileIO | None:
        """Wait for the segment; the file, or None if preparing it failed (the caller then
        creates one synchronously, where the error, if it persists, is raised)."""
        self._thread.join()
        if self._error is not None:
            log.warning("preparing %s failed: %r", self.path, self._error)
        return self._file

    def discard(self) -> None:
        self._cancel.set()
        self._thread.join()
        if self._file is not None:
            self._file.close()
            self._file = None
        self.path.unlink(missing_ok=True)


def _check_sizes(payloads: list[bytes]) -> None:
    for payload in payloads:
        if len(payload) > MAX_RECORD:
            raise ValueError(f"record of {len(payload)} bytes over the {MAX_RECORD} limit")


def _blob(payloads: list[bytes]) -> bytes:
    """``payloads`` as they are laid out in a segment, one after the other."""
    return b"".join([_encode(payload) for payload in payloads])


def _checked_blob(payloads: list[bytes]) -> bytes:
    """``_blob``, once no record is over ``MAX_RECORD`` (``ValueError`` otherwise)."""
    _check_sizes(payloads)
    return _blob(payloads)


class PreparedRewrite:
    """A segment holding a rewrite's records, written and synced but not part of the log yet
    (``WriteAheadLog.prepare_rewrite``, ``install_rewrite``)."""

    __slots__ = ("capacity", "end", "file", "path", "payloads")

    def __init__(self, path: Path, file: FileIO, capacity: int, end: int,
                 payloads: list[bytes]) -> None:
        self.path, self.file, self.capacity, self.end = path, file, capacity, end
        self.payloads = payloads

    def discard(self) -> None:
        self.file.close()
        self.path.unlink(missing_ok=True)


class WriteAheadLog:
    """Durable log in directory ``path``. Not thread-safe (one background thread of its own
    prepares segments, and touches nothing else)."""

    def __init__(self, path: str | os.PathLike[str], segment_bytes: int = SEGMENT_BYTES) -> None:
        self.dir = Path(path)
        self.segment_bytes = segment_bytes
        self.dir.mkdir(parents=True, exist_ok=True)
        #: the records found on disk when the log was opened, oldest first
        self.recovered: list[bytes] = []
        #: seconds spent in fdatasync by the last ``sync``, plus rolling over if it did (metrics)
        self.last_sync_seconds = 0.0
        self._pending: list[bytes] = []
        self._segments: list[tuple[int, Path]] = []  # (generation, path)
        self._next_generation = 0
        self._file: FileIO | None = None  # the current (last) segment
        self._offset = 0  # where the next record goes in it
        self._capacity = 0  # its size
        self._preparation: _Preparation | None = None
        self._load()
        self._count = len(self.recovered)  # durable records, recovered and appended
        self._maybe_prepare()

    # ---------------------------------------------------------------- recovery
    def _load(self) -> None:
        for leftover in self.dir.glob("segment-*.tmp"):
            leftover.unlink()  # prepared or being created, never renamed into place: no records
        found: list[tuple[int, Path]] = []
        for path in sorted(self.dir.glob("wal-*.log")):
            try:
                generation = int(path.stem.split("-")[1])
            except ValueError:
                raise WALCorruption(path, 0, "segment name is not wal-<number>.log") from None
            found.append((generation, path))
        if found:
            self._next_generation = found[-1][0] + 1
            last_path = found[-1][1]
            size = last_path.stat().st_size
            if size < len(MAGIC) and MAGIC_V1.startswith(last_path.read_bytes()):
                # an SDPXWAL1 writer crashed creating this segment in place: it holds nothing
                last_path.unlink()
                self._fsync_dir()
                found.pop()
        current_is_v2 = False
        for number, (generation, path) in enumerate(found):
            last = number == len(found) - 1
            data = path.read_bytes()
            self._segments.append((generation, path))
            magic = data[: len(MAGIC)]
            if magic == MAGIC:
                end, garbage_end = self._read_segment(path, data, last)
                if last:
                    current_is_v2 = True
                    self._open_current(path, end, len(data), garbage_end)
            elif magic == MAGIC_V1:
                end = self._read_segment_v1(path, data, last)
                if last and end < len(data):
                    with open(path, "r+b") as f:
                        f.truncate(end)
                        f.flush()
                        os.fsync(f.fileno())
            else:
                raise WALCorruption(path, 0, "bad segment header")
        if not current_is_v2:  # a new log, or one whose last segment is SDPXWAL1
            self._roll(0, wait=False)

    def _open_current(self, path: Path, end: int, size: int, garbage_end: int) -> None:
        self._file = FileIO(path, "r+")
        self._offset = end
        self._capacity = size
        if garbage_end > end:  # a torn write: zeros again, before anything is written there
            fd = self._file.fileno()
            _write_zeros(fd, end, garbage_end)
            _datasync(fd)

    def _read_segment(self, path: Path, data: bytes, last: bool) -> tuple[int, int]:
        """Append an SDPXWAL2 segment's records; return where the log ends in it and where
        the bytes of a torn write (to be zeroed) end."""
        size = len(data)
        offset = len(MAGIC)
        while offset < size:
            if size - offset < _HEADER.size:
                problem = "truncated record header"
            else:
                length, crc, header_crc = _HEADER.unpack_from(data, offset)
                start = offset + _HEADER.size
                if zlib.crc32(data[offset : offset + 8]) != header_crc:
                    problem = "bad record header"
                    if _all_zero(data, offset, start):
                        problem = "data after the end of the log (a zero header)"
                    elif last and _all_zero(data, start, size):
                        return offset, start  # a torn header, nothing after it
                else:
                    end = start + length
                    if length > MAX_RECORD:
                        problem = f"record length {length} over the limit"
                    elif end > size:
                        problem = f"record of {length} bytes runs past the end of the segment"
                    elif zlib.crc32(data[start:end]) == crc:
                        self.recovered.append(data[start:end])
                        offset = end
                        continue
                    else:
                        problem = "checksum mismatch"
                        if last and _all_zero(data, end, size):
                            return offset, end  # a torn payload, nothing after it
            if _all_zero(data, offset, size):
                return offset, offset  # the end of the log
            raise WALCorruption(path, offset, problem)
        return offset, offset

    def _read_segment_v1(self, path: Path, data: bytes, last: bool) -> int:
        """Append an SDPXWAL1 segment's records; return the offset where valid data ends."""
        offset = len(MAGIC_V1)
        size = len(data)
        while offset < size:
            problem = None
            end = size
            if size - offset < _V1_HEADER.size:
                problem = "truncated record header"
            else:
                length, crc = _V1_HEADER.unpack_from(data, offset)
                start = offset + _V1_HEADER.size
                end = start + length
                if length > MAX_RECORD:
                    problem = f"record length {length} over the limit"
                elif end > size:
                    problem = "truncated record"
                elif zlib.crc32(data[start:end], zlib.crc32(data[offset : offset + 4])) != crc:
                    problem = "checksum mismatch"
            if problem is None:
                self.recovered.append(data[start:end])
                offset = end
                continue
            # a bad final record is a torn write only if it is the last thing in the file
            if last and end >= size:
                return offset
            raise WALCorruption(path, offset, problem)
        return offset

    def _fsync_dir(self) -> None:
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # ---------------------------------------------------------------- segments
    def _next_capacity(self) -> int:
        """Capacity of the segment after the current one (doubling up to segment_bytes)."""
        return min(self.segment_bytes, max(FIRST_SEGMENT_BYTES, 2 * self._capacity))

    def _maybe_prepare(self) -> None:
        """Start preparing the next segment once the current one is half full."""
        if self._preparation is None and 2 * self._offset >= self._capacity:
            capacity = max(len(MAGIC), self._next_capacity())
            self._preparation = _Preparation(self.dir / _PREPARED, capacity)

    def _roll(self, needed: int, *, wait: bool) -> None:
        """Move to a new segment with room for ``needed`` bytes of records: the prepared one
        (waiting for it if ``wait``) if it is big enough, else one created now."""
        room = len(MAGIC) + needed
        file = None
        preparation = self._preparation
        if preparation is not None and (wait or preparation.done()):
            self._preparation = None
            if preparation.capacity >= room:
                file = preparation.take()
            if file is None:
                preparation.discard()
        if file is not None:
            assert preparation is not None
            temporary, capacity = preparation.path, preparation.capacity
        else:
            # no segment prepared: create a small one now (well under a millisecond)
            temporary = self.dir / _CREATING
            capacity = max(room, min(self.segment_bytes, FIRST_SEGMENT_BYTES))
            file = _create_segment_file(temporary, capacity)
            assert file is not None
        generation = self._next_generation
        path = self.dir / _segment_name(generation)
        try:
            os.rename(temporary, path)
            self._fsync_dir()
        except BaseException:
            file.close()
            raise
        if self._file is not None:
            self._file.close()
        self._file = file
        self._segments.append((generation, path))
        self._next_generation = generation + 1
        self._offset = len(MAGIC)
        self._capacity = capacity

    def _write(self, payloads: list[bytes], *, fsync: bool, wait: bool) -> None:
        blob = _blob(payloads)
        rolling = 0.0
        if self._offset + len(blob) > self._capacity:
            started = time.perf_counter()
            self._roll(len(blob), wait=wait)
            rolling = time.perf_counter() - started
        assert self._file is not None
        fd = self._file.fileno()
        _pwrite_all(fd, blob, self._offset)
        started = time.perf_counter()
        if fsync:
            _datasync(fd)
        self.last_sync_seconds = rolling + time.perf_counter() - started
        self._offset += len(blob)

    # ---------------------------------------------------------------- appending
    def append(self, payload: bytes) -> None:
        """Buffer one record; it is durable once ``sync`` returns."""
        if len(payload) > MAX_RECORD:
            raise ValueError(f"record of {len(payload)} bytes over the {MAX_RECORD} limit")
        self._pending.append(payload)

    def sync(self, *, fsync: bool = True) -> None:
        """Write every buffered record and fdatasync once (group commit). ``fsync=False`` only
        hands the bytes to the OS (benchmarks of the no-fsync case; not crash-safe)."""
        if not self._pending:
            return
        self._write(self._pending, fsync=fsync, wait=True)
        self._count += len(self._pending)
        self._pending.clear()
        self._maybe_prepare()

    def rewrite(self, payloads: list[bytes]) -> None:
        """Replace the whole log by ``payloads`` (durably), dropping every older segment."""
        _check_sizes(payloads)
        self.sync()
        old = list(self._segments)
        # a new segment even if the records would fit in the current one: deleting the old
        # segments must leave exactly these records. Don't wait for a segment being prepared.
        blob_size = sum(_HEADER.size + len(payload) for payload in payloads)
        self._roll(blob_size, wait=False)
        self._write(list(payloads), fsync=True, wait=False)
        self._count = len(payloads)
        for _, path in old:
            path.unlink()
        self._segments = self._segments[-1:]
        self._fsync_dir()
        self._maybe_prepare()

    def prepare_rewrite(self, payloads: list[bytes], room: int = 0) -> PreparedRewrite:
        """The first half of ``rewrite(payloads + later)``, safe in another thread (it writes
        only a segment file of its own, ``segment-rewrite.tmp``, which ``open`` removes if it
        was never installed): the segment with ``payloads`` in it, synced, with ``room``
        bytes for the records logged until ``install_rewrite`` (and after; within the
        segment size, and at least a first segment's). A
        replica prepares it with its snapshot, off its event loop; a rewrite's segment
        creation and fsyncs held the loop 30-70 ms on a busy disk."""
        blob = _checked_blob(payloads)
        end = len(MAGIC) + len(blob)
        capacity = max(end, min(self.segment_bytes, max(end + room, FIRST_SEGMENT_BYTES)))
        path = self.dir / _REWRITING
        file = _create_segment_file(path, capacity)
        assert file is not None
        try:
            _pwrite_all(file.fileno(), blob, len(MAGIC))
            _datasync(file.fileno())
        except BaseException:
            file.close()
            path.unlink(missing_ok=True)
            raise
        return PreparedRewrite(path, file, capacity, end, list(payloads))

    def install_rewrite(self, prepared: PreparedRewrite, payloads: list[bytes]) -> None:
        """``rewrite(prepared's payloads + payloads)`` with most of its I/O done already: the
        records logged since the preparation go after the prepared ones (one fdatasync), the
        segment is renamed into place (a directory fsync) and the older segments are
        deleted. Their deletion is not synced: a crash that brings them back leaves old and
        new segments, a superset that is harmless (see the module docstring), and the next
        directory fsync makes it durable. Without room for ``payloads`` in the prepared
        segment, a plain ``rewrite``."""
        blob = _checked_blob(payloads)
        self.sync()
        if prepared.end + len(blob) > prepared.capacity:
            log.info("%s: %d bytes logged while a rewrite was prepared, room for %d: rewritten "
                     "whole", self.dir, len(blob), prepared.capacity - prepared.end)
            prepared.discard()
            self.rewrite([*prepared.payloads, *payloads])
            return
        file = prepared.file
        generation = self._next_generation
        path = self.dir / _segment_name(generation)
        try:
            _pwrite_all(file.fileno(), blob, prepared.end)
            _datasync(file.fileno())
            os.rename(prepared.path, path)
            self._fsync_dir()
        except BaseException:
            prepared.discard()
            raise
        old = list(self._segments)
        if self._file is not None:
            self._file.close()
        self._file = file
        self._segments = [(generation, path)]
        self._next_generation = generation + 1
        self._offset = prepared.end + len(blob)
        self._capacity = prepared.capacity
        self._count = len(prepared.payloads) + len(payloads)
        for _, older in old:
            older.unlink()
        self._maybe_prepare()

    def __len__(self) -> int:
        """Durable records (recovered at open plus synced since)."""
        return self._count

    @property
    def closed(self) -> bool:
        """True once ``close`` ran."""
        return self._file is not None and self._file.closed

    def close(self) -> None:
        if self._preparation is not None:
            self._preparation.discard()
            self._preparation = None
        if self._file is not None:
            self._file.close()
