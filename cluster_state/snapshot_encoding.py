"""Packing a snapshot in pieces, most of them kept from the last snapshot.

A 100k-GPU store's snapshot is a few MB of msgpack, and ``msgpack.packb`` of all of it took
most of the ~100 ms a snapshot spent on the replica's event loop. Most of it does not change
between two snapshots (the groups that did not change, the events still in the log), so the
store packs those once and joins the kept bytes: msgpack packs a list as an array header
followed by its items packed one by one, so ``packed_array_header(len(items))`` followed by
each item's own ``packb`` bytes *is* ``packb(items)``, byte for byte (the snapshot stays
canonical: every replica writes the same bytes for the same state).
"""

from __future__ import annotations

import struct
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgpack

from consensus.loop_share import give_way

__all__ = ["PackedEvents", "Pieces", "pack", "packed_array_header", "unpack_snapshot"]

#: the fields of a snapshot up to its sessions, of its allocation state and of its event log
_FIELDS: Final = 7
_STATE_FIELDS: Final = 4
_EVENT_LOG_FIELDS: Final = 2

#: msgpack array headers: fixarray up to 15 items, then array 16 and array 32
_FIXARRAY_MAX: Final = 15
_FIXARRAY: Final = 0x90
_ARRAY16_MAX: Final = 0xFFFF
_ARRAY16: Final = b"\xdc"
_ARRAY32: Final = b"\xdd"


def pack(value: object) -> bytes:
    """``msgpack.packb(value)``, by a packer kept per thread (``packb`` makes a packer, and
    its buffer, for every call; the store packs every operation's answer and every changed
    group's record)."""
    packer = getattr(_packers, "packer", None)
    if packer is None:
        packer = _packers.packer = msgpack.Packer()
    packed: bytes = packer.pack(value)  # (a failed pack leaves the packer empty)
    return packed


#: each thread's ``msgpack.Packer`` (one packer is not meant to be shared by threads)
_packers = threading.local()


def packed_array_header(length: int) -> bytes:
    """The bytes msgpack starts an array of ``length`` items with."""
    if length <= _FIXARRAY_MAX:
        return bytes((_FIXARRAY | length,))
    if length <= _ARRAY16_MAX:
        return _ARRAY16 + struct.pack(">H", length)
    return _ARRAY32 + struct.pack(">I", length)


class PackedEvents:
    """The packed wire form of each event still in an event log, kept from one snapshot to
    the next: events never change, and the log only appends new ones and drops the oldest
    (a log replaced by a restore is packed again). ``pack`` may run in a replica's snapshot
    thread (on a copy of the log's events) while its loop snapshots too (a digest query, a
    backup): the kept forms are the lock's."""

    __slots__ = ("_kept", "_lock")

    def __init__(self) -> None:
        #: (event, its packed wire form), in the log's order: a prefix of what the log held
        self._kept: deque[tuple[object, bytes]] = deque()
        self._lock = threading.Lock()

    def keep(self, events: Sequence[Any], packed: Sequence[bytes]) -> None:
        """Take ``packed[i]`` as the packed wire form of ``events[i]`` (a restore: the
        snapshot's own bytes of the events it loaded)."""
        with self._lock:
            self._kept = deque(zip(events, packed, strict=True))

    def pack(self, events: Sequence[Any]) -> bytes:
        """``packb([e.to_wire() for e in events])`` (``events``: the log's deque, or a copy
        of it that nothing changes meanwhile)."""
        with self._lock:
            return self._pack(events)

    def _pack(self, events: Sequence[Any]) -> bytes:
        kept = self._kept
        if events and kept:
            oldest = events[0]
            while kept and kept[0][0] is not oldest:  # dropped from the log since
                kept.popleft()
            if len(kept) > len(events) or (kept and kept[-1][0] is not events[len(kept) - 1]):
                kept.clear()  # not the log these were kept from
        else:
            kept.clear()
        for k in range(len(kept), len(events)):
            give_way()  # (a snapshot's, a backup's, a digest's: in a replica's worker)
            event = events[k]
            kept.append((event, msgpack.packb(event.to_wire())))
        return packed_array_header(len(kept)) + b"".join([packed for _, packed in kept])


@dataclass(slots=True)
class Pieces:
    """The packed bytes of each group record and each event of a snapshot, as it held them
    (``unpack_snapshot``): a restored store keeps them, so its first snapshot packs nothing
    again."""

    groups: list[bytes]
    events: list[bytes]


def unpack_snapshot(data: bytes, fmt: int, fields: int) -> tuple[list[Any], Pieces | None]:
    """``msgpack.unpackb(data)`` and, for a snapshot of format ``fmt`` (the current one,
    ``[fmt, digest, config, revision, [groups, ...], [floor, events], sessions, ...]`` of
    ``fields`` fields), the bytes each group record and each event took in it; other formats:
    no pieces. Raises what msgpack raises for bytes that are not such a snapshot."""
    unpacker = msgpack.Unpacker(max_buffer_size=max(len(data), 1))
    unpacker.feed(data)
    if unpacker.read_array_header() != fields or unpacker.unpack() != fmt:
        return msgpack.unpackb(data), None
    head = [fmt, unpacker.unpack(), unpacker.unpack(), unpacker.unpack()]
    if unpacker.read_array_header() != _STATE_FIELDS:
        return msgpack.unpackb(data), None
    groups, group_pieces = _items(unpacker, data)
    state = [groups, unpacker.unpack(), unpacker.unpack(), unpacker.unpack()]
    if unpacker.read_array_header() != _EVENT_LOG_FIELDS:
        return msgpack.unpackb(data), None
    floor = unpacker.unpack()
    events, event_pieces = _items(unpacker, data)
    rest = [unpacker.unpack() for _ in range(fields - _FIELDS + 1)]  # sessions, ...
    if unpacker.tell() != len(data):
        raise ValueError(f"{len(data) - unpacker.tell()} bytes after the snapshot")
    return [*head, state, [floor, events], *rest], Pieces(group_pieces, event_pieces)


def _items(unpacker: msgpack.Unpacker, data: bytes) -> tuple[list[Any], list[bytes]]:
    """The items of the array ``unpacker`` is at, and the bytes each took in ``data``."""
    items, pieces = [], []
    for _ in range(unpacker.read_array_header()):
        give_way()  # (a peer's snapshot is read in a replica's worker)
        start = unpacker.tell()
        items.append(unpacker.unpack())
        pieces.append(data[start : unpacker.tell()])
    return items, pieces
