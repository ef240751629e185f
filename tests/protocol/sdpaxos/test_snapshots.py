"""Compaction and snapshot installation (snapshots.py).
"""

from __future__ import annotations

import random

from util import cmd, core, drain

from consensus.messages import CAcceptedRecord, Catchup, CCommit, ReserveRecord
from consensus.protocol.sdpaxos import SDPaxosReplica, SnapshotMeta

from .builders import A, C, all_out, caccept, cack, ccommit, ocommit

# =========================================================================== compaction


def test_compacting_to_an_older_snapshot_keeps_executed_instances_for_peers_not_the_log() -> None:
    # The driver compacts to its previous snapshot, taking a new one at the execution frontier:
    # a restart begins at the new one, so the rewritten log holds nothing executed (rewriting
    # a whole interval of commands cost a loaded replica a fifth of its CPU), while a peer a
    # little behind still gets the executed instances from memory.
    r = core(3, 2)
    older = r.snapshot_meta()
    r.step(caccept(1, 1, 0, (A,)), 0)
    r.step(ccommit(1, 1, 0, (A,)), 0)
    r.step(ocommit(0, (0, 1)), 0)
    r.step(caccept(0, 0, 0, (C,)), 0)
    r.step(cack(0, 0, 0), 0)  # chosen (0 and we), not yet ordered: the log must keep it
    assert [e.command for e in drain(r).executions()] == [A]
    records = r.compact(older)
    assert [(x.owner, x.index) for x in records if isinstance(x, CAcceptedRecord)] == [(0, 0)]
    r.step(Catchup(src=0, view=0, slot=0), 1)
    sent = [m for _, m in all_out(drain(r)) if isinstance(m, CCommit)]
    assert [(m.owner, m.index, m.batch) for m in sent] == [(1, 0, (A,)), (0, 0, (C,))]
    # restarted from the new snapshot and those records, it is where it was
    again = SDPaxosReplica(r.config, 2, recovered=records, snapshot=r.snapshot_meta(),
                           rng=random.Random(0))
    assert again.executed_through() == r.executed_through()
    assert (0, 0) in again.c_store and (1, 0) not in again.c_store


# ===================================================================== installing a peer's snapshot


def test_own_proposals_a_peers_snapshot_covers_fail_indefinitely_instead_of_crashing() -> None:
    # a straggler proposes, falls behind, and catches up by installing a peer's snapshot that
    # already executed its instance: the outcome is in the snapshot, not here (a benchmark's
    # straggler replica crashed with KeyError on the next OCommit)
    r1 = core(3, 1)
    mine, theirs = cmd(20, 0), cmd(30, 0)
    r1.propose(mine, 0)
    drain(r1)
    records = r1.install_snapshot(SnapshotMeta(slot=2, exec_counts=(1, 1, 0)))
    assert records  # the rewritten log still holds the view and what is left
    ready = drain(r1)
    assert [(f.command, f.definite) for f in ready.failed] == [(mine, False)]
    # the protocol goes on: later orders, commits and timers find nothing stale
    r1.step(caccept(0, 0, 1, (theirs,)), 10)
    r1.step(ccommit(0, 0, 1, (theirs,)), 10)
    r1.step(ocommit(0, (2, 0)), 10)
    r1.tick(10_000_000)
    assert [e.command for e in drain(r1).executions()] == [theirs]


def test_a_rewritten_log_keeps_the_index_reservation() -> None:
    # the log a snapshot rewrites still says which of our indexes may have been named: a
    # restart from the snapshot and those records proposes past them
    r = core(3, 1)
    for command in (A, C):
        r.propose(command, 0)
        drain(r)
    assert r.c_store.reserved == 3 and r.c_store.next_index == 2
    records = r.durable_records()
    assert ReserveRecord(below=3) in records
    again = SDPaxosReplica(r.config, 1, recovered=records, snapshot=r.snapshot_meta(),
                           rng=random.Random(0))
    assert again.c_store.next_index == 3 and again.c_store.reserved_durable == 3
