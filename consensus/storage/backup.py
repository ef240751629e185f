"""Backup files: a consistent snapshot of a live cluster, its log position and a checksum.

``sdpaxos snapshot save FILE`` writes one (``consensus.runtime.backup``); ``sdpaxos snapshot
restore FILE --dir D`` seeds a new cluster from it. Format::

    b"SDPXBAK1" | u32 header length (big-endian) | msgpack header | snapshot

The header is a map: ``format`` (``BACKUP_FORMAT``), ``cluster_id`` and ``state_machine``
(the kind) of the cluster it came from, ``replicas``, ``slot`` (every slot below it is in the
snapshot: the log position), ``taken_at`` (ISO 8601, UTC), ``size`` and ``sha256`` of the
snapshot. The snapshot is a snapshot file's bytes (``consensus.storage.snapshot``: its own
magic and CRC-32). ``decode_backup`` checks everything and raises ``DecodeError`` naming what
is wrong; nothing of a damaged file is used.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import asdict, dataclass
from typing import Final

import msgpack

from consensus.errors import DecodeError
from consensus.protocol.types import SnapshotMeta
from consensus.storage.snapshot import decode_snapshot

__all__ = ["BACKUP_FORMAT", "MAGIC", "BackupHeader", "decode_backup", "encode_backup"]

MAGIC: Final = b"SDPXBAK1"
#: the header format this build writes and reads
BACKUP_FORMAT: Final = 1
_LENGTH = struct.Struct(">I")
#: a header is a few hundred bytes; anything longer is not one
MAX_HEADER_BYTES: Final = 1 << 16


@dataclass(frozen=True, slots=True)
class BackupHeader:
    cluster_id: str
    state_machine: str
    replicas: int
    slot: int
    taken_at: str
    size: int
    sha256: str
    format: int = BACKUP_FORMAT


_FIELD_TYPES: Final = {
    "cluster_id": str, "state_machine": str, "replicas": int, "slot": int, "taken_at": str,
    "size": int, "sha256": str, "format": int,
}


def encode_backup(
    *, cluster_id: str, state_machine: str, replicas: int, taken_at: str, snapshot: bytes
) -> bytes:
    """A backup of ``snapshot`` (a snapshot file's bytes, checked here)."""
    meta, _ = decode_snapshot(snapshot)
    header = BackupHeader(
        cluster_id=cluster_id, state_machine=state_machine, replicas=replicas, slot=meta.slot,
        taken_at=taken_at, size=len(snapshot), sha256=hashlib.sha256(snapshot).hexdigest(),
    )
    packed: bytes = msgpack.packb(asdict(header))
    return MAGIC + _LENGTH.pack(len(packed)) + packed + snapshot


def decode_backup(data: bytes) -> tuple[BackupHeader, SnapshotMeta, bytes]:
    """The header, the snapshot's position and the state machine's bytes of an intact backup;
    ``DecodeError`` for anything else."""
    start = len(MAGIC) + _LENGTH.size
    if len(data) < start or data[: len(MAGIC)] != MAGIC:
        raise DecodeError("not an sdpaxos backup (bad magic)")
    (length,) = _LENGTH.unpack_from(data, len(MAGIC))
    if length > MAX_HEADER_BYTES or start + length > len(data):
        raise DecodeError("backup header is truncated")
    try:
        fields = msgpack.unpackb(data[start : start + length], max_map_len=16)
        header = BackupHeader(**fields)
    except Exception as exc:
        raise DecodeError(f"backup header is malformed: {exc}") from None
    for name, kind in _FIELD_TYPES.items():
        value = getattr(header, name)
        negative = isinstance(value, int) and value < 0
        if type(value) is not kind or negative:
            raise DecodeError(f"backup header field {name} is {value!r}, not a "
                              f"{'non-negative int' if kind is int else kind.__name__}")
    if header.format != BACKUP_FORMAT:
        raise DecodeError(f"backup format {header.format} is not one this build reads "
                          f"({BACKUP_FORMAT})")
    snapshot = data[start + length :]
    if len(snapshot) != header.size:
        raise DecodeError(f"backup holds {len(snapshot)} snapshot bytes, its header says "
                          f"{header.size}: truncated or padded")
    if hashlib.sha256(snapshot).hexdigest() != header.sha256:
        raise DecodeError("backup checksum mismatch (sha256 of the snapshot)")
    meta, state = decode_snapshot(snapshot)
    if meta.slot != header.slot:
        raise DecodeError(f"backup header says slot {header.slot}, its snapshot {meta.slot}")
    return header, meta, state
