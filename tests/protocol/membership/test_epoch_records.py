"""What a voter keeps of its epoch across a peer's snapshot (the 1,000-seed sweeps).

* Every log a member rewrites (its own snapshot, or a peer's it installs) starts with its
  epoch's configuration (``ConfigRecord``): a restart reads the records before the first one
  as epoch 0's. A voter of epoch 1 that installed a peer's snapshot of epoch 1 wrote its
  core's records alone; restarted, it skipped them as epoch 0's and lost its core of epoch 1
  (what it promised and accepted there: N=3 LAN seed 192, snapshots every 10).
* A probe for the end of our epoch ends when a snapshot moves us into a later one: its
  answer holds the SEAL that began the new epoch, and taken for the new one's end it retired
  the core we vote with (N=3 WAN seed 82)."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from consensus.config import ProtocolConfig
from consensus.messages import (
    NO_LEASE_REQUEST,
    Command,
    ConfigRecord,
    Heartbeat,
    LearnedSlot,
    LearnReply,
    LearnRequest,
    Record,
    VRequest,
)
from consensus.protocol.membership import EPOCH_SHIFT, MemberReplica, bootstrap, record_of
from consensus.protocol.membership.config import Configuration
from consensus.protocol.types import SnapshotMeta

#: epoch 1 of a cluster whose three voters did not change (its first view is led by 0)
EPOCH_1 = Configuration(epoch=1, base=45, voters=(0, 1, 2), members=bootstrap(3).members,
                        next_id=3)
#: the epoch after it (its SEAL at global slot 55)
EPOCH_2 = Configuration(epoch=2, base=56, voters=(0, 1, 2), members=bootstrap(3).members,
                        next_id=3)
LATER = 10**9  # past a restarted replica's lease period from its first input (no votes in it)


def voter(unsafe: frozenset[str], records: Sequence[Record], snapshot: SnapshotMeta
          ) -> MemberReplica:
    config = ProtocolConfig(replicas=3, unsafe=unsafe)
    return MemberReplica(config, 0, recovered=records, rng=random.Random(7), snapshot=snapshot)


@pytest.mark.parametrize("broken", [False, True])
def test_a_voter_restarted_after_installing_a_snapshot_of_its_epoch_keeps_its_core(
    broken: bool,
) -> None:
    unsafe = frozenset({"snapshot_log_unmarked"} if broken else ())
    member = voter(unsafe, [record_of(EPOCH_1)], SnapshotMeta(50, (2, 2, 1), record_of(EPOCH_1)))
    assert member.voting and member.config == EPOCH_1
    # it promises a later view of the epoch (a candidate's vote request)
    member.tick(0)
    member.advance(member.ready())
    view = EPOCH_1.start_view + 1
    member.step(VRequest(src=1, view=view, from_slot=member.exec_slot - EPOCH_1.base), LATER)
    member.advance(member.ready())
    assert member.view == view
    # a peer's snapshot of the same epoch, further on: the log is rewritten with these
    peer_snapshot = SnapshotMeta(60, (5, 5, 5), record_of(EPOCH_1))
    records = member.install_snapshot(peer_snapshot)
    assert (records[:1] == [record_of(EPOCH_1)]) is not broken
    assert all(not isinstance(r, ConfigRecord) for r in records[1:])

    again = voter(unsafe, records, peer_snapshot)
    if broken:  # read as epoch 0's records, skipped: no core of the epoch it votes in
        assert not again.voting
        return
    assert again.voting and again.view == view  # its promise survived
    assert again.exec_slot == 60


@pytest.mark.parametrize("broken", [False, True])
def test_a_snapshot_of_a_later_epoch_ends_the_probe_for_the_end_of_ours(broken: bool) -> None:
    unsafe = frozenset({"probe_survives_snapshot"} if broken else ())
    member = voter(unsafe, [record_of(EPOCH_1)], SnapshotMeta(50, (2, 2, 1), record_of(EPOCH_1)))
    # a peer claims epoch 2: we ask everyone for the log from our frontier (slot 50)
    member.step(Heartbeat(src=1, view=2 << EPOCH_SHIFT, executed=0,
                          lease_request=NO_LEASE_REQUEST), 1)
    ready = member.ready()
    member.advance(ready)
    assert {o.message.slot for o in ready.send if isinstance(o.message, LearnRequest)} == {50}
    # before the answer, a peer's snapshot of epoch 2 moves us on: we vote in epoch 2
    member.install_snapshot(SnapshotMeta(60, (3, 3, 3), record_of(EPOCH_2)))
    assert member.voting and member.config == EPOCH_2
    # the answer: slots 50.. of epoch 1, the SEAL that began epoch 2 at 55
    slots = [LearnedSlot(seal=False, batch=(Command(client_id=1, seq=k, op=b"x", keys=()),))
             for k in range(5)]
    slots.append(LearnedSlot(seal=True, batch=()))
    member.step(LearnReply(src=1, view=EPOCH_2.start_view, start=50, executed=60,
                           slots=tuple(slots)), 2)
    member.advance(member.ready())
    # (broken: taken for the end of epoch 2, it retires the core of the epoch it votes in)
    assert member.voting is not broken
