"""A crash-safe write-ahead log of opaque records, with group commit.

File format (segment files ``wal-<generation, 20 digits>.log``, read in generation order)::

    segment := header record*
    header  := b"SDPXWAL1"
    record  := length:u32 big-endian  crc:u32 big-endian  payload:length bytes

``crc`` is CRC-32 of ``length`` (4 bytes) followed by ``payload``, so a torn length field is
caught too. ``append`` buffers; ``sync`` writes everything buffered and fsyncs once (group
commit: the driver calls it once per loop turn, before sending what depends on the records).

Recovery (``open``) reads every segment in order:

* a record that is cut short, or whose CRC fails, *at the end of the last segment* is a torn
  write from a crash: it was never acknowledged (``sync`` had not returned), so the tail is
  truncated and the log reopens;
* anything else that does not check out — a bad record followed by more data, a bad header,
  damage in a segment that is not the last — is corruption of acknowledged data:
  ``WALCorruption`` names the file and byte offset, and nothing is silently dropped.

Compaction: ``rewrite(payloads)`` writes the records still needed (after a snapshot) to a new
segment, fsyncs it and the directory, then deletes the older segments. A crash in between
leaves old and new segments; reading both replays a superset, which the records' meaning
(later ones win) makes harmless.
"""

from __future__ import annotations

import os
import struct
import time
import zlib
from pathlib import Path

from consensus.errors import SDPaxosError

__all__ = ["MAX_RECORD", "WALCorruption", "WriteAheadLog"]

MAGIC = b"SDPXWAL1"
_HEADER = struct.Struct(">II")
#: largest record payload accepted (larger is a bug upstream, or a corrupt length on reading)
MAX_RECORD = 64 << 20
#: start a new segment once the current one passes this size
SEGMENT_BYTES = 64 << 20


class WALCorruption(SDPaxosError):
    """Durable log data is damaged: the replica must stop rather than lose acknowledged data."""

    def __init__(self, path: Path, offset: int, reason: str) -> None:
        super().__init__(f"{path}: offset {offset}: {reason}")
        self.path = path
        self.offset = offset


def _crc(length_field: bytes, payload: bytes) -> int:
    return zlib.crc32(payload, zlib.crc32(length_field))


def _segment_name(first: int) -> str:
    return f"wal-{first:020d}.log"


class WriteAheadLog:
    """Append-only durable log in directory ``path``. Not thread-safe."""

    def __init__(self, path: str | os.PathLike[str], segment_bytes: int = SEGMENT_BYTES) -> None:
        self.dir = Path(path)
        self.segment_bytes = segment_bytes
        self.dir.mkdir(parents=True, exist_ok=True)
        #: the records found on disk when the log was opened, oldest first
        self.recovered: list[bytes] = []
        self._count = 0  # durable records, recovered and appended
        self._pending: list[bytes] = []
        self._segments: list[tuple[int, Path]] = []  # (generation, path)
        self._load()
        self._count = len(self.recovered)
        self._file = open(self._segments[-1][1], "ab")  # noqa: SIM115 - held open for appends
        self._size = self._file.tell()
        #: seconds spent in fsync by the last ``sync`` (for metrics)
        self.last_sync_seconds = 0.0

    # ---------------------------------------------------------------- recovery
    def _load(self) -> None:
        paths = sorted(self.dir.glob("wal-*.log"))
        if not paths:
            self._new_segment(0)
            return
        for number, path in enumerate(paths):
            last = number == len(paths) - 1
            try:
                generation = int(path.stem.split("-")[1])
            except ValueError:
                raise WALCorruption(path, 0, "segment name is not wal-<number>.log") from None
            self._segments.append((generation, path))
            good_end = self._read_segment(path, last)
            if last and good_end < path.stat().st_size:
                with open(path, "r+b") as f:
                    f.truncate(good_end)
                    f.flush()
                    os.fsync(f.fileno())

    def _read_segment(self, path: Path, last: bool) -> int:
        """Append the segment's records; return the offset where valid data ends."""
        data = path.read_bytes()
        if data[: len(MAGIC)] != MAGIC:
            if last and len(data) < len(MAGIC) and MAGIC.startswith(data):
                return 0  # crashed while writing the header: an empty segment
            raise WALCorruption(path, 0, "bad segment header")
        offset = len(MAGIC)
        size = len(data)
        while offset < size:
            problem = None
            if size - offset < _HEADER.size:
                problem = "truncated record header"
            else:
                length, crc = _HEADER.unpack_from(data, offset)
                end = offset + _HEADER.size + length
                if length > MAX_RECORD:
                    problem = f"record length {length} over the limit"
                elif end > size:
                    problem = "truncated record"
                elif _crc(data[offset : offset + 4], data[offset + _HEADER.size : end]) != crc:
                    problem = "checksum mismatch"
            if problem is None:
                self.recovered.append(data[offset + _HEADER.size : end])
                offset = end
                continue
            torn_tail = last and (
                problem.startswith("truncated") or self._nothing_valid_after(data, offset)
            )
            if torn_tail:
                return offset
            raise WALCorruption(path, offset, problem)
        return offset

    @staticmethod
    def _nothing_valid_after(data: bytes, offset: int) -> bool:
        """A bad final record is a torn write only if it is the last thing in the file."""
        length: int = _HEADER.unpack_from(data, offset)[0]
        return offset + _HEADER.size + length >= len(data)

    def _new_segment(self, first: int) -> None:
        path = self.dir / _segment_name(first)
        with open(path, "wb") as f:
            f.write(MAGIC)
            f.flush()
            os.fsync(f.fileno())
        self._fsync_dir()
        self._segments.append((first, path))

    def _fsync_dir(self) -> None:
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # ---------------------------------------------------------------- appending
    def append(self, payload: bytes) -> None:
        """Buffer one record; it is durable once ``sync`` returns."""
        if len(payload) > MAX_RECORD:
            raise ValueError(f"record of {len(payload)} bytes over the {MAX_RECORD} limit")
        self._pending.append(payload)

    def sync(self, *, fsync: bool = True) -> None:
        """Write every buffered record and fsync once (group commit). ``fsync=False`` only
        hands the bytes to the OS (benchmarks of the no-fsync case; not crash-safe)."""
        if not self._pending:
            return
        chunks = []
        for payload in self._pending:
            head = struct.pack(">I", len(payload))
            chunks.append(head + struct.pack(">I", _crc(head, payload)) + payload)
        blob = b"".join(chunks)
        self._file.write(blob)
        self._file.flush()
        started = time.perf_counter()
        if fsync:
            os.fsync(self._file.fileno())
        self.last_sync_seconds = time.perf_counter() - started
        self._size += len(blob)
        self._count += len(self._pending)
        self._pending.clear()
        if self._size >= self.segment_bytes:
            self._roll()

    def _roll(self) -> None:
        self._file.close()
        self._new_segment(self._segments[-1][0] + 1)
        self._file = open(self._segments[-1][1], "ab")  # noqa: SIM115 - held open for appends
        self._size = self._file.tell()

    def rewrite(self, payloads: list[bytes]) -> None:
        """Replace the whole log by ``payloads`` (durably), dropping every older segment."""
        self.sync()
        old = list(self._segments)
        self._roll()
        self._pending = list(payloads)
        self._count = 0
        self.sync()
        for _, path in old:
            path.unlink()
        self._segments = self._segments[-1:]
        self._fsync_dir()

    def __len__(self) -> int:
        """Durable records (recovered at open plus synced since)."""
        return self._count

    def close(self) -> None:
        self._file.close()
