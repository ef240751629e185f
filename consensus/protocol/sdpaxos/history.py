"""The sequencer's history table: the last slot assigned to an update of each key (§3.5).

A linearizable read needs the slot of the latest update it could observe: the sequencer
answers ``RRequest`` with ``read_slot(keys)`` and the reading replica serves the read once it
executed through that slot. The answer may be later than necessary, never earlier:

* a command that names no keys counts as updating every key (``floor``);
* an O-instance ordered before the sequencer saw its command's keys (a ``CRequest`` that
  named none, a recovery) counts as updating every key until its keys are learned
  (``unknown``);
* after a view change the new sequencer knows no history: everything it did not order
  itself counts as a write to every key (``reset(floor)``);
* the batches noted are walked for their keys only when a read asks (``read_slot``), all
  the ones noted since at once: with no reads the sequencer never walks a batch (walking
  every one as it was ordered took a few percent of a loaded sequencer's CPU). Past
  ``PENDING_BATCHES`` unwalked ones the table forgets them and counts their slots as
  updating every key (``floor``).

Pure state, tested alone (tests/protocol/sdpaxos/test_history.py).
"""

from __future__ import annotations

from collections.abc import Iterable

from consensus.messages import Command
from consensus.protocol.sdpaxos.instances import NO_SLOT

__all__ = ["PENDING_BATCHES", "HistoryTable"]

#: the most batches noted and not yet walked for their keys (see the module header): a read
#: after a longer stretch without one waits for every slot noted before it, which have
#: mostly executed by then. Small, since the table holds the batches meanwhile.
PENDING_BATCHES = 256


class HistoryTable:
    """Per key, the last slot assigned to an update of it."""

    __slots__ = ("_floor", "_pending", "last", "unknown")

    def __init__(self) -> None:
        self.last: dict[str, int] = {}
        #: every slot up to this one counts as updating every key (``floor``)
        self._floor = NO_SLOT
        #: (owner, index) ordered before its keys were known -> its slot
        self.unknown: dict[tuple[int, int], int] = {}
        #: (slot, batch) noted and not yet walked for their keys, oldest first
        self._pending: list[tuple[int, Iterable[Command]]] = []

    @property
    def floor(self) -> int:
        """Every slot up to this one counts as updating every key."""
        self._walk_pending()
        return self._floor

    def reset(self, floor: int) -> None:
        self.last.clear()
        self.unknown.clear()
        self._pending.clear()
        self._floor = floor

    def note_update(self, slot: int, batch: Iterable[Command]) -> None:
        """``slot`` updates the keys of ``batch`` (walked when a read asks)."""
        pending = self._pending
        pending.append((slot, batch))
        if len(pending) > PENDING_BATCHES:
            self._floor = max(self._floor, max(noted for noted, _ in pending))
            pending.clear()

    def _walk_pending(self) -> None:
        """Note the keys of the batches noted since the last walk, each walked once."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        last = self.last
        for slot, batch in pending:
            for command in batch:
                if not command.keys:
                    # the keys noted so far were right too, and the floor covers the rest
                    self._floor = max(self._floor, slot)
                    break
                for key in command.keys:
                    if last.get(key, NO_SLOT) < slot:
                        last[key] = slot

    def note_keys(self, slot: int, keys: Iterable[str]) -> None:
        """``slot`` updates ``keys`` (as a ``CRequest`` names them)."""
        self._walk_pending()  # (slots grow: what was noted before is older)
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
        self._walk_pending()
        slot = max((self.last.get(key, NO_SLOT) for key in keys), default=NO_SLOT)
        if self.unknown:
            slot = max(slot, max(self.unknown.values()))
        return max(slot, self._floor)
