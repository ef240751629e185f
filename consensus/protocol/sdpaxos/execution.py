"""Execution (§3.2): slot ``j`` runs once ``O[j]`` and the C-instance it places are chosen
and every slot before ``j`` ran.

``try_execute`` walks the frontier: the ``k``-th O-instance naming ``n`` places ``C[n][k]``
(``exec_count[n]`` counts them), a ``NO_CL`` slot places nothing, and a ``SEAL`` places
nothing and ends the log: execution stops there for good (``sealed_at``), and the membership
layer starts the next epoch. Executing our own
instance also makes it ready (executed implies chosen and ordered for good). A replica
executes nothing between joining a view and accepting its NewView, so it never runs a slot
the new view may reassign.

Durability without fsync: ``log_executed`` records, lazily in ``Ready.log`` (written after
``persist``, no fsync of its own), which slots ran (``ExecutedRecord``: owner and chosen
ballot per slot), after the chosen values among them our records lack (learned from a
commit). A restart executes them again from its own records (``replay_executed``): a value
held at the chosen ballot or a higher one is the chosen value (Paxos), and the replay stops
at the first slot it cannot prove (a crash between the two writes); peers bring the rest.
Votes, new views and recoveries after a restart then cover only what is undecided.
``replay_accepted`` is the broken variant (every accepted value taken as chosen) that a
teeth test catches.

Entry points: ``try_execute``, ``log_executed``, ``replay_executed``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from consensus.messages import (
    MAX_SLOTS,
    SEAL,
    CAcceptedRecord,
    ExecutedRecord,
)
from consensus.protocol.ready import SlotBatch
from consensus.protocol.sdpaxos.instances import NO_INDEX, PLACES_NOTHING

if TYPE_CHECKING:
    from consensus.protocol.sdpaxos.replica import SDPaxosReplica

__all__ = ["Executor"]


class Executor:
    """Runs chosen slots in order and records what ran."""

    def __init__(self, r: SDPaxosReplica) -> None:
        self.r = r
        #: slots below this are in an ExecutedRecord (or the snapshot)
        self.logged = 0
        #: when execution last moved (or this incarnation started, or a snapshot came)
        self.progress_at = 0

    def start(self, now: int) -> None:
        """The first input of this incarnation: execution counts as moving."""
        self.progress_at = now

    def on_snapshot_installed(self) -> None:
        """A snapshot moved the frontier: execution counts as moving."""
        self.progress_at = self.r.now

    def try_execute(self) -> None:
        r = self.r
        if not r.view_ready:
            return
        o_log = r.o_log
        while True:
            slot = o_log.exec_slot
            if slot not in o_log.committed:
                return
            owner = o_log.value[slot]
            index = NO_INDEX  # NO_CL or SEAL: nothing to run
            if owner not in PLACES_NOTHING:
                index = o_log.exec_count[owner]
                inst = r.c_store.instances.get((owner, index))
                if inst is None or not inst.committed or inst.batch is None:
                    return
                led_here = owner == r.me
                # executed implies chosen and ordered for good: whatever the ready rule still
                # waits for (a lost OAck, say), the command is ready now
                if led_here:
                    r.proposals.executed(index, inst.batch)
                if r.ordering.history.unknown:
                    r.ordering.learn_keys(owner, index, inst.batch)
                r.out.apply.append(SlotBatch(slot, 0, inst.batch, led_here))
            o_log.execute(slot, owner, index, r.view)
            self.progress_at = r.now
            if owner == SEAL:
                return

    def log_executed(self) -> None:
        """Record the slots executed since the last record (``ExecutedRecord``), after the
        chosen values among them that our records lack: a restart executes them again from
        its own records (``replay_executed``) instead of re-learning the log from peers."""
        r = self.r
        o_log, store = r.o_log, r.c_store
        start = max(self.logged, o_log.compacted)
        if start >= o_log.exec_slot:
            return
        owners: list[int] = []
        ballots: list[int] = []
        for slot in range(start, o_log.exec_slot):
            owner, index = o_log.executed[slot]
            owners.append(owner)
            if owner in PLACES_NOTHING:
                ballots.append(0)
                continue
            inst = store.instances[(owner, index)]
            ballots.append(inst.ballot)
            if store.values_to_log and store.take_value_to_log((owner, index)):
                assert inst.batch is not None
                r.out.log.append(
                    CAcceptedRecord(owner=owner, index=index, ballot=inst.ballot, batch=inst.batch)
                )
        for offset in range(0, len(owners), MAX_SLOTS):
            r.out.log.append(
                ExecutedRecord(
                    start=start + offset,
                    owners=tuple(owners[offset : offset + MAX_SLOTS]),
                    ballots=tuple(ballots[offset : offset + MAX_SLOTS]),
                )
            )
        self.logged = o_log.exec_slot

    def replay_executed(self, executed: Mapping[int, tuple[int, int]]) -> None:
        """After a restart: execute again, from our own records, the slots an
        ``ExecutedRecord`` says we executed (slot -> (owner, ballot) of its C-instance).
        Executed means chosen: a value we hold for that instance at its chosen ballot or a
        higher one is the chosen value (Paxos). Stops at the first slot whose value the
        records lack (a crash between the two writes): peers bring the rest, as before."""
        r = self.r
        if "replay_accepted" in r.unsafe:
            # broken on purpose: every accepted O-instance taken as chosen, at any ballot
            executed = {
                **{s: (o, 0) for s, o in r.o_log.value.items() if s >= r.o_log.exec_slot},
                **executed,
            }
        o_log = r.o_log
        while o_log.exec_slot in executed:
            slot = o_log.exec_slot
            owner, ballot = executed[slot]
            index = NO_INDEX  # NO_CL or SEAL
            if owner not in PLACES_NOTHING:
                index = o_log.exec_count[owner]
                inst = r.c_store.instances.get((owner, index))
                if inst is None or inst.batch is None or inst.ballot < ballot:
                    break
                r.c_store.choose(owner, index, inst)
                led_here = owner == r.me
                r.out.apply.append(SlotBatch(slot, 0, inst.batch, led_here))
            o_log.execute(slot, owner, index, r.view)
        self.logged = o_log.exec_slot
        r.c_store.used(o_log.exec_count[r.me])
