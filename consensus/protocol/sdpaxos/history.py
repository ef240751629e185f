"""The sequencer's history table: the last slot assigned to an update of each key (§3.5).

A linearizable read needs the slot of the latest update it could observe: the sequencer
answers ``RRequest`` with ``read_slot(keys)`` and the reading replica serves the read once it
executed through that slot. The answer may be later than necessary, never earlier:

* a command that names no keys counts as updating every key (``floor``);
* an O-instance ordered before the sequencer saw its command's keys (a ``CRequest`` that
  named none, a recovery) counts as updating every key until its keys are learned
  (``unknown``);
* after a view change the new sequencer knows no history: everything it did not order
  itself counts as a write to every key (``reset(floor)``).

Pure state, tested alone (tests/protocol/sdpaxos/test_history.py).
"""

from __future__ import annotations

from collections.abc import Iterable

from consensus.messages import Command
from consensus.protocol.sdpaxos.instances import NO_SLOT

__all__ = ["HistoryTable"]


class HistoryTable:
    """Per key, the last slot assigned to an update of it."""

    __slots__ = ("floor", "last", "unknown")

    def __init__(self) -> None:
        self.last: dict[str, int] = {}
        #: every slot up to this one counts as updating every key
        self.floor = NO_SLOT
        #: (owner, index) ordered before its keys were known -> its slot
        self.unknown: dict[tuple[int, int], int] = {}

    def reset(self, floor: int) -> None:
        self.last.clear()
        self.unknown.clear()
        self.floor = floor

    def note_update(self, slot: int, batch: Iterable[Command]) -> None:
        """``slot`` updates the keys of ``batch``. On the sequencer's path for every command:
        it walks the batch once (building a sorted union of its keys twice per CAccept took a
        fifth of a loaded sequencer's CPU)."""
        last = self.last
        for command in batch:
            if not command.keys:
                self.floor = max(self.floor, slot)
                return  # the keys noted so far were right too, and the floor covers the rest
            for key in command.keys:
                if last.get(key, NO_SLOT) < slot:
                    last[key] = slot

    def note_keys(self, slot: int, keys: Iterable[str]) -> None:
        """``slot`` updates ``keys`` (as a ``CRequest`` names them)."""
        for key in keys:
            self.last[key] = slot

    def note_unknown(self, instance: tuple[int, int], slot: int) -> None:
        """``slot`` places ``instance``, whose keys we do not know yet."""
        self.unknown[instance] = slot

    def learn_keys(self, instance: tuple[int, int], batch: Iterable[Command]) -> None:
        """The value of ``instance`` became known: its slot updates its keys only."""
        slot = self.unknown.pop(instance, None)
        if slot is not None:
            self.note_update(slot, batch)

    def read_slot(self, keys: Iterable[str], last_slot: int) -> int:
        """The slot a read of ``keys`` must wait for (``last_slot``, the last one assigned,
        for a read that names no key)."""
        keys = tuple(keys)
        if not keys:
            return last_slot
        slot = max((self.last.get(key, NO_SLOT) for key in keys), default=NO_SLOT)
        if self.unknown:
            slot = max(slot, max(self.unknown.values()))
        return max(slot, self.floor)
