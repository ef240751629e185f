"""Ordering, the sequencer's side (sequencer.py, §3.1-3.2, Figure 5): slots assigned on CAccept
and CRequest, one OAccept per peer per turn, idempotent requests, re-sending from the
requester's prefix, and who may order.
"""

from __future__ import annotations

import pytest
from util import core, drain, msgs

from consensus.errors import InvariantViolation
from consensus.messages import (
    SEAL,
    CAcceptedRecord,
    OAccept,
    OAcceptedRecord,
    OAck,
    OEntry,
    VRequest,
)
from consensus.protocol.sdpaxos import Role
from consensus.protocol.types import SnapshotMeta

from .builders import A, B, C, D, caccept, cack, crequest, in_view_1, o_entries, oaccept, oack

# =========================================================================== ordering


def test_sequencer_orders_on_caccept() -> None:
    r0 = core(3, 0)
    r0.step(caccept(1, 1, 0, (A,)), 1)
    ready = drain(r0)
    assert ready.persist == [
        CAcceptedRecord(owner=1, index=0, ballot=1, batch=(A,)),
        OAcceptedRecord(view=0, entries=(OEntry(slot=0, owner=1),)),
    ]
    # three replicas: our own OAck says we accepted (an OAccept may leave before we did);
    # the first OAccept waits for our fsync all the same: restarted from nothing, we would
    # serve view 0 again, and could propose another owner at slot 0 and ballot 0
    assert msgs(ready.send_after_persist) == [
        (1, cack(0, 1, 0)), (1, oaccept((0, 1))), (1, oack(0, 0)), (2, oaccept((0, 1))),
        (2, oack(0, 0)),
    ]
    assert msgs(ready.send) == []
    r0.step(caccept(2, 2, 0, (B,)), 2)
    ready = drain(r0)  # a record of ours is durable: the OAccept leaves with our fsync
    assert msgs(ready.send) == [(1, oaccept((1, 2))), (2, oaccept((1, 2)))]
    assert msgs(ready.send_after_persist) == [(2, cack(0, 2, 0)), (1, oack(0, 1)), (2, oack(0, 1))]
    r0 = core(5, 0)  # five: an owner commits on the OAccept alone, so it waits for the fsync
    r0.step(caccept(1, 1, 0, (A,)), 1)
    ready = drain(r0)
    assert msgs(ready.send) == []
    assert msgs(ready.send_after_persist, OAccept) == [(p, oaccept((0, 1))) for p in (1, 2, 3, 4)]
    assert msgs(ready.send_after_persist, OAck) == []


def test_sequencer_orders_on_crequest() -> None:
    r0 = core(3, 0)
    r0.step(crequest(2, 0), 1)
    ready = drain(r0)
    assert o_entries(ready) == [(0, 2)]
    assert msgs(ready.send_after_persist, OAccept) == [(1, oaccept((0, 2))), (2, oaccept((0, 2)))]
    r0.step(crequest(1, 0), 2)
    assert msgs(drain(r0).send) == [(1, oaccept((1, 1))), (2, oaccept((1, 1)))]


def test_sequencer_turn_batches_entries_into_one_oaccept_per_peer() -> None:
    r0 = core(3, 0)
    r0.step(caccept(1, 1, 0, (A,)), 1)
    r0.step(caccept(2, 2, 0, (B,)), 1)
    r0.propose(C, 1)
    ready = drain(r0)
    # the own proposal is flushed at ready(): its slot comes last
    assert o_entries(ready) == [(0, 1), (1, 2), (2, 0)]
    assert msgs(ready.send_after_persist, OAccept) == [
        (1, oaccept((0, 1), (1, 2), (2, 0))),
        (2, oaccept((0, 1), (1, 2), (2, 0))),
    ]


def test_duplicated_and_reordered_crequests_are_idempotent() -> None:
    r0 = core(5, 0)
    r0.step(crequest(2, 2), 1)  # index 2 first: replica 2 needs three O-instances
    first = drain(r0)
    assert o_entries(first) == [(0, 2), (1, 2), (2, 2)]
    created: list[tuple[int, int]] = []
    for message in (crequest(2, 0), crequest(2, 2), crequest(2, 1), crequest(2, 2),
                    caccept(2, 2, 1, (A,)), caccept(2, 2, 0, (B,))):
        r0.step(message, 2)
        created += o_entries(drain(r0))
    assert created == []
    r0.step(crequest(3, 0), 3)  # another replica gets the next slot
    assert o_entries(drain(r0)) == [(3, 3)]


def test_crequest_for_ordered_instance_resends_from_requester_prefix() -> None:
    r0 = core(3, 0)
    r0.step(caccept(2, 2, 0, (A,)), 1)  # slot 0 => 2
    r0.step(caccept(1, 1, 0, (B,)), 1)  # slot 1 => 1
    r0.step(caccept(1, 1, 1, (C,)), 1)  # slot 2 => 1
    r0.propose(D, 1)  # slot 3 => 0
    drain(r0)
    # replica 1 accepted slot 0 only and asks again for its index 0 (slot 1)
    r0.step(crequest(1, 0, o_prefix=1), 2)
    ready = drain(r0)
    assert o_entries(ready) == []
    # (with our acceptance, which the OAccept does not carry)
    assert msgs(ready.send_after_persist) == [(1, oaccept((1, 1))), (1, oack(0, 1))]
    # with a gap from slot 0 and a request for index 1 (slot 2): slots 0..2
    r0.step(crequest(1, 1, o_prefix=0), 3)
    ready = drain(r0)
    assert msgs(ready.send_after_persist) == [(1, oaccept((0, 2), (1, 1), (2, 1))),
                                              (1, oack(0, 0, 1, 2))]


def test_fresh_crequest_sends_one_oaccept() -> None:
    r0 = core(5, 0)
    r0.step(crequest(1, 0), 1)
    ready = drain(r0)
    assert o_entries(ready) == [(0, 1)]
    # one OAccept to each replica (the requester included) — not two to the requester
    assert msgs(ready.send_after_persist, OAccept) == [
        (p, oaccept((0, 1))) for p in (1, 2, 3, 4)
    ]


@pytest.mark.parametrize("broken", [False, True])
def test_a_sealed_sequencer_resends_through_the_seal_on_a_request_it_cannot_order(
    broken: bool,
) -> None:
    r0 = core(3, 0, unsafe=frozenset({"sealed_ignores_crequest"} if broken else ()))
    r0.step(caccept(2, 2, 0, (A,)), 1)  # slot 0 => 2
    r0.close_epoch()  # slot 1: SEAL
    ready = drain(r0)
    assert o_entries(ready) == [(0, 2), (1, SEAL)]
    # replica 2 lost that OAccept; its request names its latest instance, index 1, which a
    # sealed sequencer does not order (the next epoch does): what it lacks goes again
    r0.step(crequest(2, 1, o_prefix=0), 2)
    ready = drain(r0)
    assert o_entries(ready) == []
    resent = [] if broken else [(2, oaccept((0, 2), (1, SEAL))), (2, oack(0, 0, 1))]
    assert msgs(ready.send_after_persist) == resent


# =========================================================================== who orders


def test_o_phase_messages_only_from_sequencer() -> None:
    r2 = core(3, 2)
    r2.step(oaccept((0, 1), src=1), 1)  # replica 1 is not the sequencer of view 0
    assert drain(r2).is_empty()
    r1 = core(3, 1)
    r1.step(crequest(2, 0), 1)  # only the sequencer orders
    assert drain(r1).is_empty()


def test_old_sequencer_does_not_order_after_view_change() -> None:
    r0 = in_view_1(0)
    r0.step(crequest(2, 0, view=1), 1)
    assert drain(r0).is_empty()  # replica 0 is not the sequencer of view 1


def test_deposed_sequencer_records_its_last_orders_under_their_own_view() -> None:
    # (N=3 seed 1466, all faults) a sequencer that orders and then joins a higher view in
    # the same turn must not stamp those orders with the new view: a restart would read them
    # back as the new view's, a second value for a slot the new sequencer assigns
    r0 = core(3, 0)
    r0.tick(0)
    drain(r0)
    later = 10_000_000  # past any lease
    r0.step(crequest(2, 0), later)  # ordered at once: slot 0 -> 2, OAccept queued
    r0.step(VRequest(src=1, view=1, from_slot=0), later)
    ready = drain(r0)
    assert r0.view == 1
    records = [r for r in ready.persist if isinstance(r, OAcceptedRecord)]
    assert records == [OAcceptedRecord(view=0, entries=(OEntry(slot=0, owner=2),))]
    assert {m.view for _, m in msgs(ready.send_after_persist, OAccept)} <= {0}


@pytest.mark.parametrize("unsafe", [frozenset(), frozenset({"stale_sequencer_orders"})])
def test_a_snapshot_past_the_assigned_slots_stops_the_sequencer_serving(
    unsafe: frozenset[str],
) -> None:
    """View 0's sequencer assigned slot 0 only, then installs a peer's snapshot at slot 5:
    a later view's sequencer chose slots 1-4 (it was cut off meanwhile). Serving on, its next
    order would take slot 1, which its log executed (N=5 seed 26 of the simulator with
    snapshots every 10); it stops serving instead, and orders nothing."""
    r0 = core(3, 0)
    r0.unsafe = unsafe
    r0.step(caccept(1, 1, 0, (A,)), 1)
    drain(r0)
    r0.install_snapshot(SnapshotMeta(slot=5, exec_counts=(1, 3, 1)))
    drain(r0)
    if unsafe:
        with pytest.raises(InvariantViolation, match="slot 1 accepted after it executed"):
            r0.step(caccept(2, 2, 1, (B,)), 2)
        return
    assert r0.role is Role.FOLLOWER
    r0.step(caccept(2, 2, 1, (B,)), 2)
    assert o_entries(drain(r0)) == []
