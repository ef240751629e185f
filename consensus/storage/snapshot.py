"""State-machine snapshot files: ``snapshot-<slot, 20 digits>.bin``, written atomically.

Format: ``b"SDPXSNP1"``, CRC-32 (u32, big-endian) of the rest, then msgpack
``[slot, exec_counts, state_machine_bytes]`` (see ``SnapshotMeta``), with a fourth element,
the membership in force (a ``ConfigRecord`` in the codec's record encoding), once the
members ever changed. The same bytes travel to a
lagging peer, which checks and keeps them as they are.
"""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import msgpack

from consensus.codec import decode_record, encode_record
from consensus.errors import DecodeError
from consensus.messages import ConfigRecord
from consensus.protocol.types import SnapshotMeta

__all__ = ["decode_snapshot", "encode_snapshot", "latest_snapshot", "write_snapshot"]

MAGIC = b"SDPXSNP1"


def encode_snapshot(meta: SnapshotMeta, state: bytes) -> bytes:
    fields: list[object] = [meta.slot, list(meta.exec_counts), state]
    if meta.config is not None:
        fields.append(encode_record(meta.config))
    body: bytes = msgpack.packb(fields)
    return MAGIC + struct.pack(">I", zlib.crc32(body)) + body


def decode_snapshot(data: bytes) -> tuple[SnapshotMeta, bytes]:
    """Raises ``DecodeError`` for anything but an intact snapshot."""
    if len(data) < len(MAGIC) + 4 or data[: len(MAGIC)] != MAGIC:
        raise DecodeError("not a snapshot (bad magic)")
    (crc,) = struct.unpack_from(">I", data, len(MAGIC))
    body = data[len(MAGIC) + 4 :]
    if zlib.crc32(body) != crc:
        raise DecodeError("snapshot checksum mismatch")
    try:
        slot, counts, state, *rest = msgpack.unpackb(body)
    except Exception as exc:
        raise DecodeError(f"snapshot body is malformed: {exc}") from None
    config = None
    if rest:
        if len(rest) != 1 or not isinstance(rest[0], bytes):
            raise DecodeError("snapshot body has the wrong shape")
        record = decode_record(rest[0])
        if not isinstance(record, ConfigRecord):
            raise DecodeError("a snapshot's membership is not a configuration")
        config = record
    valid = (
        isinstance(slot, int)
        and slot >= 0
        and isinstance(counts, list)
        and all(isinstance(c, int) and c >= 0 for c in counts)
        and isinstance(state, bytes)
    )
    if not valid:
        raise DecodeError("snapshot body has the wrong shape")
    return SnapshotMeta(slot, tuple(counts), config), state


def write_snapshot(directory: Path, data: bytes, slot: int) -> Path:
    """Durably store an encoded snapshot (temp file, fsync, rename, fsync the directory) and
    delete older ones."""
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"snapshot-{slot:020d}.bin"
    temp = directory / (final.name + ".tmp")
    with open(temp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, final)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    for older in directory.glob("snapshot-*.bin"):
        if older.name < final.name:
            older.unlink()
    return final


def latest_snapshot(directory: Path) -> tuple[bytes, SnapshotMeta, bytes] | None:
    """The newest snapshot as (encoded bytes, meta, state), or None. A damaged newest
    snapshot raises ``DecodeError`` naming the file: silently starting older would lose data
    its compacted log no longer holds."""
    files = sorted(directory.glob("snapshot-*.bin")) if directory.exists() else []
    if not files:
        return None
    data = files[-1].read_bytes()
    try:
        meta, state = decode_snapshot(data)
    except DecodeError as exc:
        raise DecodeError(f"{files[-1]}: {exc}") from None
    return data, meta, state
