"""Execution (execution.py, §3.2): slots run in global-log order, the k-th O-instance naming a
replica places its k-th C-instance, and executed slots are logged lazily for a restart.
"""

from __future__ import annotations

from util import core, drain, msgs

from consensus.codec import LAZY_FROM_BYTES, decode_frame, encode_frame
from consensus.messages import NO_CL, CAcceptedRecord, CCommit, ExecutedRecord, OCommit
from consensus.packed_batch import PackedBatch
from consensus.protocol.ready import Execution, SlotBatch

from .builders import A, B, C, caccept, cack, ccommit, oaccept, oack, ocommit, restarted

# =========================================================================== global-log order


def test_execution_follows_global_log_order() -> None:
    r1 = core(3, 1)
    r1.propose(A, 0)
    drain(r1)
    r1.step(cack(2, 1, 0), 1)
    r1.step(oaccept((0, 0), (1, 1)), 1)  # slot 0 => sequencer, slot 1 => us
    r1.step(oack(0, 0, 1), 1)  # the sequencer's acceptance, once durable
    ready = drain(r1)
    assert ready.ready == [A]  # C chosen and one O-instance for us chosen
    assert ready.executions() == []  # but slot 0 is not committed here
    assert msgs(ready.send_after_persist, OCommit) == [
        (0, ocommit(1, (1, 1))), (2, ocommit(1, (1, 1)))
    ]
    r1.step(ocommit(0, (0, 0)), 2)  # slot 0 committed; C[0][0] still unknown
    assert drain(r1).executions() == []
    r1.step(ccommit(0, 0, 0, (B,)), 3)
    ready = drain(r1)
    assert ready.executions() == [Execution(0, 0, B, False), Execution(1, 0, A, True)]
    assert r1.executed_through() == 1
    assert r1.committed_log() == {0: (B,), 1: (A,)}


def test_ocommit_out_of_order_at_follower() -> None:
    r2 = core(3, 2)
    r2.step(ccommit(0, 0, 0, (A, B)), 1)
    r2.step(ccommit(1, 1, 0, (C,)), 1)
    r2.step(ocommit(1, (1, 1)), 2)
    assert drain(r2).executions() == []
    r2.step(ocommit(0, (0, 0)), 3)
    assert drain(r2).executions() == [
        Execution(0, 0, A, False),
        Execution(0, 1, B, False),
        Execution(1, 0, C, False),
    ]
    r2.step(ocommit(0, (0, 0)), 4)  # a duplicate commit executes nothing again
    assert drain(r2).is_empty()


def test_a_slot_executes_as_its_batch_handed_over_as_it_came() -> None:
    # one SlotBatch per slot, holding the very batch the CCommit brought, still packed: the
    # follower builds nothing per command (the driver decodes it as it applies it)
    batch = tuple(A._replace(seq=seq, op=b"%040d" % seq) for seq in range(40))  # (not short)
    frame = encode_frame([ccommit(0, 0, 0, batch)])
    assert len(frame) >= LAZY_FROM_BYTES
    [commit] = decode_frame(frame, lazy_batches=True)
    assert isinstance(commit, CCommit) and isinstance(commit.batch, PackedBatch)
    r2 = core(3, 2)
    r2.step(commit, 1)
    r2.step(ccommit(1, 1, 0, (C,)), 1)
    r2.step(ocommit(0, (0, 0), (1, 1)), 2)
    ready = r2.ready()
    assert ready.apply == [SlotBatch(0, 0, commit.batch, False), SlotBatch(1, 0, (C,), False)]
    assert ready.apply[0].commands is commit.batch and not commit.batch.decoded
    assert ready.applied_count() == 41 and ready.apply[1].position == 1 << 16
    r2.advance(ready)


def test_kth_o_instance_places_kth_c_instance() -> None:
    r2 = core(3, 2)
    r2.step(ccommit(1, 1, 1, (B,)), 1)  # C[1][1] first
    r2.step(ccommit(1, 1, 0, (A,)), 1)
    r2.step(ocommit(1, (0, 1), (1, 0), (2, 1)), 2)
    r2.step(ccommit(0, 0, 0, (C,)), 2)
    ready = drain(r2)
    assert [(e.slot, e.command) for e in ready.executions()] == [(0, A), (1, C), (2, B)]


# =========================================================================== executed records


def test_executing_writes_an_executed_record_that_needs_no_fsync() -> None:
    # Executed means chosen: the record lets a restart execute again from its own records.
    # It is written lazily (``Ready.log``): a turn that only executes costs no fsync.
    r = core(3, 2)
    r.step(caccept(1, 1, 0, (A,)), 0)
    accepted = drain(r).persist
    r.step(ccommit(1, 1, 0, None), 0)
    r.step(ocommit(0, (0, 1), (1, NO_CL)), 0)
    ready = drain(r)
    assert [e.command for e in ready.executions()] == [A]
    assert ready.persist == []
    assert ready.log == [ExecutedRecord(start=0, owners=(1, NO_CL), ballots=(1, 0))]
    # restarted from those records it executes both slots again at once, with no peer
    again, first = restarted(r, [*accepted, *ready.log])
    assert [(e.slot, e.command) for e in first.executions()] == [(0, A)]
    assert again.executed_through() == 1 and again.committed_log() == r.committed_log()
    # and it never logs them twice
    assert first.log == []


def test_a_value_learned_from_a_commit_is_logged_before_its_executed_record() -> None:
    # C[1][0] reached us only in a commit (catch-up): our records lack it, so the executed
    # record alone could not be replayed. The value goes first, in the same lazy write.
    r = core(3, 2)
    r.step(ccommit(1, 1, 0, (A,)), 0)
    r.step(ocommit(0, (0, 1)), 0)
    ready = drain(r)
    assert ready.log == [
        CAcceptedRecord(owner=1, index=0, ballot=1, batch=(A,)),
        ExecutedRecord(start=0, owners=(1,), ballots=(1,)),
    ]
    _, first = restarted(r, ready.log)
    assert [e.command for e in first.executions()] == [A]
