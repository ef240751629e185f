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
from collections import deque
from collections.abc import Sequence
from typing import Any, Final

import msgpack

__all__ = ["PackedEvents", "packed_array_header"]

#: msgpack array headers: fixarray up to 15 items, then array 16 and array 32
_FIXARRAY_MAX: Final = 15
_FIXARRAY: Final = 0x90
_ARRAY16_MAX: Final = 0xFFFF
_ARRAY16: Final = b"\xdc"
_ARRAY32: Final = b"\xdd"


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
    (a log replaced by a restore is packed again)."""

    __slots__ = ("_kept",)

    def __init__(self) -> None:
        #: (event, its packed wire form), in the log's order: a prefix of what the log held
        self._kept: deque[tuple[object, bytes]] = deque()

    def pack(self, events: Sequence[Any]) -> bytes:
        """``packb([e.to_wire() for e in events])`` (``events``: the log's deque)."""
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
            event = events[k]
            kept.append((event, msgpack.packb(event.to_wire())))
        return packed_array_header(len(kept)) + b"".join([packed for _, packed in kept])
