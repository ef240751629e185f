"""C-instance recovery (recovery.py, §3.3): who recovers what and when, asking again at the same
ballot, promises over compacted instances, paged promises.
"""

from __future__ import annotations

import dataclasses

import pytest
from util import cmd, core, drain, msgs

from consensus.messages import (
    EVERY_INDEX,
    CAccept,
    CAcceptedRecord,
    CNack,
    CPrepare,
    CPromise,
    CVote,
    Heartbeat,
    PeerMessage,
)
from consensus.protocol.ballot import ballot_of
from consensus.protocol.batch import batch_size
from consensus.protocol.sdpaxos import recovery as recovery_module

from .builders import (
    A,
    C,
    all_out,
    caccept,
    cack,
    ccommit,
    compacted_at,
    oaccept,
    oack,
    ocommit,
)

# =========================================================================== recovering


def test_owner_recovers_an_instance_execution_waits_for_and_retransmits_the_noop() -> None:
    # (N=3 seeds 354, 1472, all faults) slot 0 is chosen for replica 1's index 0, which it
    # does not hold (proposed before a crash and never made durable, say): it must recover
    # the index itself, and keep re-sending the no-op it proposes until a majority has it
    r1 = core(3, 1)
    r1.step(oaccept((0, 1)), 1)
    r1.step(oack(0, 0), 1)
    drain(r1)
    prepare: CPrepare | None = None
    now = 0
    while prepare is None:
        now += 50_000
        assert now < 2_000_000, "no recovery of the instance execution waits for"
        r1.tick(now)
        ready = drain(r1)
        found = msgs(ready.send_after_persist + ready.send, CPrepare)
        prepare = found[0][1] if found else None  # type: ignore[assignment]
    assert (prepare.owner, prepare.from_index) == (1, 0)
    r1.step(CPromise(src=2, view=0, owner=1, from_index=0, ballot=prepare.ballot,
                     accepted=(), high=-1, through=EVERY_INDEX), now)
    ready = drain(r1)
    noop = CAccept(src=1, view=0, owner=1, index=0, ballot=prepare.ballot, batch=())
    assert msgs(ready.send_after_persist, CAccept) == [(0, noop), (2, noop)]
    # both lost: the no-op is sent again after the retransmission timeout
    r1.tick(now + 250_000)
    assert (2, noop) in msgs(drain(r1).send_after_persist, CAccept)


def test_a_recovery_without_a_majority_in_time_asks_again_at_the_same_ballot() -> None:
    # past saturation a Prepare round trip outlasted the timeout: each retry at a higher
    # ballot voided the promises on their way, and owners re-prepared their own instances
    # over and over, holding back their clients' commands meanwhile
    r1 = core(5, 1)
    r1.step(oaccept((0, 1)), 1)
    drain(r1)
    prepares: list[tuple[int, PeerMessage]] = []
    now = 0
    while not prepares:  # execution stopped: it recovers the instance execution waits for
        now += 50_000
        assert now < 2_000_000, "no recovery"
        r1.tick(now)
        prepares = [(to, m) for to, m in all_out(drain(r1)) if isinstance(m, CPrepare)]
    prepare = prepares[0][1]
    assert isinstance(prepare, CPrepare) and (prepare.owner, prepare.from_index) == (1, 0)
    timeout = r1.config.election_timeout_us
    late = now + 10_000
    r1.step(CPromise(src=2, view=0, owner=1, from_index=0, ballot=prepare.ballot,
                     accepted=(), high=-1, through=EVERY_INDEX), late)
    drain(r1)
    r1.tick(late + timeout)
    again = [(to, m) for to, m in all_out(drain(r1)) if isinstance(m, CPrepare)]
    assert again == [(0, prepare), (3, prepare), (4, prepare)]
    r1.step(CPromise(src=3, view=0, owner=1, from_index=0, ballot=prepare.ballot,
                     accepted=(), high=-1, through=EVERY_INDEX), late + timeout + 1)
    noop = CAccept(src=1, view=0, owner=1, index=0, ballot=prepare.ballot, batch=())
    assert msgs(drain(r1).send_after_persist, CAccept) == [(0, noop), (2, noop), (3, noop),
                                                           (4, noop)]


def test_a_recovery_asks_again_from_where_execution_got_to() -> None:
    # (N=5 seeds 4, 6, 7 with snapshots every 10 slots) asking again from the first start
    # reached below the peers' compaction point: they answered with snapshots, never with
    # promises, and the recovery never ended
    r2 = core(5, 2)
    r2.tick(0)
    r2.recovery.start_recovery(1, 0)
    (prepare,) = {m for _, m in all_out(drain(r2)) if isinstance(m, CPrepare)}
    r2.step(caccept(1, 1, 0, (A,)), 10)
    r2.step(ccommit(1, 1, 0, (A,)), 10)
    r2.step(oaccept((0, 1)), 10)
    r2.step(ocommit(0, (0, 1)), 10)
    assert [e.command for e in drain(r2).executions()] == [A]
    r2.tick(r2.config.election_timeout_us + 20)
    again = {m for _, m in all_out(drain(r2)) if isinstance(m, CPrepare)}
    assert again == {dataclasses.replace(prepare, from_index=1)}


def test_an_owner_does_not_recover_its_own_chosen_instances_while_execution_waits() -> None:
    # past saturation execution stalled for longer than the election timeout behind others'
    # instances; an owner took its chosen but not yet ordered instances for ones nobody drove
    # and prepared them again, raising its ballot each time (33 of 36 recoveries in a run)
    r1 = core(5, 1)
    r1.propose(A, 0)
    drain(r1)
    r1.step(cack(2, 1, 0), 1)
    r1.step(cack(4, 1, 0), 1)
    drain(r1)
    for now in range(50_000, 3_000_000, 50_000):
        for peer in (0, 2, 3, 4):
            r1.step(Heartbeat(src=peer, view=0, executed=0, lease_request=-1), now)
        r1.tick(now)
        assert [m for _, m in all_out(drain(r1)) if isinstance(m, CPrepare)] == [], now
    assert r1.recoveries_started == 0


def test_an_owner_overtaken_by_a_recoverer_takes_back_what_it_proposed_after() -> None:
    # Found by `bench throughput --straggler 0.33 --straggler-replica 1`: peers suspected the
    # slow replica 1 and recovered its instances. A recoverer's promise covers every later
    # index, so what replica 1 had in flight was refused, and nobody drove it. Replica 1
    # retook its own instances only once execution stopped, which it never did under load:
    # its clients waited for good.
    r1 = core(3, 1, heartbeat_us=10_000_000)
    r1.tick(0)
    r1.propose(C, 1)
    (accept,) = {m for _, m in msgs(drain(r1).send_after_persist, CAccept)}
    for src in (0, 2):  # both promised a recoverer of ours a higher ballot meanwhile
        r1.step(CNack(src=src, view=0, owner=1, index=accept.index,
                      ballot=ballot_of(1, 0)), 2)
    drain(r1)
    prepare: CPrepare | None = None
    now, slot = 0, 0
    while prepare is None:
        now += 50_000
        assert now < 2_000_000, "the refused proposal is never taken back"
        # replica 2's commands keep executing here meanwhile
        r1.step(caccept(2, 2, slot, (cmd(100 + slot, 2),)), now)
        r1.step(ccommit(2, 2, slot, (cmd(100 + slot, 2),)), now)
        r1.step(ocommit(0, (slot, 2)), now)
        slot += 1
        r1.tick(now)
        ready = drain(r1)
        assert ready.executions()
        found = msgs(ready.send_after_persist + ready.send, CPrepare)
        prepare = found[0][1] if found else None  # type: ignore[assignment]
    assert (prepare.owner, prepare.from_index) == (1, accept.index)
    assert prepare.ballot > ballot_of(1, 0)


def test_a_recoverer_that_promised_a_higher_ballot_meanwhile_proposes_nothing() -> None:
    # (N=3 seed 390 at 6 clients per site) replica 0 recovered replica 2's instances at
    # ballot 1280, promised replica 2's own recovery 1282, then got its last promise: its
    # no-op at 1280, accepted by itself against its promise, was chosen with replica 1, and
    # replica 2's batch at 1282 was chosen too. Replica 2 executed the batch in slot 77,
    # the others nothing.
    r0 = core(3, 0)
    r0.tick(0)
    r0.recovery.start_recovery(2, 0)
    (ours,) = {m for _, m in all_out(drain(r0)) if isinstance(m, CPrepare)}
    r0.step(CPrepare(src=2, view=0, owner=2, from_index=0, ballot=ours.ballot + 2), 1)
    assert [type(m) for _, m in all_out(drain(r0))] == [CPromise]
    r0.step(CPromise(src=1, view=0, owner=2, from_index=0, ballot=ours.ballot, accepted=(),
                     high=0, through=EVERY_INDEX), 2)
    ready = drain(r0)
    assert [m for _, m in all_out(ready) if isinstance(m, CAccept)] == []
    assert [r for r in ready.persist if isinstance(r, CAcceptedRecord)] == []


# =========================================================================== compaction


def test_a_promise_never_hides_a_compacted_value_of_the_instances_it_covers() -> None:
    # C[1][0] was accepted and executed here, then compacted: promising from index 0 and
    # reporting nothing would let the recoverer choose a no-op over it
    r2 = compacted_at(2, 1)
    r2.step(CPrepare(src=0, view=0, owner=1, from_index=0, ballot=ballot_of(1, 0)), 10)
    ready = drain(r2)
    assert all_out(ready) == [] and ready.persist == []
    assert ready.snapshot_requests == [0]
    r2.step(CPrepare(src=0, view=0, owner=1, from_index=1, ballot=ballot_of(1, 0)), 20)
    assert [type(m) for _, m in all_out(drain(r2))] == [CPromise]


def test_a_recovery_never_re_proposes_an_instance_executed_meanwhile() -> None:
    r2 = core(3, 2)
    r2.recovery.start_recovery(1, 0)  # C[1][0] looks stalled
    drain(r2)
    # meanwhile C[1][0] is decided and executed here, and compacted away
    r2.step(ccommit(1, 1, 0, (A,)), 1)
    r2.step(ocommit(0, (0, 1)), 1)
    assert [e.command for e in drain(r2).executions()] == [A]
    r2.compact(r2.snapshot_meta())
    drain(r2)
    ballot = r2.recovery.recoveries[1].ballot
    r2.step(CPromise(src=0, view=0, owner=1, from_index=0, ballot=ballot, accepted=(),
                     high=0, through=EVERY_INDEX), 2)
    ready = drain(r2)
    assert msgs(ready.send, CAccept) + msgs(ready.send_after_persist, CAccept) == []
    assert not any(isinstance(r, CAcceptedRecord) for r in ready.persist)


# =========================================================================== paged promises


def test_a_promise_over_more_than_a_page_reports_on_a_page_and_says_how_far(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a promise reporting on every accepted instance was sized by the log: a restarted peer
    # decoded tens of thousands of votes (seconds on the event loop; past 65,536 none did)
    r2 = core(3, 2)
    batch = (cmd(1, 0),)
    per_vote = batch_size(batch)
    for index in range(10):
        r2.step(caccept(1, 1, index, batch), 0)
    drain(r2)
    monkeypatch.setattr(recovery_module, "PROMISE_PAGE_BYTES", 3 * per_vote)
    r2.step(CPrepare(src=0, view=0, owner=1, from_index=0, ballot=ballot_of(1, 0)), 1)
    (promise,) = [m for _, m in all_out(drain(r2)) if isinstance(m, CPromise)]
    assert [v.index for v in promise.accepted] == [0, 1, 2]
    assert (promise.through, promise.high) == (2, 9)
    r2.step(CPrepare(src=0, view=0, owner=1, from_index=8, ballot=ballot_of(1, 0)), 2)
    (rest,) = [m for _, m in all_out(drain(r2)) if isinstance(m, CPromise)]
    assert [v.index for v in rest.accepted] == [8, 9] and rest.through == EVERY_INDEX
    # one batch over the budget still goes, alone: a page always makes progress
    monkeypatch.setattr(recovery_module, "PROMISE_PAGE_BYTES", 1)
    r2.step(CPrepare(src=0, view=0, owner=1, from_index=4, ballot=ballot_of(1, 0)), 3)
    (single,) = [m for _, m in all_out(drain(r2)) if isinstance(m, CPromise)]
    assert [v.index for v in single.accepted] == [4] and single.through == 4


def test_a_recoverer_goes_no_further_than_the_shortest_page_then_asks_for_the_next() -> None:
    # Beyond a page an acceptor of the majority may hold a value (here C[1][3], which may be
    # chosen): a no-op there would be a second value. The recoverer proposes through the
    # page, then asks again from its end at the same ballot (the promises hold already).
    r0 = core(3, 0)
    r0.tick(0)
    r0.recovery.start_recovery(1, 0)
    (prepare,) = {m for _, m in all_out(drain(r0)) if isinstance(m, CPrepare)}
    batches = [(cmd(1, i),) for i in range(4)]
    page = CPromise(src=2, view=0, owner=1, from_index=0, ballot=prepare.ballot,
                    accepted=tuple(CVote(index=i, ballot=1, batch=batches[i]) for i in (0, 1)),
                    high=3, through=1)
    r0.step(page, 10)
    ready = drain(r0)
    proposed = {m.index: m.batch for _, m in msgs(ready.send_after_persist, CAccept)}
    assert proposed == {0: batches[0], 1: batches[1]}
    again = {m for _, m in all_out(ready) if isinstance(m, CPrepare)}
    assert again == {dataclasses.replace(prepare, from_index=2)}
    # a late answer to the first page counts for nothing on the second
    r0.step(dataclasses.replace(page, src=1), 11)
    assert msgs(drain(r0).send_after_persist, CAccept) == []
    rest = CPromise(src=2, view=0, owner=1, from_index=2, ballot=prepare.ballot,
                    accepted=(CVote(index=3, ballot=1, batch=batches[3]),), high=3,
                    through=EVERY_INDEX)
    r0.step(rest, 12)
    proposed = {m.index: m.batch for _, m in msgs(drain(r0).send_after_persist, CAccept)}
    assert proposed == {2: (), 3: batches[3]}
