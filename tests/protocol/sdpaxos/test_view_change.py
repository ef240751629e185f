"""View change (view_change.py, §3.3, Figure 7): the new sequencer's rebuild of the assignment
log, the N = 5 re-proposals and hole filling, votes and snapshots below a compaction point, the
span a view change covers, and a NewView too wide for a message.
"""

from __future__ import annotations

import random

import pytest
from util import cmd, core, drain, msgs

from consensus.messages import NO_CL, NewView, OVote, PreVote, PreVoteReply, Vote, VRequest
from consensus.protocol.sdpaxos import Role, SDPaxosReplica
from consensus.protocol.sdpaxos import view_change as view_change_module
from consensus.protocol.sdpaxos.view_change import fill_for
from consensus.protocol.types import SnapshotMeta

from .builders import A, C, all_out, caccept, ccommit, compacted_at, ocommit

# =========================================================================== rebuild


def _silence_until_prevote(r: SDPaxosReplica, now: int) -> tuple[PreVote, int]:
    """Tick ``r`` in 50 ms steps, hearing nothing, until it asks for pre-votes."""
    while True:
        now += 50_000
        r.tick(now)
        found = msgs(drain(r).send, PreVote)
        if found:
            return found[0][1], now


def _candidate_of_view_4_after_view_2(
    new_view_start: int, owners: tuple[int, ...]
) -> SDPaxosReplica:
    """Replica 1 installed view 2's NewView, then stands for view 4 (replica 0 pre-votes)."""
    r1 = core(3, 1)
    r1.tick(0)
    drain(r1)
    r1.step(NewView(src=2, view=2, start=new_view_start, owners=owners), 1_000)
    drain(r1)
    prevote, now = _silence_until_prevote(r1, 1_000)  # view 2's sequencer falls silent
    assert prevote.view == 4
    r1.step(PreVoteReply(src=0, view=4, granted=True), now)
    drain(r1)
    return r1


def test_new_sequencer_drops_a_deposed_sequencers_leftover_order() -> None:
    # (N=3 seeds 490 LAN, 1044 WAN, all faults) replica 0, deposed sequencer of view 0, ordered
    # slot 5 for replica 2 after view 2 was elected without it. Slot 5 cannot have been chosen
    # (view 2's NewView, which replica 1 installed, would hold it), so view 4 must not revive
    # it: replica 2's next command would land there, before commands already ready
    r1 = _candidate_of_view_4_after_view_2(0, (0, 0, 0, 0, 0))
    stale = OVote(slot=5, owner=2, ballot=0)
    r1.step(Vote(src=0, view=4, accepted_view=0, accepted_from=0, executed=0, entries=(stale,),
                 c_high=(-1, -1, 9)), 10_000_000)
    new_views = msgs(drain(r1).send_after_persist, NewView)
    assert new_views and all(m.owners == (0, 0, 0, 0, 0) for _, m in new_views)


def test_new_sequencer_keeps_old_values_below_the_newest_views_start() -> None:
    # below the start of view 2's NewView, replica 1 holding nothing proves nothing: those
    # slots were decided before view 2 (executed by its sequencer), maybe as replica 0 says
    r1 = _candidate_of_view_4_after_view_2(3, (0, 0))
    old = OVote(slot=1, owner=2, ballot=0)
    r1.step(Vote(src=0, view=4, accepted_view=0, accepted_from=0, executed=0, entries=(old,),
                 c_high=(-1, -1, 9)), 10_000_000)
    new_views = msgs(drain(r1).send_after_persist, NewView)
    assert new_views and all(m.owners[1] == 2 for _, m in new_views)


# =========================================================================== compaction


def test_a_voter_that_compacted_what_the_candidate_asks_about_sends_its_snapshot() -> None:
    # a vote from slot 0 would report no value for slot 0, which is chosen: the candidate
    # could fill it with a no-op. The candidate gets the snapshot and asks again from there.
    r2 = compacted_at(2, 1)
    later = 10 * r2.config.lease_us  # a restarted replica's vote is no longer held back
    r2.step(VRequest(src=1, view=1, from_slot=0), later)
    ready = drain(r2)
    assert all_out(ready) == []
    assert ready.snapshot_requests == [1]
    r2.step(VRequest(src=1, view=1, from_slot=1), later)
    (vote,) = [m for _, m in all_out(drain(r2)) if isinstance(m, Vote)]
    assert vote.executed == 1


# =========================================================================== N = 5


def _n5_candidate_that_executed_two_slots(*, compact: bool) -> SDPaxosReplica:
    """Replica 1 of five executed slots 0 and 1 (replicas 2 and 3's first commands, ordered by
    view 0's sequencer), then stands for view 1 with one pre-vote from replica 2."""
    r1 = core(5, 1)
    r1.tick(0)
    for slot, (owner, command) in enumerate([(2, A), (3, C)]):
        r1.step(caccept(owner, owner, 0, (command,)), 0)
        r1.step(ccommit(owner, owner, 0, (command,)), 0)
        r1.step(ocommit(0, (slot, owner)), 0)
    assert [e.command for e in drain(r1).executions()] == [A, C]
    if compact:
        r1.compact(r1.snapshot_meta())
        drain(r1)
    prevote, now = _silence_until_prevote(r1, 0)  # view 0's sequencer falls silent
    for src in (2, 3):
        r1.step(PreVoteReply(src=src, view=prevote.view, granted=True), now)
    (request,) = {m for _, m in all_out(drain(r1)) if isinstance(m, VRequest)}
    assert (request.view, request.from_slot) == (1, 2)
    return r1


def _vote_n5(src: int, executed: int) -> Vote:
    return Vote(src=src, view=1, accepted_view=0, accepted_from=0, executed=executed,
                entries=(), c_high=(-1, -1, 0, 0, -1))


def test_n5_new_view_re_proposes_what_the_candidate_executed_and_a_voter_did_not() -> None:
    # With five replicas slots 0-1 may be accepted by their owners and view 0's sequencer
    # only (committed on the OAccept alone). Replica 2 never executed them: unless the new
    # view makes a majority accept them, a later view elected without replicas 0 and 1 (and
    # without their owners) would hand them to someone else.
    r1 = _n5_candidate_that_executed_two_slots(compact=False)
    r1.step(_vote_n5(2, executed=0), 10_000_000)
    r1.step(_vote_n5(3, executed=2), 10_000_000)
    (new_view,) = {m for _, m in msgs(drain(r1).send_after_persist, NewView)}
    assert (new_view.start, new_view.owners[:2]) == (0, (2, 3))


def test_n5_new_view_gives_the_untraced_replica_no_more_slots_than_it_may_have_ready() -> None:
    """Figure 7 fills holes for the untraced replica m until it owns C[m] O-instances with no
    hole before the last: filling the hole in front of m's two slots from view 0 gave it a
    third, where its next proposal would land before every command ordered after the view
    change (N=5 seed 362: a read proposed after a write was acknowledged ran before it)."""
    r1 = _n5_candidate_that_executed_two_slots(compact=False)
    # voters 2 and 3 accepted m = 4's slots 3 and 4 from view 0; nobody has slot 2 (view 0's
    # sequencer, 0, gave it to someone and does not vote); m has two C-instances at most
    entries = (OVote(slot=3, owner=4, ballot=0), OVote(slot=4, owner=4, ballot=0))
    for src in (2, 3):
        r1.step(Vote(src=src, view=1, accepted_view=0, accepted_from=0, executed=2,
                     entries=entries, c_high=(-1, -1, 0, 0, 1)), 10_000_000)
    (new_view,) = {m for _, m in msgs(drain(r1).send_after_persist, NewView)}
    assert (new_view.start, new_view.owners) == (2, (4, 4, NO_CL))


@pytest.mark.parametrize("unsafe", [frozenset(), frozenset({"candidacy_counts_now"})])
def test_n5_a_snapshot_installed_during_the_candidacy_does_not_move_the_hole_filling(
    unsafe: frozenset[str],
) -> None:
    """The candidate asked for votes from slot 2, then caught up from a peer's snapshot at
    slot 5, in which m = 4 (untraced: it and view 0's sequencer do not vote) owns slots 3 and
    4. The votes still report those slots. Counting m's slots below the start from what the
    candidate holds *now* (2, with the snapshot's) made the hole filling think m had all it
    may own, and give both chosen slots away (N=5 seed 1245 of the simulator, snapshots every
    10: two values for one slot). As of the candidacy's start, m owned none below it."""
    r1 = _n5_candidate_that_executed_two_slots(compact=False)
    r1.unsafe = unsafe
    r1.install_snapshot(SnapshotMeta(slot=5, exec_counts=(0, 0, 2, 1, 2)))
    drain(r1)
    entries = (OVote(slot=2, owner=2, ballot=1), OVote(slot=3, owner=4, ballot=1),
               OVote(slot=4, owner=4, ballot=1))
    for src in (2, 3):
        r1.step(Vote(src=src, view=1, accepted_view=0, accepted_from=0, executed=5,
                     entries=entries, c_high=(-1, -1, 1, 0, 1)), 10_000_000)
    (new_view,) = {m for _, m in msgs(drain(r1).send_after_persist, NewView)}
    kept = (new_view.start, new_view.owners) == (2, (2, 4, 4))
    assert kept == (not unsafe), new_view


def test_n5_candidate_sends_its_snapshot_to_a_voter_behind_its_compaction_point() -> None:
    r1 = _n5_candidate_that_executed_two_slots(compact=True)
    r1.step(_vote_n5(2, executed=0), 10_000_000)
    r1.step(_vote_n5(3, executed=2), 10_000_000)
    ready = drain(r1)
    assert msgs(ready.send_after_persist, NewView) == []
    assert ready.snapshot_requests == [2]
    r1.step(_vote_n5(4, executed=2), 10_000_000)  # a third vote from beyond it: elected
    (new_view,) = {m for _, m in msgs(drain(r1).send_after_persist, NewView)}
    assert new_view.start == 2


# =========================================================================== view-change span


def test_n5_candidate_leaves_out_a_voter_too_far_behind_and_waits_for_nearer_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Re-proposing from a voter thousands of slots behind made the NewView as big as the log
    # (past MAX_SLOTS no peer could decode it): such a voter catches up under the new view.
    monkeypatch.setattr(view_change_module, "VIEW_SPAN", 1)
    r1 = _n5_candidate_that_executed_two_slots(compact=False)
    r1.step(_vote_n5(2, executed=0), 10_000_000)  # two slots behind: over the span
    r1.step(_vote_n5(3, executed=2), 10_000_000)
    assert msgs(drain(r1).send_after_persist, NewView) == []
    r1.step(_vote_n5(4, executed=1), 10_000_000)  # one behind: within it
    (new_view,) = {m for _, m in msgs(drain(r1).send_after_persist, NewView)}
    assert (new_view.start, new_view.owners[:1]) == (1, (3,))


def test_a_voter_does_not_vote_for_a_candidate_far_behind_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(view_change_module, "VIEW_SPAN", 2)
    r2 = core(3, 2)
    r2.tick(0)
    for index in range(4):
        r2.step(caccept(1, 1, index, (cmd(1, index),)), 0)
        r2.step(ccommit(1, 1, index, None), 0)
        r2.step(ocommit(0, (index, 1)), 0)
    drain(r2)
    assert r2.executed_through() == 3
    later = 10 * r2.config.lease_us
    r2.step(VRequest(src=1, view=1, from_slot=1), later)  # three behind
    ready = drain(r2)
    assert all_out(ready) == [] and r2.view == 0
    r2.step(VRequest(src=1, view=1, from_slot=2), later)  # two behind: within the span
    (vote,) = [m for _, m in all_out(drain(r2)) if isinstance(m, Vote)]
    assert [e.slot for e in vote.entries] == [2, 3]


# ============================================================= hole filling (Figure 7, lines 32-36)


def _fill_for_reference(m: int, needed: int, before: int, owners: list[int | None]) -> None:
    """Figure 7's loop as first written (fill the first hole, count again): quadratic."""
    while True:
        count = before
        last_needed = -1
        for position, owner in enumerate(owners):
            if owner == m:
                count += 1
                if count == needed:
                    last_needed = position
        if count >= needed and None not in owners[: max(last_needed, 0)]:
            break
        if None in owners:
            owners[owners.index(None)] = m
        else:
            owners.append(m)
    for position in range(last_needed + 1, len(owners)):
        if owners[position] == m:
            owners[position] = None


@pytest.mark.parametrize("seed", range(300))
def test_hole_filling_in_one_pass_matches_figure_7s_loop(seed: int) -> None:
    rng = random.Random(seed)
    m = 4
    owners = [rng.choice([None, None, m, 0, 1, NO_CL]) for _ in range(rng.randrange(12))]
    needed, before = rng.randrange(8), rng.randrange(4)
    expected = list(owners)
    _fill_for_reference(m, needed, before, expected)
    fill_for(m, needed, before, owners)
    assert owners == expected


def test_hole_filling_is_linear() -> None:
    # a vote naming 200,000 instances of the untraced replica: the old loop took minutes
    owners: list[int | None] = [None, 1] * 100_000
    fill_for(4, 200_000, 0, owners)
    assert owners.count(4) == 200_000 and None not in owners


# ================================================================= a NewView too wide for a message


def test_a_candidate_whose_new_view_would_not_fit_a_message_sends_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the encoder refuses a NewView of more than MAX_SLOTS owners (the replica would stop):
    # the candidacy is given up instead, and the election times out
    monkeypatch.setattr(view_change_module, "MAX_SLOTS", 3)
    r1 = _n5_candidate_that_executed_two_slots(compact=False)
    entries = tuple(OVote(slot=s, owner=3, ballot=0) for s in range(2, 8))
    for src in (2, 3):
        r1.step(Vote(src=src, view=1, accepted_view=0, accepted_from=0, executed=2,
                     entries=entries, c_high=(-1, -1, 0, 5, -1)), 10_000_000)
    assert msgs(drain(r1).send_after_persist, NewView) == []
    assert r1.too_wide_views == 1 and r1.role is Role.CANDIDATE
