"""What a replica knows of single instances, and helpers every part uses.

``CInstance``: one C-instance as this replica knows it (ballot, value, whether chosen, and
the leader's bookkeeping). ``OwnerSlots``: the slots of one owner's O-instances minus a
compacted prefix. ``Recovery``: one Prepare round. The markers for "no value" live here, each
below every value of its kind (so comparisons need no special case; the codec carries them):
``NO_BALLOT``, ``NO_INDEX``, ``NO_SLOT``, and ``NEVER`` for times; what is merely absent is
None. ``PLACES_NOTHING`` tells ``NO_CL`` and ``SEAL`` from a slot's replica. With the pure
helpers ``pages``, ``keys_of`` and ``union_keys``.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from typing import TypeVar

from consensus import messages
from consensus.messages import (
    MAX_REQUEST_KEYS,
    Command,
    CPromise,
)
from consensus.protocol.types import NEVER

#: no C-instance index: of a slot that places none (``NO_CL``, ``SEAL``) in
#: ``OLog.executed``, and an owner's highest accepted index (``CStore.high``) while it has none
NO_INDEX = -1
#: below every ballot: nothing promised or accepted
NO_BALLOT = -1
#: below every slot
NO_SLOT = -1
#: the O-instance values that place no C-instance (every other value names a replica, whose
#: next C-instance it places)
PLACES_NOTHING = frozenset({messages.NO_CL, messages.SEAL})

__all__ = [
    "NEVER",
    "NO_BALLOT",
    "NO_INDEX",
    "NO_SLOT",
    "PLACES_NOTHING",
    "Batch",
    "CInstance",
    "OwnerSlots",
    "Recovery",
    "keys_of",
    "pages",
    "union_keys",
]

Batch = messages.Batch  # the commands, or the bytes they came in (PackedBatch)
_T = TypeVar("_T")


class CInstance:
    """What one replica knows of one C-instance: its value (``ballot``, ``batch``,
    ``committed``: the C-instance store's) and the proposer's bookkeeping (the C-phase's)."""

    __slots__ = (
        "acks", "ballot", "batch", "committed", "leading", "overtaken_at", "sent_at", "sent_to"
    )

    def __init__(self, ballot: int, batch: Batch | None) -> None:
        self.ballot = ballot
        self.batch = batch
        self.committed = False
        # bookkeeping of the replica proposing it at ``ballot`` (owner or recoverer)
        self.leading = False
        self.acks: set[int] = set()
        self.sent_at = 0
        #: peers sent its CAccept at ``ballot``: their commit need not carry the batch again
        self.sent_to: frozenset[int] = frozenset()
        #: when the owner learned that a recoverer took it over (None: none did)
        self.overtaken_at: int | None = None

    @property
    def held(self) -> bool:
        """Nothing accepted here (``NO_BALLOT``): an own index held for our own recovery
        (``CPhase._hold_for_recovery``), the only instance kept without a value."""
        return self.ballot == NO_BALLOT


class OwnerSlots:
    """The global slots of one replica's O-instances, in order, minus a compacted prefix:
    ``self[k]`` is the slot of its ``k``-th O-instance (``k >= base``)."""

    __slots__ = ("base", "slots")

    def __init__(self, base: int = 0) -> None:
        self.base = base
        self.slots: list[int] = []

    def __len__(self) -> int:
        return self.base + len(self.slots)

    def __getitem__(self, index: int) -> int:
        if index < self.base:
            raise IndexError(f"O-instance {index} was compacted away (base {self.base})")
        return self.slots[index - self.base]

    def append(self, slot: int) -> None:
        self.slots.append(slot)

    def count_below(self, slot: int) -> int:
        return self.base + bisect.bisect_left(self.slots, slot)

    def trim_below(self, slot: int) -> None:
        k = bisect.bisect_left(self.slots, slot)
        del self.slots[:k]
        self.base += k


class Recovery:
    """A Prepare round over ``owner``'s C-instances from ``from_index`` on."""

    __slots__ = ("asked_at", "ballot", "from_index", "owner", "promises")

    def __init__(self, owner: int, from_index: int, ballot: int, now: int) -> None:
        self.owner = owner
        self.from_index = from_index
        self.ballot = ballot
        self.asked_at = now  # when the Prepare last went out
        self.promises: dict[int, CPromise] = {}


def pages(items: Sequence[_T], size: int) -> Iterator[tuple[_T, ...]]:
    """``items`` in order, as tuples of at most ``size`` (one message's worth each)."""
    for start in range(0, len(items), size):
        yield tuple(items[start : start + size])


def keys_of(batch: Batch | None) -> tuple[str, ...]:
    """The keys a batch updates; () when unknown, too many to send, or when one of its commands
    names none (it may update any key): the sequencer then treats the batch's slot as touching
    every key."""
    if not batch:
        return ()
    if len(batch) == 1:
        return batch[0].keys
    keys: set[str] = set()
    for command in batch:
        if not command.keys:
            return ()
        keys.update(command.keys)
    return tuple(sorted(keys)) if len(keys) <= MAX_REQUEST_KEYS else ()


def union_keys(reads: Sequence[Command]) -> tuple[str, ...]:
    """The keys whose latest update serves every one of ``reads``: the union of their keys, or
    none ("the last slot overall") if any of them names no key."""
    if any(not read.keys for read in reads):
        return ()
    return tuple(sorted({key for read in reads for key in read.keys}))
