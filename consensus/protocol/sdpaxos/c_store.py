"""The C-instance store: what this replica accepted, learned and promised of every replica's
C-instances, and the indexes of its own.

``CStore`` is the only writer of

* the values: per ``(owner, index)`` a ``CInstance`` (``instances``: the parts read the map
  itself, typed read-only) whose ``ballot``, ``batch`` and ``committed`` change only here
  (``accept``, ``learn``, ``choose``, ``hold``, ``restore``);
  the proposer's bookkeeping on it (``leading``, ``acks``, ``sent_at``, ``sent_to``,
  ``overtaken_at``) is the C-phase's (c_phase.py);
* ``high``: per owner, the highest index accepted here (``NO_INDEX``: none), what a vote
  reports (``Vote.c_high``) and a promise carries;
* ``promised``: per owner, the ballot promised to a recoverer and the index it covers from;
* ``ballot_seen`` (the highest ballot seen: a recovery's ballot goes above it,
  ``new_ballot``), ``own_ballot`` (the ballot our new instances are proposed at);
* ``next_index``: our next own index (``take_index``), and ``values_to_log``: chosen values
  learned from a commit, never accepted here, that the execution record must carry;
* ``reserved`` and ``reserved_durable``: our own indexes below them may have been used.

Reservations (the rules that let our ``CAccept`` leave before our own record is durable,
Raft thesis §10.2.1; c_phase.py sends it):

* A restart must never propose at an index a ``CAccept`` of the previous incarnation named:
  its value may be accepted somewhere, or the sequencer may have ordered the index (commands
  proposed after the restart would run in a slot given out before them). Our own
  ``CAcceptedRecord`` says so only once durable, so an early ``CAccept`` relies on a
  ``ReserveRecord`` instead: "indexes below R may have been used".
* A turn that took indexes reserves ahead (``reserve``, called as the turn ends; the caller
  persists the ``ReserveRecord`` in it) once less than that many are reserved past the next
  index: twice as many, so a steady load writes one every other turn. ``advance``
  (``synced``) makes what the turn wrote durable.
* ``sendable_early``: only an index below the *durable* reservation may be named before its
  own record is durable; the first index past it waits for the turn's fsync, as before.
* A restart (``restore_reservation``) starts ``next_index`` at the reservation (at most
  twice a turn's indexes past its last record). The indexes between its last record and the
  reservation (``gap``) get ordered as soon as it proposes past them, and execution waits
  until a recovery decides them (the value a majority's promises report, a no-op where none
  does; recovery.py): our own recovery does so once we are caught up
  (``OwnProposals.resume_after_restart``).
* Compaction and snapshots keep it: ``durable_records`` writes the reservation again, and a
  membership epoch's core keeps its own (its records follow the epoch's ``ConfigRecord``;
  a new epoch's indexes start again at 0, in another instance space).

Invariants (verified as they change when ``consensus.protocol.checks`` are on):

1. **An own index is used once.** ``next_index`` never decreases, and every own instance the
   store holds is below it: ``used`` is the one method that moves it past an index someone
   else used or decided (a recoverer's accept, a commit, a restart's records, a snapshot),
   and ``take_index`` the one that hands a fresh one out.
2. **A chosen value never changes.** A committed instance holds a value, and ``accept``,
   ``learn`` and ``hold`` refuse it (Paxos: nothing else can be chosen there).
3. **Accepted ballots only grow.** ``accept`` never lowers an instance's ballot, and a
   promise never goes down (``promise``). (``learn`` may lower it: the chosen ballot of a
   value we accepted again at a higher one.)
4. **Our ballot is ours.** ``own_ballot`` is a ballot of this replica
   (``ballot % BALLOT_STRIDE == me``) and never decreases.
5. ``high[owner]`` is at least the index of every instance accepted here since the store
   began (``accept`` and ``restore`` raise it).
6. Every key in ``values_to_log`` holds a value.
7. ``reserved_durable <= reserved``, and neither decreases.
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterator, Mapping
from typing import Final

from consensus.messages import CAcceptedRecord
from consensus.protocol.ballot import BALLOT_STRIDE, next_ballot
from consensus.protocol.checks import violated
from consensus.protocol.sdpaxos.instances import (
    NO_BALLOT,
    NO_INDEX,
    PLACES_NOTHING,
    Batch,
    CInstance,
)

__all__ = ["CStore", "Key"]

Key = tuple[int, int]  # (owner, index)

_OWNER: Final = "CStore"


class CStore:
    """Every C-instance this replica knows, with its promises and its own indexes."""

    __slots__ = (
        "_checking", "_instances", "_me", "_syncing", "_taken", "ballot_seen", "gap", "high",
        "instances", "next_index", "own_ballot", "promised", "reserved", "reserved_durable",
        "values_to_log",
    )

    def __init__(self, replicas: int, me: int, *, checking: bool = False) -> None:
        self._me = me
        self._checking = checking
        self._instances: dict[Key, CInstance] = {}
        #: every instance known, by key: read it here (the one map, not a copy); change it
        #: only through the methods below
        self.instances: Mapping[Key, CInstance] = self._instances
        self.high: list[int] = [NO_INDEX] * replicas
        self.promised: dict[int, tuple[int, int]] = {}  # owner -> (ballot, from_index)
        self.ballot_seen = 0
        # Our instances start pre-prepared at (0, me); once a Prepare (ours or a recoverer's)
        # promised a higher ballot over our instance space, we propose at the ballot of our
        # own last successful Prepare instead: one phase 1 for all later instances.
        self.own_ballot = me
        self.next_index = 0
        # chosen values we hold but never accepted (learned from a commit): written to our
        # records when executed, so that a restart can execute them again from the records
        self.values_to_log: set[Key] = set()
        #: our indexes below this may have been used (the reservation written, perhaps not
        #: durable yet) / below this one, durably so / what the turn handed out writes
        self.reserved = 0
        self.reserved_durable = 0
        self._syncing = 0
        self._taken = 0  # indexes taken this turn
        #: a restart's own indexes ``[start, end)`` that an earlier incarnation may have used
        #: without a durable record of its own: our recovery decides them (see above)
        self.gap: tuple[int, int] | None = None

    # ------------------------------------------------------------------ reading
    def get(self, key: Key) -> CInstance | None:
        """The instance at ``key``, or None."""
        return self._instances.get(key)

    def __getitem__(self, key: Key) -> CInstance:
        return self._instances[key]

    def __contains__(self, key: object) -> bool:
        return key in self._instances

    def __iter__(self) -> Iterator[Key]:
        return iter(self._instances)

    def __len__(self) -> int:
        return len(self._instances)

    def items(self) -> ItemsView[Key, CInstance]:
        return self._instances.items()

    def promised_ballot(self, owner: int, index: int) -> int:
        """The ballot promised for ``C[owner][index]`` (``NO_BALLOT``: none)."""
        promise = self.promised.get(owner)
        if promise is not None and index >= promise[1]:
            return promise[0]
        return NO_BALLOT

    # ------------------------------------------------------------------ own indexes
    def take_index(self) -> int:
        """A fresh own index (never used, by us or anyone)."""
        index = self.next_index
        self.next_index = index + 1
        self._taken += 1
        if self._checking and (self._me, index) in self._instances:
            raise violated(_OWNER, f"own index {index} handed out while held")
        return index

    def used(self, end: int) -> None:
        """Every own index below ``end`` is used (proposed, accepted, decided or executed
        somewhere): never propose at one of them again."""
        if end > self.next_index:
            self.next_index = end

    def reserve(self) -> int | None:
        """The turn ends: if it took indexes and fewer than that many are reserved past the
        next one, the new reservation (twice as many), which the caller persists
        (``ReserveRecord``) in this turn."""
        taken, self._taken = self._taken, 0
        if not taken or self.reserved >= self.next_index + taken:
            return None
        self.reserved = self.next_index + 2 * taken
        return self.reserved

    def sendable_early(self, index: int) -> bool:
        """Whether our ``index`` may be named before its own record is durable: it is below a
        durable reservation."""
        return index < self.reserved_durable

    def handed_out(self) -> None:
        """The turn's records were handed to the driver (``ready``)."""
        self._syncing = self.reserved

    def synced(self) -> None:
        """The driver made the handed-out turn's records durable (``advance``)."""
        if self._syncing > self.reserved_durable:
            self.reserved_durable = self._syncing

    def restore_reservation(self, below: int) -> None:
        """A restart replays a ``ReserveRecord``: indexes below ``below`` may have been used."""
        if below > self.reserved:
            self.reserved = self.reserved_durable = self._syncing = below
        self.used(below)

    def note_gap(self, start: int) -> None:
        """A restart's records hold none of our indexes from ``start`` to the reservation."""
        self.gap = (start, self.reserved) if start < self.reserved else None

    def end_gap(self) -> None:
        """The restart's gap is decided (or executed): our recovery need not cover it."""
        self.gap = None

    # ------------------------------------------------------------------ values
    def accept(self, owner: int, index: int, ballot: int, batch: Batch) -> CInstance:
        """We accepted ``batch`` for ``C[owner][index]`` at ``ballot`` (ours, a peer's or a
        recovery's proposal): the caller persists it (``CAcceptedRecord``)."""
        key = (owner, index)
        inst = self._instances.get(key)
        if inst is None:
            inst = self._instances[key] = CInstance(ballot, batch)
        else:
            if self._checking and ballot < inst.ballot:
                raise violated(_OWNER, f"{key} accepted at ballot {ballot} after "
                                       f"{inst.ballot}")
            self._overwrite(key, inst, ballot, batch)
        if index > self.high[owner]:
            self.high[owner] = index
        if owner == self._me:
            self.used(index + 1)
        return inst

    def learn(self, owner: int, index: int, ballot: int, batch: Batch) -> CInstance:
        """``C[owner][index]`` was chosen with ``batch`` at ``ballot`` (a commit told us; we
        did not accept it): the execution record carries it (``values_to_log``)."""
        key = (owner, index)
        inst = self._instances.get(key)
        if inst is None:
            inst = self._instances[key] = CInstance(ballot, batch)
        else:
            self._overwrite(key, inst, ballot, batch)
        self.values_to_log.add(key)
        return inst

    def _overwrite(self, key: Key, inst: CInstance, ballot: int, batch: Batch) -> None:
        if self._checking and inst.committed:
            raise violated(_OWNER, f"{key} is chosen: its value cannot change")
        inst.ballot, inst.batch = ballot, batch

    def choose(self, owner: int, index: int, inst: CInstance) -> None:
        """``C[owner][index]`` (``inst``) is chosen with the value it holds."""
        if self._checking and (inst.batch is None or self._instances.get((owner, index))
                               is not inst):
            raise violated(_OWNER, f"{(owner, index)} chosen without a value held here")
        inst.committed = True
        if owner == self._me:
            self.used(index + 1)

    def hold(self, index: int, now: int) -> CInstance:
        """Our fresh ``index`` is held for our own recovery (see ``CPhase``): nothing is
        accepted there yet."""
        key = (self._me, index)
        if self._checking and key in self._instances:
            raise violated(_OWNER, f"{key} held while it holds a value")
        inst = self._instances[key] = CInstance(NO_BALLOT, None)
        inst.overtaken_at = now
        return inst

    # ------------------------------------------------------------------ ballots, promises
    def see_ballot(self, ballot: int) -> None:
        if ballot > self.ballot_seen:
            self.ballot_seen = ballot

    def new_ballot(self) -> int:
        """A ballot of ours above every ballot seen (a recovery's)."""
        ballot = self.ballot_seen = next_ballot(max(self.ballot_seen, self._me), self._me)
        return ballot

    def promise(self, owner: int, ballot: int, from_index: int) -> None:
        """We promised ``ballot`` for ``owner``'s instances from ``from_index`` on: the caller
        persists it (``CPromiseRecord``)."""
        if self._checking:
            before = self.promised.get(owner)
            if before is not None and ballot < before[0]:
                raise violated(_OWNER, f"promise for {owner} lowered to {ballot} from "
                                       f"{before[0]}")
        self.promised[owner] = (ballot, from_index)

    def raise_own_ballot(self, ballot: int) -> None:
        """Our own recovery prepared our instances at ``ballot`` (a ballot of ours)."""
        if self._checking and ballot % BALLOT_STRIDE != self._me:
            raise violated(_OWNER, f"own ballot {ballot} is not replica {self._me}'s")
        if ballot > self.own_ballot:
            self.own_ballot = ballot

    # ------------------------------------------------------------------ restart, compaction
    def restore(self, record: CAcceptedRecord) -> None:
        """A restart replays an accepted value from our records (the highest ballot wins)."""
        owner, index, ballot = record.owner, record.index, record.ballot
        key = (owner, index)
        inst = self._instances.get(key)
        if inst is None or ballot >= inst.ballot:
            self._instances[key] = CInstance(ballot, record.batch)
        if index > self.high[owner]:
            self.high[owner] = index
        self.see_ballot(ballot)
        if owner == self._me:
            self.used(index + 1)
            if ballot % BALLOT_STRIDE == self._me:
                self.raise_own_ballot(ballot)

    def restore_promise(self, owner: int, ballot: int, from_index: int) -> None:
        """A restart replays a promise from our records (a later one replaces it)."""
        self.promised[owner] = (ballot, from_index)
        self.see_ballot(ballot)

    def take_value_to_log(self, key: Key) -> bool:
        """Whether the execution record must carry ``key``'s value (once)."""
        if key in self.values_to_log:
            self.values_to_log.discard(key)
            return True
        return False

    def compact(self, executed: Mapping[int, tuple[int, int]], counts: tuple[int, ...]) -> None:
        """Forget the instances placed in compacted slots (``executed``: slot -> key) and
        every instance below the compaction point's counts."""
        instances = self._instances
        for owner, index in executed.values():
            if owner not in PLACES_NOTHING:
                instances.pop((owner, index), None)
        for key in [k for k in instances if k[1] < counts[k[0]]]:
            del instances[key]
        self.values_to_log = {k for k in self.values_to_log if k[1] >= counts[k[0]]}

    # ------------------------------------------------------------------ checks
    def check(self) -> None:
        """Verify every invariant over the whole store (tests; O(instances))."""
        me = self._me
        for (owner, index), inst in self._instances.items():
            if owner == me and index >= self.next_index:
                raise violated(_OWNER, f"own index {index} held at or past next_index "
                                       f"{self.next_index}")
            if inst.committed and inst.batch is None:
                raise violated(_OWNER, f"{(owner, index)} chosen without a value")
        if self.own_ballot % BALLOT_STRIDE != me:
            raise violated(_OWNER, f"own ballot {self.own_ballot} is not replica {me}'s")
        if self.reserved_durable > self.reserved:
            raise violated(_OWNER, f"durable reservation {self.reserved_durable} past the "
                                   f"reservation {self.reserved}")
        for key in self.values_to_log:
            held = self._instances.get(key)
            if held is None or held.batch is None:
                raise violated(_OWNER, f"{key} to log without a value")
